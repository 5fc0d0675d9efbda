"""Collators: lists of examples -> dicts of torch tensors, one per model layout.

Batches follow Hugging Face transformers' conventions by default, so that ``model(**batch)``
of an HF model (and HF ``Trainer``) trains what the dataset holds:

- ``labels`` are **unshifted** (``labels[t] = input_ids[t]``, ``-100`` = no loss): HF causal
  models shift inside (position ``t - 1`` predicts ``labels[t]``). Megatron-style pre-shifted
  labels (``labels[t] = input_ids[t + 1]``, a model that does not shift) are an option
  (``shift_labels=True``).
- Masks a model must honour are 4-D **additive float** masks ``(B, 1, L, L)`` (0 = attend,
  the dtype's most negative value = not), which eager, sdpa and flex attention all apply;
  never an all-masked row (:mod:`loaders.masks`). Plain padding stays a 2-D ``attention_mask``.
- Packed documents are handled like HF's ``DataCollatorWithFlattening``: ``position_ids``
  restart at each document and each document's first label is ``-100`` (it would be
  predicted from the previous document). FlashAttention's varlen kwargs go out under HF's
  names (``cu_seq_lens_q``/``cu_seq_lens_k`` int32 tensors, ``max_length_q``/``max_length_k``
  Python ints) only when asked for (``flash_attention_kwargs=True``).
- Only tensors a model's ``forward`` takes are in a batch; extras (``prefix_length``,
  ``position_ids`` of encoders) only when asked for.
- Padding is trimmed: a batch is as long as its longest real row (rounded up to
  ``pad_to_multiple_of``), not as the stored, padded width (UL2's decoder rows are padded to
  the longest denoiser's length).

Collators:

- :class:`CausalCollator` (clm): ``documents="mask"`` (default): per-document causal
  attention as a 4-D mask, positions restarting per document; ``"position_ids"``: no mask,
  positions restarting per document, the form HF's flattening collator emits (transformers
  5 models derive the per-document mask from such positions under every attention
  implementation, and FlashAttention reads ``cu_seq_lens_*`` when asked for); it is O(B*L)
  where a 4-D mask is O(B*L*L). ``"none"``: plain causal attention over the packed row
  (GPT-2/Megatron default; attention crosses documents), 2-D padding mask.
- :class:`PrefixLMCollator` (prefix_lm, ul2 decoder-only): 4-D mask, bidirectional over the
  first ``prefix_length`` tokens and causal after; loss on the suffix only. Examples
  without ``prefix_length`` (clm in a mixture) are plain causal.
- :class:`MLMCollator` (mlm): bidirectional; labels as stored, 2-D padding mask.
- :class:`Seq2SeqCollator` (span_corruption, bart, ul2 encoder-decoder): ``inputs`` ->
  ``input_ids``/``attention_mask``, ``targets`` -> ``labels``, ``decoder_input_ids`` = labels
  shifted right behind ``decoder_start_id`` (T5: pad; BART: eos), as HF's
  ``shift_tokens_right``, and ``decoder_attention_mask``.
- :class:`StackCollator`: the named columns as stored, stacked (no labels or masks), for
  trainers that build those on the device.

Every collator takes a list of example dicts or an :class:`~loaders.batch.ExampleBatch`
(``accepts_example_batch = True``): from the latter it reads whole columns (one ``(B, L)``
array per fixed-length column) instead of one row at a time, with the same result.

Tensors are built in numpy and wrapped with ``torch.from_numpy``; inside a DataLoader
worker a batch's arrays are packed into one storage per dtype, which halves the cost of
handing the batch to the main process. torch is imported when a collator runs, so this
module imports without it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from loaders.batch import ExampleBatch, Ragged
from loaders.collate_arrays import (
    batch_length,
    collated_length,
    column_rows,
    content_lengths,
    fit_rows,
    float_mask,
    int_column,
    real_lengths,
    require_columns,
    row_widths,
    to_tensors,
)
from loaders.errors import UnsupportedSchemaError
from loaders.masks import causal_segment_mask, document_segments, resolve_mask_dtype, segment_ids
from transforms.objectives.common import IGNORE_INDEX

__all__ = [
    "IGNORE_INDEX",
    "CausalCollator",
    "MLMCollator",
    "PrefixLMCollator",
    "Seq2SeqCollator",
    "StackCollator",
    "collator_for",
]

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


class MLMCollator:
    """Masked-LM batches from ``input_ids`` + ``labels`` (bidirectional attention).

    Outputs: ``input_ids``, ``attention_mask`` (``(B, L)``, 0 on padding), ``labels`` (as stored,
    ``-100`` on padding) and, when asked, ``position_ids`` (encoders such as RoBERTa number
    positions their own way, so by default the model does).

    Args:
        pad_id: padding id: padded and stored padding positions get no attention.
        pad_to_multiple_of: round the batch length up.
        trim_padding: cut the columns that are padding in every row (default True).
        return_position_ids: add ``position_ids`` ``0 .. L-1``.
    """

    def __init__(self, pad_id: int, *, pad_to_multiple_of: int | None = None, trim_padding: bool = True,
                 return_position_ids: bool = False):
        self.pad_id, self.pad_to_multiple_of = pad_id, pad_to_multiple_of
        self.trim_padding, self.return_position_ids = trim_padding, return_position_ids

    accepts_example_batch = True

    def __call__(self, examples: Sequence[dict[str, Any]]) -> dict[str, Any]:
        name = type(self).__name__
        require_columns(name, examples, ["input_ids", "labels"])
        rows = column_rows(examples, "input_ids")
        length = collated_length(self, rows, content_lengths(rows, self.pad_id))
        input_ids = fit_rows(rows, length, self.pad_id, name)
        labels = fit_rows(column_rows(examples, "labels"), length, IGNORE_INDEX, "labels")
        attention = (input_ids != self.pad_id).astype(np.int64)
        out = {"input_ids": input_ids, "attention_mask": attention,
               "labels": np.where(attention == 1, labels, IGNORE_INDEX)}
        if self.return_position_ids:
            out["position_ids"] = np.broadcast_to(np.arange(length), input_ids.shape).copy()
        return to_tensors(out)


class Seq2SeqCollator:
    """Encoder-decoder batches from ``inputs`` + ``targets``.

    Outputs: ``input_ids``, ``attention_mask``, ``labels`` (``-100`` on padding),
    ``decoder_input_ids`` (``labels`` shifted right behind ``decoder_start_id``, padding as
    ``pad_id``: HF's ``shift_tokens_right``), ``decoder_attention_mask`` and, when asked,
    ``position_ids`` of the encoder (T5 and BART take none).

    Args:
        pad_id: padding id (also ends padded targets in ``decoder_input_ids``).
        decoder_start_id: first decoder input (None: ``pad_id``, T5's convention; BART uses eos).
        inputs_length, targets_length: pad to these fixed lengths (error when longer).
        pad_to_multiple_of: round variable batch lengths up.
        trim_padding: cut trailing padding (pad ids) shared by every row (default True).
        return_position_ids: add the encoder's ``position_ids``.
    """

    def __init__(self, pad_id: int, *, decoder_start_id: int | None = None, inputs_length: int | None = None,
                 targets_length: int | None = None, pad_to_multiple_of: int | None = None,
                 trim_padding: bool = True, return_position_ids: bool = False):
        self.pad_id = pad_id
        self.decoder_start_id = pad_id if decoder_start_id is None else decoder_start_id
        self.inputs_length, self.targets_length = inputs_length, targets_length
        self.pad_to_multiple_of, self.trim_padding = pad_to_multiple_of, trim_padding
        self.return_position_ids = return_position_ids

    accepts_example_batch = True

    def _fit(self, rows: np.ndarray | list[np.ndarray], fixed: int | None, what: str) -> np.ndarray:
        basis = content_lengths(rows, self.pad_id).tolist() if self.trim_padding else row_widths(rows)
        length = batch_length(basis, self.pad_to_multiple_of, fixed, what)
        return fit_rows(rows, length, self.pad_id, what)

    def __call__(self, examples: Sequence[dict[str, Any]]) -> dict[str, Any]:
        require_columns(type(self).__name__, examples, ["inputs", "targets"])
        input_ids = self._fit(column_rows(examples, "inputs"), self.inputs_length, "inputs")
        target_ids = self._fit(column_rows(examples, "targets"), self.targets_length, "targets")
        real_targets = target_ids != self.pad_id
        decoder_input_ids = np.empty_like(target_ids)
        decoder_input_ids[:, 0] = self.decoder_start_id
        decoder_input_ids[:, 1:] = target_ids[:, :-1]
        out = {
            "input_ids": input_ids,
            "attention_mask": (input_ids != self.pad_id).astype(np.int64),
            "labels": np.where(real_targets, target_ids, IGNORE_INDEX),
            "decoder_input_ids": decoder_input_ids,
            "decoder_attention_mask": np.concatenate(
                [np.ones((len(target_ids), 1), dtype=np.int64), real_targets[:, :-1].astype(np.int64)], axis=1),
        }
        if self.return_position_ids:
            out["position_ids"] = np.broadcast_to(np.arange(input_ids.shape[1]), input_ids.shape).copy()
        return to_tensors(out)


class StackCollator:
    """The named columns as stored, stacked into tensors: no labels, masks or positions.

    For trainers that build those on the device (or need only the tokens). A fixed-length
    column becomes ``(B, L)`` in its stored dtype (``input_ids``: int32); an integer column
    ``(B,)`` int64; a variable-length one ``(B, longest)``, right-padded with ``pad_id``;
    a string column (``key``) a list.

    Args:
        columns: the columns to stack (default ``input_ids``).
        pad_id: padding of variable-length columns (needed only when rows differ in length).

    Raises:
        UnsupportedSchemaError: a column the examples do not have.
    """

    accepts_example_batch = True

    def __init__(self, columns: Sequence[str] = ("input_ids",), *, pad_id: int | None = None):
        if isinstance(columns, str) or not columns:
            raise ValueError(f"columns must be a non-empty list of names, got {columns!r}")
        self.columns, self.pad_id = tuple(columns), pad_id

    def __call__(self, examples: Sequence[dict[str, Any]]) -> dict[str, Any]:
        require_columns(type(self).__name__, examples, self.columns)
        out: dict[str, Any] = {}
        for name in self.columns:
            if isinstance(examples, ExampleBatch):
                column = examples.columns[name]
                values = column.rows() if isinstance(column, Ragged) else column
            else:
                values = [e[name] for e in examples]
            if isinstance(values, np.ndarray):
                out[name] = values.astype(np.int64) if values.ndim == 1 else values
            elif all(isinstance(v, np.ndarray) for v in values):
                out[name] = self._stack(name, values)
            elif all(isinstance(v, (int, np.integer)) for v in values):
                out[name] = np.array(values, dtype=np.int64)
            else:
                out[name] = list(values)
        return to_tensors(out)

    def _stack(self, name: str, rows: list[np.ndarray]) -> np.ndarray:
        length = max(len(row) for row in rows)
        dtype = rows[0].dtype
        if all(len(row) == length for row in rows):
            return np.stack(rows).astype(dtype, copy=False)
        if self.pad_id is None:
            raise ValueError(f"{type(self).__name__}: rows of {name} need padding but no pad_id was given")
        out = np.full((len(rows), length), self.pad_id, dtype=dtype)
        for i, row in enumerate(rows):
            out[i, : len(row)] = row
        return out


def collator_for(dataset: Any, **kwargs: Any):
    """The collator for a dataset's examples (family and columns), with its pad id.

    ``decoder`` -> :class:`PrefixLMCollator` when examples carry ``prefix_length``, else
    :class:`CausalCollator`; ``encoder`` -> :class:`MLMCollator`; ``seq2seq`` ->
    :class:`Seq2SeqCollator` (decoder start: the objective's ``decoder_start`` role, eos for
    bart, else pad). ``kwargs`` go to it.

    Raises:
        UnsupportedSchemaError: a family no collator handles (or a mixture of families).
    """
    family, columns = dataset.family, set(dataset.example_columns())
    special = dataset.special_ids
    pad = kwargs.pop("pad_id", special.get("pad"))
    if family == "decoder":
        if "prefix_length" in columns:
            return PrefixLMCollator(pad, **kwargs)
        return CausalCollator(pad, **kwargs)
    if pad is None:
        raise UnsupportedSchemaError(f"{family} examples need a pad id; the dataset's tokenizer has none (pass pad_id)")
    if family == "encoder":
        return MLMCollator(pad, **kwargs)
    if family == "seq2seq":
        if "decoder_start_id" not in kwargs:
            from transforms.objectives.registry import decoder_start_role

            role = decoder_start_role(dataset.objective_name)
            if role != "pad":  # the collator's own default
                kwargs["decoder_start_id"] = special.get(role)
        return Seq2SeqCollator(pad, **kwargs)
    raise UnsupportedSchemaError(f"no collator for example family {family!r} (columns {sorted(columns)})")
