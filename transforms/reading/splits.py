"""Reading inputs below the file level: byte ranges of text and JSONL, row groups of Parquet.

One large file must not be one task. :func:`plan_tasks` cuts every input into
:class:`ReadTask` s:

- an uncompressed text (``line`` or ``paragraph`` mode) or JSONL file larger than the split
  size: byte ranges ``[k * size, (k + 1) * size)``. A record belongs to the range where it
  starts: a range reads from the first record start at or after its start
  (:func:`record_start`) to the first record start at or after its end, so the ranges
  partition the file's records, whatever the split size. A line starts at byte 0 or after a
  ``\\n``; a paragraph at a non-blank line that follows a blank one (or starts the file).
- an uncompressed Parquet file: one task per run of row groups of about the split size
  (read from its footer); a task reads its row groups only, never the whole file.
- everything else (``.gz``/``.zst``, which cannot be entered in the middle, text in
  ``file`` mode, small files): the whole file, as before.

Positions in rejected records stay what a whole-file read gives: line numbers for text and
JSONL, row numbers for Parquet. A row group's first row is known from the footer. A range's
first line number is not known before the ranges before it are read: each range counts the
lines it read (line ends, as the reader counts them), the counts of a file are summed in order
(:class:`FixLinePositions`), and the rejections of every range but the first get their line numbers shifted by the lines
before it. So the bytes written, rejected records included, do not depend on the split size.
"""

from __future__ import annotations

import contextlib
import io
from collections.abc import Iterator
from typing import Any, NamedTuple

import apache_beam as beam
from apache_beam.io.filesystem import CompressionTypes
from apache_beam.io.filesystems import FileSystems

__all__ = ["DEFAULT_SPLIT_BYTES", "RANGE_LINES", "FixLinePositions", "RangeStream", "ReadTask", "as_task", "open_task",
           "plan_tasks", "record_start", "row_group_values", "text_bytes"]

#: Default ``--input-split-mb``: 64 MiB per read task.
DEFAULT_SPLIT_BYTES = 64 << 20
_SCAN_BYTES = 1 << 16
#: Counter key under which :func:`open_task` leaves the lines a range read.
RANGE_LINES = "_range_lines"
_WHITESPACE = b" \t\r\x0b\x0c"  # ASCII whitespace but the line feed
_BOM = b"\xef\xbb\xbf"


class ReadTask(NamedTuple):
    """One unit of reading.

    Attributes:
        path: the file.
        kind: ``file`` (all of it), ``range`` (bytes ``[start, stop)``, cut to record starts) or
            ``row_groups`` (Parquet row groups ``[start, stop)``).
        start: first byte or row group.
        stop: end byte or row group (exclusive).
        index: the task's place among its file's tasks (0 for the first).
        first_row: for ``row_groups``, the file's row number of the first row read.
    """

    path: str
    kind: str = "file"
    start: int = 0
    stop: int = 0
    index: int = 0
    first_row: int = 0


def _open_raw(path: str):
    return FileSystems.open(path, compression_type=CompressionTypes.UNCOMPRESSED)


def _read_at(handle, offset: int, size: int) -> bytes:
    handle.seek(offset)
    return handle.read(size)


def _line_start(handle, position: int, size: int) -> int:
    """The first line start at or after ``position``: 0, or just after a ``\\n``."""
    if position <= 0:
        return 0
    offset = position - 1  # a line starts at ``position`` when the byte before it is "\n"
    while offset < size:
        block = _read_at(handle, offset, _SCAN_BYTES)
        if not block:
            break
        found = block.find(b"\n")
        if found >= 0:
            return offset + found + 1
        offset += len(block)
    return size


def _is_blank(line: bytes) -> bool:
    """A separator line (the reader's rule): empty or ASCII whitespace after a byte-order mark."""
    return not (line[3:] if line.startswith(_BOM) else line).strip()


def _previous_line_blank(handle, line_start: int) -> bool:
    """Whether the line that ends just before ``line_start`` is blank (True at the file start).

    Read backwards a block at a time, and only until it is known: a byte other than
    whitespace (or a byte-order mark's) settles it at once.
    """
    if line_start <= 0:
        return True
    end = line_start - 1  # the "\n" that ends the previous line
    tail = b""
    while True:
        begin = max(0, end - _SCAN_BYTES)
        block = _read_at(handle, begin, end - begin)
        newline = block.rfind(b"\n")
        if newline >= 0:
            return _is_blank(block[newline + 1 :] + tail)
        tail = block + tail
        if begin == 0:
            return _is_blank(tail)
        if tail.translate(None, _WHITESPACE + _BOM):
            return False
        end = begin


