"""ReadCorpus: raw corpus files -> text records, bad records -> rejected entries.

Formats (docs/design.md section 2, step 1):

- ``.txt``: one document per line (``line``), per blank-line-separated block
  (``paragraph``) or per file (``file``);
- ``.jsonl`` / ``.json``: one JSON object per line, text in ``--text-field`` (dotted paths
  such as ``meta.text`` reach into nested objects);
- ``.parquet``: the text column;

each optionally compressed (``.gz``, ``.zst``), from local paths or any Beam filesystem.
Files are opened through ``FileSystems`` and decompressed here (:mod:`transforms.archives`),
so a corrupt archive becomes a rejected entry with a reason instead of a crash inside a
worker.

Everything read is untrusted (docs/design.md section 7):

- **Bounded memory per record.** Lines are read in bounded pieces
  (:mod:`transforms.line_reader`) and no record is held beyond ``max_record_bytes`` (64 MiB
  by default): a longer text record is cut into pieces as it is read (``--long-docs
  split``) or rejected ``too_long`` without being held (``--long-docs reject``); a longer
  JSON line is always ``too_long``. Decompression is streamed with a bounded window, so a
  decompression bomb becomes ``too_long`` (or ``nul_bytes``) records, never an OOM.
- **Archives verified before their records count.** A compressed file is decompressed
  once to check every gzip CRC and zstd content checksum before any of its records is
  read (:func:`transforms.archives.verify_archive`). A file that fails is one
  ``unreadable_file`` rejection that says how many records it held: none of them is used.
  A zstd frame written without a checksum cannot be verified: its file is read and
  listed as unverified in the manifest (``unverified_zstd="keep"``, the default) or
  rejected with reason ``unverified_archive``.
- **Line ends** are ``\n``, ``\r\n`` and a lone ``\r``.
- **Nothing vanishes.** A file that yields no record (no bytes, or only blank lines) is one
  ``empty_file`` rejection. A file that changes size or modification time between the
  listing of the inputs and the end of its reading fails the job
  (:class:`~transforms.inputs.InputChangedError`).

A record is ``(source, position, text)``; a rejected record is a dict with ``source``,
``position``, ``reason`` and a short ``excerpt``. Reasons: ``malformed_json``,
``not_an_object``, ``missing_text_field``, ``text_not_string``, ``invalid_utf8``,
``nul_bytes``, ``empty_text`` (empty or whitespace-only), ``too_long``, ``empty_file``,
``unverified_archive`` and ``unreadable_file`` (a file that cannot be opened or
decompressed: for a compressed file none of its records is kept; for an uncompressed one
the records before the fault are kept and the rest of the file counts as one rejection).
Invalid UTF-8, NUL bytes, byte-order marks and long documents follow a
:class:`~transforms.record_policy.RecordPolicy`.

Blank lines (empty or only ASCII whitespace) are separators, never records, and are not
counted; a line of other whitespace (U+3000, ...) is a record with reason ``empty_text``.
JSON integers too long for Python's integer conversion (over 4,300 digits) are kept as
their digits: they do not make a record malformed.
"""

from __future__ import annotations

import contextlib
import io
import json
import zlib
from collections import Counter
from collections.abc import Iterator
from typing import Any

import apache_beam as beam

from transforms.archives import compression_of, open_decompressed, verify_archive
from transforms.inputs import InputChangedError, InputFile, check_unchanged, list_inputs
from transforms.line_reader import BLOCK_BYTES, RecordBuffer, iter_lines
from transforms.progress import PROGRESS
from transforms.record_policy import BOM, BOM_BYTES, RecordPolicy, has_surrogates, replace_surrogates, split_text
from transforms.splits import (
    DEFAULT_SPLIT_BYTES,
    RANGE_LINES,
    FixLinePositions,
    ReadTask,
    as_task,
    open_task,
    row_group_values,
    tasks_of,
)

__all__ = [
    "TEXT_MODES",
    "UNVERIFIED_PREFIX",
    "InputChangedError",
    "ReadCorpus",
    "RecordPolicy",
    "expand_inputs",
    "iter_file_records",
    "list_inputs",
    "MISSING_SOURCE",
    "SourceLabel",
    "empty_file_rejection",
    "record_fields",
    "rejection",
]

TEXT_MODES = ("line", "paragraph", "file")
UTF8_REPLACED, NUL_STRIPPED = "invalid_utf8_replaced", "nul_bytes_stripped"
#: Prefix of the read-stats key that marks a file read without verified checksums.
UNVERIFIED_PREFIX = "unverified_input:"
EXCERPT_CHARS = 200
_TEXT_SUFFIXES = (".txt", ".text", ".md", ".rst")
_JSON_SUFFIXES = (".jsonl", ".json", ".ndjson")


