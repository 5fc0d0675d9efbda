"""Reading WebDataset tar shards, checked against the manifest, with nothing unpickled.

Tars are read sequentially with :mod:`tarfile` (:func:`iter_tar_shard`, which needs no
``webdataset`` install); only ``.npy`` (decoded with ``allow_pickle=False``,
:func:`decode_npy`) and ``.txt`` members are accepted. :func:`read_tar_rows` keeps only
the rows a reader asked for and stops once it has them.

Every member's dtype and shape are compared with the manifest's schema as it is read
(:func:`field_specs`), and the row count once the tar ends (the file's size and sha256
were checked before, by :meth:`loaders.access.files.DatasetLocation.open_shard`). A mismatch
raises :class:`~loaders.errors.ShardIntegrityError` naming the shard.
"""

from __future__ import annotations

import functools
import io
import math
import re
import tarfile
from collections.abc import Iterator
from typing import Any, NamedTuple

import numpy as np

from loaders.errors import ShardIntegrityError

__all__ = ["FieldSpec", "decode_npy", "field_specs", "iter_tar_shard", "read_tar_rows"]


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
                raise ShardIntegrityError(f"{len(payload) - size} bytes of array data, the header {shape} {dtype} "
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
    :func:`loaders.access.reader.read_tar_shard` for ``open_dataset`` and the inspection commands).
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
