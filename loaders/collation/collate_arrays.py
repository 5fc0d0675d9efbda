"""numpy building blocks of the collators (:mod:`loaders.collation.collate`): rows fitted to a batch length
(trailing padding cut, short rows padded), real row lengths, and the hand-over
as torch tensors. torch is imported only to wrap the finished arrays.
"""

from __future__ import annotations

import contextvars
from collections.abc import Sequence
from typing import Any

import numpy as np

from loaders.collation.batch import ExampleBatch, Ragged
from loaders.errors import UnsupportedSchemaError

__all__ = ["batch_length", "collated_length", "column_rows", "content_lengths", "fit_rows", "real_length",
           "real_lengths", "require_columns", "row_widths", "to_tensors"]

def require_columns(name: str, examples: Sequence[dict[str, Any]], columns: Sequence[str]) -> None:
    if not len(examples):
        raise ValueError(f"{name}: empty batch")
    have = examples.columns if isinstance(examples, ExampleBatch) else examples[0]
    missing = [c for c in columns if c not in have]
    if missing:
        raise UnsupportedSchemaError(
            f"{name} needs columns {list(columns)}; the examples have {sorted(have)} (missing {missing})"
        )


def column_rows(examples: Sequence[dict[str, Any]], name: str) -> np.ndarray | list[np.ndarray]:
    """Column ``name``: a ``(B, L)`` array (a fixed-length column of an ExampleBatch) or a list of rows."""
    if isinstance(examples, ExampleBatch):
        column = examples.columns[name]
        if isinstance(column, np.ndarray) and column.ndim == 2:
            return column
        if isinstance(column, Ragged):
            return column.rows()
        return [np.asarray(row) for row in column]
    return [np.asarray(e[name]) for e in examples]


def row_widths(rows: np.ndarray | list[np.ndarray]) -> list[int]:
    if isinstance(rows, np.ndarray):
        return [rows.shape[1]]  # every row: only the longest matters
    return [len(row) for row in rows]


def batch_length(lengths: Sequence[int], multiple: int | None, fixed: int | None = None, what: str = "") -> int:
    longest = max(max(lengths), 1)
    if fixed is not None:
        if longest > fixed:
            raise ValueError(f"{what} of {longest} tokens does not fit the fixed length {fixed}")
        return fixed
    if multiple:
        longest = -(-longest // multiple) * multiple
    return longest


def fit_rows(rows: np.ndarray | Sequence[np.ndarray], length: int, value: int | None, what: str) -> np.ndarray:
    """``(B, length)`` int64: each row cut to ``length`` (only its padding is cut) or right-padded with ``value``."""
    out = np.empty((len(rows), length), dtype=np.int64)
    if isinstance(rows, np.ndarray):  # (B, L') block: one pass
        width = rows.shape[1]
        out[:, : min(width, length)] = rows[:, :length]
        if width < length:
            if value is None:
                raise ValueError(f"{what}: rows need padding but no pad id was given")
            out[:, width:] = value
        return out
    if all(len(row) == length for row in rows):
        return np.stack(rows, out=out)  # one pass: gather and widen to int64
    for i, row in enumerate(rows):
        n = min(len(row), length)
        out[i, :n] = row[:n]
        if n < length:
            if value is None:
                raise ValueError(f"{what}: rows need padding but no pad id was given")
            out[i, n:] = value
    return out


#: Set while a loader worker collates a group of batches whose storages it packs itself
#: (:func:`loaders.streaming.dataloader._one_storage_per_dtype`): :func:`to_tensors` then copies nothing.
_GROUPED: contextvars.ContextVar[bool] = contextvars.ContextVar("lmshards_grouped_batches", default=False)


def to_tensors(arrays: dict[str, Any]) -> dict[str, Any]:
    """numpy -> torch without a copy; inside a DataLoader worker, one storage per dtype.

    A worker hands every tensor storage to the main process as its own shared-memory
    segment, and that transfer, not the copy, is what limits a worker's batches per second;
    packing a batch's arrays into one storage per dtype roughly halves it for four arrays.
    (The loader's own workers pack a whole group of batches at once, see ``_GROUPED``.)
    """
    import torch
    from torch.utils.data import get_worker_info

    if get_worker_info() is None or _GROUPED.get():
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


def real_length(example: dict[str, Any]) -> int:
    doc_lengths = example.get("doc_lengths")
    if doc_lengths is None:
        return len(example["input_ids"])
    return sum(doc_lengths.tolist()) if isinstance(doc_lengths, np.ndarray) else int(sum(doc_lengths))


def real_lengths(examples: Sequence[dict[str, Any]], rows: np.ndarray | list[np.ndarray]) -> np.ndarray:
    """Tokens before the padding of each row: the sum of ``doc_lengths`` (or the row length)."""
    if isinstance(examples, ExampleBatch) and isinstance(rows, np.ndarray):
        docs = examples.columns.get("doc_lengths")
        if docs is None:
            return np.full(len(examples), rows.shape[1], dtype=np.int64)
        if isinstance(docs, Ragged):
            total = np.zeros(docs.values.size + 1, dtype=np.int64)
            np.cumsum(docs.values, out=total[1:])
            return total[docs.offsets[1:]] - total[docs.offsets[:-1]]
    return np.array([real_length(e) for e in examples], dtype=np.int64)


def content_lengths(rows: np.ndarray | list[np.ndarray], pad_id: int) -> np.ndarray:
    """Tokens of each row up to its last non-pad token (its trailing padding cut)."""
    if isinstance(rows, np.ndarray):
        real = rows != pad_id
        last = rows.shape[1] - np.argmax(real[:, ::-1], axis=1)
        return np.where(real.any(axis=1), last, 0).astype(np.int64)
    out = np.zeros(len(rows), dtype=np.int64)
    for i, row in enumerate(rows):
        real = np.flatnonzero(np.asarray(row) != pad_id)
        out[i] = real[-1] + 1 if real.size else 0
    return out


def collated_length(collator: Any, rows: np.ndarray | list[np.ndarray], real: np.ndarray) -> int:
    """The batch length: the longest real row when the collator trims padding, else the widest
    stored row; rounded up to its ``pad_to_multiple_of``."""
    basis = [int(real.max())] if collator.trim_padding else row_widths(rows)
    return batch_length(basis, collator.pad_to_multiple_of)

