"""Module access checks of SPEC §6.6, on the syntax tree."""

import pytest

from cellblock.server import messages as m
from cellblock.server.source._input import InputFailure
from cellblock.server.source._source import PreparedSource, prepare_source

REJECTED = [
    'import x from "y"',
    'import "y"',
    'import * as ns from "y"',
    'import { a as b } from "y"',
    "export const a = 1",
    "export default 1",
    "export { a }",
    'export * from "y"',
    'if (x) { import x from "y" }',
    'if (x) { import("y") }',
    'const m = await import("y")',
    'x = `a${import("y")}b`',
    'x = `a${`b${require("y")}`}`',
    "import.meta.url",
    "const u = import.meta",
    'require("fs")',
    'require?.("fs")',
    '(require)("fs")',
    '(0, require)("fs")',
    "const load = require",
    'r\\u0065quire("fs")',
    'r\\u{65}quire("fs")',
    "({ require })",
    'new require("x")',
    "typeof (0, require)",
    "if (typeof require === \"function\") require(\"fs\")",
    'function f() { return () => require("x") }',
    'module.require("fs")',
    'module?.require("fs")',
    'module["require"]("fs")',
    'module?.["require"]("fs")',
    'module[`require`]("fs")',
    'module["requir\\u0065"]("fs")',
    'process.getBuiltinModule("fs")',
    'process["getBuiltinModule"]("fs")',
    'process?.getBuiltinModule("fs")',
    'const x = 1;\nreturn await import("node:fs")',
]

ALLOWED = [
    "api.import(x)",
    "api?.require?.(x)",
    'api["require"](x)',
    "api.import.meta",
    "api.require",
    "const important = 1; return important",
    "const requirement = 2; return requirement",
    "const s = \"require('fs')\"; return s",
    'const t = `import x from "y"`; return t',
    '// require("fs")\nreturn 1',
    '/* import("x") */ return 1',
    'return /require\\("fs"\\)/.test(s)',
    "return { import: 1, require: 2 }",
    "class A { require() {} import() {} }",
    "return value?.return / 2 / 3",
    "module.exports = 1",
    "return process.env",
    'obj.module.require("x")',
    "const { require: r } = api",
    "x = module.requireX",
    'return x["require"]',
    "return new.target",
    "return `${api.import(1)}`",
    # typeof is a probe (SPEC §6.6, §8.1 item 2), also parenthesised.
    "return typeof require",
    "return typeof (require) === \"undefined\"",
    "return [typeof require, typeof module, typeof process, typeof exports]",
]


@pytest.mark.parametrize("source", REJECTED)
def test_module_access_is_rejected(source: str) -> None:
    assert prepare_source(source, "javascript") == InputFailure(m.S04)


@pytest.mark.parametrize("source", ALLOWED)
def test_lookalikes_are_allowed(source: str) -> None:
    result = prepare_source(source, "javascript")
    assert result == PreparedSource(text=source, language="javascript")


def test_there_are_at_least_forty_cases() -> None:
    assert len(REJECTED) + len(ALLOWED) >= 40


def test_typescript_import_type_is_stripped_not_module_access() -> None:
    result = prepare_source('import type { A } from "x";\nreturn 1', "typescript")
    assert isinstance(result, PreparedSource)
    assert result.text == " " * 27 + "\nreturn 1"


def test_typescript_value_import_is_module_access() -> None:
    assert prepare_source('import { type A, b } from "x"', "typescript") == InputFailure(m.S04)


@pytest.mark.parametrize("escape", ["\\u{FFFFFFFFFFFFFFFFFFFFFFFF}", "\\u{110000}"])
def test_an_escape_naming_no_code_point_is_kept_not_raised(escape: str) -> None:
    # Hostile input: a code point past int range used to raise OverflowError out of prepare_source.
    source = f'return globalThis["{escape}"]'
    assert prepare_source(source, "javascript") == PreparedSource(text=source, language="javascript")


def test_a_hex_escape_still_spells_a_forbidden_member() -> None:
    assert prepare_source('return module["requ\\x69re"]', "javascript") == InputFailure(m.S04)
