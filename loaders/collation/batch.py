"""Columnar batches: the examples of one batch stored column by column.

The Arrow fast path of :class:`~loaders.dataset.ShardedDataset` gathers a whole batch at
once from the memory-mapped shards instead of building one dict per example: a
fixed-length column (``fixed_size_list<int32>[L]``) becomes one ``(B, L)`` array, an
integer column a ``(B,)`` array, a variable-length one a :class:`Ragged` (offsets and
concatenated values), strings a list. An :class:`ExampleBatch` holds those columns and
is also a ``Sequence`` of example dicts (``batch[i]["input_ids"]``), so code written for
a list of examples reads it unchanged; collators that declare
``accepts_example_batch = True`` (all of :mod:`loaders.collation.collate`) use the columns directly.

This module is pure numpy: no torch.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np

__all__ = ["ExampleBatch", "Ragged", "accepts_example_batch"]


class Ragged:
    """Variable-length rows as ``offsets`` (``n + 1``, int64) into one ``values`` array.

    Row ``i`` is ``values[offsets[i]:offsets[i + 1]]`` (a view).
    """

    __slots__ = ("offsets", "values")

    def __init__(self, offsets: np.ndarray, values: np.ndarray):
        self.offsets, self.values = offsets, values

    @classmethod
    def from_rows(cls, rows: Sequence[np.ndarray], dtype: Any = None) -> Ragged:
        """Concatenate ``rows`` (1-D arrays)."""
        offsets = np.zeros(len(rows) + 1, dtype=np.int64)
        np.cumsum([len(r) for r in rows], out=offsets[1:])
        if rows:
            values = np.concatenate(rows)
            if dtype is not None:
                values = values.astype(dtype, copy=False)
        else:
            values = np.zeros(0, dtype=dtype or np.int32)
        return cls(offsets, values)

    def __len__(self) -> int:
        return len(self.offsets) - 1

    def __getitem__(self, index: int) -> np.ndarray:
        return self.values[self.offsets[index] : self.offsets[index + 1]]

    def lengths(self) -> np.ndarray:
        """Length of each row (int64)."""
        return np.diff(self.offsets)

    def rows(self) -> list[np.ndarray]:
        """Every row, as views."""
        ends = self.offsets.tolist()
        return [self.values[a:b] for a, b in zip(ends[:-1], ends[1:], strict=True)]


class ExampleBatch(Sequence):
    """A batch of examples stored by column; also a sequence of example dicts.

    Args:
        columns: name -> ``(B, ...)`` ndarray (fixed-length and integer columns, one row per
            example), :class:`Ragged` (variable-length columns), or a list of per-example values.
        size: ``B``.

    Example ``i`` (``batch[i]``) is a dict with the same value types as a per-example read:
    a row view for array columns, a Python ``int`` for integer columns, the stored value
    (``str``, ...) for list columns.
    """

    __slots__ = ("columns", "_size")

    def __init__(self, columns: dict[str, Any], size: int):
        self.columns, self._size = columns, size

    def __len__(self) -> int:
        return self._size

    def column(self, name: str) -> Any:
        """The whole column ``name`` (KeyError when absent)."""
        return self.columns[name]

    def __contains__(self, value: object) -> bool:  # Sequence's default would build every example
        return any(value == example for example in self)

    def __getitem__(self, index):
        if isinstance(index, slice):
            return [self[i] for i in range(*index.indices(self._size))]
        if index < 0:
            index += self._size
        if not 0 <= index < self._size:
            raise IndexError(f"example {index} out of range for a batch of {self._size}")
        out: dict[str, Any] = {}
        for name, values in self.columns.items():
            if isinstance(values, np.ndarray) and values.ndim == 1:
                out[name] = int(values[index])
            else:
                out[name] = values[index]
        return out

    def __iter__(self) -> Iterator[dict[str, Any]]:
        for index in range(self._size):
            yield self[index]

    def __repr__(self) -> str:
        return f"ExampleBatch(size={self._size}, columns={list(self.columns)})"


def accepts_example_batch(collate_fn: Any) -> bool:
    """Whether a collate function reads :class:`ExampleBatch` columns (``accepts_example_batch = True``)."""
    return bool(getattr(collate_fn, "accepts_example_batch", False))

