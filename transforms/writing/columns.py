"""Examples of one schema stored column by column: :class:`ExampleColumns`, and
:class:`MergedColumns` (rows taken from several of them in another order), with their
Arrow record-batch view (no Beam).

The pipeline moves examples between stages and the shard encoders (:mod:`transforms.writing.shard_format`,
:mod:`transforms.writing.tar_format`) read them in this form.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np
import pyarrow as pa

from schemas.examples import ExampleSchema

__all__ = ["ARROW_BATCH_ROWS", "ExampleColumns", "MergedColumns", "narrowest"]

#: Rows per Arrow record batch of a shard; fixed so that bytes never depend on the runner.
ARROW_BATCH_ROWS = 1000


class ExampleColumns:
    """Examples of one schema stored column by column (numpy, no per-row objects).

    The pipeline moves examples between stages and writes shards in this form: one
    ``int32`` buffer plus row offsets per array column, one ``int32`` array per scalar
    column, one list per string column. :meth:`encode` turns it into a tuple of bytes,
    lists and ints that Beam's default coder encodes without pickling.

    Attributes:
        schema: the example schema.
        count: number of rows.
        arrays: array column -> ``(flat values, int64 offsets of length count + 1)``: int32 as
            built; uint16 or int16 when decoded from :meth:`encode` (read as int32 by every
            writer's view: :meth:`record_batches`, :meth:`array_rows`).
        scalars: scalar column -> int32 array of ``count`` values.
        strings: string column -> list of ``count`` strings.
    """

    __slots__ = ("schema", "count", "arrays", "scalars", "strings")

    def __init__(self, schema: ExampleSchema, count: int, arrays: dict, scalars: dict, strings: dict):
        self.schema, self.count = schema, count
        self.arrays, self.scalars, self.strings = arrays, scalars, strings

    @classmethod
    def from_examples(cls, examples: Sequence[dict[str, Any]], schema: ExampleSchema) -> ExampleColumns:
        """Columns of ``examples`` (dicts of column -> value).

        Raises:
            ValueError: a fixed-length column has a row of another length.
        """
        arrays = {}
        for name in schema.array_columns:
            values = [np.asarray(example[name], dtype=np.int32) for example in examples]
            lengths = np.fromiter((v.shape[0] for v in values), dtype=np.int64, count=len(values))
            fixed = schema.fixed_length(name)
            if fixed is not None and values and (lengths != fixed).any():
                bad = int(lengths[np.argmax(lengths != fixed)])
                raise ValueError(f"column {name!r} is fixed at {fixed} tokens, got a row of {bad}")
            offsets = np.zeros(len(values) + 1, dtype=np.int64)
            np.cumsum(lengths, out=offsets[1:])
            flat = np.concatenate(values) if values else np.zeros(0, np.int32)
            arrays[name] = (flat, offsets)
        scalars = {
            name: np.fromiter((example[name] for example in examples), dtype=np.int32, count=len(examples))
            for name in schema.scalar_columns
        }
        strings = {name: [str(example[name]) for example in examples] for name in schema.string_columns}
        return cls(schema, len(examples), arrays, scalars, strings)

    @classmethod
    def concat(cls, parts: Sequence[ExampleColumns], schema: ExampleSchema) -> ExampleColumns:
        """Rows of ``parts`` one after the other."""
        if len(parts) == 1:
            return parts[0]
        arrays = {}
        for name in schema.array_columns:
            flats = [p.arrays[name][0] for p in parts]
            lengths = [np.diff(p.arrays[name][1]) for p in parts]
            merged = np.concatenate(lengths) if lengths else np.zeros(0, np.int64)
            offsets = np.zeros(len(merged) + 1, dtype=np.int64)
            np.cumsum(merged, out=offsets[1:])
            arrays[name] = (np.concatenate(flats) if flats else np.zeros(0, np.int32), offsets)
        scalars = {
            name: np.concatenate([p.scalars[name] for p in parts]) if parts else np.zeros(0, np.int32)
            for name in schema.scalar_columns
        }
        strings = {name: [value for p in parts for value in p.strings[name]] for name in schema.string_columns}
        return cls(schema, sum(p.count for p in parts), arrays, scalars, strings)

    def take(self, indices: np.ndarray) -> ExampleColumns:
        """The rows at ``indices``, in that order."""
        indices = np.asarray(indices, dtype=np.int64)
        arrays = {}
        for name, (flat, offsets) in self.arrays.items():
            fixed = self.schema.fixed_length(name)
            if fixed is not None:  # rows of equal length: a 2-D row gather
                rows = flat.reshape(-1, fixed)[indices].reshape(-1)
                arrays[name] = (rows, np.arange(len(indices) + 1, dtype=np.int64) * fixed)
                continue
            starts = offsets[:-1][indices]
            lengths = offsets[1:][indices] - starts
            new_offsets = np.zeros(len(indices) + 1, dtype=np.int64)
            np.cumsum(lengths, out=new_offsets[1:])
            if len(indices) and new_offsets[-1] >= 64 * len(indices):
                # Long rows: copying row slices beats building an index per value.
                ends = starts + lengths
                rows = [flat[a:b] for a, b in zip(starts.tolist(), ends.tolist())]
                arrays[name] = (np.concatenate(rows).astype(np.int32, copy=False), new_offsets)
                continue
            # Position p of output row r reads flat[starts[r] + (p - new_offsets[r])].
            gather = np.arange(new_offsets[-1], dtype=np.int64) + np.repeat(starts - new_offsets[:-1], lengths)
            arrays[name] = (flat[gather], new_offsets)
        scalars = {name: values[indices] for name, values in self.scalars.items()}
        strings = {name: [values[i] for i in indices.tolist()] for name, values in self.strings.items()}
        return ExampleColumns(self.schema, len(indices), arrays, scalars, strings)

    def array_rows(self, column: str) -> tuple[np.ndarray, list]:
        """``(lengths, rows)`` of an array column: each row's length and its int32 values as a
        buffer (a view, no copy), for writers that take the rows one by one."""
        flat, offsets = self.arrays[column]
        flat = np.ascontiguousarray(flat, dtype=np.int32)
        lengths = np.diff(offsets)
        if self.count == 0:
            return lengths, []
        values = flat[offsets[0] : offsets[-1]]
        if (lengths == lengths[0]).all():
            return lengths, list(values.reshape(self.count, int(lengths[0])))
        data = memoryview(values).cast("B")
        bounds = (4 * (offsets - offsets[0])).tolist()
        return lengths, [data[a:b] for a, b in zip(bounds[:-1], bounds[1:])]

    def row(self, index: int) -> dict[str, Any]:
        """Row ``index`` as an example dict (arrays are views)."""
        example: dict[str, Any] = {}
        for name, (flat, offsets) in self.arrays.items():
            example[name] = flat[offsets[index] : offsets[index + 1]]
        for name, values in self.scalars.items():
            example[name] = int(values[index])
        for name, values in self.strings.items():
            example[name] = values[index]
        return example

    def record_batches(self, rows: int | None = None) -> Iterator[pa.RecordBatch]:
        """Arrow record batches of ``rows`` rows (default :data:`ARROW_BATCH_ROWS`; the last one shorter)."""
        rows = rows or ARROW_BATCH_ROWS
        for start in range(0, self.count, rows):
            stop = min(start + rows, self.count)
            arrays = []
            for f in self.schema.schema:
                name = f.name
                if name in self.arrays:
                    flat, offsets = self.arrays[name]
                    values = pa.array(flat[offsets[start] : offsets[stop]], type=pa.int32())
                    fixed = self.schema.fixed_length(name)
                    if fixed is not None:
                        arrays.append(pa.FixedSizeListArray.from_arrays(values, fixed))
                    else:
                        local = (offsets[start : stop + 1] - offsets[start]).astype(np.int32)
                        arrays.append(pa.ListArray.from_arrays(pa.array(local, type=pa.int32()), values))
                elif name in self.scalars:
                    arrays.append(pa.array(self.scalars[name][start:stop], type=f.type))
                else:
                    arrays.append(pa.array(self.strings[name][start:stop], type=f.type))
            yield pa.RecordBatch.from_arrays(arrays, schema=self.schema.schema)

    def encode(self) -> tuple:
        """A tuple of ints, bytes, lists and dicts (cheap for Beam's default coder).

        Each array column's values travel in the narrowest of uint16, int16 and int32 that holds
        them all (token ids of a vocabulary of up to 65,536 entries, labels with -100), with
        their dtype: half the bytes to send, and to hold in front of the shard shuffle; they are
        read back as the same integers, and written as int32.
        """
        return (
            self.count,
            {name: (*_narrow(flat), offsets.tobytes()) for name, (flat, offsets) in self.arrays.items()},
            {name: values.tobytes() for name, values in self.scalars.items()},
            dict(self.strings),
        )

    @classmethod
    def decode(cls, encoded: tuple, schema: ExampleSchema) -> ExampleColumns:
        """Inverse of :meth:`encode`."""
        count, arrays, scalars, strings = encoded
        return cls(
            schema,
            count,
            {name: _widen(*encoded) for name, encoded in arrays.items()},
            {name: np.frombuffer(values, dtype=np.int32) for name, values in scalars.items()},
            {name: list(values) for name, values in strings.items()},
        )


#: The dtypes array column values may travel in (:meth:`ExampleColumns.encode`).
_TRAVEL_DTYPES = {"<u2": np.dtype("<u2"), "<i2": np.dtype("<i2"), "<i4": np.dtype("<i4")}


def narrowest(values: np.ndarray, candidates: tuple[str, ...] = ("<u2", "<i2")) -> np.ndarray:
    """``values`` in the first of ``candidates`` that holds every one of them (an empty array in
    the first), else as int32: how token ids and example values cross a shuffle."""
    if not values.size:
        return values.astype(candidates[0])
    low, high = int(values.min()), int(values.max())
    for candidate in candidates:
        info = np.iinfo(candidate)
        if info.min <= low and high <= info.max:
            return values.astype(candidate)
    return values.astype("<i4", copy=False)


def _narrow(flat: np.ndarray) -> tuple[bytes, str]:
    """``(bytes, dtype)`` of ``flat`` in the narrowest travel dtype that holds every value."""
    narrow = narrowest(flat)
    return narrow.tobytes(), narrow.dtype.str


def _widen(flat: bytes, dtype: str, offsets: bytes) -> tuple[np.ndarray, np.ndarray]:
    """Inverse of :func:`_narrow` with the offsets: ``(values, int64 offsets)``."""
    if dtype not in _TRAVEL_DTYPES:
        raise ValueError(f"example values of dtype {dtype!r}: expected one of {sorted(_TRAVEL_DTYPES)}")
    return np.frombuffer(flat, dtype=_TRAVEL_DTYPES[dtype]), np.frombuffer(offsets, dtype=np.int64)


class MergedColumns:
    """Row ``i`` is row ``row[i]`` of ``parts[part[i]]``, the array values copied only as the
    writers take them: an Arrow record batch at a time, or (tar) not at all.

    A shard's rows come in many pieces and are written in another order; gathering them into
    one array first would copy every token once more, into memory the process has not used
    yet, which is slow to get on some hosts (fresh pages can cost more than the copy). Same
    reading interface as :class:`ExampleColumns` for
    :func:`~transforms.writing.shard_format.write_arrow_columns` and
    :func:`~transforms.writing.tar_format.write_tar_columns`: ``schema``, ``count``, ``scalars``,
    ``strings`` (gathered: they are small), :meth:`record_batches` and :meth:`array_rows`.
    """

    def __init__(self, parts: Sequence[ExampleColumns], part: np.ndarray, row: np.ndarray, schema: ExampleSchema):
        self.schema, self.count = schema, len(part)
        self._parts, self._part = list(parts), np.asarray(part, dtype=np.int64)
        starts = np.zeros(len(parts) + 1, dtype=np.int64)
        np.cumsum([p.count for p in parts], out=starts[1:])
        self._index = starts[self._part] + np.asarray(row, dtype=np.int64)  # each row among the parts end to end
        pairs = list(zip(self._part.tolist(), np.asarray(row).tolist()))
        self.scalars = {
            name: (np.concatenate([p.scalars[name] for p in parts]) if parts else np.zeros(0, np.int32))[self._index]
            for name in schema.scalar_columns
        }
        self.strings = {name: [parts[p].strings[name][r] for p, r in pairs] for name in schema.string_columns}
        self._bounds_of: dict[str, tuple[np.ndarray, np.ndarray]] = {}

    def _bounds(self, column: str) -> tuple[np.ndarray, np.ndarray]:
        """Each row's start and end in the flat values of its part (worked out once per column:
        both formats' writers ask)."""
        bounds = self._bounds_of.get(column)
        if bounds is None:
            offsets = [p.arrays[column][1] for p in self._parts]
            starts = np.concatenate([o[:-1] for o in offsets]) if offsets else np.zeros(0, np.int64)
            ends = np.concatenate([o[1:] for o in offsets]) if offsets else np.zeros(0, np.int64)
            bounds = self._bounds_of[column] = (starts[self._index], ends[self._index])
        return bounds

    def array_rows(self, column: str) -> tuple[np.ndarray, list]:
        """As :meth:`ExampleColumns.array_rows`: views into the parts, in row order."""
        starts, ends = self._bounds(column)
        data = [memoryview(np.ascontiguousarray(p.arrays[column][0], dtype=np.int32)).cast("B") for p in self._parts]
        rows = [data[p][4 * a : 4 * b] for p, a, b in zip(self._part.tolist(), starts.tolist(), ends.tolist())]
        return ends - starts, rows

    def record_batches(self, rows: int | None = None) -> Iterator[pa.RecordBatch]:
        """As :meth:`ExampleColumns.record_batches`; each batch's values are gathered for it alone."""
        rows = rows or ARROW_BATCH_ROWS
        bounds = {name: self._bounds(name) for name in self.schema.array_columns}
        flats = {name: [p.arrays[name][0] for p in self._parts] for name in self.schema.array_columns}
        parts = self._part.tolist()
        for start in range(0, self.count, rows):
            stop = min(start + rows, self.count)
            arrays, scalars = {}, {}
            for name, (begins, ends) in bounds.items():
                local = np.zeros(stop - start + 1, dtype=np.int64)
                np.cumsum(ends[start:stop] - begins[start:stop], out=local[1:])
                sources, first, last = flats[name], begins[start:stop].tolist(), ends[start:stop].tolist()
                values = np.concatenate([sources[p][a:b] for p, a, b in zip(parts[start:stop], first, last)])
                arrays[name] = (values.astype(np.int32, copy=False), local)
            for name, values in self.scalars.items():
                scalars[name] = values[start:stop]
            strings = {name: values[start:stop] for name, values in self.strings.items()}
            batch = ExampleColumns(self.schema, stop - start, arrays, scalars, strings)
            yield from batch.record_batches(stop - start)


