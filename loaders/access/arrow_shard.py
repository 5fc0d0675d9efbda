"""Opening one Arrow shard and reading rows of it by index, checked against the manifest.

Arrow shards (IPC stream format, uncompressed) are memory-mapped once per process; a
fixed-size token column becomes one ``(rows, L)`` numpy view per record batch and a
``list<int32>`` column an (offsets, values) pair, so reading a row copies nothing. Any row
is reachable directly (:meth:`ArrowShard.take`).

On open, the shard's Arrow schema (column names and types), its row count and the absence
of nulls are compared with the manifest (its size and sha256 were checked before, by
:meth:`loaders.access.files.DatasetLocation.open_shard`); a mismatch raises
:class:`~loaders.errors.ShardIntegrityError` naming the shard. A memory-mapped file that
shrinks under a reader would crash the process (SIGBUS) at the first access past its new
end: an open Arrow shard keeps a descriptor of its file and checks its size before each
batch is gathered from it (:meth:`ArrowShard.check_intact`), so a shard truncated while it
is read is a Python error naming it. A truncation that falls between that check and the pages
read after it still kills the process with SIGBUS (a map cannot be guarded otherwise); for a
DataLoader worker, when torch reports its death while the loader waits for a batch, the loader
names the shard from the files (:meth:`loaders.access.shards.ShardSet.shrunk_file_error`).
"""

from __future__ import annotations

import bisect
import os
from typing import Any

import numpy as np
import pyarrow as pa

from loaders.access.cache import Lease
from loaders.errors import ShardIntegrityError

__all__ = ["ArrowShard"]


class ArrowShard:
    """Random row access into one memory-mapped Arrow IPC stream shard.

    The one Arrow opener of every reader (:class:`~loaders.access.shards.ShardSet`,
    :func:`loaders.access.reader.read_arrow_shard` and so the inspection commands). Checked on open, each a
    :class:`ShardIntegrityError` naming the shard: an Arrow IPC stream whose record batches pass
    pyarrow's full validation (offsets inside their buffers, UTF-8 strings), the manifest's schema
    and row count, and no nulls (the format has none, and a null row's bytes are not data).

    Args:
        path: local file.
        name: the shard's relative path (for messages).
        columns: expected ``{name: arrow type string}`` from the manifest (None: not checked).
        rows: expected row count (None: not checked).
        size: the manifest's byte size of the file (None: not known), named when the stream is
            unreadable because the file changed after its size was checked.
    """

    def __init__(self, path: str, *, name: str, columns: dict[str, str] | None, rows: int | None,
                 size: int | None = None):
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
            self.check_intact()  # shrunk since its size was taken (mapped shorter): say that, not "unreadable"
            if size is not None and self._size != size:  # changed between the manifest check and the open
                raise ShardIntegrityError(
                    f"shard {name}: {self._size} bytes on disk, the manifest says {size}") from None
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

