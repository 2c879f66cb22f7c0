"""Source preparation on the host (SPEC §6): strip, parse, shell check, module check.

:func:`prepare_source` takes the submitted program and returns the JavaScript text
that runs unchanged in the cell, or the [S01]–[S04] refusal. Every position in the
prepared text equals the position in the submitted text (lines ending at LF, CRLF,
CR, U+2028 or U+2029; columns in UTF-16 code units).

The work is split by role: ``_syntax`` (tree-sitter parsing, positions, syntax
errors), ``_typescript`` (position-preserving type stripping), ``_shell`` (shell
detection) and ``_module_access`` ([S04] on the syntax tree).
"""

from __future__ import annotations

from dataclasses import dataclass

from cellblock.server import messages as m
from cellblock.server.config import Language
from cellblock.server.source._input import InputFailure
from cellblock.server.source._module_access import _uses_modules
from cellblock.server.source._shell import _looks_like_shell_parsed, looks_like_shell
from cellblock.server.source._syntax import _parse_checked, _syntax_failure, _Text
from cellblock.server.source._typescript import _strip_typescript, _Stripped

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
