"""Opening shards and reading rows by index, checked against the manifest.

- **Arrow** shards (IPC stream format, uncompressed) are memory-mapped once per process;
  a fixed-size token column becomes one ``(rows, L)`` numpy view per record batch and a
  ``list<int32>`` column an (offsets, values) pair, so reading a row copies nothing. Any
  row is reachable directly (:meth:`ArrowShard.take`).
- **WebDataset** tars are read sequentially with :mod:`tarfile` (:func:`iter_tar_shard`, which
  needs no ``webdataset`` install); only ``.npy`` (decoded with ``allow_pickle=False``) and
  ``.txt`` members are accepted, nothing is unpickled. :func:`read_tar_rows` keeps only the
  rows a reader asked for and stops once it has them.

:class:`ArrowShard` and :func:`iter_tar_shard` are the only shard openers: the loader,
:func:`loaders.reader.open_dataset` and the inspection commands all read through them, after
:meth:`loaders.files.DatasetLocation.open_shard` has found the file and checked it.

On open, a shard's size and sha256 (see :mod:`loaders.files`), its Arrow schema (column
names and types) and its row count are compared with the manifest; every WebDataset
member's dtype and shape are compared with the manifest's schema as it is read
(:func:`field_specs`). A mismatch raises :class:`~loaders.errors.ShardIntegrityError`
naming the shard. A memory-mapped file that shrinks under a reader would crash the
process (SIGBUS) at the first access past its new end: an open Arrow shard keeps a
descriptor of its file and checks its size before each batch is gathered from it
(:meth:`ArrowShard.check_intact`), so a shard truncated while it is read is a Python error
naming it.

Remote datasets are read from a bounded local cache (:mod:`loaders.cache`): an opened
Arrow shard holds a lease on its cached file until the reader releases it
(:meth:`ShardSet.plan`), and a background thread downloads the next shards.
"""

from __future__ import annotations

import bisect
import functools
import io
import math
import os
import re
import tarfile
import weakref
from collections.abc import Iterator
from typing import Any, NamedTuple

import numpy as np
import pyarrow as pa

from loaders.batch import ExampleBatch, Ragged
from loaders.cache import Lease, Prefetcher
from loaders.errors import ShardIntegrityError
from loaders.files import DatasetLocation
from schemas.manifest import Manifest, ShardInfo

__all__ = ["FORMATS", "ArrowShard", "FieldSpec", "SegmentTable", "ShardSet", "decode_npy", "field_specs",
           "iter_tar_shard", "read_tar_rows"]

FORMATS = ("arrow", "webdataset")


