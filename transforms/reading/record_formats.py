"""The records of one opened file, format by format: text lines, paragraphs or whole files,
JSON lines, Parquet text columns (no Beam, no file opening).

A record generator yields ``(position, value, repairs, piece)``: ``value`` is the record's
bytes (or text, or a rejection dict), ``piece`` says it is one of the pieces of a record
longer than ``max_record_bytes`` (all with the record's position). :func:`finish_record` then
applies the :class:`~transforms.reading.record_policy.RecordPolicy` to a record's text. The rules
(formats, bounded memory, blank lines, rejection reasons) are those of :mod:`transforms.reading.read`;
:mod:`transforms.reading.file_records` opens, verifies and reads a file through these.
"""

from __future__ import annotations

import io
import json
import re
from collections import Counter
from collections.abc import Iterator
from typing import Any

from transforms.reading.line_reader import BLOCK_BYTES, RecordBuffer, iter_lines
from transforms.reading.record_policy import (
    BOM,
    BOM_BYTES,
    RecordPolicy,
    has_surrogates,
    replace_surrogates,
    split_text,
)
from transforms.reading.splits import ReadTask, row_group_values, text_bytes

__all__ = [
    "EXCERPT_CHARS",
    "MISSING_SOURCE",
    "NUL_STRIPPED",
    "SOURCE_CHARS",
    "SourceLabel",
    "UTF8_REPLACED",
    "finish_record",
    "records_of",
    "rejection",
]

UTF8_REPLACED, NUL_STRIPPED = "invalid_utf8_replaced", "nul_bytes_stripped"
#: Characters of a rejected record kept as its excerpt.
EXCERPT_CHARS = 200

def _bytes_excerpt(data: bytes) -> str:
    """The first :data:`EXCERPT_CHARS` characters of bytes, each byte that is not UTF-8 written
    ``\\xNN`` (not U+FFFD, which would lose what the byte was: a rejected record is read to find
    out what is wrong with it). ``4 * EXCERPT_CHARS`` bytes are decoded, so the characters kept
    are whole (a character is at most 4 bytes): no valid character cut at the end reads as
    invalid bytes, and no ``\\xNN`` is cut in two."""
    text = bytes(data[: 4 * EXCERPT_CHARS]).decode("utf-8", errors="backslashreplace")
    return text if len(text) <= EXCERPT_CHARS else re.sub(r"\\(x[0-9a-f]?)?$", "", text[:EXCERPT_CHARS])


def rejection(source: str, position: int, reason: str, excerpt: Any = "") -> dict[str, Any]:
    """A rejected-record entry (written to ``OUT/rejected/``); the excerpt is at most
    :data:`EXCERPT_CHARS` characters. Rejected files are no shards: how an excerpt is written
    changes no shard byte."""
    if isinstance(excerpt, (bytes, bytearray)):
        excerpt = _bytes_excerpt(excerpt)
    elif not isinstance(excerpt, str):
        excerpt = repr(excerpt)
    return {"source": source, "position": position, "reason": reason, "excerpt": excerpt[:EXCERPT_CHARS]}

def _text_field(obj: dict[str, Any], field_path: str) -> Any:
    value: Any = obj
    for part in field_path.split("."):
        if not isinstance(value, dict) or part not in value:
            raise KeyError(part)
        value = value[part]
    return value


def _is_blank(line: bytes) -> bool:
    """A separator line: empty or ASCII whitespace, after a byte-order mark if any."""
    return not (line[3:] if line.startswith(BOM_BYTES) else line).strip()

def _record_end(position: int, buffer: RecordBuffer, path: str, strip: bytes) -> Iterator[tuple]:
    """The last (or only) piece of a buffered record, or its ``too_long`` rejection."""
    data = buffer.finish()
    if strip and not buffer.over and data is not None and _is_blank(data):
        return  # a long blank line: a separator, as a short one is
    if data is None:
        yield position, rejection(path, position, "too_long", f"more than {buffer.limit:,} bytes (--max-record-bytes):"
                                  f" {_bytes_excerpt(buffer.excerpt[:120])}"), (), False
        return
    yield from _pieces(position, [data.rstrip(strip) if strip else data], buffer.over)


def _pieces(position: int, pieces: list[bytes], split: bool) -> Iterator[tuple]:
    for piece in pieces:
        if not split:
            yield position, piece, (), False
        elif not RecordBuffer.blank(piece):  # whitespace between pieces is not a document
            yield position, piece, (), True


