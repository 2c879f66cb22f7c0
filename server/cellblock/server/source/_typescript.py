"""TypeScript type stripping that keeps every position (SPEC §6.2)."""

from __future__ import annotations

from dataclasses import dataclass

import tree_sitter

from cellblock.server.source._syntax import _LINE_BREAKS, _parse_checked, _SyntaxProblem, _Text

# ---------------------------------------------------------------------------
# TypeScript stripping (§6.2).


@dataclass(frozen=True)
class _CodegenProblem:
    byte_offset: int
    construct: str


_REMOVED_DECLARATIONS = {
    "interface_declaration",
    "type_alias_declaration",
    "ambient_declaration",
    "function_signature",
    "abstract_method_signature",
}
_CLASS_ONLY_REMOVED = {"index_signature", "method_signature"}
_REMOVED_NODES = {
    "type_annotation",
    "type_predicate_annotation",
    "asserts_annotation",
    "opting_type_annotation",
    "omitting_type_annotation",
    "adding_type_annotation",
    "type_arguments",
    "type_parameters",
    "implements_clause",
    "accessibility_modifier",
    "override_modifier",
}
_TYPE_ONLY_STATEMENTS = {
    "interface_declaration",
    "type_alias_declaration",
    "ambient_declaration",
    "empty_statement",
    "comment",
}


def _children_of_type(node: tree_sitter.Node, kind: str) -> list[tree_sitter.Node]:
    return [c for c in node.children if c.type == kind and not c.is_named]


def _is_type_only_namespace(node: tree_sitter.Node) -> bool:
    body = node.child_by_field_name("body")
    if body is None:
        return True
    for child in body.named_children:
        if not _is_type_only_statement(child):
            return False
    return True


def _namespace_of(node: tree_sitter.Node) -> tree_sitter.Node | None:
    if node.type in ("internal_module", "module"):
        return node
    if node.type == "expression_statement" and node.named_child_count == 1:
        inner = node.named_children[0]
        if inner.type in ("internal_module", "module"):
            return inner
    return None


def _is_type_only_statement(node: tree_sitter.Node) -> bool:
    if node.type in _TYPE_ONLY_STATEMENTS:
        return True
    namespace = _namespace_of(node)
    if namespace is not None:
        return _is_type_only_namespace(namespace)
    if node.type == "export_statement":
        if _children_of_type(node, "type"):
            return True
        declaration = node.child_by_field_name("declaration")
        return declaration is not None and _is_type_only_statement(declaration)
    return False


def _is_parameter_property(node: tree_sitter.Node) -> bool:
    return any(
        c.type in ("accessibility_modifier", "override_modifier") or c.type == "readonly"
        for c in node.children
    )


