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
from typing import Any

import numpy as np

from loaders.batch import ExampleBatch, Ragged

__all__ = ["additive_mask", "causal_segment_mask", "document_segments", "resolve_mask_dtype", "segment_ids"]

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


def causal_segment_mask(segments: np.ndarray) -> np.ndarray:
    """``(B, L, L)`` bool: query ``q`` may attend key ``k`` when both are in one segment and ``k <= q``."""
    length = segments.shape[1]
    t = np.arange(length)
    return (segments[:, :, None] == segments[:, None, :]) & (t[None, None, :] <= t[None, :, None])


def document_segments(examples: Sequence[dict[str, Any]], real: np.ndarray,
                      length: int) -> tuple[np.ndarray, np.ndarray]:
    """Segments of the flattened batch: each row's documents (non-empty ones), then its padding.

    ``real[i]`` is row ``i``'s tokens before its padding; rows are ``length`` tokens. A row
    without ``doc_lengths`` is one document. Returns ``(segment lengths, boundary)``;
    ``boundary`` marks a document that does not open its row.
    """
    docs = examples.columns.get("doc_lengths") if isinstance(examples, ExampleBatch) else None
    if isinstance(docs, Ragged) or (isinstance(examples, ExampleBatch) and docs is None):
        # vectorised: the same segments as the per-row loop below
        if docs is None:
            values, row_of = real.astype(np.int64), np.arange(len(examples))
        else:
            values = docs.values.astype(np.int64)
            row_of = np.repeat(np.arange(len(examples)), docs.lengths())
        keep = values > 0
        values, row_of = values[keep], row_of[keep]
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
        return values, boundary
    pieces: list[int] = []
    boundary_flags: list[bool] = []  # per segment: a document that does not open its row
    for i, example in enumerate(examples):
        row_docs = example.get("doc_lengths")
        row_docs = [d for d in (np.asarray(row_docs).tolist() if row_docs is not None else [int(real[i])]) if d > 0]
        pieces += row_docs
        boundary_flags += [False] + [True] * (len(row_docs) - 1) if row_docs else []
        if length > real[i]:
            pieces.append(length - int(real[i]))
            boundary_flags.append(False)
    return np.array(pieces, dtype=np.int64), np.array(boundary_flags, dtype=bool)
