"""A minimal reader: iterate the examples of a dataset directory as numpy arrays.

Arrow shards are memory-mapped and read without copying (a fixed-size token column
becomes an ``(rows, L)`` numpy view); WebDataset tars are read with :mod:`tarfile` and
``np.load(allow_pickle=False)``, never unpickled. Examples come in shard order, then in
stored order (the shuffled order the writer chose). The streaming torch loader builds on
this module.

:class:`DatasetReader` checks what it reads as :class:`~loaders.dataset.ShardedDataset`
does: the manifest and its paths (:func:`loaders.files.parse_manifest`), each shard's size
and sha256 (``verify``: ``once``, ``always`` or ``never``, which trusts the bytes), its
Arrow schema and row count, and the dtype and shape of every WebDataset member. A
mismatch is a :class:`~loaders.errors.ShardIntegrityError` naming the shard. An Arrow
shard whose file shrinks while it is read is an error before the next batch is touched
(not a SIGBUS).
"""

from __future__ import annotations

import os
import tarfile
from collections.abc import Iterator
from typing import Any

import pyarrow as pa

from loaders.errors import ShardIntegrityError
from loaders.files import VERIFY_MODES, DatasetLocation, verify_file
from loaders.shards import _decode_member, field_specs
from schemas.manifest import ShardInfo

__all__ = ["DatasetReader", "iter_examples", "open_dataset", "read_arrow_shard", "read_tar_shard"]


def _column_to_numpy(column: pa.ChunkedArray | pa.Array) -> Any:
    if isinstance(column, pa.ChunkedArray):
        column = column.combine_chunks() if column.num_chunks != 1 else column.chunk(0)
    if pa.types.is_fixed_size_list(column.type):
        width = column.type.list_size
        values = column.values.to_numpy(zero_copy_only=True)
        return values.reshape(-1, width)[: len(column)]
    if pa.types.is_list(column.type):
        offsets = column.offsets.to_numpy(zero_copy_only=True)
        values = column.values.to_numpy(zero_copy_only=True)
        return [values[offsets[i] : offsets[i + 1]] for i in range(len(column))]
    if pa.types.is_integer(column.type):
        return column.to_numpy(zero_copy_only=True)
    return column.to_pylist()


def _shard_error(name: str, exc: BaseException) -> ShardIntegrityError:
    return ShardIntegrityError(f"shard {name}: cannot be read ({type(exc).__name__}: {exc})")


def read_arrow_shard(path: str, *, name: str | None = None, columns: dict[str, str] | None = None,
                     rows: int | None = None) -> Iterator[dict[str, Any]]:
    """Examples of one Arrow IPC stream shard, batch by batch, memory-mapped.

    With ``columns`` (``{name: arrow type}``) and ``rows`` from the manifest, the schema and the
    row count are checked before the first example.

    Raises:
        ShardIntegrityError: a shard that is not an Arrow stream, a schema or row count that
            differs, or a file that shrank while it was read (naming ``name``).
    """
    name = name or path
    with open(path, "rb") as held, pa.memory_map(path, "r") as source:
        size = os.fstat(held.fileno()).st_size
        try:
            reader = pa.ipc.open_stream(source)
            batches = list(reader)
        except (pa.ArrowInvalid, OSError) as exc:
            raise _shard_error(name, exc) from None
        if columns is not None:
            found = {field.name: str(field.type) for field in reader.schema}
            if found != columns:
                raise ShardIntegrityError(f"shard {name}: schema {found} does not match the manifest's {columns}")
        found_rows = sum(b.num_rows for b in batches)
        if rows is not None and found_rows != rows:
            raise ShardIntegrityError(f"shard {name}: {found_rows} rows, the manifest says {rows}")
        for batch in batches:
            if os.fstat(held.fileno()).st_size < size:
                raise ShardIntegrityError(f"shard {name}: truncated while it was being read")
            values = {field: _column_to_numpy(batch.column(i)) for i, field in enumerate(batch.schema.names)}
            for row in range(batch.num_rows):
                yield {field: column[row] for field, column in values.items()}


