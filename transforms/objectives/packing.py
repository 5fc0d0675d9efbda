"""Packing tokenized documents into chunks (pure numpy).

Modes (docs/design.md section 2, step 4):

- ``concat``: documents (each followed by EOS) are concatenated in key order and cut
  into chunks whose lengths the objective plans one at a time (fixed for most
  objectives, per-chunk for UL2). The tail that does not fill the next chunk is returned
  as a *remainder* and re-packed with the other buckets' remainders, so at most one
  partial chunk per split is dropped or padded. Like Megatron-LM's GPT dataset and HF's
  ``group_texts``, but with per-document lengths recorded for attention masks.
- ``best_fit``: best-fit-decreasing bin packing (Ding et al. 2024, "Fewer truncations");
  documents longer than a chunk are split into chunk-sized pieces first; no document is
  truncated, bins are padded. Since best fit never opens a bin while an open one has
  room, at most one bin per bucket is at most half full; its pieces are the remainder.
- ``none``: one document per chunk, long documents split into chunk-sized pieces.

A :class:`Piece` is a run of tokens with its document segment lengths and aligned
per-token features. The EOS appended to each document belongs to that document. With no
separator (``eos=None``, ``--document-separator none``) documents are joined as they are, as
T5's ``reduce_concat_tokens`` and HF's ``group_texts`` join them; the segment lengths still
mark where each one ends.
"""

from __future__ import annotations

import bisect
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import numpy as np

__all__ = ["BLOCK_TOKENS", "PACKING_MODES", "ConcatPacker", "Piece", "concat_documents", "concat_pieces",
           "pack_best_fit", "pack_concat", "pack_none"]

PACKING_MODES = ("concat", "best_fit", "none")
#: Feature value the EOS separator gets, per feature (absent: False).
EOS_FEATURE = {"word_starts": True, "space_starts": True}


@dataclass
class Piece:
    """Tokens plus the lengths of the document segments they hold (sum = len(tokens))."""

    tokens: np.ndarray
    doc_lengths: np.ndarray
    features: dict[str, np.ndarray] = field(default_factory=dict)

    def __len__(self) -> int:
        return int(self.tokens.shape[0])

    def split(self, cuts: list[int]) -> list[Piece]:
        """Pieces ``[cuts[i], cuts[i + 1])`` for ascending cuts from 0 to ``len(self)``, in one pass.

        Equal to ``[self.slice(a, b) for a, b in zip(cuts, cuts[1:])]`` without recomputing the
        document boundaries for every piece.
        """
        cuts_array = np.asarray(cuts, dtype=np.int64)
        bounds = np.concatenate([[0], np.cumsum(self.doc_lengths, dtype=np.int64)])
        # every cut and document boundary, sorted, once each (both are sorted already; np.union1d
        # would hash them)
        points = np.concatenate([bounds, cuts_array])
        points.sort(kind="stable")
        keep = np.empty(points.shape[0], dtype=bool)
        keep[:1] = True
        np.not_equal(points[1:], points[:-1], out=keep[1:])
        points = points[keep]
        lengths = np.diff(points).astype(np.int32)
        owner = np.searchsorted(cuts_array, points[:-1], side="right") - 1  # piece of each segment
        indices = np.arange(len(cuts) - 1)
        first = np.searchsorted(owner, indices, side="left")
        last = np.searchsorted(owner, indices, side="right")
        return [
            Piece(
                tokens=self.tokens[start:stop],
                doc_lengths=lengths[first[i] : last[i]],
                features={k: v[start:stop] for k, v in self.features.items()},
            )
            for i, (start, stop) in enumerate(zip(cuts[:-1], cuts[1:]))
        ]

    def slice(self, start: int, stop: int) -> Piece:
        """Tokens ``[start, stop)`` with their segments cut to the window."""
        bounds = np.concatenate([[0], np.cumsum(self.doc_lengths)])
        cuts = np.clip(bounds, start, stop) - start
        lengths = np.diff(cuts)
        return Piece(
            tokens=self.tokens[start:stop],
            doc_lengths=lengths[lengths > 0].astype(np.int32),
            features={k: v[start:stop] for k, v in self.features.items()},
        )


