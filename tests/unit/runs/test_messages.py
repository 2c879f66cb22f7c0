"""Exact message texts of SPEC §14."""

from cellblock.server import messages as m


def test_fixed_texts() -> None:
    assert m.E01 == "exec input must be a JSON object."
    assert m.e05("typescript") == (
        "typescript cells are disabled by this service's languages setting."
    )
    assert m.W06 == "this run is already being resumed by another wait; let that call return first."
    assert m.S04 == (
        "module access is disabled: cells cannot use import, export, import(), import.meta or "
        "require(). No tools were called; use tools or the MCP namespace instead."
    )
    assert m.R17 == "internal error: the cell sent an invalid response."


def test_placeholders() -> None:
    assert m.s02(3, 7, "Unexpected token ';'") == (
        "SyntaxError at cellblock:user.js:3:7: Unexpected token ';'. "
        "No tools were called; fix the source and send it again."
    )
    assert m.s03(1, 2, "export =") == (
        "TypeScript at cellblock:user.js:1:2 needs code generation (export =), but cellblock only "
        "removes types. No tools were called; rewrite it as plain JavaScript and send it again."
    )
    assert m.r05(10000) == (
        "timeout exceeded: the program was still running when its 10000 ms budget ran out."
    )
    assert m.r09(67108864).startswith(
        "cell memory exhausted: the program needed more than its 67108864-byte limit."
    )
    assert m.r14(11, 10) == (
        "snapshot limit exceeded: the suspended program needs 11 bytes, more than "
        "maxSnapshotBytes (10). Keep less data alive across awaits."
    )
    assert m.p03("bridge:call:1") == "duplicate bridge id: bridge:call:1"


def test_lone_surrogates_are_found_and_escaped() -> None:
    """SPEC §0.3 item 7: the one helper pair every path uses."""
    assert [m.has_lone_surrogate(t) for t in ("", "abc", "é😀", "\ud800", "a\udfffb", "\ud83d\ude00")] == [False, False, False, True, True, True]
    assert m.escape_lone_surrogates("a\ud800b\uDC00é😀") == "a\\ud800b\\udc00é😀"
    text = "plain é"
    assert m.escape_lone_surrogates(text) is text


def test_echoed_guest_text_has_its_lone_surrogates_escaped() -> None:
    assert m.p04("MCP.\ud800") == "unknown namespace path: MCP.\\ud800"
    assert m.b19("host:core:x\udc00").encode("utf-8") == b'Tool "host:core:x\\udc00" was cancelled before it returned.'
    assert m.echo("\ud800" * 300) == "\\ud800" * 200  # cut first (200 code points), then escaped


def test_echoed_guest_text_is_cut_to_200_characters() -> None:
    long = "😀" * 250
    assert m.p04(long) == "unknown namespace path: " + "😀" * 200
    assert m.b19("x" * 201) == 'Tool "' + "x" * 200 + '" was cancelled before it returned.'
    assert m.r03("t" * 300).startswith('restartSafe runs may only make replay-safe read calls, and "' + "t" * 200 + '" is')
    assert m.s02(1, 1, "e" * 300).count("e") - m.s02(1, 1, "").count("e") == 240
