"""A minimal reader: iterate the examples of a dataset directory as numpy arrays.

Arrow shards are memory-mapped and read without copying (a fixed-size token column
becomes an ``(rows, L)`` numpy view); WebDataset tars are read with :mod:`tarfile` and
``np.load(allow_pickle=False)``, never unpickled. Examples come in shard order, then in
stored order (the shuffled order the writer chose). The streaming torch loader builds on
this module.
"""

from __future__ import annotations

import io
import os
import tarfile
from collections.abc import Iterator
from typing import Any

import numpy as np
import pyarrow as pa

from schemas.manifest import MANIFEST_NAME, Manifest, ShardInfo

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


def read_arrow_shard(path: str) -> Iterator[dict[str, Any]]:
    """Examples of one Arrow IPC stream shard, batch by batch, memory-mapped."""
    with pa.memory_map(path, "r") as source:
        reader = pa.ipc.open_stream(source)
        for batch in reader:
            columns = {name: _column_to_numpy(batch.column(i)) for i, name in enumerate(batch.schema.names)}
            for row in range(batch.num_rows):
                yield {name: values[row] for name, values in columns.items()}


def read_tar_shard(path: str) -> Iterator[dict[str, Any]]:
    """Examples of one WebDataset tar shard (``.npy`` and ``.txt`` members only)."""
    current: dict[str, Any] | None = None
    with tarfile.open(path, mode="r|") as tar:
        for member in tar:
            if not member.isfile():
                continue
            name = member.name
            if name.startswith("/") or ".." in name.split("/"):
                raise ValueError(f"{path}: unsafe member name {name!r}")
            key, _, rest = os.path.basename(name).partition(".")
            field, _, ext = rest.rpartition(".")
            payload = tar.extractfile(member).read()
            if ext == "npy":
                value: Any = np.load(io.BytesIO(payload), allow_pickle=False)
                if value.ndim == 0:
                    value = value.item()
            elif ext == "txt":
                value = payload.decode("utf-8")
            else:
                raise ValueError(f"{path}: member {name!r} has unsupported type .{ext} (only .npy and .txt)")
            if current is None or current["key"] != key:
                if current is not None:
                    yield current
                current = {"key": key}
            current[field] = value
    if current is not None:
        yield current


class DatasetReader:
    """A dataset directory opened through its manifest.

    Args:
        path: the dataset directory (local).

    Raises:
        FileNotFoundError: no ``manifest.json`` (missing or incomplete dataset).
    """

    def __init__(self, path: str):
        self.path = path
        manifest_path = os.path.join(path, MANIFEST_NAME)
        if not os.path.exists(manifest_path):
            raise FileNotFoundError(f"{path}: no {MANIFEST_NAME}; the dataset is missing or was not completed")
        with open(manifest_path, encoding="utf-8") as handle:
            self.manifest = Manifest.loads(handle.read())

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
            yield from read(os.path.join(self.path, shard.files[fmt].path))


def open_dataset(path: str) -> DatasetReader:
    """Open a dataset directory (see :class:`DatasetReader`)."""
    return DatasetReader(path)


def iter_examples(path: str, split: str = "train", fmt: str | None = None) -> Iterator[dict[str, Any]]:
    """Shortcut for ``open_dataset(path).iter_examples(split, fmt)``."""
    return open_dataset(path).iter_examples(split, fmt)