def document_piece(ids: np.ndarray, eos: int | None, features: dict[str, np.ndarray] | None = None) -> Piece:
    """A document's tokens followed by EOS (none for ``eos=None``), as one single-segment piece."""
    separator = 0 if eos is None else 1
    tokens = np.empty(len(ids) + separator, dtype=np.int32)
    tokens[: len(ids)] = ids
    if separator:
        tokens[-1] = eos
    feats = {}
    for name, values in (features or {}).items():
        flags = np.asarray(values, dtype=bool)
        feats[name] = np.append(flags, EOS_FEATURE.get(name, False)) if separator else flags.copy()
    return Piece(tokens, np.array([len(tokens)], dtype=np.int32), feats)


def concat_pieces(pieces: list[Piece]) -> Piece:
    """Concatenate pieces in order; segment boundaries are kept."""
    if not pieces:
        return Piece(np.zeros(0, np.int32), np.zeros(0, np.int32))
    names = pieces[0].features.keys()
    return Piece(
        tokens=np.concatenate([p.tokens for p in pieces]).astype(np.int32, copy=False),
        doc_lengths=np.concatenate([p.doc_lengths for p in pieces]).astype(np.int32, copy=False),
        features={n: np.concatenate([p.features[n] for p in pieces]) for n in names},
    )


def concat_documents(documents: list[tuple[np.ndarray | bytes, dict[str, np.ndarray]]], eos: int | None,
                     head: Piece | None = None) -> Piece:
    """``concat_pieces([head, *(document_piece(ids, eos, features) for ids, features in documents)])``,
    copying every document (and ``head``) once (``eos=None``: no separator).

    Args:
        documents: ``(ids, features)`` per document; ids as an integer array (any integer dtype:
            cast to int32 as copied) or the bytes of an int32 one; every document has the same
            feature names.
        head: a piece to put first (for example the tail of the previous block), or None.
    """
    if not documents:
        return concat_pieces([] if head is None else [head])
    separator = 0 if eos is None else 1
    arrays = [np.frombuffer(ids, dtype=np.int32) if isinstance(ids, bytes) else np.asarray(ids) for ids, _ in documents]
    lengths = np.fromiter((len(ids) + separator for ids in arrays), dtype=np.int64, count=len(arrays))
    first = 0 if head is None else len(head.tokens)
    ends = first + np.cumsum(lengths)
    tokens = np.empty(int(ends[-1]), dtype=np.int32)
    if head is not None:
        tokens[:first] = head.tokens
    start = first
    for ids, end in zip(arrays, ends.tolist()):
        tokens[start:start + len(ids)] = ids  # one copy, cast to int32 (documents may be uint16)
        start = end
    if separator:
        tokens[ends - 1] = eos
    lengths = lengths.astype(np.int32)
    features = {}
    for name in documents[0][1]:
        end_flag = np.array([EOS_FEATURE.get(name, False)])[:separator]
        flags = [] if head is None else [np.asarray(head.features[name], dtype=bool)]
        for _, document_features in documents:
            flags.append(np.asarray(document_features[name], dtype=bool))
            flags.append(end_flag)
        features[name] = np.concatenate(flags)
    if head is not None:
        lengths = np.concatenate([np.asarray(head.doc_lengths, dtype=np.int32), lengths])
    return Piece(tokens, lengths, features)


#: Tokens (about) a :class:`ConcatPacker` copies into one block.
BLOCK_TOKENS = 1 << 22


