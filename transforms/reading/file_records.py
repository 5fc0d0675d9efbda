"""The records of one input file: :func:`iter_file_records` opens it (whole or one read task),
verifies a compressed one first, reads it through :mod:`transforms.reading.record_formats` and turns
every fault into a rejected entry (no Beam). The rules are those of :mod:`transforms.reading.read`,
whose :class:`~transforms.reading.read.ReadCorpus` runs this per read task.
"""

from __future__ import annotations

import contextlib
import functools
import io
import json
import os
import threading
import zlib
from collections import Counter
from collections.abc import Callable, Generator, Iterator
from typing import Any

from schemas.errors import ConfigError
from transforms.flag_values import TEXT_MODES
from transforms.reading.archives import ArchiveCheck, compression_of, open_decompressed, verify_archive
from transforms.reading.inputs import list_inputs
from transforms.reading.line_reader import iter_lines
from transforms.reading.record_formats import SourceLabel, finish_record, records_of, rejection
from transforms.reading.record_policy import RecordPolicy
from transforms.reading.splits import ReadTask, open_task

__all__ = [
    "TEXT_MODES",
    "UNVERIFIED_PREFIX",
    "empty_file_rejection",
    "expand_inputs",
    "file_format",
    "iter_file_records",
    "record_fields",
]

#: Prefix of the read-stats key that marks a file read without verified checksums.
UNVERIFIED_PREFIX = "unverified_input:"
#: A compressed file of at most this many bytes is verified first and read from the verified
#: bytes (decompressed once); a larger one is verified beside its reading.
VERIFY_FIRST_BYTES = 1 << 20
#: The most text of records read beside an archive's verification held until it ends.
HOLD_BYTES = 32 << 20
_TEXT_SUFFIXES = (".txt", ".text", ".md", ".rst")
_JSON_SUFFIXES = (".jsonl", ".json", ".ndjson")

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
    raise ConfigError(
        f"--input {path}: unknown file type; expected .txt/.md/.rst, .jsonl/.json or .parquet, optionally .gz or .zst"
    )


def expand_inputs(patterns: list[str]) -> list[tuple[str, int]]:
    """Expand input globs to a sorted list of ``(path, size_bytes)`` (see :func:`list_inputs`).

    Raises:
        ConfigError: a pattern matches no file, or a file has an unknown type.
    """
    return [(f.path, f.size) for f in list_inputs(patterns, file_format).files]

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
            for _ in records_of(path, kind, _SmallReads(stream), text_mode, text_field, policy):
                count += 1
    except Exception:  # noqa: BLE001 - the fault that made the file unreadable
        pass
    return count


def _verdict(path: str, kind: str, text_mode: str, text_field: str, policy: RecordPolicy, counters: Counter,
             check: ArchiveCheck) -> dict[str, Any] | None:
    """The one rejected entry of an archive whose verification failed; None when it passed (a
    file with unverifiable zstd frames that is kept is then marked in ``counters``)."""
    if check.error is None and not (check.unverified and policy.unverified_zstd == "reject"):
        if check.unverified:
            counters[UNVERIFIED_PREFIX + path] = 1
        return None
    held = _count_records(path, kind, text_mode, text_field, policy)
    if check.error is not None:
        return rejection(path, 0, "unreadable_file", f"{check.error} (none of the {held:,} records before the "
                         "fault is used)")
    return rejection(path, 0, "unverified_archive", f"{check.unverified} zstd frame(s) without a content "
                     f"checksum; {held:,} records not used (--unverified-zstd keep reads them)")


def _compressed_size(path: str, size: int | None) -> float:
    """The file's size: ``size`` as listed, a local file's from the file system, else unknown (inf)."""
    if size is not None:
        return size
    if "://" not in path:
        with contextlib.suppress(OSError):
            return os.path.getsize(path)
    return float("inf")