def _lines_from(handle, start: int, size: int):
    """``(offset, blank)`` of every line from ``start`` (a line start) on, each read in
    bounded pieces (a long line is never held)."""
    reader = io.BufferedReader(RangeStream(handle, start, size), buffer_size=_SCAN_BYTES)
    offset, line_offset, blank, first_piece = start, start, True, True
    while True:
        piece = reader.readline(_SCAN_BYTES)
        if not piece:
            if not first_piece:
                yield line_offset, blank
            return
        blank = (_is_blank(piece) if first_piece else not piece.strip()) and blank
        first_piece = False
        offset += len(piece)
        if piece.endswith(b"\n"):
            yield line_offset, blank
            line_offset, blank, first_piece = offset, True, True


def record_start(handle, position: int, size: int, mode: str) -> int:
    """The first record start at or after ``position`` of a text (``line`` or ``paragraph``
    mode) or JSONL (``line``) file of ``size`` bytes; ``size`` when there is none."""
    start = _line_start(handle, position, size)
    if mode != "paragraph":
        return start
    blank_before = _previous_line_blank(handle, start)
    for offset, blank in _lines_from(handle, start, size):
        if not blank and blank_before:
            return offset
        blank_before = blank
    return size


class RangeStream(io.RawIOBase):
    """Bytes ``[start, stop)`` of a seekable handle, as a readable stream; counts the line ends
    it hands out as the reader does (:attr:`lines`: ``\\n``, ``\\r\\n`` and a lone ``\\r``,
    :func:`transforms.reading.line_reader.iter_lines`)."""

    def __init__(self, handle, start: int, stop: int):
        super().__init__()
        self._handle, self._position, self._stop = handle, start, stop
        self._ends: int = 0  # line ends in full blocks handed out
        self._last_cr = False  # the last byte handed out was a "\r" (its line end may be "\r\n")

    @property
    def lines(self) -> int:
        """Line ends handed out so far (a final ``\\r`` counts at once: a range ends at a line start)."""
        return self._ends

    def readable(self) -> bool:
        return True

    def readinto(self, buffer) -> int:
        size = min(len(buffer), self._stop - self._position)
        if size <= 0:
            return 0
        data = _read_at(self._handle, self._position, size)
        count = len(data)
        buffer[:count] = data
        self._position += count
        if data:
            # every "\n" and every "\r" end a line, but a "\r\n" ends only one
            ends = data.count(b"\n") + data.count(b"\r") - data.count(b"\r\n")
            if self._last_cr and data.startswith(b"\n"):
                ends -= 1  # the "\r" before this block and this "\n" are one line end
            self._ends += ends
            self._last_cr = data.endswith(b"\r")
        return count

    def drain(self) -> None:
        """Read what is left (so that :attr:`lines` counts the whole range)."""
        while self.read(1 << 20):
            pass


def _splittable(path: str, text_mode: str, kind: str, compressed: bool) -> bool:
    return not compressed and (kind == "jsonl" or (kind == "text" and text_mode != "file"))


