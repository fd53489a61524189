"""Names and paths from a checkpoint, shown literally.

A checkpoint is untrusted data: its uids, names and paths may hold anything Java's modified UTF-8
can carry. Wherever ckpt shows one (a terminal, an error line, a JUnit or TOML file), the
characters that could act instead of being seen are shown as escapes: control characters (an
ESC would start a terminal sequence, a newline a new line), invisible format characters (bidi
overrides, zero-width characters), line and paragraph separators, lone surrogates (not
encodable) and the noncharacters U+FFFE and U+FFFF (not allowed in XML): ``\\n``, ``\\r`` and
``\\t``, ``\\x1b`` for another code point below 256, ``\\u202e`` for one in the BMP,
``\\U000e0001`` above. Everything else is shown as is.
"""

from __future__ import annotations

import re

# What is escaped: C0 and C1 controls and DEL, soft hyphen, Arabic letter mark, Mongolian vowel
# separator, zero-width and directional marks, line/paragraph separators, bidi embeddings and
# overrides, word joiner to nominal digit shapes (invisible operators, isolates), the BOM,
# interlinear annotation marks, surrogates, U+FFFE/U+FFFF and the tag characters.
UNSAFE = re.compile(
    "[\x00-\x1f\x7f-\x9f\u00ad\u061c\u180e\u200b-\u200f\u2028-\u202e\u2060-\u206f\ufeff\ufff9-\ufffb"
    "\ud800-\udfff\ufffe\uffff\U000e0000-\U000e007f]"
)
# Error lines and table cells show at most this many characters of a value (a hostile name may be
# megabytes long); the middle is cut out and says how much.
LINE_LIMIT = 2000


_SHORT = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}


def escape(char: str) -> str:
    """One character as a Python-style escape (``\\n``, ``\\x1b``, ``\\u202e``)."""
    if char in _SHORT:
        return _SHORT[char]
    code = ord(char)
    if code < 0x100:
        return f"\\x{code:02x}"
    return f"\\u{code:04x}" if code < 0x10000 else f"\\U{code:08x}"


def printable(text: str, limit: int | None = None) -> str:
    """``text`` with every unsafe character escaped; with ``limit``, at most about that many of its
    characters, the middle cut out (``…[1234 characters cut]…``)."""
    if limit is not None and len(text) > limit:
        head, tail = limit * 3 // 4, limit // 4
        text = f"{text[:head]}…[{len(text) - head - tail} characters cut]…{text[len(text) - tail :]}"
    return UNSAFE.sub(lambda match: escape(match.group()), text)


def one_line(text: str) -> str:
    """An error or warning message as one bounded line of visible characters."""
    return printable(text, LINE_LIMIT)


def toml_string(text: str) -> str | None:
    """``text`` as a TOML basic string whose every unsafe character is an escape, so that it can
    never end its line or its string; None where TOML cannot hold it (a lone surrogate)."""
    if any(0xD800 <= ord(c) <= 0xDFFF for c in text):
        return None
    quoted = text.replace("\\", "\\\\").replace('"', '\\"')
    return '"' + UNSAFE.sub(lambda match: _toml_escape(match.group()), quoted) + '"'


def _toml_escape(char: str) -> str:
    code = ord(char)
    return f"\\u{code:04x}" if code < 0x10000 else f"\\U{code:08x}"


def shown(text: str) -> str:
    """``text`` quoted for reading (in a comment, a message): ``"`` and ``\\`` escaped like the rest."""
    return '"' + printable(text.replace("\\", "\\\\").replace('"', '\\"')) + '"'
