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

_SENTENCE_END = re.compile(r"[.!?\u2026][\"'\u201d\u2019)\]]*\s+(?=\S)")
_BLANK_LINE = re.compile(r"\n[ \t]*\n\s*")
_OPENERS = "\"'\u201c\u2018(["


def _opens_sentence(char: str) -> bool:
    # str.isupper, not [A-Z]: "Élan" and "Über" start sentences too.
    return char.isupper() or char.isdigit() or char in _OPENERS


def sentence_start_chars(text: str) -> np.ndarray:
    """Character offsets where sentences start (sorted, first is the first non-space char)."""
    first = len(text) - len(text.lstrip())
    starts = [first] if first < len(text) else []
    starts += [m.end() for m in _SENTENCE_END.finditer(text) if _opens_sentence(text[m.end()])]
    starts += [m.end() for m in _BLANK_LINE.finditer(text) if m.end() < len(text)]
    return np.unique(np.asarray(starts, dtype=np.int64))


def token_flags_from_chars(token_starts: np.ndarray, char_positions: np.ndarray) -> np.ndarray:
    """True for the token holding each character position.

    That is the last token starting at or before it (byte-level BPE and Metaspace tokens
    begin with the space before a word, so ``" This"`` holds the start of ``This``); of
    several tokens with the same start (the bytes of one character), the first.
    """
    flags = np.zeros(len(token_starts), dtype=bool)
    if len(token_starts) == 0 or len(char_positions) == 0:
        return flags
    token_starts = np.asarray(token_starts)
    index = np.maximum(np.searchsorted(token_starts, char_positions, side="right") - 1, 0)
    flags[np.searchsorted(token_starts, token_starts[index], side="left")] = True
    return flags
