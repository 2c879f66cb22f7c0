"""Syntax errors (SPEC §6.5) and TypeScript stripping (§6.2)."""

import pytest

from cellblock.server import messages as m
from cellblock.server.source._input import InputFailure
from cellblock.server.source._source import PreparedSource, prepare_source

SYNTAX_ERRORS = [
    # (language, source, line, column, parser message)
    ("javascript", "let x = ;", 1, 9, "Unexpected token ';'"),
    ("javascript", "let x = 1 2;", 1, 11, "Unexpected token '2'"),
    ("javascript", "foo(1, 2", 1, 9, "Unexpected end of input"),
    ("javascript", "x = 1 +", 1, 8, "Unexpected end of input"),
    ("javascript", "}", 1, 1, "Unexpected token '}'"),
    ("javascript", "let x = {a:1\n", 2, 1, "Unexpected end of input"),
    ("javascript", "def f(x):\n  return x", 1, 5, "Unexpected token 'f'"),
    ("javascript", "const a = <div/>", 1, 11, "Unexpected token '<'"),
    ("javascript", "if (x { }", 1, 7, "Unexpected token '{'"),
    ("javascript", "foo(]", 1, 5, "Unexpected token ']'"),
    ("javascript", "print 'hi'", 1, 7, "Unexpected token ''hi''"),
    ("javascript", "const { a } = await x;\nreturn a +;", 2, 11, "Unexpected token ';'"),
    # An astral character on an earlier line never changes later positions.
    ("javascript", "const s = '😀';\nlet x = 1 2;", 2, 11, "Unexpected token '2'"),
    # On its own line it counts 2 UTF-16 columns.
    ("javascript", "const y = '😀' 3;", 1, 16, "Unexpected token '3'"),
    ("javascript", "const y = '😀😀' 3;", 1, 18, "Unexpected token '3'"),
    ("javascript", "const y = 'é' 3;", 1, 15, "Unexpected token '3'"),
    # Line breaks: LF, CRLF, CR, U+2028, U+2029.
    ("javascript", "a\r\nb c", 2, 3, "Unexpected token 'c'"),
    ("javascript", "a\r\n\r\nb c", 3, 3, "Unexpected token 'c'"),
    ("javascript", "a\rb c", 2, 3, "Unexpected token 'c'"),
    ("javascript", "a\u2028b c", 2, 3, "Unexpected token 'c'"),
    ("javascript", "a\u2029\u2029b c", 3, 3, "Unexpected token 'c'"),
    ("javascript", "#!/usr/bin/env node\nlet x = 1 2;", 2, 11, "Unexpected token '2'"),
    # TypeScript input: positions refer to the submitted text.
    ("typescript", "let x: = 3", 1, 8, "Unexpected token '='"),
    ("typescript", "const a: string = 'x';\nlet b: number = 1 2;", 2, 19, "Unexpected token '2'"),
    ("typescript", "type T = '😀';\nconst q: T = 1 2;", 2, 16, "Unexpected token '2'"),
]


@pytest.mark.parametrize(("language", "source", "line", "column", "message"), SYNTAX_ERRORS)
def test_syntax_error_positions(
    language: str, source: str, line: int, column: int, message: str
) -> None:
    assert prepare_source(source, language) == InputFailure(m.s02(line, column, message))


def test_syntax_error_message_is_cut_to_240_characters() -> None:
    name = "a" * 300
    result = prepare_source(f"x {name}", "javascript")
    assert isinstance(result, InputFailure)
    assert result.message == (
        "SyntaxError at cellblock:user.js:1:3: Unexpected token '"
        + "a" * 222
        + ". No tools were called; fix the source and send it again."
    )


