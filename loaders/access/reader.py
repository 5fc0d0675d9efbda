"""A minimal reader: iterate the examples of a dataset directory as numpy arrays.

Arrow shards are memory-mapped and read without copying (a fixed-size token column
becomes an ``(rows, L)`` numpy view); WebDataset tars are read with :mod:`tarfile`, their
``.npy`` members never unpickled. Examples come in shard order, then in stored order (the
shuffled order the writer chose).

:class:`DatasetReader` reads through the same doors as :class:`~loaders.dataset.ShardedDataset`,
so it checks exactly what the loader checks: the manifest and its paths
(:meth:`loaders.access.files.DatasetLocation.read_manifest`), each shard's size and sha256
(:meth:`~loaders.access.files.DatasetLocation.open_shard`; ``verify``: ``once``, ``always`` or
``never``, which trusts the bytes), and what is inside it (:class:`loaders.access.arrow_shard.ArrowShard`:
a valid stream, schema, row count, no nulls; :func:`loaders.access.tar_shard.iter_tar_shard`: member
names, types, dtypes, shapes, rows). A mismatch is a
:class:`~loaders.errors.ShardIntegrityError` naming the shard. An Arrow shard whose file
shrinks while it is read is an error before the next record batch is touched (not a SIGBUS).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from loaders.access.arrow_shard import ArrowShard
from loaders.access.cache import DEFAULT_CACHE_BYTES
from loaders.access.files import VERIFY_MODES, DatasetLocation
from loaders.access.tar_shard import iter_tar_shard
from schemas.manifest import ShardInfo

__all__ = ["DatasetReader", "iter_examples", "open_dataset", "read_arrow_shard", "read_tar_shard"]


def read_arrow_shard(path: str, *, name: str | None = None, columns: dict[str, str] | None = None,
                     rows: int | None = None) -> Iterator[dict[str, Any]]:
    """Examples of one Arrow IPC stream shard in stored order, memory-mapped
    (opened by :class:`~loaders.access.arrow_shard.ArrowShard`, the loader's own opener, with its checks).

    With ``columns`` (``{name: arrow type}``) and ``rows`` from the manifest, the schema and the
    row count are checked before the first example.

    Raises:
        ShardIntegrityError: a shard that is not a valid Arrow stream, has nulls, a schema or row
            count that differs, or a file that shrank while it was read (naming ``name``).
    """
    shard = ArrowShard(path, name=name or path, columns=columns, rows=rows)
    fields = shard.fields(None)
    batch_starts = set(shard._starts)
    for index in range(shard.num_rows):
        if index in batch_starts:
            shard.check_intact()  # a file that shrank under its mapping: an error, not a SIGBUS
        yield shard.row(index, fields)


def read_tar_shard(path: str, *, name: str | None = None, columns: dict[str, str] | None = None,
                   rows: int | None = None) -> Iterator[dict[str, Any]]:
    """Examples of one WebDataset tar shard (``.npy`` and ``.txt`` members only), read by
    :func:`~loaders.access.tar_shard.iter_tar_shard`, the loader's own reader, with its checks.

    With ``columns`` (``{name: arrow type}``) every example's fields, dtypes and shapes are checked
    against them, and with ``rows`` the row count at the end.
    """
    return iter_tar_shard(path, name=name or path, columns=columns, rows=rows)


class DatasetReader:
    """A dataset directory opened through its manifest, checked as it is read.

    Args:
        path: the dataset directory, or a URL (``gs://``, ``s3://``, ...: shards are downloaded into
            the loader's local cache, see :mod:`loaders.access.files`).
        verify: shard sha256 check: ``once`` per process (default), ``always``, or ``never``
            (sizes only: the bytes are trusted).
        cache_dir, cache_size_bytes, storage_options: remote datasets, as for
            :class:`~loaders.dataset.ShardedDataset`.

    Raises:
        FileNotFoundError: no ``manifest.json`` (missing or incomplete dataset), or no tokenizer.
        ShardIntegrityError: a damaged manifest (see :func:`loaders.access.files.parse_manifest`), or a
            tokenizer whose sha256 is not the manifest's.
    """

    def __init__(self, path: str, verify: str = "once", *, cache_dir: str | None = None,
                 cache_size_bytes: int | None = DEFAULT_CACHE_BYTES, storage_options: dict[str, Any] | None = None):
        if verify not in VERIFY_MODES:
            raise ValueError(f"verify={verify!r}: expected one of {VERIFY_MODES}")
        self.path = path
        self.verify = verify
        self._location = DatasetLocation(path, cache_dir, cache_size_bytes=cache_size_bytes,
                                         storage_options=storage_options)
        self.manifest = self._location.read_manifest()
        self._location.check_tokenizer(self.manifest, verify=verify)
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
            with self._location.open_shard(file, verify=self.verify) as lease:  # held while it is read
                yield from read(lease.path, name=file.path, columns=self.columns, rows=shard.rows)


def open_dataset(path: str, verify: str = "once", **options: Any) -> DatasetReader:
    """Open a dataset directory or URL (see :class:`DatasetReader`)."""
    return DatasetReader(path, verify, **options)


def iter_examples(path: str, split: str = "train", fmt: str | None = None,
                  verify: str = "once") -> Iterator[dict[str, Any]]:
    """Shortcut for ``open_dataset(path, verify).iter_examples(split, fmt)``."""
    return open_dataset(path, verify).iter_examples(split, fmt)
