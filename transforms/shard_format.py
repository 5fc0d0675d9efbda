"""Byte-exact encoders of one shard: Arrow IPC stream and WebDataset tar (no Beam).

Both write to any binary, possibly non-seekable handle (a local file, a GCS upload) and
are deterministic: fixed record-batch size, uncompressed Arrow buffers, tar members with
mtime 0, uid/gid 0, empty owner names, mode 0644, and sorted names (examples in the given
order, fields in name order inside an example).
"""

from __future__ import annotations

import hashlib
import io
import tarfile
from collections.abc import Sequence
from typing import Any, BinaryIO

import numpy as np
import pyarrow as pa

from schemas.examples import ExampleSchema

__all__ = ["ARROW_BATCH_ROWS", "HashingWriter", "examples_to_batch", "write_arrow", "write_tar", "npy_bytes"]

#: Rows per Arrow record batch; fixed so that bytes never depend on the runner.
ARROW_BATCH_ROWS = 1000


class HashingWriter(io.RawIOBase):
    """Pass-through writer that counts bytes and computes their sha256."""

    def __init__(self, raw: BinaryIO):
        super().__init__()
        self._raw = raw
        self.sha256 = hashlib.sha256()
        self.bytes = 0

    def writable(self) -> bool:
        return True

    def write(self, data) -> int:
        view = memoryview(data).cast("B")
        self._raw.write(view)
        self.sha256.update(view)
        self.bytes += len(view)
        return len(view)

    def tell(self) -> int:
        return self.bytes

    def flush(self) -> None:
        self._raw.flush()


def _token_array(values: Sequence[np.ndarray], fixed: int | None) -> pa.Array:
    if fixed is not None:
        flat = np.stack(values).astype(np.int32, copy=False).reshape(-1) if values else np.zeros(0, np.int32)
        return pa.FixedSizeListArray.from_arrays(pa.array(flat, type=pa.int32()), fixed)
    lengths = np.fromiter((len(v) for v in values), dtype=np.int64, count=len(values))
    offsets = np.zeros(len(values) + 1, dtype=np.int32)
    np.cumsum(lengths, out=offsets[1:])
    flat = np.concatenate(values).astype(np.int32, copy=False) if values else np.zeros(0, np.int32)
    return pa.ListArray.from_arrays(pa.array(offsets, type=pa.int32()), pa.array(flat, type=pa.int32()))


def examples_to_batch(examples: Sequence[dict[str, Any]], schema: ExampleSchema) -> pa.RecordBatch:
    """Columnar record batch of ``examples`` (dicts of column -> value).

    Raises:
        ValueError: a fixed-length column has a row of another length.
    """
    arrays = []
    for f in schema.schema:
        values = [ex[f.name] for ex in examples]
        if f.name in schema.array_columns:
            fixed = schema.fixed_length(f.name)
            if fixed is not None:
                bad = next((len(v) for v in values if len(v) != fixed), None)
                if bad is not None:
                    raise ValueError(f"column {f.name!r} is fixed at {fixed} tokens, got a row of {bad}")
            arrays.append(_token_array(values, fixed))
        else:
            arrays.append(pa.array(values, type=f.type))
    return pa.RecordBatch.from_arrays(arrays, schema=schema.schema)


def write_arrow(handle: BinaryIO, examples: Sequence[dict[str, Any]], schema: ExampleSchema) -> None:
    """Write ``examples`` as one Arrow IPC stream (uncompressed, fixed batch rows)."""
    options = pa.ipc.IpcWriteOptions(compression=None)
    with pa.ipc.new_stream(handle, schema.schema, options=options) as writer:
        for start in range(0, len(examples), ARROW_BATCH_ROWS):
            writer.write_batch(examples_to_batch(examples[start : start + ARROW_BATCH_ROWS], schema))


def npy_bytes(array: np.ndarray) -> bytes:
    """``.npy`` bytes of an array (no pickling, deterministic header)."""
    buffer = io.BytesIO()
    np.lib.format.write_array(buffer, np.ascontiguousarray(array), allow_pickle=False)
    return buffer.getvalue()


def _member(name: str, payload: bytes) -> tuple[tarfile.TarInfo, io.BytesIO]:
    info = tarfile.TarInfo(name)
    info.size = len(payload)
    info.mtime = 0
    info.mode = 0o644
    info.uid = info.gid = 0
    info.uname = info.gname = ""
    return info, io.BytesIO(payload)


def example_members(example: dict[str, Any], schema: ExampleSchema) -> list[tuple[str, bytes]]:
    """``(member name, payload)`` of one example, sorted by name.

    Token and integer-list columns become int32 ``.npy``; scalar ints a 0-d int32 ``.npy``;
    strings other than the key a UTF-8 ``.txt``.
    """
    key = example["key"]
    if "." in key or "/" in key:
        raise ValueError(f"example key {key!r} may not contain '.' or '/' (it is the WebDataset __key__)")
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
    """Write ``examples`` as a WebDataset tar stream (USTAR, reproducible headers)."""
    with tarfile.open(fileobj=handle, mode="w|", format=tarfile.USTAR_FORMAT) as tar:
        for example in examples:
            for name, payload in example_members(example, schema):
                info, data = _member(name, payload)
                tar.addfile(info, data)
