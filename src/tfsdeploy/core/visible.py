"""Text from hosts made safe to show: every character a terminal would act on instead of
print is written as its escape (``\\x1b``, ``\\r``, ``\\x00``, ``\\u202e``), so that a
container's log, a record's field or an error read back from a host can neither move the
cursor, retitle the window, rewrite a line already shown, hide text behind a reversed
direction, nor stop the output with an unencodable character. Pure.

What is escaped, and why:
- C0 controls but newline and tab, and DEL (ECMA-48: ESC starts every escape sequence, CR
  returns to the line's start, BEL, BS, VT, FF act, NUL ends C strings);
- C1 controls U+0080-U+009F (ECMA-48's 8-bit forms: U+009B is CSI, U+009D is OSC);
- the Unicode bidirectional controls (U+061C, U+200E, U+200F, U+202A-U+202E, U+2066-U+2069:
  the "Trojan Source" reordering, CVE-2021-42574) and the line and paragraph separators
  (U+2028, U+2029), which some terminals and editors take as line breaks;
- lone surrogates (U+D800-U+DFFF: what Python's surrogateescape makes of bytes that are not
  UTF-8), which no UTF-8 stream can encode.
Newline and tab are kept: they are how the toolkit itself lays out lines and cells.
"""

from __future__ import annotations

import re

_KEPT = {"\n", "\t"}
_CONTROLS = [chr(c) for c in (*range(0x00, 0x20), 0x7F, *range(0x80, 0xA0))
             if chr(c) not in _KEPT]
_FORMATS = [chr(c) for c in (0x061C, 0x200E, 0x200F, *range(0x202A, 0x202F),
                             *range(0x2066, 0x206A), 0x2028, 0x2029)]
_SURROGATES = [chr(c) for c in range(0xD800, 0xE000)]


def _escape(char: str) -> str:
    code = ord(char)
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


_TABLE = {ord(c): _escape(c) for c in (*_CONTROLS, *_FORMATS, *_SURROGATES)}
_ANY = re.compile("[" + "".join(re.escape(c) for c in (*_CONTROLS, *_FORMATS))
                  + "\ud800-\udfff]")


def visible(text: str) -> str:
    """``text`` with every character a terminal acts on written as its escape (see the
    module's docstring); text without any is returned as it is."""
    return text.translate(_TABLE) if _ANY.search(text) else text

