"""ReadCorpus: raw corpus files -> text records, bad records -> rejected entries.

Formats (DESIGN.md section 2.1):

- ``.txt``: one document per line (``line``), per blank-line-separated block
  (``paragraph``) or per file (``file``);
- ``.jsonl`` / ``.json``: one JSON object per line, text in ``--text-field`` (dotted paths
  such as ``meta.text`` reach into nested objects);
- ``.parquet``: the text column;

each optionally compressed (``.gz``, ``.zst``), from local paths or any Beam filesystem.
Files are opened through ``FileSystems`` and decompressed here, so a truncated archive
becomes a rejected entry with a reason instead of a crash inside a worker.

A record is ``(source, position, text)``; a rejected record is a dict with ``source``,
``position``, ``reason`` and a short ``excerpt``. Reasons: ``malformed_json``,
``not_an_object``, ``missing_text_field``, ``text_not_string``, ``invalid_utf8``,
``nul_bytes``, ``empty_text`` (empty or whitespace-only), ``too_long`` and
``unreadable_file`` (a file that cannot be opened or decompressed to its end: the
records before the fault are kept and the rest of the file counts as one rejection).
Invalid UTF-8, NUL bytes, byte-order marks and long documents follow a
:class:`~transforms.record_policy.RecordPolicy`.

Blank lines (empty or only ASCII whitespace) are separators, never records, and are not
counted; a line of other whitespace (U+3000, ...) is a record with reason ``empty_text``.
"""

from __future__ import annotations

import contextlib
import gzip
import io
import json
import zlib
from collections import Counter
from collections.abc import Iterator
from typing import Any

import apache_beam as beam
from apache_beam.io.filesystem import CompressionTypes
from apache_beam.io.filesystems import FileSystems

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
    "ReadCorpus",
    "RecordPolicy",
    "expand_inputs",
    "iter_file_records",
    "rejection",
]

TEXT_MODES = ("line", "paragraph", "file")
UTF8_REPLACED, NUL_STRIPPED = "invalid_utf8_replaced", "nul_bytes_stripped"
EXCERPT_CHARS = 200
_TEXT_SUFFIXES = (".txt", ".text", ".md", ".rst")
_JSON_SUFFIXES = (".jsonl", ".json", ".ndjson")


def rejection(source: str, position: int, reason: str, excerpt: Any = "") -> dict[str, Any]:
    """A rejected-record entry (written to ``OUT/rejected/``)."""
    if isinstance(excerpt, bytes):
        excerpt = excerpt[:EXCERPT_CHARS].decode("utf-8", errors="replace")
    elif not isinstance(excerpt, str):
        excerpt = repr(excerpt)
    return {"source": source, "position": position, "reason": reason, "excerpt": excerpt[:EXCERPT_CHARS]}


def _split_compression(path: str) -> tuple[str, str | None]:
    lower = path.lower()
    for suffix, kind in ((".gz", "gzip"), (".gzip", "gzip"), (".zst", "zstd"), (".zstd", "zstd")):
        if lower.endswith(suffix):
            return lower[: -len(suffix)], kind
    return lower, None


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
    """Expand input globs to a sorted list of ``(path, size_bytes)``.

    Raises:
        ValueError: a pattern matches no file, or a file has an unknown type.
    """
    if not patterns:
        raise ValueError("--input: at least one input glob is required")
    files: dict[str, int] = {}
    for pattern in patterns:
        try:
            results = FileSystems.match([pattern])[0].metadata_list
        except Exception as exc:  # Beam raises BeamIOError for unreadable patterns
            raise ValueError(f"--input {pattern}: cannot list files ({exc})") from exc
        matched = [m for m in results if not m.path.endswith("/")]
        if not matched:
            raise ValueError(f"--input {pattern}: matches no file")
        for meta in matched:
            file_format(meta.path)
            files[meta.path] = meta.size_in_bytes
    return sorted(files.items())


