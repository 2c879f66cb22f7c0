"""Shell detection, both cases, in linear time (SPEC §6.4)."""

from __future__ import annotations

from collections.abc import Iterator

import tree_sitter

from cellblock.server.source._module_access import _decode_escapes
from cellblock.server.source._syntax import _LINE_BREAKS, _Text, _token_text, _words
from cellblock.server.source._typescript import _children_of_type

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