def plan_tasks(path: str, size: int, *, kind: str, compressed: bool, text_mode: str,
               split_bytes: int) -> list[ReadTask]:
    """The read tasks of one input (see the module docstring).

    Args:
        path: the file; size: its size in bytes.
        kind: ``text``, ``jsonl`` or ``parquet`` (:func:`transforms.reading.file_records.file_format`).
        compressed: whether it is ``.gz``/``.zst`` (read whole).
        text_mode: ``line``, ``paragraph`` or ``file``.
        split_bytes: bytes per task (at most, but for Parquet row groups that are larger).
    """
    if kind == "parquet" and not compressed:
        return _row_group_tasks(path, split_bytes)
    if size <= split_bytes or not _splittable(path, text_mode, kind, compressed):
        return [ReadTask(path)]
    count = -(-size // split_bytes)
    return [ReadTask(path, "range", k * split_bytes, min(size, (k + 1) * split_bytes), k) for k in range(count)]


def _row_group_tasks(path: str, split_bytes: int) -> list[ReadTask]:
    import pyarrow.parquet as pq

    try:
        with _open_raw(path) as handle:
            metadata = pq.ParquetFile(handle).metadata
    except Exception:  # not a readable Parquet file: reading it whole reports why
        return [ReadTask(path)]
    tasks, start, first_row, row, taken = [], 0, 0, 0, 0
    for group in range(metadata.num_row_groups):
        info = metadata.row_group(group)
        if group > start and taken + info.total_byte_size > split_bytes:
            tasks.append(ReadTask(path, "row_groups", start, group, len(tasks), first_row))
            start, first_row, taken = group, row, 0
        taken += info.total_byte_size
        row += info.num_rows
    tasks.append(ReadTask(path, "row_groups", start, metadata.num_row_groups, len(tasks), first_row))
    return tasks


def text_bytes(column) -> list[bytes | None] | None:
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


def row_group_values(handle, task: ReadTask, text_field: str) -> Iterator[tuple[int, Any]]:
    """``(row number, value)`` of the text column in the task's row groups, a batch at a time,
    values as UTF-8 bytes where the column is text (see :func:`text_bytes`).

    Raises:
        KeyError: the file has no column ``text_field`` (at once, before any row).
    """
    import pyarrow.parquet as pq

    parquet = pq.ParquetFile(handle)
    if text_field not in parquet.schema_arrow.names:
        raise KeyError(f"columns: {parquet.schema_arrow.names}")
    return _row_group_rows(parquet, task, text_field)


def _row_group_rows(parquet, task: ReadTask, text_field: str) -> Iterator[tuple[int, Any]]:
    row = task.first_row
    for batch in parquet.iter_batches(columns=[text_field], batch_size=4096,
                                      row_groups=list(range(task.start, task.stop))):
        column = batch.column(0)
        values = text_bytes(column)
        for value in column.to_pylist() if values is None else values:
            yield row, value
            row += 1


def _line_offsets(element):
    path, counts = element
    lines = 0
    for index, count, _ in sorted(counts):
        yield (path, index), lines
        lines += count


def _empty_file(element):
    """The path of a file none of whose ranges held a record."""
    path, counts = element
    if not any(records for _, _, records in counts):
        yield path


def _shift(element, offsets: dict):
    key, record = element
    return {**record, "position": record["position"] + offsets[tuple(key)]}


class FixLinePositions(beam.PTransform):
    """Rejections of ranges after a file's first -> rejections with the file's line numbers;
    and the split files that hold no record at all.

    Input: ``(relative, lines)``: ``((path, range index), rejected record)`` with positions
    counted from the range's first line, and ``(path, (range index, lines read, records
    read))`` of every range of every split file. Output: ``(shifted rejections, paths of
    empty files)``.
    """

    def expand(self, inputs):
        relative, lines = inputs
        per_file = lines | "LinesPerFile" >> beam.GroupByKey()
        offsets = per_file | "LinesBefore" >> beam.FlatMap(_line_offsets)
        empty = per_file | "EmptyFiles" >> beam.FlatMap(_empty_file)
        return relative | "ShiftPositions" >> beam.Map(_shift, offsets=beam.pvalue.AsDict(offsets)), empty


def as_task(element: Any) -> ReadTask:
    """A read task from a task (or the tuple a coder made of one) or a bare path (a whole file)."""
    if isinstance(element, ReadTask):
        return element
    return ReadTask(*element) if isinstance(element, (tuple, list)) else ReadTask(element)


@contextlib.contextmanager
def open_task(task: ReadTask, record_mode: str, open_whole, counters) -> Iterator[Any]:
    """The stream a task's records are read from.

    Args:
        task: the task.
        record_mode: ``paragraph`` or ``line`` (what a record start is, for ranges).
        open_whole: ``path -> context manager of the decompressed stream``, for whole files.
        counters: a range leaves the lines it read here, under :data:`RANGE_LINES` (all of
            its lines, also when its reading stopped early).
    """
    if task.kind == "file":
        with open_whole(task.path) as stream:
            yield stream
        return
    with _open_raw(task.path) as handle:
        if task.kind == "row_groups":
            yield handle
            return
        handle.seek(0, io.SEEK_END)
        size = handle.tell()
        # the first range starts at the file's start, blank lines before its first record
        # included: every line of the file is then counted by exactly one range
        start = record_start(handle, task.start, size, record_mode) if task.start else 0
        stop = record_start(handle, task.stop, size, record_mode) if task.stop < size else size
        stream = RangeStream(handle, start, max(start, stop))
        try:
            yield io.BufferedReader(stream, buffer_size=1 << 20)
        finally:
            with contextlib.suppress(Exception):
                stream.drain()
            counters[RANGE_LINES] = stream.lines


def tasks_of(path: str, *, kind: str, compressed: bool, text_mode: str, split_bytes: int) -> list[ReadTask]:
    """:func:`plan_tasks` of a file whose size is looked up only where it can matter."""
    if not compressed and (kind == "parquet" or _splittable(path, text_mode, kind, compressed)):
        try:
            size = FileSystems.match([path])[0].metadata_list[0].size_in_bytes
        except Exception:  # unlistable now: reading it whole reports why
            return [ReadTask(path)]
        return plan_tasks(path, size, kind=kind, compressed=compressed, text_mode=text_mode, split_bytes=split_bytes)
    return [ReadTask(path)]