class ConcatPacker:
    """``pack_concat(concat_documents(documents, eos), next_length)``, a block at a time.

    The documents are concatenated (each followed by EOS) a block of about ``block_tokens``
    tokens at a time, and the block is cut into chunks of the planned lengths; the tail that
    does not fill the next chunk starts the next block. The chunks are those of the one-stream
    :func:`pack_concat` (the cuts fall at the same places of the same stream), but only one
    block is ever copied at a time, and each document's entry in ``documents`` is set to None
    once copied, so that a group's tokens are held once, not twice.

    Iterate over it for the full chunks (views of their block); :attr:`rest` is the
    remainder once the iteration has ended. ``next_length`` is called once per chunk index,
    in order, as in :func:`pack_concat`.
    """

    def __init__(self, documents: list, eos: int | None, next_length: Callable[[int], int], *,
                 block_tokens: int = BLOCK_TOKENS):
        self._documents, self._eos, self._next_length, self._block_tokens = documents, eos, next_length, block_tokens
        self.rest: Piece | None = None

    def __iter__(self) -> Iterator[Piece]:
        documents, count = self._documents, len(self._documents)
        carry: Piece | None = None
        position, index, length = 0, 0, None
        while True:
            batch, tokens = [], 0
            while position < count and (not batch or tokens < self._block_tokens):
                document, documents[position] = documents[position], None
                position += 1
                batch.append(document)
                ids = document[0]
                tokens += (len(ids) // 4 if isinstance(ids, bytes) else len(ids)) + (self._eos is not None)
            block = concat_documents(batch, self._eos, head=carry)
            del batch, carry
            cuts = [0]
            while True:
                if length is None:
                    length = self._next_length(index)
                    if length <= 0:
                        raise ValueError(f"planned chunk length must be > 0, got {length}")
                if cuts[-1] + length > len(block):
                    break
                cuts.append(cuts[-1] + length)
                index, length = index + 1, None
            cuts.append(len(block))
            pieces = block.split(cuts)
            del block
            carry = pieces.pop()
            yield from pieces
            del pieces
            if position >= count:
                self.rest = carry
                return


def pack_concat(stream: Piece, next_length: Callable[[int], int]) -> tuple[list[Piece], Piece]:
    """Cut ``stream`` into chunks of the planned lengths.

    Args:
        stream: the concatenated documents.
        next_length: chunk index -> raw length of that chunk (called once per index, in order,
            also for the index whose chunk would not fill and becomes the remainder).

    Returns:
        (full chunks, remainder piece shorter than the next planned length).
    """
    cuts = [0]
    total = len(stream)
    while True:
        length = next_length(len(cuts) - 1)
        if length <= 0:
            raise ValueError(f"planned chunk length must be > 0, got {length}")
        if cuts[-1] + length > total:
            break
        cuts.append(cuts[-1] + length)
    cuts.append(total)
    pieces = stream.split(cuts)
    return pieces[:-1], pieces[-1]


def split_long(piece: Piece, length: int) -> Iterator[Piece]:
    """Cut a piece into ``length``-token pieces (the last one shorter)."""
    for start in range(0, len(piece), length):
        yield piece.slice(start, min(start + length, len(piece)))


def pack_none(documents: list[Piece], length: int) -> list[Piece]:
    """One document per chunk; long documents split into ``length``-token pieces."""
    return [part for doc in documents for part in split_long(doc, length)]


def pack_best_fit(items: list[Piece], length: int, *, release: bool = False) -> tuple[list[Piece], list[Piece]]:
    """Best-fit-decreasing packing of pieces into bins of ``length`` tokens.

    Items longer than ``length`` are split first. Ties are broken by input order, so the
    result is a pure function of the (ordered) input.

    Args:
        release: empty ``items`` and let go of each piece once it is copied into its bin, so
            that the pieces and the bins are not both held in full.

    Returns:
        (bins more than half full, the pieces of the at most one bin that is not).
    """
    parts: list = [part for item in items for part in split_long(item, length)]
    if release:
        items.clear()
    order = sorted(range(len(parts)), key=lambda i: (-len(parts[i]), i))
    bins: list[list[int]] = []
    fill: list[int] = []
    # Sorted (remaining capacity, bin id) of bins that still have room.
    open_bins: list[tuple[int, int]] = []
    for index in order:
        size = len(parts[index])
        pos = bisect.bisect_left(open_bins, (size, -1))
        if pos < len(open_bins):
            remaining, bin_id = open_bins.pop(pos)
        else:
            bin_id = len(bins)
            bins.append([])
            fill.append(0)
            remaining = length
        bins[bin_id].append(index)
        fill[bin_id] += size
        remaining -= size
        if remaining > 0:
            bisect.insort(open_bins, (remaining, bin_id))
    full: list[Piece] = []
    rest: list[Piece] = []
    for bin_id, members in enumerate(bins):
        if 2 * fill[bin_id] > length:
            full.append(concat_pieces([parts[i] for i in members]))
        else:
            rest.extend(parts[i] for i in members)
        if release:
            for i in members:
                parts[i] = None
    return full, rest
