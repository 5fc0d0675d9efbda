"""Attention masks and document segments of packed rows (numpy; torch only to convert a dtype).

A collated batch is ``B`` rows of ``L`` tokens. A row holds one or more documents (its
``doc_lengths``) and then its padding; over the flattened ``B * L`` tokens these are
*segments*: each row's non-empty documents in order, then (when the row is padded) one
segment for its padding. Segments drive everything document-aware a collator emits:

- ``position_ids`` restart at 0 at each segment (HF's ``DataCollatorWithFlattening``); that
  alone keeps clm's documents apart: transformers derives the per-document mask from them;
- the 4-D attention mask (prefix-LM, or clm's ``documents="mask"``) lets a token attend only to
  its own segment: to the segment's prefix (prefix-LM: ``prefix_lengths``) and to earlier tokens;
- FlashAttention's varlen kwargs (``cu_seq_lens_q/k``) are the segments' cumulative ends.

The padding being a segment of its own keeps every query row of a mask non-empty, so no
softmax row is all ``-inf`` (HF's eager attention would turn that into NaN).

**Mask form.** A 4-D mask is *additive* and floating point, shape ``(B, 1, L, L)``: ``0.0``
where a query may attend, the dtype's most negative finite value elsewhere. That is the form
transformers documents for custom 4-D masks and the one every attention implementation
honours on eager and sdpa: eager adds it to the scores, sdpa passes it as ``attn_mask``. A
boolean mask is only right under sdpa (eager adds ``True``/``False`` as 1/0, i.e. masks
nothing). sdpa requires the mask's dtype to equal the query's, so a model run in bfloat16
without autocast needs ``mask_dtype=torch.bfloat16``; under autocast the float32 default is
cast with the query. Flex attention gets the same pattern as its own ``BlockMask``
(:func:`segment_block_mask`): transformers would turn a tensor mask into a ``score_mod`` reading
the tensor, which torch's CPU flex compiler cannot run (the process aborts).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, NamedTuple

import numpy as np

from loaders.collation.batch import ExampleBatch, Ragged

__all__ = ["SegmentMaskMod", "Segments", "document_segments", "prefix_ends", "resolve_mask_dtype", "segment_block_mask",
           "segment_ids", "segment_mask"]

_NUMPY_FLOATS = {"float32": np.float32, "float16": np.float16, "float64": np.float64}


def resolve_mask_dtype(dtype: Any) -> str:
    """The name of a floating mask dtype (``float32``, ``float16``, ``bfloat16``, ``float64``).

    Accepts a torch dtype, a numpy dtype or a name.

    Raises:
        ValueError: not a floating-point dtype (a bool mask is not honoured by eager attention).
    """
    name = str(dtype).replace("torch.", "")
    if name not in (*_NUMPY_FLOATS, "bfloat16"):
        raise ValueError(
            f"mask_dtype={dtype!r}: expected a floating dtype (float32, bfloat16, float16, float64); "
            "masks are additive so that eager, sdpa and flex attention all honour them"
        )
    return name


def segment_ids(segment_lengths: np.ndarray, batch: int, length: int) -> np.ndarray:
    """``(B, L)`` index of the segment each token belongs to (segments numbered over the batch)."""
    return np.repeat(np.arange(segment_lengths.size), segment_lengths).reshape(batch, length)


def prefix_ends(segments: Segments, batch: int, length: int) -> np.ndarray:
    """``(B, L)`` per token: the in-row position where its segment's prefix ends (its segment's
    start + prefix); a key before it is visible from every query of the segment."""
    starts = np.cumsum(segments.lengths) - segments.lengths
    in_row = starts % length  # a segment never crosses rows
    return np.repeat(in_row + segments.prefixes, segments.lengths).reshape(batch, length)


def segment_mask(segments: Segments, batch: int, length: int, dtype: str = "float32") -> Any:
    """The additive ``(B, 1, L, L)`` mask of packed (prefix-LM) segments.

    Query ``q`` may attend key ``k`` when both are in one segment and ``k <= q`` or ``k`` lies
    in the segment's prefix: each segment is bidirectional over its prefix and causal after it,
    and no attention crosses segments (T5's packed prefix-LM; a segment without a prefix is
    plain causal). Every query sees at least itself, so no softmax row is empty.

    Written straight into the mask's own storage: one fill with the dtype's most negative value,
    then per segment its prefix's columns zeroed and its causal triangle merged in from one
    triangle pattern as long as the longest segment. Its only O(L^2) memory is the mask (and
    that pattern). bfloat16, which numpy lacks, is written as its bit patterns (0.0 is 0x0000,
    the most negative finite value 0xFF7F) and viewed by torch.
    """
    dtype = resolve_mask_dtype(dtype)
    if dtype == "bfloat16":
        storage, low, merge = np.uint16, np.uint16(0xFF7F), np.minimum  # as bits, 0 is the smallest
    else:
        storage = _NUMPY_FLOATS[dtype]
        low, merge = np.finfo(storage).min, np.maximum  # as numbers, 0 is the largest
    out = np.empty((batch, 1, length, length), dtype=storage)
    out.fill(low)
    flat = out.reshape(batch * length, length)
    longest = int(segments.lengths.max(initial=0))
    triangle = np.where(np.tri(longest, dtype=bool), storage(0), low).astype(storage, copy=False)
    starts = (np.cumsum(segments.lengths) - segments.lengths).tolist()
    for start, size, prefix in zip(starts, segments.lengths.tolist(), segments.prefixes.tolist(), strict=True):
        first = start % length  # the segment's first position in its row
        block = flat[start : start + size, first : first + size]
        block[:, :prefix] = 0
        merge(block, triangle[:size, :size], out=block)
    if dtype == "bfloat16":
        import torch

        return torch.from_numpy(out.view(np.int16)).view(torch.bfloat16)
    return out


class SegmentMaskMod:
    """flex attention's ``mask_mod`` of :func:`segment_mask` (a class, so a BlockMask built in a
    DataLoader worker pickles to the main process)."""

    def __init__(self, segments: Any, ends: Any):
        self.segments, self.ends = segments, ends

    def __call__(self, b: Any, h: Any, q: Any, k: Any) -> Any:
        same = self.segments[b, q] == self.segments[b, k]
        return same & ((k <= q) | (k < self.ends[b, q]))


def segment_block_mask(segments: np.ndarray, ends: np.ndarray) -> Any:
    """The mask of :func:`segment_mask` as flex attention's ``BlockMask``.

    transformers hands a 4-D tensor mask to flex attention as a ``score_mod`` that reads the
    tensor, which torch's CPU flex compiler cannot run (the process aborts); a BlockMask is
    flex attention's own form and is passed through as it is.
    """
    import torch
    from torch.nn.attention.flex_attention import create_block_mask

    batch, length = segments.shape
    mask_mod = SegmentMaskMod(torch.from_numpy(np.ascontiguousarray(segments)),
                              torch.from_numpy(np.ascontiguousarray(ends)))
    return create_block_mask(mask_mod, batch, None, length, length, device="cpu")



class Segments(NamedTuple):
    """The segments of a flattened ``(B, L)`` batch (see the module docstring).

    Attributes:
        lengths: tokens of each segment, in order; they sum to ``B * L``.
        boundary: per segment, whether it is a document that does not open its row.
        prefixes: per segment, its bidirectional prefix (prefix-LM; 0 for causal documents
            and for padding).
    """

    lengths: np.ndarray
    boundary: np.ndarray
    prefixes: np.ndarray


def _row_documents(example: dict[str, Any], real: int) -> tuple[list[int], list[int]]:
    """A row's documents and their prefixes: ``prefix_lengths`` (one per document), a single
    ``prefix_length`` (format 2: the whole row is one segment with that prefix), or none."""
    docs = example.get("doc_lengths")
    docs = np.asarray(docs).tolist() if docs is not None else [real]
    prefixes = example.get("prefix_lengths")
    if prefixes is not None:
        prefixes = np.asarray(prefixes).tolist()
        if len(prefixes) != len(docs):
            raise ValueError(f"prefix_lengths has {len(prefixes)} entries for {len(docs)} documents")
    elif "prefix_length" in example:
        docs, prefixes = [real], [int(example["prefix_length"])]
    else:
        prefixes = [0] * len(docs)
    kept = [(d, p) for d, p in zip(docs, prefixes, strict=True) if d > 0]
    return [d for d, _ in kept], [p for _, p in kept]


def document_segments(examples: Sequence[dict[str, Any]], real: np.ndarray, length: int) -> Segments:
    """Segments of the flattened batch: each row's documents (non-empty ones), then its padding.

    ``real[i]`` is row ``i``'s tokens before its padding; rows are ``length`` tokens. A row
    without ``doc_lengths`` is one document. A document's prefix comes from the row's
    ``prefix_lengths`` (one per document); a row with the older single ``prefix_length`` is
    one segment with that prefix.

    Raises:
        ValueError: ``prefix_lengths`` and ``doc_lengths`` of a row differ in length.
    """
    if isinstance(examples, ExampleBatch) and "prefix_length" not in examples.columns:
        columns = examples.columns
        docs, prefixes = columns.get("doc_lengths"), columns.get("prefix_lengths")
        if (docs is None or isinstance(docs, Ragged)) and (prefixes is None or isinstance(prefixes, Ragged)):
            return _columnar_segments(docs, prefixes, real, length, len(examples))
    pieces: list[int] = []
    prefix_of: list[int] = []
    boundary_flags: list[bool] = []  # per segment: a document that does not open its row
    for i, example in enumerate(examples):
        row_docs, row_prefixes = _row_documents(example, int(real[i]))
        pieces += row_docs
        prefix_of += row_prefixes
        boundary_flags += [False] + [True] * (len(row_docs) - 1) if row_docs else []
        if length > real[i]:
            pieces.append(length - int(real[i]))
            prefix_of.append(0)
            boundary_flags.append(False)
    return Segments(np.array(pieces, dtype=np.int64), np.array(boundary_flags, dtype=bool),
                    np.array(prefix_of, dtype=np.int64))


def _columnar_segments(docs: Ragged | None, prefixes: Ragged | None, real: np.ndarray, length: int,
                       batch: int) -> Segments:
    """:func:`document_segments` over whole columns: the same segments as its per-row loop."""
    if docs is None:
        values, row_of = real.astype(np.int64), np.arange(batch)
        prefix_values = np.zeros(batch, dtype=np.int64)
    else:
        values = docs.values.astype(np.int64)
        row_of = np.repeat(np.arange(batch), docs.lengths())
        if prefixes is None:
            prefix_values = np.zeros(values.size, dtype=np.int64)
        else:
            if not np.array_equal(prefixes.offsets, docs.offsets):
                raise ValueError("prefix_lengths must have one entry per document of doc_lengths")
            prefix_values = prefixes.values.astype(np.int64)
    keep = values > 0
    values, row_of, prefix_values = values[keep], row_of[keep], prefix_values[keep]
    boundary = np.ones(values.size, dtype=bool)
    boundary[0:1] = False
    boundary[1:] = row_of[1:] == row_of[:-1]
    padding = length - real
    padded = np.flatnonzero(padding > 0)
    if padded.size:
        rows = np.concatenate([row_of, padded])
        order = np.argsort(rows, kind="stable")  # a row's documents, then its padding
        values = np.concatenate([values, padding[padded]])[order]
        boundary = np.concatenate([boundary, np.zeros(padded.size, dtype=bool)])[order]
        prefix_values = np.concatenate([prefix_values, np.zeros(padded.size, dtype=np.int64)])[order]
    return Segments(values, boundary, prefix_values)
