"""Source preparation on the host (SPEC §6): strip, parse, shell check, module check.

:func:`prepare_source` takes the submitted program and returns the JavaScript text
that runs unchanged in the cell, or the [S01]–[S04] refusal. Every position in the
prepared text equals the position in the submitted text (lines ending at LF, CRLF,
CR, U+2028 or U+2029; columns in UTF-16 code units).

Parser: tree-sitter with the ``tree-sitter-javascript`` grammar (and
``tree-sitter-typescript`` for TypeScript cells only), chosen because it is
actively maintained, tracks current ECMAScript (class fields, ``using``, ``??=``,
optional chaining) in prebuilt wheels, parses top-level ``await``/``return`` and
``import`` anywhere without a wrapper, and gives exact byte spans, so positions are
computed against the submitted text. Being error-tolerant, it reports where the
first error node sits rather than a validating parser's exact diagnostic, and it
accepts JSX, which is refused here as an unexpected token.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from dataclasses import dataclass

import tree_sitter

from cellblock.server.runs import _messages as m
from cellblock.server.runs._input import InputFailure, Language


def _words(text: str) -> frozenset[str]:
    return frozenset(text.split())


# ---------------------------------------------------------------------------
# Parsers (loaded lazily; TypeScript tooling only for TypeScript cells).

_local = threading.local()


def _parser(kind: str) -> tree_sitter.Parser:
    parsers: dict[str, tree_sitter.Parser] | None = getattr(_local, "parsers", None)
    if parsers is None:
        parsers = {}
        _local.parsers = parsers
    parser = parsers.get(kind)
    if parser is None:
        if kind == "javascript":
            import tree_sitter_javascript

            language = tree_sitter.Language(tree_sitter_javascript.language())
        else:
            import tree_sitter_typescript

            language = tree_sitter.Language(tree_sitter_typescript.language_typescript())
        parser = tree_sitter.Parser(language)
        parsers[kind] = parser
    return parser


# ---------------------------------------------------------------------------
# Positions.

_LINE_BREAKS = "\n\r\u2028\u2029"


class _Text:
    """A source string with its UTF-8 bytes and byte → character offsets."""

    def __init__(self, text: str) -> None:
        self.text = text
        self.data = text.encode("utf-8", "surrogatepass")
        self._ascii = len(self.data) == len(text)
        self._starts: list[int] | None = None

    def char_index(self, byte_offset: int) -> int:
        """Maps a UTF-8 byte offset (at a character boundary) to a str index."""
        if self._ascii:
            return byte_offset
        if self._starts is None:
            starts = []
            offset = 0
            for ch in self.text:
                starts.append(offset)
                code = ord(ch)
                offset += 1 if code < 0x80 else 2 if code < 0x800 else 3 if code < 0x10000 else 4
            starts.append(offset)
            self._starts = starts
        from bisect import bisect_left

        return bisect_left(self._starts, byte_offset)

    def slice(self, start_byte: int, end_byte: int) -> str:
        return self.data[start_byte:end_byte].decode("utf-8", "surrogatepass")

    def line_column(self, index: int) -> tuple[int, int]:
        """Returns the 1-based line and UTF-16 column of str index ``index``."""
        text = self.text
        line = 1
        line_start = 0
        i = 0
        while i < index:
            ch = text[i]
            if ch in _LINE_BREAKS:
                if ch == "\r" and i + 1 < len(text) and text[i + 1] == "\n":
                    i += 1
                    if i >= index:
                        break
                line += 1
                line_start = i + 1
            i += 1
        column = 1
        for ch in text[line_start:index]:
            column += 2 if ord(ch) > 0xFFFF else 1
        return line, column


def _utf16_len(text: str) -> int:
    return sum(2 if ord(ch) > 0xFFFF else 1 for ch in text)


# ---------------------------------------------------------------------------
# Tree helpers (iterative: trees can be deeper than Python's recursion limit).


def _walk(node: tree_sitter.Node) -> Iterator[tree_sitter.Node]:
    """Yields ``node`` and its descendants in document order."""
    stack = [node]
    while stack:
        current = stack.pop()
        yield current
        stack.extend(reversed(current.children))


# ---------------------------------------------------------------------------
# Syntax errors (§6.5).


@dataclass(frozen=True)
class _SyntaxProblem:
    byte_offset: int
    message: str


def _token_text(text: _Text, node: tree_sitter.Node) -> str:
    return text.slice(node.start_byte, node.end_byte)


def _unexpected(text: _Text, node: tree_sitter.Node | None) -> _SyntaxProblem:
    if node is None:
        return _SyntaxProblem(len(text.data), "Unexpected end of input")
    return _SyntaxProblem(node.start_byte, f"Unexpected token '{_token_text(text, node)}'")


def _next_token(root: tree_sitter.Node, byte_offset: int) -> tree_sitter.Node | None:
    return next((t for t in _tokens(root) if t.start_byte >= byte_offset), None)


_OPENERS = {"(": ")", "[": "]", "{": "}", "${": "}"}
_CLOSERS = frozenset({")", "]", "}"})
_OPERATORS = _words(
    """= + - * / % ** < > <= >= == === != !== && || ?? & | ^ << >> >>> . ?. ? : => += -= *=
    /= %= **= <<= >>= >>>= &= |= ^= &&= ||= ??= ! ~ ..."""
)
_EXPECTS_MORE = _OPERATORS | _words(
    """, new return const let var function class await yield typeof void delete in of
    instanceof async if for while switch catch else do try finally throw case"""
)
_ATOMIC = frozenset({"string", "template_string", "regex", "number"})
_NAMES = frozenset(
    {
        "identifier",
        "property_identifier",
        "shorthand_property_identifier",
        "statement_identifier",
        "private_property_identifier",
    }
)
_VALUE_START = _NAMES | {"string", "number"}
_VALUE_END = _NAMES | {"string", "number", "template_string", "regex", "]"}


def _tokens(node: tree_sitter.Node) -> Iterator[tree_sitter.Node]:
    """Yields the tokens of ``node``: leaves, with literals kept whole."""
    stack = [node]
    while stack:
        current = stack.pop()
        if current.type == "comment":
            continue
        if current.child_count == 0 or current.type in _ATOMIC:
            if current.end_byte > current.start_byte:
                yield current
            continue
        stack.extend(reversed(current.children))


def _first_problem_node(root: tree_sitter.Node, allow_jsx: bool) -> tree_sitter.Node | None:
    for node in _walk(root):
        if node.is_error or node.is_missing:
            return node
        if not allow_jsx and node.type.startswith("jsx_"):
            return node
    return None


def _content_end(text: _Text) -> int:
    end = len(text.data)
    while end > 0 and text.data[end - 1 : end].isspace():
        end -= 1
    return end


_BREAK_BYTES = (b"\n", b"\r", "\u2028".encode(), "\u2029".encode())


def _scan_error_tokens(
    text: _Text,
    tokens: list[tree_sitter.Node],
    before: tree_sitter.Node | None,
    after: tree_sitter.Node | None,
) -> tree_sitter.Node | None:
    """Finds the first token of an error node that cannot follow the one before it."""

    def same_line(first: tree_sitter.Node, second: tree_sitter.Node) -> bool:
        between = text.data[first.end_byte : second.start_byte]
        return not any(mark in between for mark in _BREAK_BYTES)

    stack: list[str] = []
    previous = before
    for token in tokens:
        kind = token.type
        if previous is not None:
            if kind in _CLOSERS or kind == ";":
                if previous.type in _OPERATORS:
                    return token
            elif (
                kind in _VALUE_START
                and previous.type in _VALUE_END
                and same_line(previous, token)
            ):
                return token
        if kind in _CLOSERS and stack:
            if _OPENERS[stack.pop()] != kind:
                return token
        elif kind in _OPENERS:
            stack.append(kind)
        previous = token
    if after is not None and previous is not None:
        if previous.type in _OPERATORS and (after.type in _CLOSERS or after.type == ";"):
            return after
        if (
            after.type in _VALUE_START
            and previous.type in _VALUE_END
            and same_line(previous, after)
        ):
            return after
    return None


def _locate_error(
    text: _Text, root: tree_sitter.Node, allow_jsx: bool, partial: bool = False
) -> _SyntaxProblem | None:
    """Finds the first syntax error of a parsed tree, or ``None`` when it is valid.

    With ``partial`` the tree is of a prefix of the source: only errors that no
    continuation can repair are reported, and ``None`` means "unknown".
    """
    if not root.has_error and (allow_jsx or not _has_jsx(root)):
        return None
    node = _first_problem_node(root, allow_jsx)
    if node is None:  # pragma: no cover - has_error always has a node
        return None if partial else _SyntaxProblem(0, "Unexpected token")
    if node.type.startswith("jsx_"):
        return _SyntaxProblem(node.start_byte, "Unexpected token '<'")
    if node.is_missing:
        following = _next_token(root, node.end_byte)
        if partial and following is None:
            return None
        return _unexpected(text, following)
    tokens = list(_tokens(node))
    before = None
    for token in _tokens(root):
        if token.end_byte > node.start_byte:
            break
        before = token
    after = _next_token(root, node.end_byte)
    culprit = _scan_error_tokens(text, tokens, before, after)
    if culprit is not None:
        return _unexpected(text, culprit)
    if partial:
        return None
    if not tokens:
        return _unexpected(text, after)
    # Unclosed brackets or a dangling operator up to the end of the text: the
    # parser ran out of input.
    if after is None:
        depth = 0
        for token in tokens:
            if token.type in _OPENERS:
                depth += 1
            elif token.type in _CLOSERS:
                depth -= 1
        if depth > 0 or tokens[-1].type in _EXPECTS_MORE:
            return _unexpected(text, None)
    return _unexpected(text, tokens[0])


_PREFIX_THRESHOLD = 16384
_PREFIX_BYTES = 8192
_PREFIX_MARGIN = 512


def _parse_checked(
    kind: str, text: _Text, allow_jsx: bool
) -> tuple[tree_sitter.Tree | None, _SyntaxProblem | None]:
    """Parses ``text`` and locates its first syntax error.

    tree-sitter's error recovery is linear but slow on long runs of bad tokens, so
    a long source is first parsed by an 8 KiB prefix: an error that no continuation
    can repair, found well before the cut, is the source's first error and the full
    parse is skipped (the tree is then ``None``).
    """
    parser = _parser(kind)
    data = text.data
    if len(data) > _PREFIX_THRESHOLD:
        cut = _PREFIX_BYTES
        while cut > 0 and data[cut] & 0xC0 == 0x80:
            cut -= 1
        prefix = _Text(text.text[: text.char_index(cut)])
        prefix_tree = parser.parse(prefix.data)
        problem = _locate_error(prefix, prefix_tree.root_node, allow_jsx, partial=True)
        if problem is not None and problem.byte_offset < cut - _PREFIX_MARGIN:
            return None, problem
    tree = parser.parse(data)
    return tree, _locate_error(text, tree.root_node, allow_jsx)


def _has_jsx(root: tree_sitter.Node) -> bool:
    return any(node.type.startswith("jsx_") for node in _walk(root))


def _syntax_failure(text: _Text, problem: _SyntaxProblem) -> InputFailure:
    line, column = text.line_column(text.char_index(problem.byte_offset))
    return InputFailure(m.s02(line, column, problem.message))


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


# ---------------------------------------------------------------------------
# Module access (§6.6).


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
        if nxt == "u" and raw.startswith("{", i + 2):
            close = raw.find("}", i + 3)
            if close > 0:
                try:
                    out.append(chr(int(raw[i + 3 : close], 16)))
                    i = close + 1
                    continue
                except ValueError:
                    pass
        elif nxt == "u":
            try:
                out.append(chr(int(raw[i + 2 : i + 6], 16)))
                i += 6
                continue
            except ValueError:
                pass
        elif nxt == "x":
            try:
                out.append(chr(int(raw[i + 2 : i + 4], 16)))
                i += 4
                continue
            except ValueError:
                pass
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
            if _decode_escapes(_token_text(text, node)) == "require":
                return True
        elif kind in ("member_expression", "subscript_expression") and (
            _member_access(text, node) in _FORBIDDEN_MEMBERS
        ):
            return True
    return False


# ---------------------------------------------------------------------------
# Shell detection (§6.4).

SHELL_COMMANDS = _words(
    """ls pwd echo cat find dir sh bash zsh head tail mkdir rm cp mv chmod chown curl wget which
    env export cd printf test stat file grep sed awk xargs tee touch ln python python3 node ruby
    perl whoami exit set source command exec git npm npx pnpm yarn go cargo make sort wc jq rg
    tree ps kill du df uname hostname less more diff tar zip unzip ssh scp rsync docker kubectl
    pip pip3 uv deno bun java javac gcc gradle mvn pytest tsc sleep history alias unset"""
)
"""The known shell commands ``K`` of SPEC §6.4."""

GUEST_GLOBALS = _words(
    """Object Function Error EvalError RangeError ReferenceError SyntaxError TypeError URIError
    InternalError AggregateError SuppressedError Iterator Array parseInt parseFloat isNaN isFinite
    queueMicrotask decodeURI decodeURIComponent encodeURI encodeURIComponent escape unescape
    Infinity NaN undefined eval Number Boolean String Math Reflect Symbol DisposableStack
    globalThis BigInt Date RegExp JSON Proxy Map Set WeakMap WeakSet ArrayBuffer
    SharedArrayBuffer Uint8ClampedArray Int8Array Uint8Array Int16Array Uint16Array Int32Array
    Uint32Array BigInt64Array BigUint64Array Float16Array Float32Array Float64Array DataView
    Promise AsyncDisposableStack WeakRef FinalizationRegistry DOMException btoa atob performance
    ALL_TOOLS tools MCP API namespaces text json console yield_control setTimeout
    clearTimeout"""
)
"""Own properties of the guest's global object at start: the QuickJS built-ins of the
pinned engine plus the globals of SPEC §8.1."""

_SHELL_KEYWORDS = _words(
    """const let var function class return await async new typeof delete void yield import
    export if for while do switch try throw break continue with debugger true false null this
    super interface type enum declare abstract namespace module"""
)
_SHELL_OPERATORS = frozenset({">", ">>", "<", "|", "||", "&&"})
_FUNCTION_SCOPES = frozenset(
    {
        "function_declaration",
        "generator_function_declaration",
        "function_expression",
        "function",
        "generator_function",
        "arrow_function",
        "method_definition",
        "class_body",
    }
)


def _is_space(ch: str) -> bool:
    return ch.isspace() or ch == "\ufeff"


def _pattern_names(text: _Text, pattern: tree_sitter.Node) -> Iterator[str]:
    stack = [pattern]
    while stack:
        node = stack.pop()
        kind = node.type
        if kind in ("identifier", "shorthand_property_identifier_pattern"):
            yield _decode_escapes(_token_text(text, node))
        elif kind in ("assignment_pattern", "object_assignment_pattern"):
            left = node.child_by_field_name("left")
            if left is not None:
                stack.append(left)
        elif kind == "pair_pattern":
            value = node.child_by_field_name("value")
            if value is not None:
                stack.append(value)
        elif kind in ("object_pattern", "array_pattern", "rest_pattern"):
            stack.extend(node.named_children)


def _hoisted_names(text: _Text, root: tree_sitter.Node) -> set[str]:
    """Names bound by function declarations or ``var`` outside nested function bodies."""
    names: set[str] = set()
    stack = list(root.children)
    while stack:
        node = stack.pop()
        kind = node.type
        if kind in ("function_declaration", "generator_function_declaration"):
            name = node.child_by_field_name("name")
            if name is not None:
                names.add(_decode_escapes(_token_text(text, name)))
            continue
        if kind in _FUNCTION_SCOPES:
            continue
        if kind == "variable_declaration":
            for declarator in node.named_children:
                if declarator.type == "variable_declarator":
                    name = declarator.child_by_field_name("name")
                    if name is not None:
                        names.update(_pattern_names(text, name))
        elif kind == "for_in_statement" and _children_of_type(node, "var"):
            left = node.child_by_field_name("left")
            if left is not None:
                names.update(_pattern_names(text, left))
        stack.extend(node.children)
    return names


def _binary_operator(node: tree_sitter.Node) -> str | None:
    if node.type != "binary_expression":
        return None
    operator = node.child_by_field_name("operator")
    return operator.type if operator is not None else None


def _looks_like_shell_parsed(text: _Text, root: tree_sitter.Node) -> bool:
    """Case A of SPEC §6.4: the source parses."""
    statement = next((c for c in root.named_children if c.type != "comment"), None)
    if statement is None or statement.type != "expression_statement":
        return False
    expression = next((c for c in statement.named_children if c.type != "comment"), None)
    if expression is None or expression.start_byte != statement.start_byte:
        return False
    first = expression
    while first.child_count:
        first = first.children[0]
    if first.type != "identifier" or first.start_byte != expression.start_byte:
        return False
    word = _decode_escapes(_token_text(text, first))
    if word in GUEST_GLOBALS:
        return False
    in_commands = word in SHELL_COMMANDS
    after = text.text[text.char_index(first.end_byte) :]
    shaped = False
    if expression.type == "identifier":
        shaped = in_commands
    if not shaped and in_commands and _binary_operator(expression) in _SHELL_OPERATORS:
        left = expression
        while _binary_operator(left) in _SHELL_OPERATORS:
            next_left = left.child_by_field_name("left")
            if next_left is None:
                break
            left = next_left
        shaped = left.type == "identifier" and left.start_byte == first.start_byte
    if not shaped and (expression.type == "identifier" or _binary_operator(expression)):
        left = expression
        while _binary_operator(left) is not None:
            next_left = left.child_by_field_name("left")
            if next_left is None:
                break
            left = next_left
        if left.type == "identifier" and left.start_byte == first.start_byte:
            shaped = _followed_by_flag_or_path(after)
    if not shaped and in_commands:
        shaped = _followed_by_lone_dot(after)
    if not shaped:
        return False
    return word not in _hoisted_names(text, root)


def _followed_by_flag_or_path(after: str) -> bool:
    i = 0
    while i < len(after) and _is_space(after[i]):
        i += 1
    return (
        i > 0
        and i + 1 < len(after)
        and after[i] in "-/"
        and not _is_space(after[i + 1])
    )


def _followed_by_lone_dot(after: str) -> bool:
    i = 0
    while i < len(after) and _is_space(after[i]):
        i += 1
    return i > 0 and i + 1 < len(after) and after[i] == "." and _is_space(after[i + 1])


_NAME_START = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz_")
_NAME_CHARS = _NAME_START | frozenset("0123456789")
_WORD_CHARS = _NAME_CHARS | frozenset(".+-@%")
_HORIZONTAL = " \t\v\f\u00a0\ufeff"
_ARGUMENT_START = frozenset("-/.~'\"$\\@")
_OPERATOR_PREFIXES = (">>", ">", "<", "||", "|", "&&", "2>", "&>")


class _Scanner:
    """Linear, regex-free scanner for Case B of SPEC §6.4."""

    def __init__(self, text: str) -> None:
        self.text = text
        self.n = len(text)

    def skip_horizontal(self, i: int) -> int:
        text, n = self.text, self.n
        while i < n and text[i] not in _LINE_BREAKS and _is_space(text[i]):
            i += 1
        return i

    def skip_all_space(self, i: int) -> int:
        text, n = self.text, self.n
        while i < n and _is_space(text[i]):
            i += 1
        return i

    def end_of_line(self, i: int) -> int:
        text, n = self.text, self.n
        while i < n and text[i] not in _LINE_BREAKS:
            i += 1
        return i

    def first_code(self) -> int | None:
        """Skips blank lines, ``#`` and ``//`` lines and leading block comments."""
        text, n = self.text, self.n
        i = 0
        while True:
            i = self.skip_all_space(i)
            if i >= n:
                return None
            if text[i] == "#" or text.startswith("//", i):
                i = self.end_of_line(i)
                continue
            if text.startswith("/*", i):
                close = text.find("*/", i + 2)
                if close < 0:
                    return None
                i = close + 2
                continue
            return i

    def name_end(self, i: int) -> int:
        """Returns the end of ``[A-Za-z_][A-Za-z0-9_]*`` at ``i`` (``i`` when absent)."""
        text, n = self.text, self.n
        if i >= n or text[i] not in _NAME_START:
            return i
        i += 1
        while i < n and text[i] in _NAME_CHARS:
            i += 1
        return i

    def value_end(self, i: int) -> int:
        """Returns the end of the shell word starting at ``i`` (possibly empty)."""
        text, n = self.text, self.n
        while i < n:
            ch = text[i]
            if _is_space(ch) or ch in ";|&<>":
                return i
            if ch == "\\":
                i += 2
            elif ch == "'":
                close = text.find("'", i + 1)
                i = n if close < 0 else close + 1
            elif ch == '"':
                i += 1
                while i < n and text[i] != '"':
                    i += 2 if text[i] == "\\" else 1
                i = min(i + 1, n)
            else:
                i += 1
        return n

    def skip_assignments(self, i: int) -> int | None:
        text, n = self.text, self.n
        while True:
            name_end = self.name_end(i)
            if name_end == i or name_end >= n or text[name_end] != "=":
                return i
            end = self.value_end(name_end + 1)
            if end < n and not _is_space(text[end]):
                return i
            i = self.skip_horizontal(end)
            if i >= n or text[i] in _LINE_BREAKS:
                i = self.skip_all_space(i)
                if i >= n:
                    return None

    def followed(self, end: int) -> tuple[bool, bool]:
        """Returns (terminator/operator/argument follows, first argument is a flag)."""
        text, n = self.text, self.n
        i = self.skip_horizontal(end)
        if i >= n or text[i] in _LINE_BREAKS or text[i] == ";":
            return True, False
        if text.startswith(_OPERATOR_PREFIXES, i):
            return True, False
        if i > end and (text[i].isalnum() or text[i] in _ARGUMENT_START):
            flag = text[i] == "-" and i + 1 < n and not _is_space(text[i + 1])
            return True, flag
        return False, False

    def is_path(self, i: int) -> bool:
        text, n = self.text, self.n
        if text.startswith(("/", "./", "../", "~/", ".\\", "..\\"), i):
            return True
        return (
            i + 2 < n
            and text[i].isascii()
            and text[i].isalpha()
            and text[i + 1] == ":"
            and text[i + 2] in "\\/"
        )

    def looks_like_shell(self) -> bool:
        start = self.first_code()
        if start is None:
            return False
        i = self.skip_assignments(start)
        if i is None or i >= self.n:
            return False
        if self.is_path(i):
            return True
        text, n = self.text, self.n
        end = i
        while end < n and text[end] in _WORD_CHARS:
            end += 1
        word = text[i:end]
        if not word:
            return False
        if word in ("if", "while", "until"):
            j = self.skip_all_space(end)
            return j < n and text[j] != "("
        if word == "for":
            j = self.skip_all_space(end)
            if text.startswith("((", j):
                return True
            k = self.name_end(j)
            return k > j and text[j:k] != "await"
        if word == "function":
            j = self.skip_all_space(end)
            k = self.name_end(j)
            if j == end or k == j:
                return False
            while k < n and (text[k] in _NAME_CHARS or text[k] == "-"):
                k += 1
            k = self.skip_all_space(k)
            return k < n and text[k] == "{"
        if word == "export":
            j = self.skip_horizontal(end)
            k = self.name_end(j)
            return j > end and k > j and k < n and text[k] == "="
        follows, flag = self.followed(end)
        if not follows:
            return False
        if word in SHELL_COMMANDS:
            return True
        if word in _SHELL_KEYWORDS:
            return False
        return flag or any(ch in ".+-@%" for ch in word)


