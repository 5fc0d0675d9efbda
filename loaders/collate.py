"""Collators: lists of examples -> dicts of torch tensors, one per model layout.

Every collator returns ``input_ids``, ``attention_mask``, ``labels`` (``-100`` where no
loss) and ``position_ids`` (int64), right-padded to the longest row (or a multiple of
``pad_to_multiple_of``), plus what its layout needs:

- :class:`CausalCollator` (clm): ``documents="none"`` is plain causal attention over the
  packed row (GPT-2/Megatron default); ``"cu_seqlens"`` restarts ``position_ids`` at each
  document and adds FlashAttention's varlen ``cu_seqlens`` (int32, over the flattened
  ``B*L`` tokens; each row's padding is one more segment) and ``max_seqlen``; ``"mask"``
  restarts positions and makes ``attention_mask`` a ``(B, 1, L, L)`` bool block-diagonal
  causal mask (True = may attend). With ``shift_labels`` (default) ``labels[t]`` is the
  token at ``t+1`` (Megatron-style: no shift in the model); with ``shift_labels=False`` it
  is the token at ``t`` (Hugging Face models shift inside). With document attention the
  prediction of a document's first token from the previous document is not trained
  (``mask_document_boundaries``, as HF's ``DataCollatorWithFlattening``).
- :class:`PrefixLMCollator` (prefix_lm, ul2 decoder-only): ``(B, 1, L, L)`` bool mask,
  bidirectional over the first ``prefix_length`` tokens and causal after; loss on the
  suffix only; ``prefix_length`` (B,). Examples without ``prefix_length`` (clm in a
  mixture) are plain causal.
- :class:`MLMCollator` (mlm): bidirectional; labels as stored.
- :class:`Seq2SeqCollator` (span_corruption, bart, ul2 encoder-decoder): ``inputs`` ->
  ``input_ids``/``attention_mask``, ``targets`` -> ``labels``, ``decoder_input_ids`` = labels
  shifted right behind ``decoder_start_id`` (T5: pad; BART: eos), ``decoder_attention_mask``.

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

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from loaders.batch import ExampleBatch, Ragged
from loaders.errors import UnsupportedSchemaError

__all__ = [
    "IGNORE_INDEX",
    "CausalCollator",
    "MLMCollator",
    "PrefixLMCollator",
    "Seq2SeqCollator",
    "StackCollator",
    "collator_for",
]

IGNORE_INDEX = -100
#: Inside a DataLoader worker, pack a batch's arrays into one storage per dtype (off when the
#: loader's shared-memory ring copies them anyway).
_PACK_IN_WORKER = True
#: Inside a DataLoader worker whose shared-memory ring takes this module's collators' outputs:
#: ``allocate(shape, dtype)`` -> where to build an output array (None: a new array). Set by the
#: loader while it reads and collates a group (:meth:`loaders.transport.RingSender.allocate`), so
#: that the outputs are built in the group's slot instead of being copied there.
_ALLOCATE: Callable[[tuple[int, ...], Any], np.ndarray | None] | None = None
DOCUMENT_MODES = ("none", "cu_seqlens", "mask")


def _empty(shape: tuple[int, ...], dtype: Any = np.int64) -> np.ndarray:
    """An uninitialised C-contiguous output array (in the ring's slot when :data:`_ALLOCATE` says so)."""
    if _ALLOCATE is not None:
        out = _ALLOCATE(shape, dtype)
        if out is not None:
            return out
    return np.empty(shape, dtype=dtype)


def _require(name: str, examples: Sequence[dict[str, Any]], columns: Sequence[str]) -> None:
    if not len(examples):
        raise ValueError(f"{name}: empty batch")
    have = examples.columns if isinstance(examples, ExampleBatch) else examples[0]
    missing = [c for c in columns if c not in have]
    if missing:
        raise UnsupportedSchemaError(
            f"{name} needs columns {list(columns)}; the examples have {sorted(have)} (missing {missing})"
        )


def _rows(examples: Sequence[dict[str, Any]], name: str) -> np.ndarray | list[np.ndarray]:
    """Column ``name``: a ``(B, L)`` array (a fixed-length column of an ExampleBatch) or a list of rows."""
    if isinstance(examples, ExampleBatch):
        column = examples.columns[name]
        if isinstance(column, np.ndarray) and column.ndim == 2:
            return column
        if isinstance(column, Ragged):
            return column.rows()
        return [np.asarray(row) for row in column]
    return [np.asarray(e[name]) for e in examples]


def _lengths(rows: np.ndarray | list[np.ndarray]) -> list[int]:
    if isinstance(rows, np.ndarray):
        return [rows.shape[1]]  # every row: only the longest matters
    return [len(row) for row in rows]


def _scalars(examples: Sequence[dict[str, Any]], name: str, default: int) -> np.ndarray:
    """An integer column as an int64 ``(B,)`` array (``default`` where absent)."""
    if isinstance(examples, ExampleBatch):
        column = examples.columns.get(name)
        if column is None:
            return np.full(len(examples), default, dtype=np.int64)
        return np.asarray(column, dtype=np.int64)
    return np.array([int(e.get(name, default)) for e in examples], dtype=np.int64)


def _batch_length(lengths: Sequence[int], multiple: int | None, fixed: int | None = None, what: str = "") -> int:
    longest = max(lengths)
    if fixed is not None:
        if longest > fixed:
            raise ValueError(f"{what} of {longest} tokens does not fit the fixed length {fixed}")
        return fixed
    if multiple:
        longest = -(-longest // multiple) * multiple
    return longest


def _padded_input_ids(collator, examples: Sequence[dict[str, Any]], required: list[str]) -> tuple:
    """Check ``required`` columns; ``(input_ids rows, (B, L) int64 input_ids padded with the collator's
    pad_id to the batch length)`` (rounded up to its ``pad_to_multiple_of``)."""
    name = type(collator).__name__
    _require(name, examples, required)
    rows = _rows(examples, "input_ids")
    length = _batch_length(_lengths(rows), collator.pad_to_multiple_of)
    return rows, _pad_rows(rows, length, collator.pad_id, name)


def _pad_rows(rows: np.ndarray | Sequence[np.ndarray], length: int, value: int | None, what: str) -> np.ndarray:
    out = _empty((len(rows), length))
    if isinstance(rows, np.ndarray):  # (B, L') block: one pass
        width = rows.shape[1]
        out[:, :width] = rows
        if width < length:
            if value is None:
                raise ValueError(f"{what}: rows need padding but no pad id was given")
            out[:, width:] = value
        return out
    if all(len(row) == length for row in rows):
        return np.stack(rows, out=out)  # one pass: gather and widen to int64
    for i, row in enumerate(rows):
        n = len(row)
        out[i, :n] = row
        if n < length:
            if value is None:
                raise ValueError(f"{what}: rows need padding but no pad id was given")
            out[i, n:] = value
    return out


def _tensors(arrays: dict[str, Any]) -> dict[str, Any]:
    """numpy -> torch without a copy; inside a DataLoader worker, one storage per dtype.

    A worker hands every tensor storage to the main process as its own shared-memory
    segment, and that transfer, not the copy, is what limits a worker's batches per second;
    packing a batch's arrays into one storage per dtype roughly halves it for four arrays.
    """
    import torch
    from torch.utils.data import get_worker_info

    if not _PACK_IN_WORKER or get_worker_info() is None:
        return {k: torch.from_numpy(v) if isinstance(v, np.ndarray) else v for k, v in arrays.items()}
    out = {k: v for k, v in arrays.items() if not isinstance(v, np.ndarray)}
    by_dtype: dict[np.dtype, list[str]] = {}
    for name, value in arrays.items():
        if isinstance(value, np.ndarray):
            by_dtype.setdefault(value.dtype, []).append(name)
    for names in by_dtype.values():
        flat = torch.empty(sum(arrays[n].size for n in names), dtype=torch.from_numpy(arrays[names[0]][:0]).dtype)
        offset = 0
        for name in names:
            value = arrays[name]
            view = flat[offset : offset + value.size].view(value.shape)
            view.copy_(torch.from_numpy(np.ascontiguousarray(value)))
            out[name] = view
            offset += value.size
    return {name: out[name] for name in arrays}


def _real_length(example: dict[str, Any]) -> int:
    doc_lengths = example.get("doc_lengths")
    if doc_lengths is None:
        return len(example["input_ids"])
    return sum(doc_lengths.tolist()) if isinstance(doc_lengths, np.ndarray) else int(sum(doc_lengths))


def _real_lengths(examples: Sequence[dict[str, Any]], rows: np.ndarray | list[np.ndarray]) -> np.ndarray:
    """Tokens before the padding of each row: the sum of ``doc_lengths`` (or the row length)."""
    if isinstance(examples, ExampleBatch) and isinstance(rows, np.ndarray):
        docs = examples.columns.get("doc_lengths")
        if docs is None:
            return np.full(len(examples), rows.shape[1], dtype=np.int64)
        if isinstance(docs, Ragged):
            total = np.zeros(docs.values.size + 1, dtype=np.int64)
            np.cumsum(docs.values, out=total[1:])
            return total[docs.offsets[1:]] - total[docs.offsets[:-1]]
    return np.array([_real_length(e) for e in examples])


def _document_segments(examples: Sequence[dict[str, Any]], real: np.ndarray,
                       length: int) -> tuple[np.ndarray, np.ndarray]:
    """Segments of the flattened batch: each row's documents (non-empty ones), then its padding.

    Returns ``(segment lengths, boundary)``; ``boundary`` marks a document that does not open its row.
    """
    docs = examples.columns.get("doc_lengths") if isinstance(examples, ExampleBatch) else None
    if isinstance(docs, Ragged) or (isinstance(examples, ExampleBatch) and docs is None):
        # vectorised: the same segments as the per-row loop below
        if docs is None:
            values, row_of = real, np.arange(len(examples))
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
        row_docs = [d for d in (row_docs.tolist() if row_docs is not None else [int(real[i])]) if d > 0]
        pieces += row_docs
        boundary_flags += [False] + [True] * (len(row_docs) - 1) if row_docs else []
        if length > real[i]:
            pieces.append(length - int(real[i]))
            boundary_flags.append(False)
    return np.array(pieces, dtype=np.int64), np.array(boundary_flags, dtype=bool)


class CausalCollator:
    """Causal LM batches from ``input_ids`` (+ ``doc_lengths``), see the module docstring.

    Args:
        pad_id: padding id (needed only when rows differ in length).
        documents: ``none``, ``cu_seqlens`` or ``mask``.
        shift_labels: ``labels[t] = input_ids[t+1]`` (True) or ``input_ids[t]`` (False).
        mask_document_boundaries: no loss on predicting a document's first token from the
            previous document (only with document attention).
        pad_to_multiple_of: round the batch length up.
    """

    def __init__(self, pad_id: int | None = None, *, documents: str = "cu_seqlens", shift_labels: bool = True,
                 mask_document_boundaries: bool = True, pad_to_multiple_of: int | None = None):
        if documents not in DOCUMENT_MODES:
            raise ValueError(f"documents={documents!r}: expected one of {DOCUMENT_MODES}")
        self.pad_id, self.documents, self.shift_labels = pad_id, documents, shift_labels
        self.mask_document_boundaries, self.pad_to_multiple_of = mask_document_boundaries, pad_to_multiple_of

    accepts_example_batch = True
    retains_examples = False

    def __call__(self, examples: Sequence[dict[str, Any]]) -> dict[str, Any]:
        rows, input_ids = _padded_input_ids(self, examples, ["input_ids"])
        length = input_ids.shape[1]
        batch = len(rows)
        t = np.arange(length)
        real = _real_lengths(examples, rows)
        labels = _empty((batch, length))
        if self.shift_labels:
            labels[:, :-1] = input_ids[:, 1:]
            labels[:, -1] = IGNORE_INDEX
        else:
            labels[:] = input_ids
        if (real == length).all():  # packed rows without padding: the common case
            attention = _empty((batch, length))
            attention.fill(1)
        else:
            attention = (t[None, :] < real[:, None]).astype(np.int64)
            labels[t[None, :] + int(self.shift_labels) >= real[:, None]] = IGNORE_INDEX
        out: dict[str, Any] = {"input_ids": input_ids, "attention_mask": attention, "labels": labels}
        positions = _empty((batch, length))
        if self.documents == "none":
            positions[...] = t
            out["position_ids"] = positions
            return _tensors(out)
        # Segments over the flattened batch: each row's documents, then the row's padding.
        segment_lengths, boundary_flags = _document_segments(examples, real, length)
        ends = np.cumsum(segment_lengths)
        starts = ends - segment_lengths
        np.subtract(np.arange(batch * length), np.repeat(starts, segment_lengths), out=positions.reshape(-1))
        out["position_ids"] = positions
        if self.mask_document_boundaries:
            boundary = starts[boundary_flags]
            labels.reshape(-1)[boundary - 1 if self.shift_labels else boundary] = IGNORE_INDEX
        if self.documents == "cu_seqlens":
            out["cu_seqlens"] = np.concatenate([[0], ends]).astype(np.int32)
            out["max_seqlen"] = int(segment_lengths.max())
        else:
            segment_ids = np.repeat(np.arange(segment_lengths.size), segment_lengths).reshape(batch, length)
            same = segment_ids[:, :, None] == segment_ids[:, None, :]
            out["attention_mask"] = (same & (t[None, None, :] <= t[None, :, None]))[:, None]
        return _tensors(out)


class PrefixLMCollator:
    """Prefix-LM batches from ``input_ids`` + ``prefix_length`` (+ ``doc_lengths`` for padding).

    Args:
        pad_id: padding id (needed only when rows differ in length).
        shift_labels: as :class:`CausalCollator`.
        pad_to_multiple_of: round the batch length up.
    """

    def __init__(self, pad_id: int | None = None, *, shift_labels: bool = True, pad_to_multiple_of: int | None = None):
        self.pad_id, self.shift_labels, self.pad_to_multiple_of = pad_id, shift_labels, pad_to_multiple_of

    accepts_example_batch = True
    retains_examples = False

    def __call__(self, examples: Sequence[dict[str, Any]]) -> dict[str, Any]:
        rows, input_ids = _padded_input_ids(self, examples, ["input_ids"])
        length = input_ids.shape[1]
        real = _real_lengths(examples, rows)
        prefix = _scalars(examples, "prefix_length", 0)
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
            keep = (t[None, :] >= prefix[:, None]) & (t[None, :] < real[:, None])
            labels[:] = np.where(keep, input_ids, IGNORE_INDEX)
        return _tensors({
            "input_ids": input_ids,
            "attention_mask": allowed[:, None],
            "labels": labels,
            "position_ids": np.broadcast_to(t, (len(rows), length)).copy(),
            "prefix_length": prefix.astype(np.int64),
        })


class MLMCollator:
    """Masked-LM batches from ``input_ids`` + ``labels`` (bidirectional attention).

    Args:
        pad_id: padding id: padded and stored padding positions get no attention.
        pad_to_multiple_of: round the batch length up.
    """

    def __init__(self, pad_id: int, *, pad_to_multiple_of: int | None = None):
        self.pad_id, self.pad_to_multiple_of = pad_id, pad_to_multiple_of

    accepts_example_batch = True
    retains_examples = False

    def __call__(self, examples: Sequence[dict[str, Any]]) -> dict[str, Any]:
        _, input_ids = _padded_input_ids(self, examples, ["input_ids", "labels"])
        length = input_ids.shape[1]
        labels = _pad_rows(_rows(examples, "labels"), length, IGNORE_INDEX, "labels")
        attention = (input_ids != self.pad_id).astype(np.int64)
        return _tensors({
            "input_ids": input_ids,
            "attention_mask": attention,
            "labels": np.where(attention == 1, labels, IGNORE_INDEX),
            "position_ids": np.broadcast_to(np.arange(length), input_ids.shape).copy(),
        })


class Seq2SeqCollator:
    """Encoder-decoder batches from ``inputs`` + ``targets``.

    Args:
        pad_id: padding id (also ends padded targets in ``decoder_input_ids``).
        decoder_start_id: first decoder input (None: ``pad_id``, T5's convention; BART uses eos).
        inputs_length, targets_length: pad to these fixed lengths (error when longer).
        pad_to_multiple_of: round variable batch lengths up.
    """

    def __init__(self, pad_id: int, *, decoder_start_id: int | None = None, inputs_length: int | None = None,
                 targets_length: int | None = None, pad_to_multiple_of: int | None = None):
        self.pad_id = pad_id
        self.decoder_start_id = pad_id if decoder_start_id is None else decoder_start_id
        self.inputs_length, self.targets_length = inputs_length, targets_length
        self.pad_to_multiple_of = pad_to_multiple_of

    accepts_example_batch = True
    retains_examples = False

    def __call__(self, examples: Sequence[dict[str, Any]]) -> dict[str, Any]:
        _require(type(self).__name__, examples, ["inputs", "targets"])
        inputs = _rows(examples, "inputs")
        targets = _rows(examples, "targets")
        in_len = _batch_length(_lengths(inputs), self.pad_to_multiple_of, self.inputs_length, "inputs")
        out_len = _batch_length(_lengths(targets), self.pad_to_multiple_of, self.targets_length, "targets")
        input_ids = _pad_rows(inputs, in_len, self.pad_id, "inputs")
        target_ids = _pad_rows(targets, out_len, self.pad_id, "targets")
        real_targets = target_ids != self.pad_id
        decoder_input_ids = np.empty_like(target_ids)
        decoder_input_ids[:, 0] = self.decoder_start_id
        decoder_input_ids[:, 1:] = target_ids[:, :-1]
        return _tensors({
            "input_ids": input_ids,
            "attention_mask": (input_ids != self.pad_id).astype(np.int64),
            "labels": np.where(real_targets, target_ids, IGNORE_INDEX),
            "position_ids": np.broadcast_to(np.arange(in_len), (len(inputs), in_len)).copy(),
            "decoder_input_ids": decoder_input_ids,
            "decoder_attention_mask": np.concatenate(
                [np.ones((len(targets), 1), dtype=np.int64), real_targets[:, :-1].astype(np.int64)], axis=1),
        })


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
    retains_examples = False

    def __init__(self, columns: Sequence[str] = ("input_ids",), *, pad_id: int | None = None):
        if isinstance(columns, str) or not columns:
            raise ValueError(f"columns must be a non-empty list of names, got {columns!r}")
        self.columns, self.pad_id = tuple(columns), pad_id

    def __call__(self, examples: Sequence[dict[str, Any]]) -> dict[str, Any]:
        _require(type(self).__name__, examples, self.columns)
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
        return _tensors(out)

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
    :class:`Seq2SeqCollator` (decoder start = eos for bart, else pad). ``kwargs`` go to it.

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
        if "decoder_start_id" not in kwargs and dataset.objective_name == "bart":
            kwargs["decoder_start_id"] = special.get("eos")
        return Seq2SeqCollator(pad, **kwargs)
    raise UnsupportedSchemaError(f"no collator for example family {family!r} (columns {sorted(columns)})")
