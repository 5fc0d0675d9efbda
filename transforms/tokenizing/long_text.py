"""Long documents reach the tokenizer in bounded pieces, with the ids of the whole.

An encoder holds per token several times the text's size (ids, offsets, token strings,
word ids: about a hundred bytes per character of text for ``encode_batch``), so a 50 MB
document needs gigabytes. A document longer than :data:`PIECE_CHARS` characters is
therefore encoded as pieces of at most that many characters, a few pieces per encoder
call, and their ids are laid end to end.

The ids are those of the whole document when every cut falls where the tokenizer's
pre-tokenizer cuts anyway: a piece ends before a space that follows a non-space (a
newline when the window has no space; a hard cut only when it has neither), and for the
GPT-2 byte-level regex, Metaspace, Whitespace and BERT pre-tokenizers no pre-token spans
such a place. :func:`pieces_are_exact` checks this for a tokenizer on hard strings (runs of
spaces, newlines, punctuation, digits, CJK, emoji, combining marks); a tokenizer that fails
it (one whose normalizer prepends to every input, for example) gets its long documents
whole, as before. A stretch of 128 Ki characters without a space or newline is cut
hard: the one token across each cut may differ from a whole-document encoding.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

__all__ = ["PIECE_CHARS", "PiecedEncoding", "encode_pieces", "piece_starts", "pieces_are_exact"]

#: Longest piece of a document given to the encoder, in characters.
PIECE_CHARS = 1 << 18
#: Characters of pieces per encoder call (an encoder holds about 200 bytes per token of a call's
#: texts, measured with a byte-level BPE: about 55 MB here; several pieces let it use several threads).
_CALL_CHARS = 1 << 20


def _cut(text: str, start: int, limit: int) -> int:
    """End of the piece that starts at ``start``, at most ``limit``, in its second half."""
    low = start + max(1, (limit - start) // 2)
    for separator in (" ", "\n"):
        at = text.rfind(separator, low, limit)
        while at > low and text[at - 1].isspace():
            at -= 1  # the start of the whitespace run
        if at > low:
            return at
    return limit


def piece_starts(text: str, max_chars: int = PIECE_CHARS) -> list[int]:
    """Where the pieces of ``text`` start (``[0]`` for a text of at most ``max_chars``)."""
    starts = [0]
    while len(text) - starts[-1] > max_chars:
        starts.append(_cut(text, starts[-1], starts[-1] + max_chars))
    return starts


class PiecedEncoding:
    """The encoding of a document encoded in pieces: what the Tokenize stage reads of one.

    Attributes:
        ids: int32 ids of the whole document.
        word_ids: float64 word index per token (NaN: no word), numbered across pieces; None
            unless full encodings were asked for.
        offset_ends: int64 end (in characters of the document) of each token; None likewise.
    """

    def __init__(self, ids: np.ndarray, word_ids: np.ndarray | None = None, offset_ends: np.ndarray | None = None):
        self.ids, self.word_ids, self.offset_ends = ids, word_ids, offset_ends


def _merge(encodings: list, starts: list[int], full: bool) -> PiecedEncoding:
    ids = np.concatenate([np.asarray(e.ids, dtype=np.int32) for e in encodings]) if encodings else \
        np.zeros(0, np.int32)
    if not full:
        return PiecedEncoding(ids)
    words, ends, base = [], [], 0.0
    for encoding, start in zip(encodings, starts):
        piece_words = np.array([np.nan if w is None else w for w in encoding.word_ids], dtype=np.float64)
        piece_words += base
        if piece_words.size and not np.isnan(piece_words).all():
            base = float(np.nanmax(piece_words)) + 1
        words.append(piece_words)
        ends.append(np.array([end for _, end in encoding.offsets], dtype=np.int64) + start)
    return PiecedEncoding(ids, np.concatenate(words), np.concatenate(ends))


def encode_pieces(encode_batch: Callable[[list[str]], list[Any]], text: str, *, full: bool = False,
                  max_chars: int = PIECE_CHARS) -> PiecedEncoding:
    """Encode ``text`` in pieces with ``encode_batch`` (a list of texts -> their encodings).

    ``full``: also lay out word ids and offsets (the encodings must have them).
    """
    starts = piece_starts(text, max_chars)
    bounds = list(zip(starts, [*starts[1:], len(text)]))
    per_call = max(1, _CALL_CHARS // max_chars)
    encodings: list[Any] = []
    merged: list[PiecedEncoding] = []
    for first in range(0, len(bounds), per_call):
        group = bounds[first : first + per_call]
        encodings = encode_batch([text[a:b] for a, b in group])
        merged.append(_merge(list(encodings), [a for a, _ in group], full))  # drop the encodings at once
    if len(merged) == 1:
        return merged[0]
    ids = np.concatenate([m.ids for m in merged])
    if not full:
        return PiecedEncoding(ids)
    words, base = [], 0.0
    for m in merged:
        shifted = m.word_ids + base
        if shifted.size and not np.isnan(shifted).all():
            base = float(np.nanmax(shifted)) + 1
        words.append(shifted)
    return PiecedEncoding(ids, np.concatenate(words), np.concatenate([m.offset_ends for m in merged]))


_PROBES = [
    "The quick brown fox, it's said, jumped over 12,345 lazy dogs... didn't it?  Yes!\n\nNew paragraph here.",
    "a  b   c    d\te\n f \n\n g   h",
    "日本語のテキスト と 中文 文本 混合 text 123 456",
    "emoji 😀😃 and combining e\u0301 cafe\u0301 na\u0308ive — dashes – and “quotes”",
    "xxxxxx yyyyyy  (punct)!!  ...  ?? ''quoted''  [x] {y} <z>",
    "numbers 3.14159 2,718 1e10 0x1F  and   a URL: http://a.io/b  end",
]


def pieces_are_exact(encode_ids: Callable[[list[str]], list[list[int]]], max_chars: int = 16) -> bool:
    """Whether encoding in pieces gives the whole-text ids on the probe strings, for this encoder.

    ``encode_ids``: a list of texts -> their id lists.
    """
    for text in _PROBES:
        starts = piece_starts(text, max_chars)
        if any(not text[start].isspace() for start in starts[1:]):
            continue  # a hard cut: not a place the rule would cut a real document
        pieces = [text[a:b] for a, b in zip(starts, [*starts[1:], len(text)])]
        whole = list(encode_ids([text])[0])
        stitched = [i for ids in encode_ids(pieces) for i in ids]
        if whole != stitched:
            return False
    return True