def _text_records(path: str, stream: Any, mode: str, policy: RecordPolicy) -> Iterator[tuple]:
    limit, split = policy.max_record_bytes, policy.long_docs == "split"
    if mode == "file":
        buffer = RecordBuffer(limit, split)
        while block := stream.read(BLOCK_BYTES):
            yield from _pieces(0, buffer.add(block), True)
        if buffer.size:
            yield from _record_end(0, buffer, path, b"")
        return
    buffer: RecordBuffer | None = None
    start = 0
    in_line = False  # inside a line that came in several pieces
    for number, data, last in iter_lines(stream):
        if mode == "line":
            if buffer is None:
                if last and len(data) <= limit:  # a whole line within the limit: the common case
                    if not _is_blank(data):
                        yield number, data.rstrip(b"\r\n"), (), False
                    continue
                buffer, start = RecordBuffer(limit, split), number
            yield from _pieces(start, buffer.add(data), True)
            if last:
                yield from _record_end(start, buffer, path, b"\r\n")
                buffer = None
            continue
        # paragraph mode: a blank line (whole, not a piece of a long one) ends the block
        if not in_line and last and _is_blank(data):
            if buffer is not None:
                yield from _record_end(start, buffer, path, b"\r\n")
                buffer = None
            continue
        if buffer is None:
            buffer, start = RecordBuffer(limit, split), number
        yield from _pieces(start, buffer.add(data), True)
        in_line = not last
    if buffer is not None:
        yield from _record_end(start, buffer, path, b"\r\n")


class _BigInt(str):
    """A JSON integer with more digits than Python converts (kept as its digits)."""


def _lenient_int(digits: str) -> int | str:
    try:
        return int(digits)
    except ValueError:
        return _BigInt(digits)


def _loads_lenient(text: str, exc: ValueError) -> Any:
    """``json.loads`` again for a line Python's int-digit limit refused (re-raises any other error)."""
    if "integer string conversion" not in str(exc):
        raise exc
    return json.loads(text, parse_int=_lenient_int)


def _jsonl_records(path: str, stream: Any, text_field: str, policy: RecordPolicy,
                   source: SourceLabel | None = None) -> Iterator[tuple]:
    """``(line number, text or rejection, repairs made, False)`` per non-blank line.

    A line longer than ``max_record_bytes`` is a ``too_long`` rejection, never held whole.
    ``source``: set to the ``source_field`` value of each record as its text is yielded.
    """
    limit = policy.max_record_bytes
    buffer: RecordBuffer | None = None
    for number, line, last in iter_lines(stream):
        if buffer is not None or not last or len(line) > limit:  # a long line, in pieces
            if buffer is None:
                buffer = RecordBuffer(limit, split=False)
            buffer.add(line)
            if not last:
                continue
            line, excerpt, buffer = buffer.finish(), buffer.excerpt, None
            if line is None:
                yield number, rejection(path, number, "too_long", f"a JSON line of more than {limit:,} bytes "
                                        f"(--max-record-bytes): {_bytes_excerpt(excerpt[:120])}"), (), False
                continue
        if line.startswith(BOM_BYTES):  # every line may start with one (concatenated files)
            line = line[3:]
        if not line.strip():
            continue
        repairs = set()
        if b"\x00" in line and policy.nul_bytes != "keep":
            # Raw NULs are never valid JSON; name them rather than report malformed JSON.
            if policy.nul_bytes == "reject":
                yield number, rejection(path, number, "nul_bytes", line), repairs, False
                continue
            line = line.replace(b"\x00", b"")
            repairs.add(NUL_STRIPPED)
        decoded = _decode(path, number, line, policy, repairs)
        if isinstance(decoded, dict):
            yield number, decoded, repairs, False
            continue
        try:
            try:
                obj = json.loads(decoded)
            except ValueError as exc:
                obj = _loads_lenient(decoded, exc)
        except (ValueError, RecursionError):
            yield number, rejection(path, number, "malformed_json", line), repairs, False
            continue
        if not isinstance(obj, dict):
            yield number, rejection(path, number, "not_an_object", line), repairs, False
            continue
        try:
            text = _text_field(obj, text_field)
        except KeyError:
            yield number, rejection(path, number, "missing_text_field", line), repairs, False
            continue
        if type(text) is not str:  # _BigInt digits are not text either
            yield number, rejection(path, number, "text_not_string", line), repairs, False
            continue
        if has_surrogates(text):  # JSON escapes can spell lone surrogates, which no encoder accepts
            if policy.invalid_utf8 == "reject":
                yield number, rejection(path, number, "invalid_utf8", line), repairs, False
                continue
            text = replace_surrogates(text)
            repairs.add(UTF8_REPLACED)
        if source is not None:
            source.set_from(obj)
        yield number, text, repairs, False


def _parquet_records(path: str, stream: Any, text_field: str, policy: RecordPolicy) -> Iterator[tuple]:
    import pyarrow.parquet as pq

    data = stream.read()
    if not data:
        return  # no bytes: an empty file, not a corrupt one
    parquet = pq.ParquetFile(io.BytesIO(data))
    if text_field not in parquet.schema_arrow.names:
        yield 0, rejection(path, 0, "missing_text_field", f"columns: {parquet.schema_arrow.names}"), (), False
        return
    yield from _text_column_records(path, _column_rows(parquet, text_field), policy)

