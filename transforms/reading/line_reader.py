"""Lines and records of a byte stream in bounded pieces (docs/design.md section 7).

:func:`iter_lines` reads a stream a block at a time and yields its lines; a line longer
than a block comes in several pieces, so no line is ever held whole by this layer. Line
ends are ``\\n``, ``\\r\\n`` and a lone ``\\r`` (old Mac files), each kept at the end of
its line's last piece.

:class:`RecordBuffer` collects the pieces of one record (a line, a paragraph, a file) up
to a byte limit. A record that stays within the limit comes out whole; a longer one is,
as it arrives, either cut into pieces of at most the limit (``split``: after the last line
break in the second half of the window, else after the last whitespace there, else at a
UTF-8 character boundary) or dropped, keeping only an excerpt (``reject``). Either way at
most ``limit`` plus a block of bytes are held.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

__all__ = ["BLOCK_BYTES", "RecordBuffer", "cut_point", "iter_lines"]

#: Bytes read from the stream at a time (and the largest piece of a long line).
BLOCK_BYTES = 1 << 20
_WHITESPACE = b" \t\n\r\x0b\x0c"
_EXCERPT_BYTES = 200


def iter_lines(stream: Any, block_bytes: int = BLOCK_BYTES) -> Iterator[tuple[int, bytes, bool]]:
    """``(line number, piece, last piece of the line)`` for every line of a binary stream.

    Lines are numbered from 1; the pieces of one line share its number. A line's
    terminator (``\\n``, ``\\r\\n`` or ``\\r``) ends its last piece; the last line of a
    stream may have none. No piece is longer than about two blocks.
    """
    number = 0
    carry = b""
    partial = False  # pieces of the current line were passed on already
    while True:
        block = stream.read(block_bytes)
        if not block:
            if carry or partial:
                yield number + 1, carry, True
            return
        data = carry + block if carry else block
        end = len(data) - 1 if data.endswith(b"\r") else len(data)  # a "\r" may be half of "\r\n"
        cut = max(data.rfind(b"\n", 0, end), data.rfind(b"\r", 0, end))
        if cut < 0:
            if end >= block_bytes:  # a long line: pass it on in pieces
                yield number + 1, data[:end], False
                carry, partial = data[end:], True
            else:
                carry = data
            continue
        for line in data[: cut + 1].splitlines(keepends=True):
            number += 1
            yield number, line, True
        carry, partial = data[cut + 1 :], False


def cut_point(data: bytes | bytearray, limit: int) -> int:
    """Where the first piece of ``data`` (longer than ``limit``) ends: at most ``limit`` bytes.

    After the last line break in the second half of the first ``limit`` bytes, else after
    the last whitespace byte there, else at ``limit`` moved back to the start of a UTF-8
    character.
    """
    low = max(1, limit // 2)
    newline = max(data.rfind(b"\n", low, limit), data.rfind(b"\r", low, limit))
    if newline >= 0:
        return newline + 1
    space = max(data.rfind(bytes([c]), low, limit) for c in _WHITESPACE)
    if space >= 0:
        return space + 1
    cut = limit
    while cut > low and (data[cut] & 0xC0) == 0x80:  # a continuation byte: inside a character
        cut -= 1
    return cut


class RecordBuffer:
    """The bytes of one record, held up to ``limit`` (see the module docstring).

    Args:
        limit: the most bytes held.
        split: cut a longer record into pieces (True) or drop it (False).
    """

    def __init__(self, limit: int, split: bool):
        self.limit = limit
        self.split = split
        self._data = bytearray()
        self.size = 0  #: bytes of the record so far
        self.excerpt = b""  #: the record's first bytes (for a rejection)
        self.pieces = 0  #: pieces cut off so far

    @property
    def over(self) -> bool:
        """Whether the record is longer than the limit."""
        return self.size > self.limit

    def add(self, data: bytes) -> list[bytes]:
        """Add bytes; return the pieces this cuts off (``split`` records longer than the limit)."""
        if not self.size:
            self.excerpt = bytes(data[:_EXCERPT_BYTES])
        self.size += len(data)
        if self.size > self.limit and not self.split:
            self._data.clear()
            return []
        self._data += data
        pieces = []
        while len(self._data) > self.limit:
            cut = cut_point(self._data, self.limit)
            with memoryview(self._data) as view:
                pieces.append(bytes(view[:cut]))  # one copy (a bytearray slice would make two)
            del self._data[:cut]
            self.pieces += 1
        return pieces

    def finish(self) -> bytes | None:
        """The whole record, or the last piece of a split one; None for a dropped record."""
        if self.over and not self.split:
            return None
        data = bytes(self._data)
        self._data.clear()
        if self.over:
            self.pieces += 1
        return data

    @staticmethod
    def blank(data: bytes) -> bool:
        """Whether ``data`` is only ASCII whitespace."""
        return not data.strip(_WHITESPACE)
