"""WebDataset tar encoder of one shard, and the ``.npy`` bytes of its members (no Beam).

Deterministic: USTAR members with mtime 0, uid/gid 0, empty owner names, mode 0644, in the
given example order and, inside an example, in name order; the layout is ``tarfile``'s in
stream mode (header, payload padded to 512 bytes, per member; two zero blocks; zero padding
to a multiple of the 10240-byte record size), byte for byte (checked against ``tarfile`` in
``tests/transforms/test_shard_format.py``).

Member headers are built here, a column of members at a time, rather than by
``tarfile.TarInfo.tobuf``, which gives the same bytes but one member at a time through its
generic header code: measured by ``benchmarks/bench_handwritten.py`` (``tar headers``),
``tobuf`` for a shard's member headers alone takes several times as long as this module
writing the whole shard, payloads included. Only three fields vary (name, size, checksum); the constant ones come from
``tarfile.TarInfo.tobuf`` itself (:data:`_USTAR_TEMPLATE`), so only the field offsets of the
USTAR layout are written out here.
"""

from __future__ import annotations

import io
import tarfile
from typing import BinaryIO

import numpy as np

from transforms.writing.columns import ExampleColumns, MergedColumns

__all__ = ["npy_bytes", "write_tar_columns"]


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
    """The USTAR header ``tarfile`` writes for a regular file of mode 0644, uid/gid 0, mtime 0 and
    no owner names, with the checksum field as spaces (how the checksum counts it): the name,
    size and checksum are filled in per member (:func:`_member_headers`)."""
    info = tarfile.TarInfo("")
    info.mode, info.mtime, info.uid, info.gid, info.uname, info.gname = 0o644, 0, 0, 0, "", ""
    header = bytearray(info.tobuf(tarfile.USTAR_FORMAT, "utf-8", "surrogateescape"))
    header[148:156] = b"        "
    return bytes(header)


_USTAR_TEMPLATE = _ustar_template()


def _check_key(key: str) -> None:
    if "." in key or "/" in key:
        raise ValueError(f"example key {key!r} may not contain '.' or '/' (it is the WebDataset __key__)")


def _octal_fields(values: np.ndarray, digits: int) -> np.ndarray:
    """``b"%0{digits}o" % v`` of every value, as an ``(n, digits)`` uint8 array."""
    shifts = 3 * np.arange(digits - 1, -1, -1, dtype=np.int64)
    return ((values.astype(np.int64)[:, None] >> shifts) & 7).astype(np.uint8) + ord("0")


def _member_headers(names: list[bytes], sizes: np.ndarray) -> np.ndarray:
    """``(n, 512)`` uint8 USTAR headers of members ``names`` with ``sizes``.

    Built from :data:`_USTAR_TEMPLATE` (every other field is constant), a column at a time (see
    the module docstring); the bytes are what ``tarfile`` writes for the same members. USTAR
    offsets: name ``[0, 100)``, size ``[124, 136)`` (11 octal digits and NUL), checksum
    ``[148, 156)`` (6 octal digits, NUL, space).
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
    """Write the rows of ``columns`` as a WebDataset tar stream (USTAR, reproducible headers: the
    module docstring); return the number of rows (samples) written.

    A row's members, sorted by name: token and integer-list columns as int32 ``.npy``, scalar
    ints as a 0-d int32 ``.npy``, strings other than the key as UTF-8 ``.txt``.

    Column by column: every member header of a column is built in one numpy operation, the
    ``.npy`` header of each distinct row shape once, and the stream is the interleaving of
    the columns' pieces (header, ``.npy`` header, data view, padding) joined a few MiB at a
    time. Same bytes as ``tarfile`` writing each row's members one by one (the tests compare them).
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