def _column_rows(parquet, text_field: str) -> Iterator[tuple[int, Any]]:
    row = 0
    for batch in parquet.iter_batches(columns=[text_field], batch_size=4096):
        column = batch.column(0)
        values = text_bytes(column)
        for value in column.to_pylist() if values is None else values:
            yield row, value
            row += 1


def _decode(path: str, position: int, raw: bytes, policy: RecordPolicy, repairs: set) -> str | dict[str, Any]:
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        if policy.invalid_utf8 == "reject":
            return rejection(path, position, "invalid_utf8", raw)
    repairs.add(UTF8_REPLACED)
    return raw.decode("utf-8", errors="replace")


def finish_record(
    source: str, position: int, value: bytes | str, policy: RecordPolicy, repairs, counters: Counter
) -> tuple[list[tuple[str, int, str] | dict[str, Any]], bool]:
    """Apply the policies to one record's text: ``(its documents or one rejection, split by
    max_doc_chars)``.

    ``repairs`` made earlier (by the JSONL reader) and here are counted once per record,
    and only when the record is kept.
    """
    repairs = set(repairs)
    if isinstance(value, bytes):
        decoded = _decode(source, position, value, policy, repairs)
        if isinstance(decoded, dict):
            return [decoded], False
        value = decoded
    text = value[1:] if value.startswith(BOM) else value
    if "\x00" in text:
        if policy.nul_bytes == "reject":
            return [rejection(source, position, "nul_bytes", text)], False
        if policy.nul_bytes == "strip":
            text = text.replace("\x00", "")
            repairs.add(NUL_STRIPPED)
    if not text or text.isspace():  # as ``not text.strip()``, without copying a long text
        return [rejection(source, position, "empty_text", text)], False
    limit = policy.max_doc_chars
    split = limit is not None and len(text) > limit
    if split and policy.long_docs == "reject":
        return [rejection(source, position, "too_long", text)], False
    for name in repairs:
        counters[name] += 1
    if not split:
        return [(source, position, text)], False
    return [(source, position, piece) for piece in split_text(text, limit)], True

class SourceLabel:
    """The ``--source-field`` value of the record being read (its corpus, language, ...), as a
    short string: ``(missing)`` where the record lacks the field, at most
    :data:`SOURCE_CHARS` characters."""

    def __init__(self, field_path: str):
        self.field_path, self.value = field_path, MISSING_SOURCE

    def set_from(self, obj: dict[str, Any]) -> None:
        try:
            value = _text_field(obj, self.field_path)
        except KeyError:
            self.value = MISSING_SOURCE
            return
        self.value = (value if isinstance(value, str) else json.dumps(value, sort_keys=True))[:SOURCE_CHARS]


#: The source of a record without the ``--source-field`` (or of a text or Parquet file's records).
MISSING_SOURCE = "(missing)"
#: Longest source name kept (a longer value is cut).
SOURCE_CHARS = 200

def records_of(path: str, kind: str, stream: Any, text_mode: str, text_field: str, policy: RecordPolicy,
                task: ReadTask | None = None, source: SourceLabel | None = None):
    if kind == "text":
        return _text_records(path, stream, text_mode, policy)
    if kind == "jsonl":
        return _jsonl_records(path, stream, text_field, policy, source)
    if task is not None and task.kind == "row_groups":
        return _row_group_records(path, stream, task, text_field, policy)
    return _parquet_records(path, stream, text_field, policy)

def _text_column_records(path: str, rows: Iterator[tuple[int, Any]], policy: RecordPolicy) -> Iterator[tuple]:
    """``(row, value, no repairs, piece)`` of Parquet text values, long ones held in bounded pieces."""
    limit, split = policy.max_record_bytes, policy.long_docs == "split"
    for row, value in rows:
        if not isinstance(value, bytes):
            yield row, rejection(path, row, "text_not_string", value), (), False
        elif len(value) > limit:
            buffer = RecordBuffer(limit, split)
            yield from _pieces(row, buffer.add(value), True)
            yield from _record_end(row, buffer, path, b"")
        else:
            yield row, value, (), False


def _row_group_records(path: str, stream, task: ReadTask, text_field: str, policy: RecordPolicy) -> Iterator[tuple]:
    """The records of a Parquet task's row groups (positions: the file's row numbers); only the
    task's row groups are read."""
    try:
        rows = row_group_values(stream, task, text_field)
    except KeyError as missing:
        if task.index == 0:  # once per file, whatever its tasks
            yield 0, rejection(path, 0, "missing_text_field", missing.args[0]), (), False
        return
    yield from _text_column_records(path, rows, policy)