class _ZstdReader(io.RawIOBase):
    """Concatenated zstd frames -> bytes; ``EOFError`` when the input ends inside a frame.

    ``zstandard``'s ``stream_reader`` returns a short read on a truncated frame (a cut
    archive would become a silently cut last record) and cannot iterate lines.
    """

    def __init__(self, raw: io.BufferedIOBase):
        super().__init__()
        import zstandard

        self._raw = raw
        self._decompressor = zstandard.ZstdDecompressor()
        self._frame: Any = None
        self._pending = memoryview(b"")

    def readable(self) -> bool:
        return True

    def readinto(self, buffer) -> int:
        while not self._pending:
            data = self._raw.read(1 << 16)  # small reads keep each decompressed batch small
            if not data:
                if self._frame is not None and not self._frame.eof:
                    raise EOFError("zstd stream ended before the end of a frame")
                return 0
            out = []
            while data:
                if self._frame is None or self._frame.eof:
                    self._frame = self._decompressor.decompressobj()
                out.append(self._frame.decompress(data))
                data = self._frame.unused_data if self._frame.eof else b""
            self._pending = memoryview(b"".join(out))
        count = min(len(buffer), len(self._pending))
        buffer[:count] = self._pending[:count]
        self._pending = self._pending[count:]
        return count


@contextlib.contextmanager
def _open_decompressed(path: str) -> Iterator[io.BufferedIOBase]:
    # Closing a GzipFile does not close the file object it wraps, so both are managed here.
    with FileSystems.open(path, compression_type=CompressionTypes.UNCOMPRESSED) as raw:
        _, kind = _split_compression(path)
        if kind == "gzip":
            with gzip.GzipFile(fileobj=raw, mode="rb") as stream:
                yield stream
        elif kind == "zstd":
            with io.BufferedReader(_ZstdReader(raw)) as stream:
                yield stream
        else:
            yield raw


def _text_field(obj: dict[str, Any], field_path: str) -> Any:
    value: Any = obj
    for part in field_path.split("."):
        if not isinstance(value, dict) or part not in value:
            raise KeyError(part)
        value = value[part]
    return value


def _iter_lines(stream: io.BufferedIOBase) -> Iterator[tuple[int, bytes]]:
    yield from enumerate(stream, start=1)


def _is_blank(line: bytes) -> bool:
    """A separator line: empty or ASCII whitespace, after a byte-order mark if any."""
    return not (line[3:] if line.startswith(BOM_BYTES) else line).strip()


def _text_records(path: str, stream: io.BufferedIOBase, mode: str) -> Iterator[tuple]:
    """``(path, position, raw bytes, no repairs)`` per record."""
    if mode == "file":
        yield path, 0, stream.read(), ()
        return
    if mode == "line":
        for number, line in _iter_lines(stream):
            if not _is_blank(line):
                yield path, number, line.rstrip(b"\r\n"), ()
        return
    block: list[bytes] = []
    start = 0
    for number, line in _iter_lines(stream):
        if not _is_blank(line):
            if not block:
                start = number
            block.append(line)
        elif block:
            yield path, start, b"".join(block).rstrip(b"\r\n"), ()
            block = []
    if block:
        yield path, start, b"".join(block).rstrip(b"\r\n"), ()


def _jsonl_records(path: str, stream: io.BufferedIOBase, text_field: str, policy: RecordPolicy) -> Iterator[tuple]:
    """``(path, line number, text or rejection, repairs made)`` per non-blank line."""
    for number, line in _iter_lines(stream):
        if line.startswith(BOM_BYTES):  # every line may start with one (concatenated files)
            line = line[3:]
        if not line.strip():
            continue
        repairs = set()
        if b"\x00" in line and policy.nul_bytes != "keep":
            # Raw NULs are never valid JSON; name them rather than report malformed JSON.
            if policy.nul_bytes == "reject":
                yield path, number, rejection(path, number, "nul_bytes", line), repairs
                continue
            line = line.replace(b"\x00", b"")
            repairs.add(NUL_STRIPPED)
        decoded = _decode(path, number, line, policy, repairs)
        if isinstance(decoded, dict):
            yield path, number, decoded, repairs
            continue
        try:
            obj = json.loads(decoded)
        except (ValueError, RecursionError):
            yield path, number, rejection(path, number, "malformed_json", line), repairs
            continue
        if not isinstance(obj, dict):
            yield path, number, rejection(path, number, "not_an_object", line), repairs
            continue
        try:
            text = _text_field(obj, text_field)
        except KeyError:
            yield path, number, rejection(path, number, "missing_text_field", line), repairs
            continue
        if not isinstance(text, str):
            yield path, number, rejection(path, number, "text_not_string", line), repairs
            continue
        if has_surrogates(text):  # JSON escapes can spell lone surrogates, which no encoder accepts
            if policy.invalid_utf8 == "reject":
                yield path, number, rejection(path, number, "invalid_utf8", line), repairs
                continue
            text = replace_surrogates(text)
            repairs.add(UTF8_REPLACED)
        yield path, number, text, repairs


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


