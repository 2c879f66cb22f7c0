"""Parsing with tree-sitter, source positions, and syntax-error location (SPEC §6.3, §6.5).

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

from cellblock.server import messages as m
from cellblock.server.source._input import InputFailure


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


