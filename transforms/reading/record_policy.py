"""What the reader does with imperfect records: invalid UTF-8, NUL bytes, byte-order
marks and very long documents (docs/design.md section 7).

Pure functions, no Beam: :mod:`transforms.reading.read` applies them to every record of every
format, so a policy means the same thing for a text line, a JSON object and a Parquet row.

- ``invalid_utf8``: ``reject`` (reason ``invalid_utf8``) or ``replace`` each bad byte
  sequence, and each lone surrogate spelled by a JSON escape, with U+FFFD.
- ``nul_bytes``: ``reject`` (reason ``nul_bytes``), ``strip`` them, or ``keep`` them.
- ``max_doc_chars`` / ``long_docs``: a text longer than ``max_doc_chars`` characters is
  rejected (reason ``too_long``) or split with :func:`split_text` into documents of at most
  ``max_doc_chars`` characters. ``None`` means no limit.
- ``max_record_bytes``: no record is ever held whole beyond this many bytes (64 MiB by
  default, whatever the other settings): a longer line, paragraph or file is cut, as it is
  read, into pieces of at most that size (``long_docs="split"``, each piece a document) or
  rejected ``too_long`` while the rest of it is skipped (``long_docs="reject"``; a JSON line
  is always rejected, since it cannot be parsed in pieces).
- ``unverified_zstd``: a zstd frame written without a content checksum cannot be verified:
  ``keep`` its file (listed in the manifest as unverified) or ``reject`` it (reason
  ``unverified_archive``).
- A leading U+FEFF (byte-order mark) is removed from every line and every text, not only
  at the start of a file: concatenated files carry one in the middle.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from schemas.errors import ConfigError

__all__ = [
    "BOM",
    "BOM_BYTES",
    "INVALID_UTF8_POLICIES",
    "LONG_DOC_POLICIES",
    "MAX_RECORD_BYTES",
    "NUL_POLICIES",
    "UNVERIFIED_ZSTD_POLICIES",
    "RecordPolicy",
    "has_surrogates",
    "replace_surrogates",
    "split_text",
]

INVALID_UTF8_POLICIES = ("reject", "replace")
NUL_POLICIES = ("reject", "strip", "keep")
LONG_DOC_POLICIES = ("split", "reject")
UNVERIFIED_ZSTD_POLICIES = ("keep", "reject")
#: Default bound of the bytes of one record held in memory (``--max-record-bytes``).
MAX_RECORD_BYTES = 64 << 20
BOM = "\ufeff"
BOM_BYTES = BOM.encode("utf-8")

_SURROGATE = re.compile("[\ud800-\udfff]")
# Cut points, best first: after a blank line, after a line break, after a run of whitespace.
_PARAGRAPH_BREAK = re.compile(r"\n[^\S\n]*\n\s*")
_WHITESPACE_RUN = re.compile(r"\s+")


@dataclass(frozen=True)
class RecordPolicy:
    """How to treat imperfect records (flags ``--invalid-utf8``, ``--nul-bytes``,
    ``--max-doc-chars``, ``--long-docs``, ``--max-record-bytes``, ``--unverified-zstd``).

    Raises:
        ConfigError: an unknown policy or a ``max_doc_chars`` below 1, naming the flag.
    """

    invalid_utf8: str = "reject"
    nul_bytes: str = "reject"
    max_doc_chars: int | None = None
    long_docs: str = "split"
    max_record_bytes: int = MAX_RECORD_BYTES
    unverified_zstd: str = "keep"

    def __post_init__(self):
        for flag, value, choices in (
            ("--invalid-utf8", self.invalid_utf8, INVALID_UTF8_POLICIES),
            ("--nul-bytes", self.nul_bytes, NUL_POLICIES),
            ("--long-docs", self.long_docs, LONG_DOC_POLICIES),
            ("--unverified-zstd", self.unverified_zstd, UNVERIFIED_ZSTD_POLICIES),
        ):
            if value not in choices:
                raise ConfigError(f"{flag} {value}: choose one of {', '.join(choices)}")
        if self.max_doc_chars is not None and (not isinstance(self.max_doc_chars, int) or self.max_doc_chars < 1):
            raise ConfigError(f"--max-doc-chars {self.max_doc_chars}: must be an integer >= 1")
        if not isinstance(self.max_record_bytes, int) or self.max_record_bytes < 1024:
            raise ConfigError(f"--max-record-bytes {self.max_record_bytes}: must be an integer >= 1024")

    def to_json(self) -> dict:
        return {
            "invalid_utf8": self.invalid_utf8,
            "nul_bytes": self.nul_bytes,
            "max_doc_chars": self.max_doc_chars,
            "long_docs": self.long_docs,
            "max_record_bytes": self.max_record_bytes,
            "unverified_zstd": self.unverified_zstd,
        }


def has_surrogates(text: str) -> bool:
    """Whether ``text`` holds a lone surrogate (possible only through JSON ``\\ud800`` escapes)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return True
    return False


def replace_surrogates(text: str) -> str:
    """Replace lone surrogates with U+FFFD, as ``bytes.decode(errors="replace")`` does for bad bytes."""
    return _SURROGATE.sub("\ufffd", text)


def _cut_point(text: str, start: int, end: int) -> int:
    """Where the piece ``text[start:...]`` of at most ``end - start`` characters ends.

    The end of the last paragraph break, else line break, else whitespace run found in
    the second half of the window (so pieces are never tiny); a hard cut at ``end`` when
    the second half has no whitespace at all.
    """
    low = start + max(1, (end - start) // 2)
    paragraph = _last_match_end(_PARAGRAPH_BREAK, text, low, end)
    if paragraph is not None:
        return paragraph
    newline = text.rfind("\n", low, end)
    if newline >= 0:
        return newline + 1
    whitespace = _last_match_end(_WHITESPACE_RUN, text, low, end)
    return end if whitespace is None else whitespace


def _last_match_end(pattern: re.Pattern, text: str, low: int, end: int) -> int | None:
    ends = [match.end() for match in pattern.finditer(text, low, end)]
    return ends[-1] if ends else None


def split_text(text: str, max_chars: int) -> list[str]:
    """Split ``text`` into pieces of at most ``max_chars`` characters at natural boundaries.

    Each piece is a slice of ``text`` ending, where possible, after a blank line, else a
    line break, else a whitespace run (looked for in the last half of the allowed length);
    only a stretch of ``max_chars / 2`` characters without whitespace is cut hard. The
    separating whitespace stays at the end of the earlier piece, so the pieces concatenate
    back to ``text``, except that a piece made only of whitespace is dropped.

    Raises:
        ConfigError: ``max_chars`` below 1.
    """
    if max_chars < 1:
        raise ConfigError(f"--max-doc-chars {max_chars}: must be an integer >= 1")
    pieces = []
    start = 0
    while len(text) - start > max_chars:
        cut = _cut_point(text, start, start + max_chars)
        if not text[start:cut].isspace():
            pieces.append(text[start:cut])
        start = cut
    if start < len(text) and not text[start:].isspace():
        pieces.append(text[start:])
    return pieces