def _parquet_records(path: str, stream: io.BufferedIOBase, text_field: str) -> Iterator[tuple]:
    import pyarrow.parquet as pq

    parquet = pq.ParquetFile(io.BytesIO(stream.read()))
    if text_field not in parquet.schema_arrow.names:
        yield path, 0, rejection(path, 0, "missing_text_field", f"columns: {parquet.schema_arrow.names}"), ()
        return
    row = 0
    for batch in parquet.iter_batches(columns=[text_field], batch_size=4096):
        column = batch.column(0)
        values = _text_bytes(column)
        for value in column.to_pylist() if values is None else values:
            if not isinstance(value, bytes):
                yield path, row, rejection(path, row, "text_not_string", value), ()
            else:
                yield path, row, value, ()
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
) -> Iterator[tuple[str, int, str] | dict[str, Any]]:
    """Apply the policies to one record's text; yield its documents or one rejection.

    ``repairs`` made earlier (by the JSONL reader) and here are counted once per record,
    and only when the record is kept.
    """
    repairs = set(repairs)
    if isinstance(value, bytes):
        decoded = _decode(source, position, value, policy, repairs)
        if isinstance(decoded, dict):
            yield decoded
            return
        value = decoded
    text = value[1:] if value.startswith(BOM) else value
    if "\x00" in text:
        if policy.nul_bytes == "reject":
            yield rejection(source, position, "nul_bytes", text)
            return
        if policy.nul_bytes == "strip":
            text = text.replace("\x00", "")
            repairs.add(NUL_STRIPPED)
    if not text.strip():
        yield rejection(source, position, "empty_text", text)
        return
    pieces = [text]
    limit = policy.max_doc_chars
    if limit is not None and len(text) > limit:
        if policy.long_docs == "reject":
            yield rejection(source, position, "too_long", text)
            return
        pieces = split_text(text, limit)
        counters["long_documents_split"] += 1
        counters["split_pieces"] += len(pieces)
    for name in repairs:
        counters[name] += 1
    for piece in pieces:
        yield source, position, piece


def _row_group_records(path: str, stream, task: ReadTask, text_field: str) -> Iterator[tuple]:
    """``(path, row, value, no repairs)`` of a Parquet task's row groups (positions: file rows)."""
    try:
        values = row_group_values(stream, task, text_field)
    except KeyError as missing:
        if task.index == 0:  # once per file, whatever its tasks
            yield path, 0, rejection(path, 0, "missing_text_field", missing.args[0]), ()
        return
    for row, value in values:
        yield path, row, value if isinstance(value, bytes) else rejection(path, row, "text_not_string", value), ()


def iter_file_records(
    path: str,
    *,
    text_mode: str = "line",
    text_field: str = "text",
    policy: RecordPolicy | None = None,
    counters: Counter | None = None,
    task: ReadTask | None = None,
) -> Iterator[Any]:
    """Yield ``(source, position, text)`` records and rejected-entry dicts of one file.

    Decoding, checking and the :class:`~transforms.record_policy.RecordPolicy` happen here:
    every yielded text is non-blank, encodes to UTF-8 and obeys the policy. A file that
    cannot be read or decompressed to its end yields one ``unreadable_file`` rejection
    (records already read stay). No exception escapes for bad data; a bad ``text_mode``
    raises ``ValueError`` before reading.

    Args:
        policy: what to do with invalid UTF-8, NUL bytes and long documents (default:
            reject them; no length limit).
        counters: if given, counts into it the kept records that were repaired
            (``invalid_utf8_replaced``, ``nul_bytes_stripped``), the records split
            (``long_documents_split``) and the documents they became (``split_pieces``).
        task: read only this part of the file (:mod:`transforms.splits`: a byte range, whose
            positions count from its first line, or Parquet row groups); None: all of it.
    """
    if text_mode not in TEXT_MODES:
        raise ValueError(f"--text-mode {text_mode}: expected one of {TEXT_MODES}")
    policy = policy or RecordPolicy()
    counters = counters if counters is not None else Counter()
    kind = file_format(path)
    task = task or ReadTask(path)
    record_mode = "paragraph" if kind == "text" and text_mode == "paragraph" else "line"
    position = 0
    try:
        with open_task(task, record_mode, _open_decompressed, counters) as stream:
            if kind == "text":
                records = _text_records(path, stream, text_mode)
            elif kind == "jsonl":
                records = _jsonl_records(path, stream, text_field, policy)
            elif task.kind == "row_groups":
                records = _row_group_records(path, stream, task, text_field)
            else:
                records = _parquet_records(path, stream, text_field)
            for source, position, value, repairs in records:
                if isinstance(value, dict):
                    yield value
                else:
                    yield from _finish(source, position, value, policy, repairs, counters)
    except (OSError, EOFError, zlib.error, ValueError) as exc:
        yield rejection(path, position, "unreadable_file", f"{type(exc).__name__}: {exc}")
    except Exception as exc:  # zstandard.ZstdError and pyarrow errors have no common base
        yield rejection(path, position, "unreadable_file", f"{type(exc).__name__}: {exc}")