def read_tar_shard(path: str, *, name: str | None = None, columns: dict[str, str] | None = None,
                   rows: int | None = None) -> Iterator[dict[str, Any]]:
    """Examples of one WebDataset tar shard (``.npy`` and ``.txt`` members only).

    With ``columns`` (``{name: arrow type}``) every example's fields, dtypes and shapes are checked
    against them, and with ``rows`` the row count at the end.
    """
    name = name or path
    specs = field_specs(columns) if columns is not None else None
    expected = set(columns) - {"key"} if columns is not None else None
    current: dict[str, Any] | None = None
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
                    raise ShardIntegrityError(f"shard {name}: unsafe member name {member_name!r}")
                key, _, rest = os.path.basename(member_name).partition(".")
                payload = tar.extractfile(member).read()
                field, value = _decode_member(name, key, rest, payload, specs)
                if current is None or current["key"] != key:
                    if current is not None:
                        count += 1
                        yield finished(current)
                    current = {"key": key}
                current[field] = value
    except (tarfile.TarError, EOFError, OSError) as exc:
        raise _shard_error(name, exc) from None
    if current is not None:
        count += 1
        yield finished(current)
    if rows is not None and count != rows:
        raise ShardIntegrityError(f"shard {name}: {count} rows, the manifest says {rows}")


class DatasetReader:
    """A dataset directory opened through its manifest, checked as it is read.

    Args:
        path: the dataset directory (local).
        verify: shard sha256 check: ``once`` per process (default), ``always``, or ``never``
            (sizes only: the bytes are trusted).

    Raises:
        FileNotFoundError: no ``manifest.json`` (missing or incomplete dataset).
        ShardIntegrityError: a damaged manifest (see :func:`loaders.files.parse_manifest`).
    """

    def __init__(self, path: str, verify: str = "once"):
        if verify not in VERIFY_MODES:
            raise ValueError(f"verify={verify!r}: expected one of {VERIFY_MODES}")
        self.path = path
        self.verify = verify
        self._location = DatasetLocation(path)
        if self._location.remote:
            raise ValueError(f"{path}: open_dataset reads local directories; use ShardedDataset for a URL")
        self.manifest = self._location.read_manifest()
        self.columns = {c["name"]: c["type"] for c in self.manifest.schema.get("columns", [])}

    @property
    def splits(self) -> list[str]:
        return list(self.manifest.splits)

    def shards(self, split: str = "train") -> list[ShardInfo]:
        return self.manifest.shards(split)

    def formats(self) -> list[str]:
        return list(self.manifest.config["formats"])

    def iter_examples(self, split: str = "train", fmt: str | None = None) -> Iterator[dict[str, Any]]:
        """Examples of ``split`` in shard order; ``fmt`` is ``arrow`` (default if written) or ``webdataset``."""
        fmt = fmt or ("arrow" if "arrow" in self.formats() else "webdataset")
        if fmt not in self.formats():
            raise ValueError(f"format {fmt!r} was not written; the dataset has {self.formats()}")
        read = read_arrow_shard if fmt == "arrow" else read_tar_shard
        for shard in self.shards(split):
            file = shard.files[fmt]
            local = self._location.local_path(file.path)
            verify_file(local, name=file.path, sha256=file.sha256, size=file.bytes, mode=self.verify)
            yield from read(local, name=file.path, columns=self.columns, rows=shard.rows)


def open_dataset(path: str, verify: str = "once") -> DatasetReader:
    """Open a dataset directory (see :class:`DatasetReader`)."""
    return DatasetReader(path, verify)


def iter_examples(path: str, split: str = "train", fmt: str | None = None,
                  verify: str = "once") -> Iterator[dict[str, Any]]:
    """Shortcut for ``open_dataset(path, verify).iter_examples(split, fmt)``."""
    return open_dataset(path, verify).iter_examples(split, fmt)
