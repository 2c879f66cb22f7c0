"""Module access on the syntax tree (SPEC §6.6)."""

from __future__ import annotations

import tree_sitter

from cellblock.server.source._syntax import _Text, _token_text, _walk

# ---------------------------------------------------------------------------
# Module access (§6.6).


def _hex_escape(raw: str, i: int) -> tuple[str, int] | None:
    r"""Decodes the ``\u{...}``, ``\uXXXX`` or ``\xXX`` escape at ``raw[i]``.

    Returns:
        ``(character, index after the escape)``, or ``None`` when the digits do not name a
        code point (the caller then keeps the letter, as for an unknown escape).
    """
    if raw[i + 1] == "u" and raw.startswith("{", i + 2):
        close = raw.find("}", i + 3)
        if close < 0:
            return None
        digits, end = raw[i + 3 : close], close + 1
    elif raw[i + 1] == "u":
        digits, end = raw[i + 2 : i + 6], i + 6
    else:
        digits, end = raw[i + 2 : i + 4], i + 4
    try:
        return chr(int(digits, 16)), end
    except (ValueError, OverflowError):
        return None


def _decode_escapes(raw: str) -> str:
    """Decodes JavaScript escape sequences of an identifier or string literal body."""
    if "\\" not in raw:
        return raw
    out: list[str] = []
    i = 0
    simple = {"n": "\n", "t": "\t", "r": "\r", "b": "\b", "f": "\f", "v": "\v", "0": "\0"}
    while i < len(raw):
        ch = raw[i]
        if ch != "\\" or i + 1 >= len(raw):
            out.append(ch)
            i += 1
            continue
        nxt = raw[i + 1]
        if nxt in ("u", "x"):
            decoded = _hex_escape(raw, i)
            if decoded is not None:
                out.append(decoded[0])
                i = decoded[1]
                continue
        elif nxt in "\r\n\u2028\u2029":
            i += 2
            if nxt == "\r" and raw.startswith("\n", i):
                i += 1
            continue
        out.append(simple.get(nxt, nxt))
        i += 2
    return "".join(out)


_IDENTIFIER_REFERENCES = {
    "identifier",
    "shorthand_property_identifier",
    "shorthand_property_identifier_pattern",
}


def _unparenthesize(node: tree_sitter.Node) -> tree_sitter.Node:
    while node.type == "parenthesized_expression" and node.named_child_count == 1:
        node = node.named_children[0]
    return node


def _string_value(text: _Text, node: tree_sitter.Node) -> str | None:
    if node.type == "string":
        raw = text.slice(node.start_byte, node.end_byte)
        return _decode_escapes(raw[1:-1])
    if node.type == "template_string" and not any(
        c.type == "template_substitution" for c in node.children
    ):
        raw = text.slice(node.start_byte, node.end_byte)
        return _decode_escapes(raw[1:-1])
    return None


_FORBIDDEN_MEMBERS = {("module", "require"), ("process", "getBuiltinModule")}


def _member_access(text: _Text, node: tree_sitter.Node) -> tuple[str, str] | None:
    obj = node.child_by_field_name("object")
    if obj is None:
        return None
    obj = _unparenthesize(obj)
    if obj.type != "identifier":
        return None
    object_name = _decode_escapes(_token_text(text, obj))
    if node.type == "member_expression":
        prop = node.child_by_field_name("property")
        if prop is None or prop.type != "property_identifier":
            return None
        return object_name, _decode_escapes(_token_text(text, prop))
    index = node.child_by_field_name("index")
    if index is None:
        return None
    value = _string_value(text, _unparenthesize(index))
    return None if value is None else (object_name, value)


def _is_typeof_operand(node: tree_sitter.Node) -> bool:
    """True for the operand of ``typeof`` (also parenthesised): a probe, never module access."""
    parent = node.parent
    while parent is not None and parent.type == "parenthesized_expression":
        parent = parent.parent
    if parent is None or parent.type != "unary_expression":
        return False
    operator = parent.child_by_field_name("operator")
    return operator is not None and operator.type == "typeof"


def _uses_modules(text: _Text, root: tree_sitter.Node) -> bool:
    for node in _walk(root):
        kind = node.type
        if kind in ("import_statement", "export_statement"):
            return True
        if kind == "import" and node.is_named:
            return True
        if kind == "meta_property" and node.child_count and node.children[0].type == "import":
            return True
        if kind in _IDENTIFIER_REFERENCES:
            if _decode_escapes(_token_text(text, node)) == "require" and not _is_typeof_operand(node):
                return True
        elif kind in ("member_expression", "subscript_expression") and (
            _member_access(text, node) in _FORBIDDEN_MEMBERS
        ):
            return True
    return False


