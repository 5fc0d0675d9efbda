"""Whole-batch gathers out of the memory maps of opened Arrow shards (:class:`SegmentTable`).

The loader's fast path: :class:`~loaders.access.shards.ShardSet` registers each Arrow shard it
opens (:class:`~loaders.access.arrow_shard.ArrowShard`, whose column views the table reads) and
gathers a batch's rows with one numpy fancy index per fixed-length column, with no
per-example dict; the result is the same :class:`~loaders.collation.batch.ExampleBatch` as a row by
row copy (``strided=False``).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from loaders.access.arrow_shard import _FIXED, _INT, _LIST, _STRING, ArrowShard
from loaders.collation.batch import ExampleBatch, Ragged
from loaders.errors import ShardIntegrityError

__all__ = ["SegmentTable"]


class SegmentTable:
    """Every opened Arrow shard's record batches, numbered globally, for whole-batch gathers.

    A shard's rows are record batches (*segments*) of views into its memory map. The table
    gives each registered shard a range of *table rows* (its rows, in order, after those of
    the shards registered before it) and keeps every segment's first table row, so the
    ``(shard, row)`` pairs of many batches map to ``(segment, row in segment)`` with one
    ``searchsorted`` (:meth:`locate`). Memory: O(segments), never O(rows).

    :meth:`gather` then copies a batch straight out of the memory maps, with no per-example
    dict. A fixed-length column is gathered with a single numpy fancy index: the rows of
    every segment, in all shards, are rows of one read-only strided *window* over the
    process's address space (row ``o`` starts at element ``o`` after the lowest segment's
    address), so ``window[offsets]`` copies the batch's rows in one call. Only the indexed
    rows are read, and each lies inside a segment that this table keeps mapped (it holds
    the shards); the window never outlives the table. Columns that cannot be laid out this
    way (misaligned or non-contiguous rows) are copied row by row.

    Args:
        num_shards: shards of the split.
        strided: False copies every column row by row (the fallback, as a choice: the same examples).
    """

    def __init__(self, num_shards: int, *, strided: bool = True):
        self.strided = strided
        self._offset = np.full(num_shards, -1, dtype=np.int64)  # first table row of each shard
        self._starts: list[int] = []  # first table row of each segment
        self._seg_starts = np.zeros(0, dtype=np.int64)
        self._rows = 0
        self._views: dict[str, list] = {}
        self._kinds: dict[str, int] = {}
        self._windows: dict[str, tuple[np.ndarray, np.ndarray, int] | None] = {}
        self._shards: list[ArrowShard] = []  # keeps registered maps alive

    def registered(self, shard: int) -> bool:
        return self._offset[shard] >= 0

    def register(self, index: int, shard: ArrowShard) -> None:
        """Add the segments of ``shard`` (shard number ``index``)."""
        self._offset[index] = self._rows
        if not shard.num_rows:
            return
        self._starts += [self._rows + s for s in shard._starts]
        self._seg_starts = np.asarray(self._starts, dtype=np.int64)
        self._rows += shard.num_rows
        for name, kind, views in shard.fields(None):
            known = self._kinds.setdefault(name, kind)
            if known != kind:  # cannot happen: the schema is checked against the manifest
                raise ShardIntegrityError(f"shard {shard.name}: column {name} has another layout")
            self._views.setdefault(name, []).extend(views)
        self._shards.append(shard)
        self._windows.clear()  # rebuilt over the new set of segments

    def locate(self, shard_ids: np.ndarray, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """``(segment, row in segment)`` of registered ``(shard, row)`` pairs (vectorised)."""
        table_rows = self._offset[shard_ids] + rows
        segments = np.searchsorted(self._seg_starts, table_rows, side="right") - 1
        return segments, table_rows - self._seg_starts[segments]

    def _window(self, name: str) -> tuple[np.ndarray, np.ndarray, int] | None:
        """``(window, first element of each segment, width)`` of fixed column ``name`` (None: row by row)."""
        if name in self._windows:
            return self._windows[name]
        if not self.strided:
            return None
        views: list[np.ndarray] = self._views[name]
        found = None
        dtype, width = views[0].dtype, views[0].shape[1]
        size = dtype.itemsize
        addresses = np.array([v.__array_interface__["data"][0] for v in views], dtype=np.uint64)
        contiguous = all(v.dtype == dtype and v.shape[1] == width and v.flags.c_contiguous for v in views)
        if contiguous and width and not (addresses % np.uint64(size)).any():
            low = int(addresses.min())
            ends = addresses + np.array([v.nbytes for v in views], dtype=np.uint64)
            span = (int(ends.max()) - low) // size  # elements from the lowest segment to the end of the highest
            if span * width * size < 1 << 62:  # the window's nominal size must fit numpy's index type
                window = np.asarray(_Window(low, span - width + 1, width, dtype))
                first = ((addresses - np.uint64(low)) // np.uint64(size)).astype(np.int64)
                found = (window, first, width)
        self._windows[name] = found
        return found

    def gather(self, segments: np.ndarray, rows: np.ndarray, columns: tuple[str, ...]) -> ExampleBatch:
        """The examples at ``(segments[i], rows[i])`` as one :class:`ExampleBatch` (copies the rows)."""
        n = len(segments)
        out: dict[str, Any] = {}
        pairs: list[tuple[int, int]] | None = None
        for name in columns:
            kind, views = self._kinds[name], self._views[name]
            if kind == _FIXED:
                window = self._window(name)
                if window is not None:
                    values, first, width = window
                    out[name] = values[first[segments] + rows * width]  # one copy of the whole batch
                    continue
            if pairs is None:
                pairs = list(zip(segments.tolist(), rows.tolist(), strict=True))
            if kind == _FIXED:
                first_view = views[0]
                values = np.empty((n, first_view.shape[1]), dtype=first_view.dtype)
                for i, (segment, row) in enumerate(pairs):
                    values[i] = views[segment][row]
                out[name] = values
            elif kind == _INT:
                out[name] = np.fromiter((views[segment][row] for segment, row in pairs), dtype=views[0].dtype,
                                        count=n)
            elif kind == _LIST:
                pieces = []
                for segment, row in pairs:
                    offsets, data = views[segment]
                    pieces.append(data[offsets[row] : offsets[row + 1]])
                out[name] = Ragged.from_rows(pieces, views[0][1].dtype)
            elif kind == _STRING:
                strings = []
                for segment, row in pairs:
                    offsets, data = views[segment]
                    strings.append(data[offsets[row] : offsets[row + 1]].tobytes().decode("utf-8"))
                out[name] = strings
            else:
                out[name] = [views[segment][row].as_py() for segment, row in pairs]
        return ExampleBatch(out, n)


class _Window:
    """``__array_interface__`` of a read-only ``(rows, width)`` window at ``address`` whose row ``o``
    starts ``o`` elements after it (rows overlap; see :class:`SegmentTable`)."""

    def __init__(self, address: int, rows: int, width: int, dtype: np.dtype):
        self.__array_interface__ = {"data": (address, True), "shape": (rows, width), "typestr": dtype.str,
                                    "strides": (dtype.itemsize, dtype.itemsize), "version": 3}
