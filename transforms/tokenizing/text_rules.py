"""Sentence starts from a text rule that works with any tokenizer.

BART's sentence permutation needs sentence boundaries. fairseq splits on the id of "."
in its GPT-2 dictionary, which ties it to one tokenizer; we find boundaries in the text
and map them to tokens instead: through the tokens' UTF-8 byte lengths for a byte-level
BPE tokenizer (its tokens spell the text's bytes exactly), else through the encoder's
character offsets.

Rule: a sentence starts at the first non-space character of the document, after a blank
line, and after ``.``, ``!``, ``?`` or ``…`` (optionally followed by closing quotes or
brackets) plus whitespace when the next character is an uppercase letter, a digit or an
opening quote/bracket.
"""

from __future__ import annotations

import re

import numpy as np

__all__ = ["byte_positions", "sentence_start_chars", "token_flags"]

#: After a terminator: closing quotes or brackets, whitespace, then a character that may open a
#: sentence. The regex decides ASCII ones (uppercase, digit, opener), so most candidates (a
#: lowercase word after "e.g. ") never reach Python; any other non-space character is captured
#: (group 1) for :func:`_opens_sentence`, as only Python's tables decide Unicode uppercase and
#: digits. Every match ends at the first non-space character after the whitespace.
_AFTER_END = r"[\"'\u201d\u2019)\]]*\s+(?=[A-Z0-9\"'(\[]|([^\x00-\x7f\s]))"
#: One pattern per terminator: sre scans for a pattern's leading literal character several
#: times faster than for a character class, and a text lacking a terminator skips its scan
#: (``in`` is a memchr). A match spans one terminator, so splitting them finds the same matches.
_SENTENCE_ENDS = tuple((end, re.compile(re.escape(end) + _AFTER_END)) for end in ".!?\u2026")
_BLANK_LINE = re.compile(r"\n[ \t]*\n\s*")
_OPENERS = "\"'\u201c\u2018(["


def _opens_sentence(char: str) -> bool:
    # str.isupper, not [A-Z]: "Élan" and "Über" start sentences too.
    return char.isupper() or char.isdigit() or char in _OPENERS


def sentence_start_chars(text: str) -> np.ndarray:
    """Character offsets where sentences start (sorted, first is the first non-space char)."""
    first = len(text) - len(text.lstrip())
    starts = [first] if first < len(text) else []
    starts += [m.end() for m in _BLANK_LINE.finditer(text)]
    if starts and starts[-1] == len(text):
        starts.pop()  # a blank line at the end: no sentence follows (only the last match can end there)
    ascii_only = text.isascii()
    for end, pattern in _SENTENCE_ENDS:
        if end in text:
            if ascii_only:  # the regex decided every match
                starts += [m.end() for m in pattern.finditer(text)]
            else:
                starts += [m.end() for m in pattern.finditer(text) if m.lastindex is None or _opens_sentence(m[1])]
    # Each pattern's ends ascend, so sorting merges a few runs; a blank line after a sentence end
    # (or at the very start) gives the same offset twice, and duplicates are neighbours now.
    starts.sort()
    unique = np.array(starts, dtype=np.int64)
    if len(unique) > 1:
        keep = np.empty(len(unique), dtype=bool)
        keep[0] = True
        np.not_equal(unique[1:], unique[:-1], out=keep[1:])
        unique = unique[keep]
    return unique


def token_flags(token_ends: np.ndarray, positions: np.ndarray) -> np.ndarray:
    """True for the token holding each position: the first token that ends after it.

    ``token_ends`` are the tokens' end offsets (exclusive, non-decreasing) and
    ``positions`` the places to flag, both in the same unit: UTF-8 bytes of a byte-level
    tokenizer (so the token holding a character's first byte is flagged, also when the
    character's bytes are split over several tokens) or characters from an encoder's
    offsets. Byte-level BPE and Metaspace tokens begin with the space before a word, so
    ``" This"`` holds the start of ``This``. A position no token covers (a character the
    normalizer dropped) flags the next token; one after the last token flags nothing.
    """
    flags = np.zeros(len(token_ends), dtype=bool)
    if len(token_ends) == 0 or len(positions) == 0:
        return flags
    index = np.searchsorted(np.asarray(token_ends), positions, side="right")
    flags[index[index < len(flags)]] = True
    return flags


def byte_positions(text: str, encoded: bytes, chars: np.ndarray) -> np.ndarray:
    """UTF-8 byte offsets (in ``encoded``, the text's UTF-8 bytes) of the characters at ``chars``."""
    if len(encoded) == len(text):  # ASCII: bytes are characters
        return chars
    lead = np.flatnonzero((np.frombuffer(encoded, dtype=np.uint8) & 0xC0) != 0x80)  # first byte of each character
    return lead[chars]
