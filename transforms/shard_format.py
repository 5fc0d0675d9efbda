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
    cache_key = (array.dtype.str, array.shape)
    header = _NPY_HEADERS.get(cache_key)
    if header is None:
        buffer = io.BytesIO()
        np.lib.format.write_array(buffer, array, allow_pickle=False)
        header = buffer.getvalue()[: len(buffer.getvalue()) - array.nbytes]
        if len(_NPY_HEADERS) < 4096:
            _NPY_HEADERS[cache_key] = header
    return header + array.tobytes()


_BLOCK = tarfile.BLOCKSIZE
_RECORD = tarfile.RECORDSIZE


def _ustar_header(name: str, size: int) -> bytes:
    """A USTAR header for a regular file: mode 0644, uid/gid 0, mtime 0, no owner names.

    Built directly (every other field is constant) because :mod:`tarfile`'s generic
    header code dominated shard writing; the bytes are what ``tarfile`` writes for the
    same member (checked in the tests).
    """
    encoded = name.encode("utf-8")
    if len(encoded) > 100:
        raise ValueError(f"tar member name {name!r} is longer than 100 bytes")
    header = bytearray(_BLOCK)
    header[0 : len(encoded)] = encoded
    header[100:108] = b"0000644\0"
    header[108:116] = b"0000000\0"
    header[116:124] = b"0000000\0"
    header[124:136] = b"%011o\0" % size
    header[136:148] = b"00000000000\0"
    header[148:156] = b"        "
    header[156:157] = tarfile.REGTYPE
    header[257:265] = tarfile.POSIX_MAGIC
    header[148:155] = b"%06o\0" % sum(header)
    return bytes(header)


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
    """Write ``examples`` as a WebDataset tar stream (USTAR, reproducible headers).

    The layout is ``tarfile``'s in stream mode: header, payload padded to 512 bytes, per
    member; two zero blocks; zero padding to a multiple of the 10240-byte record size.
    """
    buffer = bytearray()
    written = 0
    for example in examples:
        for name, payload in example_members(example, schema):
            buffer += _ustar_header(name, len(payload))
            buffer += payload
            remainder = len(payload) % _BLOCK
            if remainder:
                buffer += bytes(_BLOCK - remainder)
        if len(buffer) >= 1 << 22:
            handle.write(buffer)
            written += len(buffer)
            buffer = bytearray()
    buffer += bytes(2 * _BLOCK)
    total = written + len(buffer)
    if total % _RECORD:
        buffer += bytes(_RECORD - total % _RECORD)
    handle.write(buffer)
