"""Shell detection of SPEC §6.4 (Case A: parses; Case B: does not parse)."""

import time

import pytest

from cellblock.server import messages as m
from cellblock.server.source._input import InputFailure
from cellblock.server.source._source import looks_like_shell, prepare_source

SHELL = [
    # Case A (the text parses as JavaScript).
    "ls",
    "pwd",
    "exit",
    "ls -la",
    "ls -1",
    "ls\n-la",
    "ls > out.txt",
    "ls | wc",
    "ls && pwd",
    "ls || pwd",
    "sort /workspace/file",
    "jq . file.json",
    "ls; const y = 1",
    "x -1",
    "#!/bin/sh\nls -la",
    # Case B (it does not parse).
    "cat file | grep x",
    "A=1 B=2 ls",
    "A='a b' B=\"c\\\" d\" git status",
    "echo \"hi\"",
    "echo $HOME",
    "exit 1",
    "git status",
    "npm install foo",
    "cd /tmp && ls",
    "# comment\nls -la",
    "// note\n\ncat a.txt b.txt",
    "/* c */ cat x y",
    "/usr/bin/env python",
    "./run.sh",
    "../bin/tool --x",
    "~/bin/tool a",
    "C:\\tools\\x.exe /q",
    "for i in 1 2 3; do echo $i; done",
    "for ((i=0; i<3; i++)); do echo $i; done",
    "if [ -f x ]; then echo y; fi",
    "while true; do sleep 1; done",
    "export PATH=/bin:$PATH",
    "function foo { echo hi; }",
    "docker-compose up -d",
    "python3 -m http.server",
    "curl -s https://x.y | jq .",
    "mytool -v file.txt",
    "grep -r foo . 2> /dev/null",
    "rm -rf /\n",
]

NOT_SHELL = [
    "function ls() {}\nls -la",
    "ls -la; function ls() {}",
    "A=1\nls",
    "{ let ls = 1 }\nls -la",
    "var pwd = 1; pwd",
    "for (var pwd of []); pwd",
    "{ var ls; }\nls -la",
    "if (a) { function ls() {} }\nls -la",
    "ls(x)",
    "ls .call()",
    "ls ?.(x)",
    "ls = 7",
    "ls + count",
    "ls - la",
    "value || fallback",
    "ls`x`",
    "Math -1",
    "text -x",
    "let ls = 1; ls -la",
    "(function(){ var ls })(); ls -la",
    'const x = await tools.search("ls"); return x',
    "return ls",
    "cat <<EOF",
    # Case B text that is not shell.
    "const x = ;",
    "A=x " * 5,
    "A=x;ls",
    "foo(1, 2",
    "if (x { }",
    "for (let i = 0; i < 3 i++) {}",
    "for await (const x of y {}",
    "function f() {",
    "export const x = ;",
    "print 'hi'",
    "/* never closed ls -la",
    "",
    "   \n\n",
]


@pytest.mark.parametrize("source", SHELL)
def test_shell_sources_are_refused(source: str) -> None:
    assert prepare_source(source, "javascript") == InputFailure(m.S01)


@pytest.mark.parametrize("source", NOT_SHELL)
def test_javascript_is_not_shell(source: str) -> None:
    result = prepare_source(source, "javascript")
    assert getattr(result, "message", None) != m.S01


def test_there_are_at_least_forty_cases() -> None:
    assert len(SHELL) >= 40
    assert len(NOT_SHELL) >= 30


def test_typescript_shell_is_refused() -> None:
    assert prepare_source("ls -la", "typescript") == InputFailure(m.S01)
    assert prepare_source("cat file | grep x", "typescript") == InputFailure(m.S01)


@pytest.mark.parametrize(
    ("source", "expected"),
    [
        ("A=x " * 32000, False),
        ("A=x " * 32000 + "ls", True),
        ('A="x ' * 32000, False),
        ("\\" * 64000, False),
    ],
)
def test_case_b_is_linear(source: str, expected: bool) -> None:
    started = time.perf_counter()
    assert looks_like_shell(source) is expected
    assert time.perf_counter() - started < 0.5


@pytest.mark.parametrize("language", ["javascript", "typescript"])
def test_32000_assignment_tokens_prepare_well_under_a_second(language: str) -> None:
    source = "A=x " * 32000
    started = time.perf_counter()
    result = prepare_source(source, language)
    elapsed = time.perf_counter() - started
    assert result == InputFailure(
        m.s02(1, 5, "Unexpected token 'A'")
    )
    assert elapsed < 0.9
