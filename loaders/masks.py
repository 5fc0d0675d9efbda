"""Attention masks and document segments of packed rows (numpy; torch only to convert a dtype).

A collated batch is ``B`` rows of ``L`` tokens. A row holds one or more documents (its
``doc_lengths``) and then its padding; over the flattened ``B * L`` tokens these are
*segments*: each row's non-empty documents in order, then (when the row is padded) one
segment for its padding. Segments drive everything document-aware a collator emits:

- ``position_ids`` restart at 0 at each segment (HF's ``DataCollatorWithFlattening``);
- the 4-D attention mask lets a token attend only to earlier tokens of its own segment;
- FlashAttention's varlen kwargs (``cu_seq_lens_q/k``) are the segments' cumulative ends.

The padding being a segment of its own keeps every query row of a mask non-empty, so no
softmax row is all ``-inf`` (HF's eager attention would turn that into NaN).

**Mask form.** A 4-D mask is *additive* and floating point, shape ``(B, 1, L, L)``: ``0.0``
where a query may attend, the dtype's most negative finite value elsewhere. That is the form
transformers documents for custom 4-D masks and the one every attention implementation
honours: eager adds it to the scores, sdpa passes it as ``attn_mask``, flex attention adds it
as a score modification. A boolean mask is only right under sdpa (eager adds ``True``/``False``
as 1/0, i.e. masks nothing). sdpa requires the mask's dtype to equal the query's, so a model
run in bfloat16 without autocast needs ``mask_dtype=torch.bfloat16``; under autocast the
float32 default is cast with the query.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, NamedTuple

import numpy as np

from loaders.batch import ExampleBatch, Ragged

__all__ = ["SegmentMaskMod", "Segments", "additive_mask", "causal_segment_mask", "document_segments", "prefix_ends",
           "resolve_mask_dtype", "segment_block_mask", "segment_ids", "segment_mask"]

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


def additive_mask(allowed: np.ndarray, dtype: str = "float32", out: np.ndarray | None = None) -> Any:
    """``allowed`` ``(B, L, L)`` bool -> additive ``(B, 1, L, L)`` mask: 0 where allowed, the
    dtype's most negative finite value elsewhere (a numpy array; a torch tensor for bfloat16,
    which numpy lacks). ``out``: a ``(B, 1, L, L)`` array of that dtype to write into."""
    dtype = resolve_mask_dtype(dtype)
    if dtype == "bfloat16":
        import torch

        # bfloat16 has float32's exponent range: its most negative finite value, built in float32
        mask = np.where(allowed[:, None], np.float32(0), np.float32(torch.finfo(torch.bfloat16).min))
        return torch.from_numpy(mask).to(torch.bfloat16)
    np_dtype = _NUMPY_FLOATS[dtype]
    if out is None or out.dtype != np_dtype:
        out = np.empty((allowed.shape[0], 1, *allowed.shape[1:]), dtype=np_dtype)
    out.fill(np.finfo(np_dtype).min)
    out[:, 0][allowed] = 0
    return out


def segment_ids(segment_lengths: np.ndarray, batch: int, length: int) -> np.ndarray:
    """``(B, L)`` index of the segment each token belongs to (segments numbered over the batch)."""
    return np.repeat(np.arange(segment_lengths.size), segment_lengths).reshape(batch, length)


def prefix_ends(segments: Segments, batch: int, length: int) -> np.ndarray:
    """``(B, L)`` per token: the in-row position where its segment's prefix ends (its segment's
    start + prefix); a key before it is visible from every query of the segment."""
    starts = np.cumsum(segments.lengths) - segments.lengths
    in_row = starts % length  # a segment never crosses rows
    return np.repeat(in_row + segments.prefixes, segments.lengths).reshape(batch, length)


def causal_segment_mask(segments: np.ndarray) -> np.ndarray:
    """``(B, L, L)`` bool: query ``q`` may attend key ``k`` when both are in one segment and ``k <= q``."""
    length = segments.shape[1]
    t = np.arange(length)
    return (segments[:, :, None] == segments[:, None, :]) & (t[None, None, :] <= t[None, :, None])


def segment_mask(segments: np.ndarray, ends: np.ndarray, dtype: str = "float32") -> Any:
    """The additive ``(B, 1, L, L)`` mask of packed prefix-LM segments.

    Query ``q`` may attend key ``k`` when both are in one segment and ``k <= q`` or ``k`` lies
    in the segment's prefix (``k < ends[q]``, :func:`prefix_ends`): each segment is bidirectional
    over its prefix and causal after it, and no attention crosses segments (T5's packed
    prefix-LM). Every query sees at least itself, so no softmax row is empty. Built row by row
    straight into the mask's dtype: its only ``O(L^2)`` memory is the mask itself.
    """
    dtype = resolve_mask_dtype(dtype)
    batch, length = segments.shape
    t = np.arange(length)
    causal = t[None, :] <= t[:, None]
    if dtype == "bfloat16":
        import torch

        out = torch.empty((batch, 1, length, length), dtype=torch.bfloat16)
        low = torch.finfo(torch.bfloat16).min
        for b in range(batch):
            allowed = _row_allowed(segments[b], ends[b], t, causal)
            out[b, 0] = torch.from_numpy(np.where(allowed, np.float32(0), np.float32(low)))
        return out
    np_dtype = _NUMPY_FLOATS[dtype]
    out = np.empty((batch, 1, length, length), dtype=np_dtype)
    low = np.finfo(np_dtype).min
    for b in range(batch):
        allowed = _row_allowed(segments[b], ends[b], t, causal)
        np.copyto(out[b, 0], low)
        out[b, 0][allowed] = 0
    return out


def _row_allowed(segments: np.ndarray, ends: np.ndarray, t: np.ndarray, causal: np.ndarray) -> np.ndarray:
    allowed = t[None, :] < ends[:, None]
    allowed |= causal
    allowed &= segments[:, None] == segments[None, :]
    return allowed


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