class ArrowShard:
    """Random row access into one memory-mapped Arrow IPC stream shard.

    The one Arrow opener of every reader (:class:`ShardSet`, :func:`loaders.reader.read_arrow_shard`
    and so the inspection commands). Checked on open, each a :class:`ShardIntegrityError` naming the
    shard: an Arrow IPC stream whose record batches pass pyarrow's full validation (offsets inside
    their buffers, UTF-8 strings), the manifest's schema and row count, and no nulls (the format has
    none, and a null row's bytes are not data).

    Args:
        path: local file.
        name: the shard's relative path (for messages).
        columns: expected ``{name: arrow type string}`` from the manifest (None: not checked).
        rows: expected row count (None: not checked).
    """

    def __init__(self, path: str, *, name: str, columns: dict[str, str] | None, rows: int | None):
        self.name = name
        self._fd = os.open(path, os.O_RDONLY)
        try:
            self._size = os.fstat(self._fd).st_size
            self._source = pa.memory_map(path, "r")
        except BaseException:
            os.close(self._fd)
            raise
        try:
            reader = pa.ipc.open_stream(self._source)
            found = {field.name: str(field.type) for field in reader.schema}
            if columns is not None and found != columns:
                raise ShardIntegrityError(f"shard {name}: schema {found} does not match the manifest's {columns}")
            batches = list(reader)
            for batch in batches:
                batch.validate(full=True)
        except (pa.ArrowInvalid, OSError) as exc:
            raise ShardIntegrityError(f"shard {name}: not a readable Arrow IPC stream ({exc})") from None
        counts = np.array([b.num_rows for b in batches], dtype=np.int64)
        if rows is not None and int(counts.sum()) != rows:
            raise ShardIntegrityError(f"shard {name}: {int(counts.sum())} rows, the manifest says {rows}")
        nulls = [(f, b.column(i).null_count) for b in batches for i, f in enumerate(found) if b.column(i).null_count]
        if nulls:
            raise ShardIntegrityError(f"shard {name}: column {nulls[0][0]} has nulls (a shard holds none)")
        self.num_rows = int(counts.sum())
        self._starts = [0, *np.cumsum(counts).tolist()][: len(batches)]
        self._uniform = len(batches) > 0 and bool(np.all(counts[:-1] == counts[0]))
        self._batch_rows = int(counts[0]) if len(batches) else 0
        try:
            self._columns = {name: [_column_view(b.column(i)) for b in batches] for i, name in enumerate(found)}
        except ShardIntegrityError as exc:
            raise ShardIntegrityError(f"shard {name}: {exc}") from None
        self._fields: dict[tuple[str, ...] | None, list[tuple[str, int, list]]] = {}
        self.lease: Lease | None = None  # the cached file of a remote shard, held while open

    def close(self) -> None:
        """Let the cache evict the file. Rows already read stay valid (the mapping lives on)."""
        if self.lease is not None:
            self.lease.close()
            self.lease = None

    def check_intact(self) -> None:
        """Raise :class:`ShardIntegrityError` if the mapped file has shrunk (reading it would SIGBUS)."""
        try:
            size = os.lseek(self._fd, 0, os.SEEK_END)  # the file's size now (a quarter of fstat's cost)
        except OSError as exc:
            raise ShardIntegrityError(f"shard {self.name}: cannot be checked ({exc})") from None
        if size < self._size:
            raise ShardIntegrityError(f"shard {self.name}: truncated while it was being read ({size:,} of "
                                      f"{self._size:,} bytes left)")

    def __del__(self) -> None:
        try:
            os.close(self._fd)
        except (OSError, AttributeError):
            pass

    def fields(self, columns: tuple[str, ...] | None) -> list[tuple[str, int, list]]:
        fields = self._fields.get(columns)
        if fields is None:
            fields = []
            for name in columns or tuple(self._columns):
                views = self._columns[name]
                sample = views[0] if views else None
                if isinstance(sample, _Strings):
                    kind = _STRING
                elif isinstance(sample, tuple):
                    kind = _LIST
                elif isinstance(sample, np.ndarray):
                    kind = _FIXED if sample.ndim == 2 else _INT
                else:
                    kind = _OTHER
                fields.append((name, kind, views))
            self._fields[columns] = fields
        return fields

    def take(self, rows, columns: tuple[str, ...] | None = None) -> list[dict[str, Any]]:
        """Examples at ``rows`` (in that order), as dicts of read-only numpy views, ints and strs."""
        rows = [int(r) for r in rows]
        if rows and (min(rows) < 0 or max(rows) >= self.num_rows):
            raise IndexError(f"shard {self.name}: rows {min(rows)}..{max(rows)} out of [0, {self.num_rows})")
        self.check_intact()
        fields = self.fields(columns)
        return [self.row(r, fields) for r in rows]

    def row(self, index: int, fields: list[tuple[str, int, list]]) -> dict[str, Any]:
        """One example (no bounds check: the hot path of the loader)."""
        batch = index // self._batch_rows if self._uniform else bisect.bisect_right(self._starts, index) - 1
        local = index - self._starts[batch]
        out: dict[str, Any] = {}
        for name, kind, views in fields:
            if kind == _FIXED:
                out[name] = views[batch][local]
            elif kind == _LIST:
                offsets, values = views[batch]
                out[name] = values[offsets[local] : offsets[local + 1]]
            elif kind == _INT:
                out[name] = int(views[batch][local])
            elif kind == _STRING:
                offsets, data = views[batch]
                out[name] = data[offsets[local] : offsets[local + 1]].tobytes().decode("utf-8")
            else:
                out[name] = views[batch][local].as_py()
        return out