STRIPPED = [
    ("const x: number = 1;", "const x         = 1;"),
    (
        "function f<T>(a: T, b?: string): T { return a }",
        "function f   (a   , b         )    { return a }",
    ),
    ("interface A { a: string }\nlet y = 2;", " " * 25 + "\nlet y = 2;"),
    ("type T = { a: '😀' };\nreturn 1", " " * 21 + "\nreturn 1"),
    ("let a = b!; let c!: number;", "let a = b ; let c         ;"),
    (
        "return (await tools.callValue<any>('x')) as { id: string }[]",
        "return (await tools.callValue     ('x'))                    ",
    ),
    ("const z = 1 satisfies number;", "const z = 1                 ;"),
    (
        "class C<T> extends B<T> implements I { private readonly x?: number = 1; "
        "declare y: string; protected override m(): void {} }",
        "class C    extends B                 {                  x          = 1; "
        "                 ;                    m()       {} }",
    ),
    (
        "abstract class A { abstract m(): void; n() { return 1 } }",
        "         class A {                   ; n() { return 1 } }",
    ),
    (
        "function g(this: Window, a: number) { return a }",
        "function g(              a        ) { return a }",
    ),
    ("export type { B };\nreturn 1", " " * 18 + "\nreturn 1"),
    ("declare const q: number;\nreturn q", " " * 24 + "\nreturn q"),
    ("declare enum D { A }\nreturn 1", " " * 20 + "\nreturn 1"),
    ("namespace N { export type X = 1 }\nreturn 1", " " * 33 + "\nreturn 1"),
    ("const v = <any>x;", "const v =      x;"),
    (
        "function over(a: string): void;\nfunction over(a: any) {}",
        " " * 31 + "\nfunction over(a     ) {}",
    ),
    ("class K { [k: string]: any; m?(): void }", "class K {                 ;            }"),
    (
        "const f = async <T,>(x: T): Promise<T> => x;",
        "const f = async     (x   )             => x;",
    ),
    ("let t: {\r\n a: 1 } = 1", "let t   \r\n        = 1"),
]


@pytest.mark.parametrize(("source", "expected"), STRIPPED)
def test_typescript_stripping_keeps_positions(source: str, expected: str) -> None:
    result = prepare_source(source, "typescript")
    assert result == PreparedSource(text=expected, language="typescript")
    assert len(expected.encode("utf-16-le")) == len(source.encode("utf-16-le"))


CODEGEN = [
    ("enum E { A }", 1, 1, "enum"),
    ("const x = 1;\n  const enum E { A }", 2, 3, "enum"),
    ("let s = '😀'; enum E { A }", 1, 15, "enum"),
    ("namespace N { export const a = 1 }", 1, 1, "namespace"),
    ("module M { const x = 1 }", 1, 1, "namespace"),
    ("class P { constructor(private x: number) {} }", 1, 23, "parameter property"),
    ("class P {\n  constructor(a: 1, readonly x: number) {} }", 2, 21, "parameter property"),
    ("import fs = require('fs');", 1, 1, "import alias"),
    ("const a = 1;\nexport = a;", 2, 1, "export ="),
]


@pytest.mark.parametrize(("source", "line", "column", "construct"), CODEGEN)
def test_code_generation_constructs_are_refused(
    source: str, line: int, column: int, construct: str
) -> None:
    assert prepare_source(source, "typescript") == InputFailure(m.s03(line, column, construct))


def test_hashbang_becomes_a_comment() -> None:
    result = prepare_source("#!/usr/bin/env node\nreturn 1", "javascript")
    assert result == PreparedSource(text="///usr/bin/env node\nreturn 1", language="javascript")


@pytest.mark.parametrize(
    "source",
    [
        "value?.return / 2 / 3",
        "return await tools.callValue('x')",
        "class A { #x = 1; static { } get y() { return this.#x } }",
        "a ??= b?.c; a ||= 1; a &&= 2",
        "label: for (;;) break label",
        "const { a = 1, ...rest } = obj; return [a, rest]",
        "return 10n ** 2n + 0x1_000n",
        "async function* g() { for await (const x of y) yield x }",
        "return /(?<year>\\d{4})/v.test(s)",
        "try { x() } catch { }",
    ],
)
def test_valid_javascript_runs_unchanged(source: str) -> None:
    assert prepare_source(source, "javascript") == PreparedSource(
        text=source, language="javascript"
    )