def _strip_ranges(
    root: tree_sitter.Node,
) -> tuple[list[tuple[int, int]], list[_CodegenProblem]]:
    """Collects the byte ranges to blank and the constructs needing code generation."""
    ranges: list[tuple[int, int]] = []
    problems: list[_CodegenProblem] = []
    stack = [root]

    def remove(node: tree_sitter.Node) -> None:
        ranges.append((node.start_byte, node.end_byte))

    while stack:
        node = stack.pop()
        kind = node.type
        parent = node.parent
        in_class_body = parent is not None and parent.type == "class_body"
        if kind in _REMOVED_DECLARATIONS or (in_class_body and kind in _CLASS_ONLY_REMOVED):
            remove(parent if parent is not None and parent.type == "export_statement" else node)
            continue
        if kind in _REMOVED_NODES:
            remove(node)
            continue
        namespace = _namespace_of(node)
        if namespace is not None:
            outer = node
            if outer.parent is not None and outer.parent.type == "export_statement":
                outer = outer.parent
            if _is_type_only_namespace(namespace):
                remove(outer)
            else:
                problems.append(_CodegenProblem(namespace.start_byte, "namespace"))
            continue
        if kind == "enum_declaration":
            problems.append(_CodegenProblem(node.start_byte, "enum"))
            continue
        if kind == "import_alias" or (
            kind == "import_statement"
            and any(c.type == "import_require_clause" for c in node.children)
        ):
            problems.append(_CodegenProblem(node.start_byte, "import alias"))
            continue
        if kind == "import_statement" and _children_of_type(node, "type"):
            remove(node)
            continue
        if kind == "export_statement":
            if _children_of_type(node, "type"):
                remove(node)
                continue
            if _children_of_type(node, "="):
                problems.append(_CodegenProblem(node.start_byte, "export ="))
                continue
        if kind in ("import_specifier", "export_specifier"):
            for token in _children_of_type(node, "type"):
                remove(token)
        if kind in ("required_parameter", "optional_parameter"):
            if _is_parameter_property(node):
                problems.append(_CodegenProblem(node.start_byte, "parameter property"))
                continue
            pattern = node.child_by_field_name("pattern")
            if pattern is not None and pattern.type == "this":
                following = node.next_sibling
                end = following.end_byte if following is not None and following.type == "," else (
                    node.end_byte
                )
                ranges.append((node.start_byte, end))
                continue
            for token in _children_of_type(node, "?"):
                remove(token)
        if kind == "public_field_definition":
            if _children_of_type(node, "declare") or _children_of_type(node, "abstract"):
                remove(node)
                continue
            for token_kind in ("readonly", "?", "!"):
                for token in _children_of_type(node, token_kind):
                    remove(token)
        if kind == "method_definition":
            for token in _children_of_type(node, "?"):
                remove(token)
        if kind == "abstract_class_declaration":
            for token in _children_of_type(node, "abstract"):
                remove(token)
        if kind == "variable_declarator":
            for token in _children_of_type(node, "!"):
                remove(token)
        if kind == "non_null_expression" and node.child_count:
            last = node.children[-1]
            if last.type == "!":
                remove(last)
        if kind in ("as_expression", "satisfies_expression"):
            keyword = "as" if kind == "as_expression" else "satisfies"
            tokens = _children_of_type(node, keyword)
            if tokens:
                ranges.append((tokens[0].start_byte, node.end_byte))
                expression = node.named_children[0] if node.named_child_count else None
                if expression is not None:
                    stack.append(expression)
                continue
        stack.extend(reversed(node.children))
    return ranges, problems


def _blank(text: _Text, ranges: list[tuple[int, int]]) -> str:
    """Replaces every character inside ``ranges`` (UTF-8 byte ranges) by spaces.

    Line breaks are kept and a character outside the BMP becomes two spaces, so
    lines and UTF-16 columns are unchanged.
    """
    if not ranges:
        return text.text
    ranges.sort()
    merged: list[list[int]] = []
    for start, end in ranges:
        if merged and start <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], end)
        else:
            merged.append([start, end])
    pieces: list[str] = []
    cursor = 0
    for start, end in merged:
        pieces.append(text.slice(cursor, start))
        removed = text.slice(start, end)
        pieces.append(
            "".join(
                ch if ch in _LINE_BREAKS else ("  " if ord(ch) > 0xFFFF else " ") for ch in removed
            )
        )
        cursor = end
    pieces.append(text.slice(cursor, len(text.data)))
    return "".join(pieces)


@dataclass(frozen=True)
class _Stripped:
    text: str
    syntax: _SyntaxProblem | None
    codegen: _CodegenProblem | None


def _strip_typescript(source: _Text) -> _Stripped:
    tree, syntax = _parse_checked("typescript", source, allow_jsx=True)
    if tree is None or syntax is not None:
        return _Stripped(source.text, syntax, None)
    ranges, problems = _strip_ranges(tree.root_node)
    codegen = min(problems, key=lambda p: p.byte_offset) if problems else None
    return _Stripped(_blank(source, ranges), syntax, codegen)


