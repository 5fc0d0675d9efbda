"""Byte-exact encoders of one shard: Arrow IPC stream and WebDataset tar (no Beam).

Both write to any binary, possibly non-seekable handle (a local file, a GCS upload) and
are deterministic: fixed record-batch size, uncompressed Arrow buffers, tar members with
mtime 0, uid/gid 0, empty owner names, mode 0644, and sorted names (examples in the given
order, fields in name order inside an example).
"""

from __future__ import annotations

import collections
import hashlib
import io
import tarfile
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any, BinaryIO

import numpy as np
import pyarrow as pa

from schemas.examples import ExampleSchema

__all__ = [
    "ARROW_BATCH_ROWS",
    "ExampleColumns",
    "HashingWriter",
    "MergedColumns",
    "examples_to_batch",
    "npy_bytes",
    "write_arrow",
    "write_arrow_columns",
    "write_tar",
    "write_tar_columns",
]

#: Rows per Arrow record batch; fixed so that bytes never depend on the runner.
ARROW_BATCH_ROWS = 1000


class HashingWriter(io.RawIOBase):
    """Pass-through writer that counts bytes and computes their sha256.

    With ``background=True`` the bytes are gathered into blocks of :data:`BACKGROUND_BLOCK`
    bytes that one helper thread writes to ``raw`` and hashes, in order, while the caller
    goes on producing the next block (``hashlib`` and file writes release the GIL, so on a
    machine with a spare core that work is free); at most :data:`BACKGROUND_BLOCKS` blocks
    wait. :meth:`finish` (also called by :attr:`sha256`) waits for them and re-raises an error
    of the helper thread.
    """

    def __init__(self, raw: BinaryIO, *, background: bool = False):
        super().__init__()
        self._raw = raw
        self._sha256 = hashlib.sha256()
        self.bytes = 0
        self._background = background
        self._block = bytearray()
        self._pending: collections.deque = collections.deque()
        self._pool: ThreadPoolExecutor | None = None

    def writable(self) -> bool:
        return True

    def _write_and_hash(self, data) -> None:
        self._raw.write(data)
        self._sha256.update(data)

    def _submit(self, data: bytes | bytearray) -> None:
        if self._pool is None:
            self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="lmshards-hash")
        while len(self._pending) >= BACKGROUND_BLOCKS:
            self._pending.popleft().result()
        self._pending.append(self._pool.submit(self._write_and_hash, data))

    def write(self, data) -> int:
        view = memoryview(data).cast("B")
        size = len(view)
        self.bytes += size
        if not self._background:
            self._write_and_hash(view)
            return size
        if type(data) is bytes and size >= BACKGROUND_BLOCK // 4:  # immutable: handed over as it is
            if self._block:
                block, self._block = self._block, bytearray()
                self._submit(block)
            self._submit(data)
            return size
        # Copied: the caller (pyarrow, for one) may reuse its buffer once write returns.
        self._block += view
        if len(self._block) >= BACKGROUND_BLOCK:
            block, self._block = self._block, bytearray()  # handed over, never touched again here
            self._submit(block)
        return size

    def finish(self) -> None:
        """Write and hash everything written so far; re-raise an error of the helper thread."""
        if self._block:
            block, self._block = self._block, bytearray()
            self._submit(block)
        try:
            while self._pending:
                self._pending.popleft().result()
        finally:
            self.stop()

    def stop(self) -> None:
        """Wait for the helper thread and end it (errors are left to :meth:`finish`)."""
        if self._pool is not None:
            self._pool.shutdown(wait=True)
            self._pool = None
        self._pending.clear()

    @property
    def sha256(self):
        """The running ``hashlib.sha256`` of all bytes written (after :meth:`finish`)."""
        self.finish()
        return self._sha256

    def tell(self) -> int:
        return self.bytes

    def flush(self) -> None:
        if not self._background:
            self._raw.flush()


#: Block size and queue depth of a background HashingWriter.
BACKGROUND_BLOCK = 1 << 22
BACKGROUND_BLOCKS = 4


