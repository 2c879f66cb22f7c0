"""Lone UTF-16 surrogates in text from JSON (SPEC §0.3 item 7).

Part of :mod:`cellblock.server.messages`, which re-exports every name here; import them from there.
"""

from __future__ import annotations

import re

__all__ = ["escape_lone_surrogates", "has_lone_surrogate"]

_LONE_SURROGATE = re.compile("[\ud800-\udfff]")


def has_lone_surrogate(text: str) -> bool:
    r"""Tells whether ``text`` holds a lone UTF-16 surrogate (U+D800-U+DFFF), so it cannot be encoded as UTF-8.

    JSON text may spell one (``"\ud800"``) and :mod:`json` decodes it into such a ``str``;
    a proto string, the run store, a log line or a file cannot take it (SPEC §0.3 item 7).
    C speed: an ASCII text is answered by ``isascii``, others by one encode attempt.

    Args:
        text: Any text.

    Returns:
        True when ``text`` does not encode as UTF-8.
    """
    if text.isascii():
        return False
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return True
    return False


def escape_lone_surrogates(text: str) -> str:
    r"""``text`` with each lone UTF-16 surrogate written as the six characters ``\uXXXX`` (lower-case hex).

    The one way the host makes a guest's or a client's text encodable where it must echo it
    (an error message naming an id, SPEC §0.3 item 7); the same spelling compact JSON uses.

    Args:
        text: Any text.

    Returns:
        ``text`` itself when it has no lone surrogate, else the escaped copy (always UTF-8 encodable).
    """
    if not has_lone_surrogate(text):
        return text
    return _LONE_SURROGATE.sub(lambda m: f"\\u{ord(m.group()):04x}", text)