def rejection(source: str, position: int, reason: str, excerpt: Any = "") -> dict[str, Any]:
    """A rejected-record entry (written to ``OUT/rejected/``)."""
    if isinstance(excerpt, (bytes, bytearray)):
        excerpt = bytes(excerpt[:EXCERPT_CHARS]).decode("utf-8", errors="replace")
    elif not isinstance(excerpt, str):
        excerpt = repr(excerpt)
    return {"source": source, "position": position, "reason": reason, "excerpt": excerpt[:EXCERPT_CHARS]}


def _split_compression(path: str) -> tuple[str, str | None]:
    kind = compression_of(path)
    lower = path.lower()
    return (lower.rsplit(".", 1)[0] if kind else lower), kind


def file_format(path: str) -> str:
    """``text``, ``jsonl`` or ``parquet`` from the file name (compression suffix ignored)."""
    stem, _ = _split_compression(path)
    if stem.endswith(".parquet"):
        return "parquet"
    if stem.endswith(_JSON_SUFFIXES):
        return "jsonl"
    if stem.endswith(_TEXT_SUFFIXES):
        return "text"
    raise ValueError(
        f"--input {path}: unknown file type; expected .txt/.md/.rst, .jsonl/.json or .parquet, optionally .gz or .zst"
    )


def expand_inputs(patterns: list[str]) -> list[tuple[str, int]]:
    """Expand input globs to a sorted list of ``(path, size_bytes)`` (see :func:`list_inputs`).

    Raises:
        ValueError: a pattern matches no file, or a file has an unknown type.
    """
    return [(f.path, f.size) for f in list_inputs(patterns, file_format).files]


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


# A record generator yields ``(position, value, repairs, piece)``: ``value`` is the record's
# bytes (or text, or a rejection dict), ``piece`` says it is one of the pieces of a record
# longer than ``max_record_bytes`` (all with the record's position).


def _record_end(position: int, buffer: RecordBuffer, path: str, strip: bytes) -> Iterator[tuple]:
    """The last (or only) piece of a buffered record, or its ``too_long`` rejection."""
    data = buffer.finish()
    if strip and not buffer.over and data is not None and _is_blank(data):
        return  # a long blank line: a separator, as a short one is
    if data is None:
        yield position, rejection(path, position, "too_long", f"more than {buffer.limit:,} bytes (--max-record-bytes):"
                                  f" {buffer.excerpt[:120].decode('utf-8', 'replace')}"), (), False
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
                                        f"(--max-record-bytes): {excerpt[:120].decode('utf-8', 'replace')}"), (), False
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


def _text_bytes(column) -> list[bytes | None] | None:
    """A Parquet text column's values as raw UTF-8 bytes; ``None`` if it is not a text column.

    Reading text as bytes lets a row with invalid UTF-8 be rejected (or repaired) on its
    own instead of failing the rest of the file.
    """
    import pyarrow as pa

    if pa.types.is_dictionary(column.type):
        column = column.cast(column.type.value_type)
    if pa.types.is_string(column.type):
        return column.cast(pa.binary()).to_pylist()
    if pa.types.is_large_string(column.type):
        return column.cast(pa.large_binary()).to_pylist()
    return None


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
        values = _text_bytes(column)
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