class ExampleColumns:
    """Examples of one schema stored column by column (numpy, no per-row objects).

    The pipeline moves examples between stages and writes shards in this form: one
    ``int32`` buffer plus row offsets per array column, one ``int32`` array per scalar
    column, one list per string column. :meth:`encode` turns it into a tuple of bytes,
    lists and ints that Beam's default coder encodes without pickling.

    Attributes:
        schema: the example schema.
        count: number of rows.
        arrays: array column -> ``(flat int32 values, int64 offsets of length count + 1)``.
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
        """A tuple of ints, bytes, lists and dicts (cheap for Beam's default coder)."""
        return (
            self.count,
            {name: (flat.tobytes(), offsets.tobytes()) for name, (flat, offsets) in self.arrays.items()},
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
            {
                name: (np.frombuffer(flat, dtype=np.int32), np.frombuffer(offsets, dtype=np.int64))
                for name, (flat, offsets) in arrays.items()
            },
            {name: np.frombuffer(values, dtype=np.int32) for name, values in scalars.items()},
            {name: list(values) for name, values in strings.items()},
        )


class MergedColumns:
    """Row ``i`` is row ``row[i]`` of ``parts[part[i]]``, the array values copied only as the
    writers take them: an Arrow record batch at a time, or (tar) not at all.

    A shard's rows come in many pieces and are written in another order; gathering them into
    one array first would copy every token once more, into memory the process has not used
    yet, which is slow to get on some hosts (a 60 MB BART shard: 0.43 s of 0.09 s per merge
    was getting fresh pages). Same reading interface as :class:`ExampleColumns` for
    :func:`write_arrow_columns` and :func:`write_tar_columns`: ``schema``, ``count``,
    ``scalars``, ``strings`` (gathered: they are small), :meth:`record_batches` and
    :meth:`array_rows`.
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


def examples_to_batch(examples: Sequence[dict[str, Any]], schema: ExampleSchema) -> pa.RecordBatch:
    """Columnar record batch of ``examples`` (dicts of column -> value).

    Raises:
        ValueError: a fixed-length column has a row of another length.
    """
    columns = ExampleColumns.from_examples(examples, schema)
    if columns.count == 0:
        return pa.RecordBatch.from_pylist([], schema=schema.schema)
    return next(columns.record_batches(columns.count))


def write_arrow_columns(handle: BinaryIO, columns: ExampleColumns | MergedColumns) -> int:
    """Write the rows of ``columns`` as one Arrow IPC stream (uncompressed, fixed batch rows);
    return the number of rows written."""
    options = pa.ipc.IpcWriteOptions(compression=None)
    rows = 0
    with pa.ipc.new_stream(handle, columns.schema.schema, options=options) as writer:
        for batch in columns.record_batches():
            writer.write_batch(batch)
            rows += batch.num_rows
    return rows


def write_arrow(handle: BinaryIO, examples: Sequence[dict[str, Any]], schema: ExampleSchema) -> None:
    """Write ``examples`` as one Arrow IPC stream (uncompressed, fixed batch rows)."""
    write_arrow_columns(handle, ExampleColumns.from_examples(examples, schema))


_NPY_HEADERS: dict[tuple[str, tuple[int, ...]], bytes] = {}


def npy_bytes(array: np.ndarray) -> bytes:
    """``.npy`` bytes of an array (no pickling, deterministic header).

    Same bytes as ``np.save``; the header depends only on dtype and shape, so it is made
    once per (dtype, shape) and reused.
    """
    # np.ascontiguousarray would turn a 0-d scalar into shape (1,); asarray(order="C") keeps it.
    array = np.asarray(array, order="C")
    if array.dtype.hasobject:
        raise ValueError("object arrays cannot be stored as .npy without pickling")
    return _npy_header(array.dtype, array.shape) + array.tobytes()


def _npy_header(dtype: np.dtype, shape: tuple[int, ...]) -> bytes:
    """The ``.npy`` header of arrays of ``dtype`` and ``shape`` (cached)."""
    cache_key = (dtype.str, shape)
    header = _NPY_HEADERS.get(cache_key)
    if header is None:
        empty = np.zeros(shape, dtype=dtype)
        buffer = io.BytesIO()
        np.lib.format.write_array(buffer, empty, allow_pickle=False)
        header = buffer.getvalue()[: len(buffer.getvalue()) - empty.nbytes]
        if len(_NPY_HEADERS) < 4096:
            _NPY_HEADERS[cache_key] = header
    return header


_BLOCK = tarfile.BLOCKSIZE
_RECORD = tarfile.RECORDSIZE


def _ustar_template() -> bytes:
    """A USTAR header for a regular file: mode 0644, uid/gid 0, mtime 0, no owner names, with
    the name, size and checksum left to fill in (:func:`_member_headers`)."""
    header = bytearray(_BLOCK)
    header[100:108] = b"0000644\0"
    header[108:116] = b"0000000\0"
    header[116:124] = b"0000000\0"
    header[136:148] = b"00000000000\0"
    header[148:156] = b"        "  # the checksum counts its own field as spaces
    header[156:157] = tarfile.REGTYPE
    header[257:265] = tarfile.POSIX_MAGIC
    return bytes(header)


_USTAR_TEMPLATE = _ustar_template()


def _check_key(key: str) -> None:
    if "." in key or "/" in key:
        raise ValueError(f"example key {key!r} may not contain '.' or '/' (it is the WebDataset __key__)")


def example_members(example: dict[str, Any], schema: ExampleSchema) -> list[tuple[str, bytes]]:
    """``(member name, payload)`` of one example, sorted by name.

    Token and integer-list columns become int32 ``.npy``; scalar ints a 0-d int32 ``.npy``;
    strings other than the key a UTF-8 ``.txt``.
    """
    key = example["key"]
    _check_key(key)
    members = []
    for column in schema.array_columns:
        members.append((f"{key}.{column}.npy", npy_bytes(np.asarray(example[column], dtype=np.int32))))
    for column in schema.scalar_columns:
        members.append((f"{key}.{column}.npy", npy_bytes(np.asarray(example[column], dtype=np.int32))))
    for column in schema.string_columns:
        if column != "key":
            members.append((f"{key}.{column}.txt", str(example[column]).encode("utf-8")))
    return sorted(members)


def write_tar(handle: BinaryIO, examples: Sequence[dict[str, Any]], schema: ExampleSchema) -> None:
    """Write ``examples`` as a WebDataset tar stream (USTAR, reproducible headers).

    The layout is ``tarfile``'s in stream mode: header, payload padded to 512 bytes, per
    member; two zero blocks; zero padding to a multiple of the 10240-byte record size.
    Members are those of :func:`example_members`.
    """
    write_tar_columns(handle, ExampleColumns.from_examples(examples, schema))


def _octal_fields(values: np.ndarray, digits: int) -> np.ndarray:
    """``b"%0{digits}o" % v`` of every value, as an ``(n, digits)`` uint8 array."""
    shifts = 3 * np.arange(digits - 1, -1, -1, dtype=np.int64)
    return ((values.astype(np.int64)[:, None] >> shifts) & 7).astype(np.uint8) + ord("0")


def _member_headers(names: list[bytes], sizes: np.ndarray) -> np.ndarray:
    """``(n, 512)`` uint8 USTAR headers of members ``names`` with ``sizes``.

    Built directly from a template (every other field is constant) because :mod:`tarfile`'s
    generic header code dominated shard writing; the bytes are what ``tarfile`` writes for
    the same members (checked in the tests).
    """
    longest = max(map(len, names), default=0)
    if longest > 100:
        name = next(n for n in names if len(n) > 100).decode("utf-8")
        raise ValueError(f"tar member name {name!r} is longer than 100 bytes")
    if len(sizes) and int(sizes.max()) >= 8**11:
        raise ValueError(f"tar member of {int(sizes.max())} bytes is too large for a USTAR header")
    headers = np.tile(np.frombuffer(_USTAR_TEMPLATE, dtype=np.uint8), (len(names), 1))
    headers[:, :100] = np.array(names, dtype="S100").view(np.uint8).reshape(len(names), 100)
    headers[:, 124:135] = _octal_fields(sizes, 11)  # byte 135 stays NUL
    checksums = headers.sum(axis=1, dtype=np.int64)  # the checksum field counts as spaces
    headers[:, 148:154] = _octal_fields(checksums, 6)
    headers[:, 154] = 0  # then NUL and the template's space, as tarfile writes it
    return headers


_INT32 = np.dtype(np.int32)
#: Zero padding of every length below a block, shared by all members.
_PADDING = [bytes(n) for n in range(_BLOCK)]
#: Bytes a tar writer joins before each write.
_TAR_WRITE_BYTES = 1 << 22


def _npy_member_payloads(lengths: np.ndarray, rows: list) -> tuple[list, list, np.ndarray]:
    """Per row of an array column (its lengths and int32 buffers): the ``.npy`` header, the
    data, and the payload size."""
    count = len(rows)
    if count == 0:
        return [], [], np.zeros(0, dtype=np.int64)
    lengths = np.asarray(lengths, dtype=np.int64)
    if (lengths == lengths[0]).all():
        header = _npy_header(_INT32, (int(lengths[0]),))
        return [header] * count, rows, np.full(count, len(header), dtype=np.int64) + 4 * lengths
    headers = {int(n): _npy_header(_INT32, (int(n),)) for n in np.unique(lengths)}
    header_sizes = np.zeros(int(lengths.max(initial=0)) + 1, dtype=np.int64)
    for n, header in headers.items():
        header_sizes[n] = len(header)
    return [headers[n] for n in lengths.tolist()], rows, header_sizes[lengths] + 4 * lengths


def _npy_scalar_payloads(values: np.ndarray) -> tuple[list, list, np.ndarray]:
    """Per row of a scalar column: the 0-d ``.npy`` header, the int32 value, the payload size."""
    values = np.ascontiguousarray(values, dtype=np.int32)
    header = _npy_header(_INT32, ())
    count = len(values)
    return [header] * count, list(values.reshape(count, 1)), np.full(count, len(header) + 4, dtype=np.int64)


def write_tar_columns(handle: BinaryIO, columns: ExampleColumns | MergedColumns) -> int:
    """Write the rows of ``columns`` as a WebDataset tar stream (see :func:`write_tar`); return
    the number of rows (samples) written.

    Column by column: every member header of a column is built in one numpy operation, the
    ``.npy`` header of each distinct row shape once, and the stream is the interleaving of
    the columns' pieces (header, ``.npy`` header, data view, padding) joined a few MiB at a
    time. Same bytes as writing the rows' :func:`example_members` one by one.
    """
    schema, count = columns.schema, columns.count
    keys = columns.strings["key"]
    for key in keys:
        _check_key(key)
    key_bytes = [key.encode("utf-8") for key in keys]
    members = []  # (suffix, per-row .npy headers, per-row data, per-row payload sizes)
    for column in schema.array_columns:
        members.append((f".{column}.npy".encode(), *_npy_member_payloads(*columns.array_rows(column))))
    for column in schema.scalar_columns:
        members.append((f".{column}.npy".encode(), *_npy_scalar_payloads(columns.scalars[column])))
    for column in schema.string_columns:
        if column != "key":
            texts = [str(value).encode("utf-8") for value in columns.strings[column]]
            members.append((f".{column}.txt".encode(), [b""] * count, texts,
                            np.fromiter(map(len, texts), dtype=np.int64, count=count)))
    members.sort(key=lambda member: member[0])  # a row's members sorted by name: by suffix
    stride = 4 * len(members)
    parts: list = [b""] * (stride * count)
    row_bytes = np.zeros(count, dtype=np.int64)
    for index, (suffix, npy_headers, data, sizes) in enumerate(members):
        padding = -sizes % _BLOCK
        parts[4 * index :: stride] = list(_member_headers([key + suffix for key in key_bytes], sizes))
        parts[4 * index + 1 :: stride] = npy_headers
        parts[4 * index + 2 :: stride] = data
        parts[4 * index + 3 :: stride] = [_PADDING[n] for n in padding.tolist()]
        row_bytes += _BLOCK + sizes + padding
    written = 0
    if count:
        rows_per_write = max(1, int(_TAR_WRITE_BYTES // max(1, int(row_bytes.max()))))
        for start in range(0, count, rows_per_write):
            chunk = b"".join(parts[start * stride : (start + rows_per_write) * stride])
            handle.write(chunk)
            written += len(chunk)
    end = bytes(2 * _BLOCK)
    total = written + len(end)
    handle.write(end + bytes(-total % _RECORD))
    return count
