"""Decoder-only batches: causal LM over packed documents and prefix LM (:mod:`loaders.collate`).

:class:`CausalCollator` (clm) and :class:`PrefixLMCollator` (prefix_lm, ul2 decoder-only)
are the collators that build attention structure: 4-D additive masks (:mod:`loaders.masks`),
positions restarting per document, labels masked at document boundaries, FlashAttention's
varlen kwargs. The conventions they follow are those of :mod:`loaders.collate`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from loaders.collate_arrays import (
    collated_length,
    column_rows,
    fit_rows,
    float_mask,
    int_column,
    real_lengths,
    require_columns,
    to_tensors,
)
from loaders.masks import causal_segment_mask, document_segments, resolve_mask_dtype, segment_ids
from transforms.objectives.common import IGNORE_INDEX

__all__ = ["DOCUMENT_MODES", "CausalCollator", "PrefixLMCollator"]

DOCUMENT_MODES = ("mask", "position_ids", "none")


def _check_documents(documents: str, flash_attention_kwargs: bool) -> None:
    if documents == "cu_seqlens":
        raise ValueError(
            "documents='cu_seqlens' was replaced: transformers reads FlashAttention's varlen arguments as "
            "cu_seq_lens_q/cu_seq_lens_k and max_length_q/max_length_k; pass documents='position_ids', "
            "flash_attention_kwargs=True"
        )
    if documents not in DOCUMENT_MODES:
        raise ValueError(f"documents={documents!r}: expected one of {DOCUMENT_MODES}")
    if flash_attention_kwargs and documents != "position_ids":
        raise ValueError(
            f"flash_attention_kwargs=True needs documents='position_ids' (got {documents!r}): FlashAttention "
            "takes the documents from cu_seq_lens_q/k and reads no 4-D mask"
        )


class CausalCollator:
    """Causal LM batches from ``input_ids`` (+ ``doc_lengths``), see the module docstring.

    Outputs: ``input_ids``, ``attention_mask`` (``mask``: ``(B, 1, L, L)`` additive float;
    ``none``: ``(B, L)`` 0/1; ``position_ids``: none), ``labels``, ``position_ids``, and with
    ``flash_attention_kwargs`` ``cu_seq_lens_q``, ``cu_seq_lens_k`` (int32, over the flattened
    ``B * L`` tokens, each row's padding one more segment), ``max_length_q``, ``max_length_k``.

    Args:
        pad_id: padding id (needed only when rows differ in length).
        documents: ``mask`` (default), ``position_ids`` or ``none``.
        shift_labels: False (default, HF): ``labels[t] = input_ids[t]``, the model shifts;
            True (Megatron): ``labels[t] = input_ids[t + 1]`` for models that do not shift.
        mask_document_boundaries: no loss on predicting a document's first token from the
            previous document (document modes only; as HF's ``DataCollatorWithFlattening``).
        flash_attention_kwargs: add FlashAttention's varlen kwargs under HF's names
            (``documents="position_ids"`` only); ``max_length_*`` are Python ints.
        mask_dtype: dtype of the 4-D mask (``float32``; ``bfloat16`` for a bf16 model run without
            autocast under sdpa, which wants the query's dtype).
        pad_to_multiple_of: round the batch length up.
        trim_padding: cut the columns that are padding in every row (default True).

    Raises:
        ValueError: an unknown ``documents`` mode, flash kwargs without ``position_ids``, or a
            mask dtype that is not floating point.
    """

    def __init__(self, pad_id: int | None = None, *, documents: str = "mask", shift_labels: bool = False,
                 mask_document_boundaries: bool = True, flash_attention_kwargs: bool = False,
                 mask_dtype: Any = "float32", pad_to_multiple_of: int | None = None, trim_padding: bool = True):
        _check_documents(documents, flash_attention_kwargs)
        self.pad_id, self.documents, self.shift_labels = pad_id, documents, shift_labels
        self.mask_document_boundaries, self.flash_attention_kwargs = mask_document_boundaries, flash_attention_kwargs
        self.mask_dtype = resolve_mask_dtype(mask_dtype)
        self.pad_to_multiple_of, self.trim_padding = pad_to_multiple_of, trim_padding

    accepts_example_batch = True

    def __call__(self, examples: Sequence[dict[str, Any]]) -> dict[str, Any]:
        name = type(self).__name__
        require_columns(name, examples, ["input_ids"])
        rows = column_rows(examples, "input_ids")
        real = real_lengths(examples, rows)
        length = collated_length(self, rows, real)
        input_ids = fit_rows(rows, length, self.pad_id, name)
        batch = len(rows)
        t = np.arange(length)
        padded = not (real == length).all()
        labels = np.empty((batch, length), dtype=np.int64)
        if self.shift_labels:
            labels[:, :-1] = input_ids[:, 1:]
            labels[:, -1] = IGNORE_INDEX
        else:
            labels[:] = input_ids
        if padded:
            labels[t[None, :] + int(self.shift_labels) >= real[:, None]] = IGNORE_INDEX
        positions = np.empty((batch, length), dtype=np.int64)
        if self.documents == "none":
            attention = np.empty((batch, length), dtype=np.int64)
            attention[:] = t[None, :] < real[:, None]
            positions[...] = t
            return to_tensors({"input_ids": input_ids, "attention_mask": attention, "labels": labels,
                             "position_ids": positions})
        # Segments over the flattened batch: each row's documents, then the row's padding.
        segment_lengths, boundary_flags = document_segments(examples, real, length)
        ends = np.cumsum(segment_lengths)
        starts = ends - segment_lengths
        np.subtract(np.arange(batch * length), np.repeat(starts, segment_lengths), out=positions.reshape(-1))
        if self.mask_document_boundaries:
            boundary = starts[boundary_flags]
            labels.reshape(-1)[boundary - 1 if self.shift_labels else boundary] = IGNORE_INDEX
            if not self.shift_labels:  # as DataCollatorWithFlattening: every document's first label
                labels[:, 0] = IGNORE_INDEX
        out: dict[str, Any] = {"input_ids": input_ids}
        if self.documents == "mask":
            allowed = causal_segment_mask(segment_ids(segment_lengths, batch, length))
            out["attention_mask"] = float_mask(allowed, self.mask_dtype)
        out["labels"], out["position_ids"] = labels, positions
        if self.flash_attention_kwargs:
            cumulative = np.concatenate([[0], ends]).astype(np.int32)
            longest = int(segment_lengths.max())
            out.update(cu_seq_lens_q=cumulative, cu_seq_lens_k=cumulative.copy(), max_length_q=longest,
                       max_length_k=longest)
        return to_tensors(out)


class PrefixLMCollator:
    """Prefix-LM batches from ``input_ids`` + ``prefix_length`` (+ ``doc_lengths`` for padding).

    Outputs: ``input_ids``, ``attention_mask`` (``(B, 1, L, L)`` additive float: the prefix
    bidirectional, causal after, padding rows attending to the real tokens and themselves),
    ``labels`` (the suffix only), ``position_ids`` and, when asked, ``prefix_length`` (B,).

    Args:
        pad_id: padding id (needed only when rows differ in length).
        shift_labels: as :class:`CausalCollator` (default False, HF).
        mask_dtype: as :class:`CausalCollator`.
        pad_to_multiple_of: round the batch length up.
        trim_padding: cut the columns that are padding in every row (default True).
        return_prefix_length: add ``prefix_length`` (HF models take no such argument).
    """

    def __init__(self, pad_id: int | None = None, *, shift_labels: bool = False, mask_dtype: Any = "float32",
                 pad_to_multiple_of: int | None = None, trim_padding: bool = True, return_prefix_length: bool = False):
        self.pad_id, self.shift_labels, self.pad_to_multiple_of = pad_id, shift_labels, pad_to_multiple_of
        self.mask_dtype, self.trim_padding = resolve_mask_dtype(mask_dtype), trim_padding
        self.return_prefix_length = return_prefix_length

    accepts_example_batch = True

    def __call__(self, examples: Sequence[dict[str, Any]]) -> dict[str, Any]:
        name = type(self).__name__
        require_columns(name, examples, ["input_ids"])
        rows = column_rows(examples, "input_ids")
        real = real_lengths(examples, rows)
        length = collated_length(self, rows, real)
        input_ids = fit_rows(rows, length, self.pad_id, name)
        prefix = int_column(examples, "prefix_length", 0)
        t = np.arange(length)
        q, k = t[None, :, None], t[None, None, :]
        allowed = ((k <= q) | (k < prefix[:, None, None])) & (k < real[:, None, None])
        allowed |= q == k  # padding rows attend to themselves: no empty softmax row
        labels = np.full((len(rows), length), IGNORE_INDEX, dtype=np.int64)
        if self.shift_labels:
            target = t[None, 1:]
            keep = (target >= prefix[:, None]) & (target < real[:, None])
            labels[:, :-1] = np.where(keep, input_ids[:, 1:], IGNORE_INDEX)
        else:
            # position 0 is never predicted: its label is -100 even without a prefix
            keep = (t[None, :] >= np.maximum(prefix, 1)[:, None]) & (t[None, :] < real[:, None])
            labels[:] = np.where(keep, input_ids, IGNORE_INDEX)
        out = {
            "input_ids": input_ids,
            "attention_mask": float_mask(allowed, self.mask_dtype),
            "labels": labels,
            "position_ids": np.broadcast_to(t, (len(rows), length)).copy(),
        }
        if self.return_prefix_length:
            out["prefix_length"] = prefix.astype(np.int64)
        return to_tensors(out)