_FIXED, _LIST, _INT, _STRING, _OTHER = range(5)


class _Strings(tuple):
    """(offsets, utf-8 bytes) views of a string column: decoded per row, nothing cached."""


def _primitive_view(array: pa.Array) -> np.ndarray:
    """Zero-copy numpy view of an integer array without nulls.

    Built from the data buffer directly: ``Array.to_numpy`` imports pandas on first use,
    a quarter of a second before the first batch.
    """
    dtype = np.dtype(f"int{array.type.bit_width}" if pa.types.is_signed_integer(array.type)
                     else f"uint{array.type.bit_width}")
    if array.null_count:
        raise ShardIntegrityError(f"column of type {array.type} has {array.null_count} nulls")
    return np.frombuffer(array.buffers()[1], dtype=dtype, count=len(array), offset=array.offset * dtype.itemsize)


def _column_view(column: pa.Array) -> Any:
    """A zero-copy numpy view of one record-batch column (strings stay Arrow arrays)."""
    if pa.types.is_fixed_size_list(column.type):
        width = column.type.list_size
        values = _primitive_view(column.values)
        start = column.offset * width
        return values[start : start + len(column) * width].reshape(-1, width)
    if pa.types.is_list(column.type) or pa.types.is_large_list(column.type):
        return _primitive_view(column.offsets), _primitive_view(column.values)
    if pa.types.is_integer(column.type):
        return _primitive_view(column)
    if (pa.types.is_string(column.type) or pa.types.is_large_string(column.type)) and not column.null_count:
        width = 8 if pa.types.is_large_string(column.type) else 4
        offsets = np.frombuffer(column.buffers()[1], dtype=f"int{8 * width}", count=len(column) + 1,
                                offset=column.offset * width)
        data = column.buffers()[2]
        return _Strings((offsets, np.frombuffer(data, dtype=np.uint8) if data is not None else np.zeros(0, np.uint8)))
    return column


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


@functools.lru_cache(maxsize=256)
def _npy_header(header: bytes) -> tuple[np.dtype, tuple[int, ...], bool] | None:
    """(dtype, shape, fortran order) of a ``.npy`` header; None when numpy must decode it itself."""
    try:
        stream = io.BytesIO(header)
        version = np.lib.format.read_magic(stream)
        read = np.lib.format.read_array_header_1_0 if version == (1, 0) else np.lib.format.read_array_header_2_0
        shape, fortran, dtype = read(stream)
    except ValueError:
        return None
    return None if dtype.hasobject else (dtype, shape, fortran)


def decode_npy(payload: bytes) -> np.ndarray:
    """A ``.npy`` member as a (read-only) array over ``payload``, never unpickled.

    A shard's members share a handful of headers (one per column and shape), so each header
    is parsed once and every other member is a ``frombuffer`` view; anything unusual (object
    dtypes, which raise, malformed headers) goes through ``np.lib.format.read_array``.
    """
    if payload[:6] == b"\x93NUMPY" and len(payload) >= 10:
        size = 10 + int.from_bytes(payload[8:10], "little") if payload[6] == 1 else \
            12 + int.from_bytes(payload[8:12], "little")
        parsed = _npy_header(bytes(payload[:size]))
        if parsed is not None:
            dtype, shape, fortran = parsed
            count = math.prod(shape)
            if len(payload) - size != count * dtype.itemsize:
                raise ValueError(f"{len(payload) - size} bytes of array data, the header {shape} {dtype} "
                                 f"needs {count * dtype.itemsize}")
            value = np.frombuffer(payload, dtype=dtype, count=count, offset=size)
            return value.reshape(shape, order="F" if fortran else "C")
    return np.lib.format.read_array(io.BytesIO(payload), allow_pickle=False)