def looks_like_shell(source: str) -> bool:
    """Case B of SPEC §6.4 for a source that does not parse.

    Args:
        source: The submitted source text.

    Returns:
        True when the first command line of ``source`` looks like a shell command.
        Runs in time linear in the length of ``source``.
    """
    return _Scanner(source).looks_like_shell()


# ---------------------------------------------------------------------------
# Entry point.


@dataclass(frozen=True)
class PreparedSource:
    """A source accepted by :func:`prepare_source`."""

    text: str
    """The JavaScript text that runs unchanged: the hashbang turned into a comment and,
    for TypeScript, erasable syntax replaced by spaces. Same lines and UTF-16 columns as
    the submitted source."""

    language: Language
    """The submitted language."""


def _replace_hashbang(source: str) -> str:
    return "//" + source[2:] if source.startswith("#!") else source


def prepare_source(source: str, language: str) -> PreparedSource | InputFailure:
    """Prepares a submitted program for a cell (SPEC §6.1 order).

    Args:
        source: The program exactly as submitted.
        language: ``"javascript"`` or ``"typescript"`` (already validated).

    Returns:
        The prepared text, or an ``invalid_input`` failure with [S01] (shell-like),
        [S02] (syntax error with line and UTF-16 column), [S03] (TypeScript needing
        code generation) or [S04] (module access).
    """
    submitted = _Text(_replace_hashbang(source))
    stripped: _Stripped | None = None
    prepared = submitted
    if language == "typescript":
        stripped = _strip_typescript(submitted)
        if stripped.syntax is not None:
            # The source does not parse: Case B of shell detection, then [S02].
            if looks_like_shell(source):
                return InputFailure(m.S01)
            return _syntax_failure(submitted, stripped.syntax)
        prepared = _Text(stripped.text)
    tree, error = _parse_checked("javascript", prepared, allow_jsx=False)
    if tree is not None and error is None:
        if _looks_like_shell_parsed(prepared, tree.root_node):
            return InputFailure(m.S01)
    elif looks_like_shell(source):
        return InputFailure(m.S01)
    codegen = stripped.codegen if stripped is not None else None
    if codegen is not None:
        codegen_at = _position(submitted, codegen.byte_offset)
        if error is None or codegen_at <= _position(prepared, error.byte_offset):
            line, column = codegen_at
            return InputFailure(m.s03(line, column, codegen.construct))
    if error is not None:
        return _syntax_failure(prepared, error)
    assert tree is not None
    if _uses_modules(prepared, tree.root_node):
        return InputFailure(m.S04)
    return PreparedSource(text=prepared.text, language=language)  # type: ignore[arg-type]


def _position(text: _Text, byte_offset: int) -> tuple[int, int]:
    return text.line_column(text.char_index(byte_offset))
