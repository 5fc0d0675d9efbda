"""Decoder-only batches: causal LM over packed documents and prefix LM (:mod:`loaders.collation.collate`).

:class:`CausalCollator` (clm) and :class:`PrefixLMCollator` (prefix_lm, ul2 decoder-only)
are the collators that build attention structure: 4-D additive masks (:mod:`loaders.collation.masks`),
positions restarting per document, labels masked at document boundaries, FlashAttention's
varlen kwargs. The conventions they follow are those of :mod:`loaders.collation.collate`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from loaders.collation.collate_arrays import (
    collated_length,
    column_rows,
    fit_rows,
    real_lengths,
    require_columns,
    to_tensors,
)
from loaders.collation.masks import (
    document_segments,
    prefix_ends,
    resolve_mask_dtype,
    segment_block_mask,
    segment_ids,
    segment_mask,
)
from transforms.objectives.common import IGNORE_INDEX

__all__ = ["DOCUMENT_MODES", "MODEL_ARGUMENTS", "CausalCollator", "PrefixLMCollator"]

DOCUMENT_MODES = ("position_ids", "mask", "none")

#: What a clm batch under ``documents="position_ids"`` adds for the model: transformers derives
#: the per-document mask from restarting ``position_ids`` only when it builds no cache
#: (``masking_utils``: no 2-D ``attention_mask`` and ``past_key_values is None``), and a causal
#: LM builds one whenever ``use_cache`` is on, which is its config's default in train mode too.
MODEL_ARGUMENTS = {"use_cache": False}


def _check_documents(documents: str, flash_attention_kwargs: bool) -> None:
    if documents not in DOCUMENT_MODES:
        raise ValueError(f"documents={documents!r}: expected one of {DOCUMENT_MODES}")
    if flash_attention_kwargs and documents != "position_ids":
        raise ValueError(
            f"flash_attention_kwargs=True needs documents='position_ids' (got {documents!r}): FlashAttention "
            "takes the documents from cu_seq_lens_q/k and reads no 4-D mask"
        )


def _check_implementation(attn_implementation: str | None) -> str | None:
    if attn_implementation is not None and not isinstance(attn_implementation, str):
        raise ValueError(f"attn_implementation must be a name such as 'sdpa', got {attn_implementation!r}")
    return attn_implementation


def _four_d_mask(segments, batch: int, length: int, dtype: str, attn_implementation: str | None) -> Any:
    """The 4-D mask of ``segments``: a BlockMask for flex attention, else an additive tensor."""
    if attn_implementation == "flex_attention":
        return segment_block_mask(segment_ids(segments.lengths, batch, length), prefix_ends(segments, batch, length))
    return segment_mask(segments, batch, length, dtype)


def _positions(segments, batch: int, length: int) -> tuple[np.ndarray, np.ndarray]:
    """``(B, L)`` positions restarting at each segment, and the flattened start of each segment."""
    starts = np.cumsum(segments.lengths) - segments.lengths
    positions = np.empty((batch, length), dtype=np.int64)
    np.subtract(np.arange(batch * length), np.repeat(starts, segments.lengths), out=positions.reshape(-1))
    return positions, starts


class CausalCollator:
    """Causal LM batches from ``input_ids`` (+ ``doc_lengths``), see the module docstring.

    Outputs: ``input_ids``, ``labels``, ``position_ids`` and per ``documents`` mode:

    - ``position_ids`` (default): ``use_cache=False`` (see :data:`MODEL_ARGUMENTS`) and no
      ``attention_mask``: transformers builds the per-document causal mask from the restarting
      positions under eager, sdpa and flex attention, in train and eval mode. O(B*L) memory.
      With ``flash_attention_kwargs`` also ``cu_seq_lens_q``, ``cu_seq_lens_k`` (int32, over
      the flattened ``B * L`` tokens, each row's padding one more segment), ``max_length_q``,
      ``max_length_k``.
    - ``mask``: ``attention_mask`` ``(B, 1, L, L)`` additive float (a BlockMask under
      ``attn_implementation="flex_attention"``): the same documents kept apart by an explicit
      O(B*L^2) mask, for models that ignore ``position_ids``.
    - ``none``: ``attention_mask`` ``(B, L)`` 0/1, plain causal attention over the packed row.

    Args:
        pad_id: padding id (needed only when rows differ in length).
        documents: ``position_ids`` (default), ``mask`` or ``none``.
        shift_labels: False (default, HF): ``labels[t] = input_ids[t]``, the model shifts;
            True (Megatron): ``labels[t] = input_ids[t + 1]`` for models that do not shift.
        mask_document_boundaries: no loss on predicting a document's first token from the
            previous document (document modes only; as HF's ``DataCollatorWithFlattening``).
        flash_attention_kwargs: add FlashAttention's varlen kwargs under HF's names
            (``documents="position_ids"`` only); ``max_length_*`` are Python ints.
        mask_dtype: dtype of the 4-D mask (``float32``; the model's dtype for a model run without
            autocast under sdpa, which wants the query's dtype).
        attn_implementation: the model's (``model.config._attn_implementation``); under
            ``flex_attention`` a 4-D mask goes out as a BlockMask.
        pad_to_multiple_of: round the batch length up.
        trim_padding: cut the columns that are padding in every row (default True).
        model_arguments: add :data:`MODEL_ARGUMENTS` (``use_cache=False``) to ``position_ids``
            batches (default True); False for a model whose ``forward`` takes no ``use_cache``
            (it must then separate documents by ``position_ids`` itself).

    Raises:
        ValueError: an unknown ``documents`` mode, flash kwargs without ``position_ids``, or a
            mask dtype that is not floating point.
    """

    def __init__(self, pad_id: int | None = None, *, documents: str = "position_ids", shift_labels: bool = False,
                 mask_document_boundaries: bool = True, flash_attention_kwargs: bool = False,
                 mask_dtype: Any = "float32", attn_implementation: str | None = None,
                 pad_to_multiple_of: int | None = None, trim_padding: bool = True, model_arguments: bool = True):
        _check_documents(documents, flash_attention_kwargs)
        self.model_arguments = model_arguments
        self.pad_id, self.documents, self.shift_labels = pad_id, documents, shift_labels
        self.mask_document_boundaries, self.flash_attention_kwargs = mask_document_boundaries, flash_attention_kwargs
        self.mask_dtype = resolve_mask_dtype(mask_dtype)
        self.attn_implementation = _check_implementation(attn_implementation)
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
        if self.documents == "none":
            attention = np.empty((batch, length), dtype=np.int64)
            attention[:] = t[None, :] < real[:, None]
            positions = np.empty((batch, length), dtype=np.int64)
            positions[...] = t
            return to_tensors({"input_ids": input_ids, "attention_mask": attention, "labels": labels,
                               "position_ids": positions})
        # Segments over the flattened batch: each row's documents, then the row's padding.
        segments = document_segments(examples, real, length)
        positions, starts = _positions(segments, batch, length)
        if self.mask_document_boundaries:
            boundary = starts[segments.boundary]
            labels.reshape(-1)[boundary - 1 if self.shift_labels else boundary] = IGNORE_INDEX
            if not self.shift_labels:  # as DataCollatorWithFlattening: every document's first label
                labels[:, 0] = IGNORE_INDEX
        out: dict[str, Any] = {"input_ids": input_ids}
        if self.documents == "mask":
            causal = segments._replace(prefixes=np.zeros_like(segments.prefixes))
            out["attention_mask"] = _four_d_mask(causal, batch, length, self.mask_dtype, self.attn_implementation)
        out["labels"], out["position_ids"] = labels, positions
        if self.documents == "position_ids" and self.model_arguments:
            out.update(MODEL_ARGUMENTS)
        if self.flash_attention_kwargs:
            cumulative = np.concatenate([[0], np.cumsum(segments.lengths)]).astype(np.int32)
            longest = int(segments.lengths.max())
            out.update(cu_seq_lens_q=cumulative, cu_seq_lens_k=cumulative.copy(), max_length_q=longest,
                       max_length_k=longest)
        return to_tensors(out)


class PrefixLMCollator:
    """Packed prefix-LM batches from ``input_ids`` + ``doc_lengths`` + ``prefix_lengths``.

    Each document of a row is a segment with its own prefix (``prefix_lengths``, one per
    document): bidirectional within the prefix, causal after it, no attention across segments,
    positions restarting per segment, loss on each segment's suffix only (T5's packed prefix-LM;
    SeqIO's ``PrefixLMFeatureConverter`` with packing). A document without a prefix (a clm row
    in a mixture) is plain causal within itself, its first token not a target. A row of the
    older format with one ``prefix_length`` is one segment with that prefix.

    A bidirectional prefix cannot be said with ``position_ids``, so the mask is 4-D, built once
    per batch in ``mask_dtype`` (:func:`loaders.collation.masks.segment_mask`), or a BlockMask under
    ``attn_implementation="flex_attention"``.

    Outputs: ``input_ids``, ``attention_mask`` (``(B, 1, L, L)``; each row's padding a segment
    of its own that attends to itself), ``labels``, ``position_ids`` and, when asked,
    ``prefix_length`` (B,): the prefix tokens of each row.

    Args:
        pad_id: padding id (needed only when rows differ in length).
        shift_labels: as :class:`CausalCollator` (default False, HF).
        mask_dtype: as :class:`CausalCollator`.
        attn_implementation: as :class:`CausalCollator`.
        pad_to_multiple_of: round the batch length up.
        trim_padding: cut the columns that are padding in every row (default True).
        return_prefix_length: add ``prefix_length`` (HF models take no such argument).
    """

    def __init__(self, pad_id: int | None = None, *, shift_labels: bool = False, mask_dtype: Any = "float32",
                 attn_implementation: str | None = None, pad_to_multiple_of: int | None = None,
                 trim_padding: bool = True, return_prefix_length: bool = False):
        self.pad_id, self.shift_labels, self.pad_to_multiple_of = pad_id, shift_labels, pad_to_multiple_of
        self.mask_dtype, self.trim_padding = resolve_mask_dtype(mask_dtype), trim_padding
        self.attn_implementation = _check_implementation(attn_implementation)
        self.return_prefix_length = return_prefix_length

    accepts_example_batch = True

    def __call__(self, examples: Sequence[dict[str, Any]]) -> dict[str, Any]:
        name = type(self).__name__
        require_columns(name, examples, ["input_ids"])
        rows = column_rows(examples, "input_ids")
        real = real_lengths(examples, rows)
        length = collated_length(self, rows, real)
        input_ids = fit_rows(rows, length, self.pad_id, name)
        batch = len(rows)
        segments = document_segments(examples, real, length)
        positions, _ = _positions(segments, batch, length)
        # a target is a token of a document (not padding) at or after its segment's prefix, and
        # never a segment's first token (nothing of its own segment precedes it)
        first_target = np.repeat(np.maximum(segments.prefixes, 1), segments.lengths).reshape(batch, length)
        target = (positions >= first_target) & (np.arange(length)[None, :] < real[:, None])
        labels = np.full((batch, length), IGNORE_INDEX, dtype=np.int64)
        if self.shift_labels:
            labels[:, :-1] = np.where(target[:, 1:], input_ids[:, 1:], IGNORE_INDEX)
        else:
            labels[:] = np.where(target, input_ids, IGNORE_INDEX)
        out = {
            "input_ids": input_ids,
            "attention_mask": _four_d_mask(segments, batch, length, self.mask_dtype, self.attn_implementation),
            "labels": labels,
            "position_ids": positions,
        }
        if self.return_prefix_length:
            row_of = (np.cumsum(segments.lengths) - segments.lengths) // length
            out["prefix_length"] = np.bincount(row_of, weights=segments.prefixes, minlength=batch).astype(np.int64)
        return to_tensors(out)