class FieldSpec(NamedTuple):
    """What a WebDataset member of a column must hold: ``text``, a ``scalar`` or an ``array``
    of ``dtype`` (of ``width`` values for a fixed-size list)."""

    kind: str
    dtype: np.dtype | None = None
    width: int | None = None


_FIXED_TYPE = re.compile(r"fixed_size_list<[^:>]*: (\w+)>\[(\d+)\]")
_LIST_TYPE = re.compile(r"(?:large_)?list<[^:>]*: (\w+)>")


def field_specs(columns: dict[str, str]) -> dict[str, FieldSpec]:
    """Member specs of the manifest's columns (``{name: arrow type string}``); unknown types are not checked."""
    specs = {}
    for name, arrow_type in columns.items():
        fixed, listed = _FIXED_TYPE.fullmatch(arrow_type), _LIST_TYPE.fullmatch(arrow_type)
        try:
            if arrow_type in ("string", "large_string", "utf8", "large_utf8"):
                specs[name] = FieldSpec("text")
            elif fixed:
                specs[name] = FieldSpec("array", np.dtype(fixed.group(1)), int(fixed.group(2)))
            elif listed:
                specs[name] = FieldSpec("array", np.dtype(listed.group(1)))
            elif re.fullmatch(r"u?int(8|16|32|64)", arrow_type):
                specs[name] = FieldSpec("scalar", np.dtype(arrow_type))
        except TypeError:
            continue
    return specs


def _decode_member(shard: str, key: str, suffix: str, payload: bytes,
                   specs: dict[str, FieldSpec] | None = None) -> tuple[str, Any]:
    field, _, ext = suffix.rpartition(".")
    spec = (specs or {}).get(field)
    if ext == "npy":
        try:
            value = decode_npy(payload)
        except ValueError as exc:
            raise ShardIntegrityError(f"shard {shard}: member {key}.{suffix} is not a valid .npy ({exc})") from None
        if spec is not None:
            shape_ok = value.ndim == 0 if spec.kind == "scalar" else (
                value.ndim == 1 and (spec.width is None or value.shape[0] == spec.width))
            if spec.kind == "text" or value.dtype != spec.dtype or not shape_ok:
                want = "text (.txt)" if spec.kind == "text" else (
                    f"{spec.dtype} scalar" if spec.kind == "scalar" else
                    f"{spec.dtype} array of shape ({spec.width if spec.width is not None else 'n'},)")
                raise ShardIntegrityError(f"shard {shard}: member {key}.{suffix} is a {value.dtype} array of shape "
                                          f"{value.shape}, the manifest's schema says {want}")
        return field, (value.item() if value.ndim == 0 else value)
    if ext == "txt":
        if spec is not None and spec.kind != "text":
            raise ShardIntegrityError(f"shard {shard}: member {key}.{suffix} is text, the manifest's schema says "
                                      f"{spec.kind} of {spec.dtype}")
        try:
            return field, payload.decode("utf-8")
        except UnicodeDecodeError:
            raise ShardIntegrityError(f"shard {shard}: member {key}.{suffix} is not UTF-8 text") from None
    raise ShardIntegrityError(f"shard {shard}: member {key}.{suffix} has unsupported type .{ext} (only .npy, .txt)")