class _ReadFile(beam.DoFn):
    def __init__(self, text_mode: str, text_field: str, policy: RecordPolicy):
        self._text_mode = text_mode
        self._text_field = text_field
        self._policy = policy

    def setup(self):
        self._records = beam.metrics.Metrics.counter("lmshards", "records_read")

    def process(self, element):
        task = as_task(element)
        path = task.path
        # rejections of a range after a file's first have positions counted from its first line
        relative = task.kind == "range" and task.index > 0
        counters: Counter = Counter()
        for item in iter_file_records(
            path, text_mode=self._text_mode, text_field=self._text_field, policy=self._policy, counters=counters,
            task=task,
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
                yield item[2]
        if task.kind == "range":
            yield beam.pvalue.TaggedOutput(ReadCorpus.LINES, (path, (task.index, counters.pop(RANGE_LINES, 0))))
        for name, value in counters.items():
            if name not in ("documents", "rejected"):
                beam.metrics.Metrics.counter("lmshards", name).inc(value)
        yield beam.pvalue.TaggedOutput(ReadCorpus.STATS, dict(counters))


class ReadOutputs(dict):
    """ReadCorpus' outputs: ``texts``, ``rejected`` and ``stats`` (also by tag: ``outputs["rejected"]``)."""

    @property
    def texts(self):
        return self["texts"]


def _tasks_of(path: str, text_mode: str, split_bytes: int) -> list[ReadTask]:
    kind = file_format(path)
    compressed = _split_compression(path)[1] is not None
    return tasks_of(path, kind=kind, compressed=compressed, text_mode=text_mode, split_bytes=split_bytes)


class ReadCorpus(beam.PTransform):
    """Read text documents from files; bad records go to the ``rejected`` output.

    Files are read in tasks below the file level where they can be (:mod:`transforms.splits`:
    byte ranges of uncompressed text and JSONL larger than ``split_bytes``, Parquet row
    groups), so one large file is read in parallel; what is read, and the positions of
    rejected records, do not depend on ``split_bytes``.

    Args:
        files: concrete file paths (already expanded, see :func:`expand_inputs`).
        text_mode: ``line``, ``paragraph`` or ``file`` for text files.
        text_field: JSON field (dotted path) or Parquet column holding the text.
        policy: invalid UTF-8, NUL byte and long-document policy.
        split_bytes: bytes per read task (``--input-split-mb``).

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
    ):
        super().__init__()
        self._files = list(files)
        self._text_mode = text_mode
        self._text_field = text_field
        self._policy = policy or RecordPolicy()
        self._split_bytes = split_bytes

    def expand(self, pbegin):
        read = (
            pbegin
            | "ListFiles" >> beam.Create(self._files, reshuffle=False)
            | "SpreadFiles" >> beam.Reshuffle()
            | "SplitFiles" >> beam.FlatMap(_tasks_of, text_mode=self._text_mode, split_bytes=self._split_bytes)
            | "SpreadTasks" >> beam.Reshuffle()
            | "ReadRecords"
            >> beam.ParDo(_ReadFile(self._text_mode, self._text_field, self._policy)).with_outputs(
                self.REJECTED, self.STATS, self.RELATIVE, self.LINES, main="texts"
            )
        )
        shifted = (read[self.RELATIVE], read[self.LINES]) | "FixLinePositions" >> FixLinePositions()
        rejected = (read[self.REJECTED], shifted) | "AllRejected" >> beam.Flatten()
        return ReadOutputs(texts=read.texts, rejected=rejected, stats=read[self.STATS])