def _read_beside_verification(path: str, compression: str, counters: Counter, records: Generator[Any, None, None],
                              verdict: Callable[[ArchiveCheck], dict[str, Any] | None]) -> Iterator[Any]:
    """``records`` of an archive, read while a thread of its own verifies it.

    Decompression releases the GIL, so the verification runs beside the parsing on another
    core. Nothing is yielded before the verification passes: what is read meanwhile is held
    (at most :data:`HOLD_BYTES` of text, then the reading waits for it). If it fails, what was
    held is dropped, the counters the reading moved are put back, and the file yields its one
    rejected entry (``verdict``), as when it is verified first.
    """
    result: list[ArchiveCheck] = []
    done = threading.Event()

    def verify() -> None:
        try:
            result.append(verify_archive(path, compression, keep=False))
        except BaseException as exc:  # noqa: BLE001 - reported as the archive's fault
            result.append(ArchiveCheck(f"{type(exc).__name__}: {exc}", 0, 0, None))
        finally:
            done.set()

    before = Counter(counters)
    threading.Thread(target=verify, name="lmshards-verify-archive", daemon=True).start()
    held: list[Any] = []
    held_bytes = 0
    try:
        for item in records:
            held.append(item)
            held_bytes += len(item[2]) if isinstance(item, tuple) else 1
            if held_bytes > HOLD_BYTES or done.is_set():
                break
        done.wait()
        failed = verdict(result[0])
        if failed is not None:
            counters.clear()
            counters.update(before)
            yield failed
            return
        yield from held
        held.clear()
        yield from records
    finally:
        records.close()

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
    size: int | None = None,
) -> Iterator[Any]:
    """Yield ``(source, position, text)`` records and rejected-entry dicts of one file
    (``(source, position, text, label)`` with ``source_field``).

    Decoding, checking and the :class:`~transforms.reading.record_policy.RecordPolicy` happen here:
    every yielded text is non-blank, encodes to UTF-8 and obeys the policy. A compressed
    file is verified first (see the module docstring): one that fails yields a single
    ``unreadable_file`` rejection. An uncompressed file that cannot be read to its end
    yields its records before the fault and one ``unreadable_file`` rejection. A file with
    no record yields one ``empty_file`` rejection. No exception escapes for bad data; a bad
    ``text_mode`` raises ``ConfigError`` before reading.

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
        task: read only this part of the file (:mod:`transforms.reading.splits`: a byte range, whose
            positions count from its first line, or Parquet row groups); None: all of it.
            Only an uncompressed file is split, so a task is never an archive to verify.
        source_field: JSONL field (dotted path) naming each record's source; its value is the
            label of the record (:class:`SourceLabel`: ``(missing)`` where absent, and for the
            records of text and Parquet files).
        size: the file's size in bytes as listed (None: a local file's is looked up). A compressed
            file of at most :data:`VERIFY_FIRST_BYTES` is verified first and read from the
            verified bytes; a larger one is verified by a thread of its own beside its reading,
            its records held (at most :data:`HOLD_BYTES` of text) until the verification ends.
    """
    if text_mode not in TEXT_MODES:
        raise ConfigError(f"--text-mode {text_mode}: expected one of {TEXT_MODES}")
    policy = policy or RecordPolicy()
    counters = counters if counters is not None else Counter()
    kind = file_format(path)
    task = task or ReadTask(path)
    record_mode = "paragraph" if kind == "text" and text_mode == "paragraph" else "line"
    compression = compression_of(path)
    read = functools.partial(_read_records, path, kind, task, record_mode, text_mode, text_field, policy, counters,
                             source_field)
    if compression is None or not verify:
        yield from read(None)
        return
    verdict = functools.partial(_verdict, path, kind, text_mode, text_field, policy, counters)
    if _compressed_size(path, size) > VERIFY_FIRST_BYTES:
        yield from _read_beside_verification(path, compression, counters, read(None), verdict)
        return
    check = verify_archive(path, compression)
    failed = verdict(check)
    yield from [failed] if failed is not None else read(check.data)


def _read_records(path: str, kind: str, task: ReadTask, record_mode: str, text_mode: str, text_field: str,
                  policy: RecordPolicy, counters: Counter, source_field: str | None,
                  kept: bytes | None) -> Iterator[Any]:
    """The records of a file whose archive, if it is one, is verified or being verified
    (:func:`iter_file_records`); from ``kept``, its verified bytes, when given."""
    position = 0
    produced = 0
    split_at = None  # position of the record whose pieces are being read
    try:
        opened = contextlib.nullcontext(io.BytesIO(kept)) if kept is not None else \
            open_task(task, record_mode, open_decompressed, counters)
        with opened as stream:
            label = SourceLabel(source_field) if source_field else None
            for position, value, repairs, piece in records_of(path, kind, stream, text_mode, text_field, policy,
                                                               task, label):
                produced += 1
                if isinstance(value, dict):
                    yield value
                    continue
                outputs, split = finish_record(path, position, value, policy, repairs, counters)
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