def _finish(
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


def _records_of(path: str, kind: str, stream: Any, text_mode: str, text_field: str, policy: RecordPolicy,
                task: ReadTask | None = None, source: SourceLabel | None = None):
    if kind == "text":
        return _text_records(path, stream, text_mode, policy)
    if kind == "jsonl":
        return _jsonl_records(path, stream, text_field, policy, source)
    if task is not None and task.kind == "row_groups":
        return _row_group_records(path, stream, task, text_field, policy)
    return _parquet_records(path, stream, text_field, policy)


class _SmallReads:
    """A stream read 8 KiB at a time: a decompressor that fails loses at most that much with it."""

    def __init__(self, stream: Any):
        self._stream = stream

    def read(self, size: int = -1) -> bytes:
        return self._stream.read(8192 if size < 0 else min(size, 8192))


def _count_records(path: str, kind: str, text_mode: str, text_field: str, policy: RecordPolicy) -> int:
    """Records of a file that can be read before its first fault."""
    count = 0
    try:
        with open_decompressed(path) as stream:
            for _ in _records_of(path, kind, _SmallReads(stream), text_mode, text_field, policy):
                count += 1
    except Exception:  # noqa: BLE001 - the fault that made the file unreadable
        pass
    return count


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


def iter_file_records(
    path: str,
    *,
    text_mode: str = "line",
    text_field: str = "text",
    policy: RecordPolicy | None = None,
    counters: Counter | None = None,
    verify: bool = True,
    task: ReadTask | None = None,
    source_field: str | None = None,
) -> Iterator[Any]:
    """Yield ``(source, position, text)`` records and rejected-entry dicts of one file
    (``(source, position, text, label)`` with ``source_field``).

    Decoding, checking and the :class:`~transforms.record_policy.RecordPolicy` happen here:
    every yielded text is non-blank, encodes to UTF-8 and obeys the policy. A compressed
    file is verified first (see the module docstring): one that fails yields a single
    ``unreadable_file`` rejection. An uncompressed file that cannot be read to its end
    yields its records before the fault and one ``unreadable_file`` rejection. A file with
    no record yields one ``empty_file`` rejection. No exception escapes for bad data; a bad
    ``text_mode`` raises ``ValueError`` before reading.

    Args:
        policy: what to do with invalid UTF-8, NUL bytes, long records and unverifiable
            archives (default: reject them; records held up to 64 MiB; no length limit).
        counters: if given, counts into it the kept records that were repaired
            (``invalid_utf8_replaced``, ``nul_bytes_stripped``), the records split
            (``long_documents_split``) and the documents they became (``split_pieces``),
            and marks a file read without verified checksums (key ``UNVERIFIED_PREFIX + path``).
        verify: False reads a compressed file without checking its checksums first: only for
            a sample of the first records taken before the pipeline runs (which verifies), so
            that sampling a large archive does not decompress all of it.
        task: read only this part of the file (:mod:`transforms.splits`: a byte range, whose
            positions count from its first line, or Parquet row groups); None: all of it.
            Only an uncompressed file is split, so a task is never an archive to verify.
        source_field: JSONL field (dotted path) naming each record's source; its value is the
            label of the record (:class:`SourceLabel`: ``(missing)`` where absent, and for the
            records of text and Parquet files).
    """
    if text_mode not in TEXT_MODES:
        raise ValueError(f"--text-mode {text_mode}: expected one of {TEXT_MODES}")
    policy = policy or RecordPolicy()
    counters = counters if counters is not None else Counter()
    kind = file_format(path)
    task = task or ReadTask(path)
    record_mode = "paragraph" if kind == "text" and text_mode == "paragraph" else "line"
    compression = compression_of(path)
    kept = None
    if compression is not None and verify:
        check = verify_archive(path, compression)
        if check.error is not None or (check.unverified and policy.unverified_zstd == "reject"):
            held = _count_records(path, kind, text_mode, text_field, policy)
            if check.error is not None:
                yield rejection(path, 0, "unreadable_file", f"{check.error} (none of the {held:,} records before the "
                                "fault is used)")
            else:
                yield rejection(path, 0, "unverified_archive", f"{check.unverified} zstd frame(s) without a content "
                                f"checksum; {held:,} records not used (--unverified-zstd keep reads them)")
            return
        if check.unverified:
            counters[UNVERIFIED_PREFIX + path] = 1
        kept = check.data
    position = 0
    produced = 0
    split_at = None  # position of the record whose pieces are being read
    try:
        opened = contextlib.nullcontext(io.BytesIO(kept)) if kept is not None else \
            open_task(task, record_mode, open_decompressed, counters)
        with opened as stream:
            label = SourceLabel(source_field) if source_field else None
            for position, value, repairs, piece in _records_of(path, kind, stream, text_mode, text_field, policy,
                                                               task, label):
                produced += 1
                if isinstance(value, dict):
                    yield value
                    continue
                outputs, split = _finish(path, position, value, policy, repairs, counters)
                if piece:
                    if split_at != position:
                        counters["long_documents_split"] += 1
                        split_at = position
                    counters["split_pieces"] += len(outputs)
                elif split:
                    counters["long_documents_split"] += 1
                    counters["split_pieces"] += len(outputs)
                if label is not None:
                    outputs = [o if isinstance(o, dict) else (*o, label.value) for o in outputs]
                yield from outputs
    except (OSError, EOFError, zlib.error, ValueError) as exc:
        yield rejection(path, position, "unreadable_file", f"{type(exc).__name__}: {exc}")
        return
    except Exception as exc:  # zstandard.ZstdError and pyarrow errors have no common base
        yield rejection(path, position, "unreadable_file", f"{type(exc).__name__}: {exc}")
        return
    if not produced and task.kind == "file":  # a file read in ranges: ReadCorpus sums its ranges' records
        yield empty_file_rejection(path)


def empty_file_rejection(path: str) -> dict[str, Any]:
    """The rejected entry of a file that holds no record (the accounting counts it as one)."""
    return rejection(path, 0, "empty_file", "the file holds no record (it is empty or has only blank lines)")


def record_fields(path: str, records: int = 20, max_line_bytes: int = 1 << 20) -> list[str]:
    """The top-level field names of the first ``records`` JSON lines (or the columns) of a
    JSONL or Parquet file, sorted; empty for a text file or one that cannot be read. For
    messages about a ``--text-field`` that nothing has; lines beyond ``max_line_bytes`` are
    skipped."""
    kind = file_format(path)
    fields: set[str] = set()
    try:
        with open_decompressed(path) as stream:
            if kind == "parquet":
                import pyarrow.parquet as pq

                return sorted(pq.ParquetFile(stream).schema_arrow.names)
            if kind != "jsonl":
                return []
            seen, line, size = 0, [], 0
            for _, piece, last in iter_lines(stream):
                size += len(piece)
                if size <= max_line_bytes:
                    line.append(piece)
                if not last:
                    continue
                text, line, too_long, size = b"".join(line), [], size > max_line_bytes, 0
                if too_long or not text.strip():
                    continue
                try:
                    obj = json.loads(text)
                except (ValueError, RecursionError):
                    obj = None
                if isinstance(obj, dict):
                    fields.update(str(key) for key in obj)
                seen += 1
                if seen >= records:
                    break
    except Exception:  # a message helper: an unreadable file is reported by the pipeline itself
        return sorted(fields)
    return sorted(fields)


class _ReadFile(beam.DoFn):
    def __init__(self, text_mode: str, text_field: str, policy: RecordPolicy, source_field: str | None = None):
        self._text_mode = text_mode
        self._text_field = text_field
        self._policy = policy
        self._source_field = source_field

    def setup(self):
        self._records = beam.metrics.Metrics.counter("lmshards", "records_read")

    def process(self, element):
        listed, task, task_bytes = _listed_task(element)
        path = task.path
        # rejections of a range after a file's first have positions counted from its first line
        relative = task.kind == "range" and task.index > 0
        if listed is not None:
            check_unchanged(listed, "after the inputs were listed")
        counters: Counter = Counter()
        for item in iter_file_records(
            path, text_mode=self._text_mode, text_field=self._text_field, policy=self._policy, counters=counters,
            task=task, source_field=self._source_field,
        ):
            if isinstance(item, dict):
                beam.metrics.Metrics.counter("lmshards", f"rejected_{item['reason']}").inc()
                counters["rejected"] += 1
                if relative:
                    yield beam.pvalue.TaggedOutput(ReadCorpus.RELATIVE, ((path, task.index), item))
                else:
                    yield beam.pvalue.TaggedOutput(ReadCorpus.REJECTED, item)
            else:
                self._records.inc()
                counters["documents"] += 1
                yield (item[2], item[3]) if self._source_field else item[2]
        if listed is not None:
            check_unchanged(listed, "while the run read it")
        PROGRESS.add_bytes(task_bytes)
        if task.kind == "range":
            records = counters["documents"] + counters["rejected"]
            yield beam.pvalue.TaggedOutput(ReadCorpus.LINES, (path, (task.index, counters.pop(RANGE_LINES, 0),
                                                                    records)))
        for name, value in counters.items():
            if name not in ("documents", "rejected") and not name.startswith(UNVERIFIED_PREFIX):
                beam.metrics.Metrics.counter("lmshards", name).inc(value)
        yield beam.pvalue.TaggedOutput(ReadCorpus.STATS, dict(counters))


class ReadOutputs(dict):
    """ReadCorpus' outputs: ``texts``, ``rejected`` and ``stats`` (also by tag: ``outputs["rejected"]``)."""

    @property
    def texts(self):
        return self["texts"]


def _listed_task(element) -> tuple[InputFile | None, ReadTask, int]:
    """``(the file as listed or None, the task, its input bytes)`` of what :class:`_ReadFile` is
    given: a triple from :func:`_tasks_of`, an :class:`~transforms.inputs.InputFile`, a task or a
    bare path (0 bytes where unknown: they only feed the progress display)."""
    if isinstance(element, InputFile):
        return element, ReadTask(element.path), element.size
    if isinstance(element, tuple) and len(element) == 3 and (element[0] is None or isinstance(element[0], InputFile)):
        return element[0], as_task(element[1]), int(element[2])
    return None, as_task(element), 0


def _tasks_of(element: str | InputFile, text_mode: str,
              split_bytes: int) -> list[tuple[InputFile | None, ReadTask, int]]:
    """The read tasks of one input, each with the file as listed (None for a bare path) and the
    input bytes it covers (for the progress display: a byte range's size, a share of the row
    groups, the whole file)."""
    listed = element if isinstance(element, InputFile) else None
    path = element.path if listed is not None else element
    kind = file_format(path)
    compressed = compression_of(path) is not None
    tasks = tasks_of(path, kind=kind, compressed=compressed, text_mode=text_mode, split_bytes=split_bytes)
    size = listed.size if listed is not None else 0
    groups = max(1, tasks[-1].stop) if tasks and tasks[-1].kind == "row_groups" else 1

    def covered(task: ReadTask) -> int:
        if task.kind == "range":
            return task.stop - task.start
        if task.kind == "row_groups":
            return size * (task.stop - task.start) // groups
        return size

    return [(listed, task, covered(task)) for task in tasks]


class ReadCorpus(beam.PTransform):
    """Read text documents from files; bad records go to the ``rejected`` output.

    Files are read in tasks below the file level where they can be (:mod:`transforms.splits`:
    byte ranges of uncompressed text and JSONL larger than ``split_bytes``, Parquet row
    groups), so one large file is read in parallel; what is read, and the positions of
    rejected records, do not depend on ``split_bytes``.

    Args:
        files: concrete file paths, or :class:`~transforms.inputs.InputFile` s (from
            :func:`list_inputs`): a file that then changes size or modification time before its
            reading ends fails the job with :class:`~transforms.inputs.InputChangedError`.
        text_mode: ``line``, ``paragraph`` or ``file`` for text files.
        text_field: JSON field (dotted path) or Parquet column holding the text.
        policy: invalid UTF-8, NUL byte and long-document policy.
        split_bytes: bytes per read task (``--input-split-mb``).
        source_field: JSONL field naming each record's source (``--source-field``): the texts
            then come as ``(text, source)`` pairs (:class:`SourceLabel`).

    Returns a :class:`ReadOutputs`: the texts, rejected-entry dicts under :attr:`REJECTED`,
    and one counters dict per task under :attr:`STATS` (``documents``, ``rejected`` and the
    repairs counted by :func:`iter_file_records`).
    """

    REJECTED = "rejected"
    STATS = "stats"
    RELATIVE = "relative"
    LINES = "lines"

    def __init__(
        self,
        files: list[str],
        *,
        text_mode: str = "line",
        text_field: str = "text",
        policy: RecordPolicy | None = None,
        split_bytes: int = DEFAULT_SPLIT_BYTES,
        source_field: str | None = None,
    ):
        super().__init__()
        self._files = list(files)
        self._text_mode = text_mode
        self._text_field = text_field
        self._policy = policy or RecordPolicy()
        self._split_bytes = split_bytes
        self._source_field = source_field

    def expand(self, pbegin):
        read = (
            pbegin
            | "ListFiles" >> beam.Create(self._files, reshuffle=False)
            | "SpreadFiles" >> beam.Reshuffle()
            | "SplitFiles" >> beam.FlatMap(_tasks_of, text_mode=self._text_mode, split_bytes=self._split_bytes)
            | "SpreadTasks" >> beam.Reshuffle()
            | "ReadRecords"
            >> beam.ParDo(_ReadFile(self._text_mode, self._text_field, self._policy, self._source_field)).with_outputs(
                self.REJECTED, self.STATS, self.RELATIVE, self.LINES, main="texts"
            )
        )
        shifted, empty = (read[self.RELATIVE], read[self.LINES]) | "FixLinePositions" >> FixLinePositions()
        # A file read in ranges is empty when none of them held a record: one rejection, as a
        # whole-file read gives, counted with the reader's statistics.
        empty_rejected = empty | "EmptyFileRejections" >> beam.Map(empty_file_rejection)
        rejected = (read[self.REJECTED], shifted, empty_rejected) | "AllRejected" >> beam.Flatten()
        empty_stats = empty | "EmptyFileStats" >> beam.Map(lambda _: {"rejected": 1})
        stats = (read[self.STATS], empty_stats) | "AllReadStats" >> beam.Flatten()
        return ReadOutputs(texts=read.texts, rejected=rejected, stats=stats)
