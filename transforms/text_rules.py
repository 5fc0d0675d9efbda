"""Sentence starts from a text rule that works with any tokenizer.

BART's sentence permutation needs sentence boundaries. fairseq splits on the id of "."
in its GPT-2 dictionary, which ties it to one tokenizer; we find boundaries in the text
and map them to tokens through the encoder's character offsets instead.

Rule: a sentence starts at the first non-space character of the document, after a blank
line, and after ``.``, ``!``, ``?`` or ``…`` (optionally followed by closing quotes or
brackets) plus whitespace when the next character is an uppercase letter, a digit or an
opening quote/bracket.
"""

from __future__ import annotations

import re

import numpy as np

__all__ = ["sentence_start_chars", "token_flags_from_chars"]

_BOUNDARY = re.compile(r"(?:[.!?\u2026][\"'\u201d\u2019)\]]*\s+(?=[A-Z0-9\"'\u201c\u2018(\[])|\n[ \t]*\n\s*)")


def sentence_start_chars(text: str) -> np.ndarray:
    """Character offsets where sentences start (sorted, first is the first non-space char)."""
    first = len(text) - len(text.lstrip())
    starts = [first] + [m.end() for m in _BOUNDARY.finditer(text) if m.end() < len(text)]
    return np.unique(np.asarray(starts, dtype=np.int64))


def token_flags_from_chars(token_starts: np.ndarray, char_positions: np.ndarray) -> np.ndarray:
    """True for the first token starting at or after each character position."""
    flags = np.zeros(len(token_starts), dtype=bool)
    if len(token_starts) == 0:
        return flags
    index = np.searchsorted(token_starts, char_positions, side="left")
    flags[index[index < len(token_starts)]] = True
    return flags