def iter_tar_shard(path: str, *, name: str, columns: dict[str, str] | None = None,
                   rows: int | None = None) -> Iterator[dict[str, Any]]:
    """Examples of a WebDataset tar shard in stored order, read in one sequential pass.

    The one tar reader of every reader (:func:`read_tar_rows` for the loader,
    :func:`loaders.reader.read_tar_shard` for ``open_dataset`` and the inspection commands).
    It streams the tar with :mod:`tarfile` (``r|``: nothing seeks, nothing is extracted to disk),
    so a reader that stops early reads no further. Checked, each a :class:`ShardIntegrityError`
    naming the shard: a readable tar (not truncated, not garbled), safe member names (not
    absolute, no ``..``), ``.npy`` and ``.txt`` members only (never unpickled), each member at
    most once per example, and with ``columns`` (``{name: arrow type}``) every example's fields
    and every member's dtype and shape; with ``rows``, the row count once the tar ends.
    """
    specs = field_specs(columns) if columns is not None else None
    expected = set(columns) - {"key"} if columns is not None else None
    current: dict[str, Any] | None = None
    prefix = None
    count = 0

    def finished(example: dict[str, Any]) -> dict[str, Any]:
        if expected is not None and set(example) - {"key"} != expected:
            raise ShardIntegrityError(f"shard {name}: example {example['key']} has fields "
                                      f"{sorted(set(example) - {'key'})}, the manifest's schema has {sorted(expected)}")
        return example

    try:
        with tarfile.open(path, mode="r|") as tar:
            for member in tar:
                if not member.isfile():
                    continue
                member_name = member.name
                if member_name.startswith("/") or ".." in member_name.split("/"):
                    raise ShardIntegrityError(f"shard {name}: unsafe member name {member_name!r} (absolute or "
                                              "with '..')")
                directory, _, base = member_name.rpartition("/")
                key, _, suffix = base.partition(".")
                payload = tar.extractfile(member).read()
                field, value = _decode_member(name, key, suffix, payload, specs)
                if current is None or (directory, key) != prefix:
                    if current is not None:
                        count += 1
                        yield finished(current)
                    current, prefix = {"key": key}, (directory, key)
                elif field in current:
                    raise ShardIntegrityError(f"shard {name}: example {key} has the member {base} twice")
                current[field] = value
    except (tarfile.TarError, EOFError, OSError) as exc:
        raise ShardIntegrityError(f"shard {name}: cannot be read ({type(exc).__name__}: {exc})") from None
    if current is not None:
        count += 1
        yield finished(current)
    if rows is not None and count != rows:
        raise ShardIntegrityError(f"shard {name}: {count} rows, the manifest says {rows}")


def read_tar_rows(
    path: str, *, name: str, columns: dict[str, str], rows: int, wanted: set[int] | None = None
) -> dict[int, dict[str, Any]]:
    """Rows of a WebDataset tar shard, by row index, read in one sequential pass (:func:`iter_tar_shard`).

    Args:
        path: local tar file.
        name: the shard's relative path (for messages).
        columns: expected ``{name: arrow type}``: each member's dtype and shape are checked against it.
        rows: expected row count (checked when the whole shard is read).
        wanted: rows to keep; None keeps every row. Reading stops after the last wanted row.

    Raises:
        ShardIntegrityError: members that do not match the manifest's columns, or a row count mismatch.
    """
    out: dict[int, dict[str, Any]] = {}
    if wanted is not None and not wanted:
        return out
    last = max(wanted) if wanted else rows
    seen = 0
    examples = iter_tar_shard(path, name=name, columns=columns, rows=rows if wanted is None else None)
    for row, example in enumerate(examples):
        seen = row + 1
        if wanted is None:
            out[row] = example  # (the row count is checked at the end of the tar)
        elif row > last:
            break
        elif row in wanted:
            out[row] = example
    if wanted and len(out) != len(wanted):
        raise ShardIntegrityError(f"shard {name}: ends after {seen} rows, the manifest says {rows}")
    return out


class ShardSet:
    """The shards of one split of a dataset in one format, opened lazily per process.

    Args:
        location: the dataset (see :class:`~loaders.files.DatasetLocation`).
        manifest: its manifest.
        split: split name.
        fmt: ``arrow`` or ``webdataset``; None picks arrow when it was written.
        verify: ``once``, ``always`` or ``never`` (see :mod:`loaders.files`).
        prefetch_shards: remote datasets: how many of the next shards to download ahead.

    Raises:
        ValueError: unknown split or format, or a format the dataset was not written in.
    """

    def __init__(self, location: DatasetLocation, manifest: Manifest, split: str, fmt: str | None, verify: str,
                 prefetch_shards: int = 2):
        formats = list(manifest.config.get("formats", []))
        fmt = fmt or ("arrow" if "arrow" in formats else (formats[0] if formats else "arrow"))
        if fmt not in FORMATS:
            raise ValueError(f"fmt={fmt!r}: expected one of {FORMATS}")
        if fmt not in formats:
            raise ValueError(f"fmt={fmt!r}: {location.path} was written as {formats}")
        if split not in manifest.splits:
            raise ValueError(f"split {split!r} is not in {location.path}; it has {sorted(manifest.splits)}")
        if not isinstance(prefetch_shards, int) or prefetch_shards < 0:
            raise ValueError(f"prefetch_shards must be an int >= 0, got {prefetch_shards!r}")
        self.location, self.fmt, self.verify = location, fmt, verify
        self.prefetch_shards = prefetch_shards
        self.shards: list[ShardInfo] = manifest.shards(split)
        self.columns = {c["name"]: c["type"] for c in manifest.schema.get("columns", [])}
        self._row_counts = np.asarray(self.rows, dtype=np.int64)
        self._reset()

    def _reset(self) -> None:
        self._open: dict[int, ArrowShard] = {}
        self._protect: frozenset[str] = frozenset()
        self._prefetcher: Prefetcher | None = None
        self._released = False  # since the last prefetch request: room may have been freed
        self._pid = os.getpid()
        self._table: SegmentTable | None = None

    def __getstate__(self):
        state = dict(self.__dict__)
        for name in ("_open", "_protect", "_prefetcher", "_released", "_pid", "_table"):
            state.pop(name)  # memory maps, leases and threads are per process
        return state

    def __setstate__(self, state):
        self.__dict__.update(state)
        self._reset()

    def _check_process(self) -> None:
        if os.getpid() != self._pid:  # forked worker: do not share the parent's maps, leases or thread
            self._reset()

    @property
    def rows(self) -> list[int]:
        return [s.rows for s in self.shards]

    def _file(self, index: int):
        return self.shards[index].files[self.fmt]

    def open_file(self, index: int) -> tuple[Lease, str]:
        """``(lease on the local file, relative name)`` of shard ``index``, fetched and verified
        (:meth:`~loaders.files.DatasetLocation.open_shard`)."""
        file = self._file(index)
        return self.location.open_shard(file, verify=self.verify, protect=self._protect), file.path

    def local_path(self, index: int) -> tuple[str, str]:
        """``(local path, relative name)`` of shard ``index``, fetched and verified (not leased)."""
        lease, name = self.open_file(index)
        lease.close()
        return lease.path, name

    def arrow(self, index: int) -> ArrowShard:
        """The opened Arrow shard ``index`` (verified on first open in this process)."""
        self._check_process()
        shard = self._open.get(index)
        if shard is None:
            lease, name = self.open_file(index)
            try:
                shard = ArrowShard(lease.path, name=name, columns=self.columns, rows=self.shards[index].rows)
            except BaseException:
                lease.close()
                raise
            shard.lease = lease if self.location.remote else None
            self._open[index] = shard
        return shard

    def start_epoch(self) -> None:
        """Forget opened shards when ``verify="always"``, so that each epoch checks them again."""
        if self.verify == "always":
            self.release(list(self._open))

    def release(self, indices) -> None:
        """Close opened shards: their cached files may be evicted (rows already read stay valid)."""
        for index in indices:
            shard = self._open.pop(index, None)
            if shard is not None:
                shard.close()
                self._released = True
                self._table = None  # holds the released shards' maps

    def segments(self, shard_ids: np.ndarray, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """``(segment, row in segment)`` of ``(shard, row)`` pairs for :meth:`gather` (Arrow).

        Opens (and verifies) the shards among ``shard_ids`` that are not open yet.
        """
        self._check_process()
        table = self._table
        if table is None:
            table = self._table = SegmentTable(len(self.shards))
        if shard_ids.size:
            # (np.unique imports numpy.ma on first use: a tenth of a second before the first batch)
            for index in np.flatnonzero(np.bincount(shard_ids, minlength=len(self.shards))).tolist():
                if not table.registered(index):
                    table.register(index, self.arrow(index))
                else:
                    self._open[index].check_intact()
            if rows.min() < 0 or (rows >= self._row_counts[shard_ids]).any():
                raise IndexError(f"rows out of range of their shards: {rows.tolist()}")
        return table.locate(shard_ids, rows)

    def gather(self, segments: np.ndarray, rows: np.ndarray, columns: tuple[str, ...]) -> ExampleBatch:
        """The examples at ``(segment, row)`` pairs from :meth:`segments` (see :meth:`SegmentTable.gather`)."""
        assert self._table is not None, "call segments() first"
        for shard in self._open.values():  # a file that shrank under its mapping: an error, not a SIGBUS
            if os.lseek(shard._fd, 0, os.SEEK_END) < shard._size:
                shard.check_intact()
        return self._table.gather(segments, rows, columns)

    def tar_rows(self, index: int, wanted: set[int] | None) -> dict[int, dict[str, Any]]:
        """Rows of tar shard ``index`` (see :func:`read_tar_rows`)."""
        self._check_process()
        lease, name = self.open_file(index)
        with lease:
            return read_tar_rows(lease.path, name=name, columns=self.columns, rows=self.shards[index].rows,
                                 wanted=wanted)

    # -- remote datasets: what to keep, what to fetch ahead --------------------------------
    def plan(self, current, upcoming=None) -> None:
        """Tell a remote shard set where the reader is (a no-op for local datasets).

        Args:
            current: shards the reader may read from soon (the shuffle blocks it is in); opened
                shards not among them are released, so the cache may evict their files.
            upcoming: shards in the order the reader will need them (an iterable, read lazily);
                the first ``prefetch_shards`` that are not open are downloaded in the
                background. None: only release.
        """
        if not self.location.remote:
            return
        self._check_process()
        current = set(current)
        self.release([index for index in self._open if index not in current])
        if upcoming is None:
            return
        window: list[int] = []
        if self.prefetch_shards:
            for index in upcoming:
                if index in self._open or index in window or not self.shards[index].rows:
                    continue
                window.append(index)
                if len(window) == self.prefetch_shards:
                    break
        self._protect = frozenset(self.location.cache_path(self._file(i).path) for i in (*current, *window))
        if self._prefetcher is None:
            if not window:
                return
            self._prefetcher = Prefetcher(functools.partial(_prefetch_one, weakref.ref(self)))
        self._prefetcher.want(window, self._protect, retry=self._released)
        self._released = False

    def wait_prefetch(self, timeout: float | None = None) -> bool:
        """Wait for the background downloads asked for so far; False on timeout."""
        return self._prefetcher is None or self._prefetcher.wait(timeout)


def _prefetch_one(shards: weakref.ref[ShardSet], index: int, protect: frozenset[str]) -> bool:
    """Prefetch job of a shard set (held weakly: the thread does not keep a dropped reader's leases)."""
    owner = shards()
    if owner is None:
        return False
    file = owner._file(index)
    return owner.location.prefetch_file(file.path, sha256=file.sha256, size=file.bytes, protect=protect)
