"""ReadCorpus: raw corpus files -> text records, bad records -> rejected entries.

Formats (docs/design.md section 2, step 1):

- ``.txt``: one document per line (``line``), per blank-line-separated block
  (``paragraph``) or per file (``file``);
- ``.jsonl`` / ``.json``: one JSON object per line, text in ``--text-field`` (dotted paths
  such as ``meta.text`` reach into nested objects);
- ``.parquet``: the text column;

each optionally compressed (``.gz``, ``.zst``), from local paths or any Beam filesystem.
Files are opened through ``FileSystems`` and decompressed here (:mod:`transforms.reading.archives`),
so a corrupt archive becomes a rejected entry with a reason instead of a crash inside a
worker.

Everything read is untrusted (docs/design.md section 7):

- **Bounded memory per record.** Lines are read in bounded pieces
  (:mod:`transforms.reading.line_reader`) and no record is held beyond ``max_record_bytes`` (64 MiB
  by default): a longer text record is cut into pieces as it is read (``--long-docs
  split``) or rejected ``too_long`` without being held (``--long-docs reject``); a longer
  JSON line is always ``too_long``. Decompression is streamed with a bounded window, so a
  decompression bomb becomes ``too_long`` (or ``nul_bytes``) records, never an OOM.
- **Archives verified before their records count.** A compressed file is decompressed
  once to check every gzip CRC and zstd content checksum before any of its records is
  used (:func:`transforms.reading.archives.verify_archive`; a large file beside its reading, its
  records held until the check ends). A file that fails is one
  ``unreadable_file`` rejection that says how many records it held: none of them is used.
  A zstd frame written without a checksum cannot be verified: its file is read and
  listed as unverified in the manifest (``unverified_zstd="keep"``, the default) or
  rejected with reason ``unverified_archive``.
- **Line ends** are ``\n``, ``\r\n`` and a lone ``\r``.
- **Nothing vanishes.** A file that yields no record (no bytes, or only blank lines) is one
  ``empty_file`` rejection. A file that changes size or modification time between the
  listing of the inputs and the end of its reading fails the job
  (:class:`~transforms.reading.inputs.InputChangedError`).

A record is ``(source, position, text)``; a rejected record is a dict with ``source``,
``position``, ``reason`` and a short ``excerpt``. Reasons: ``malformed_json``,
``not_an_object``, ``missing_text_field``, ``text_not_string``, ``invalid_utf8``,
``nul_bytes``, ``empty_text`` (empty or whitespace-only), ``too_long``, ``empty_file``,
``unverified_archive`` and ``unreadable_file`` (a file that cannot be opened or
decompressed: for a compressed file none of its records is kept; for an uncompressed one
the records before the fault are kept and the rest of the file counts as one rejection).
Invalid UTF-8, NUL bytes, byte-order marks and long documents follow a
:class:`~transforms.reading.record_policy.RecordPolicy`.

Blank lines (empty or only ASCII whitespace) are separators, never records, and are not
counted; a line of other whitespace (U+3000, ...) is a record with reason ``empty_text``.
JSON integers too long for Python's integer conversion (over 4,300 digits) are kept as
their digits: they do not make a record malformed.
"""

from __future__ import annotations

from collections import Counter

import apache_beam as beam

from transforms.progress import PROGRESS
from transforms.reading.archives import compression_of
from transforms.reading.file_records import (
    TEXT_MODES,
    UNVERIFIED_PREFIX,
    empty_file_rejection,
    expand_inputs,
    file_format,
    iter_file_records,
    record_fields,
)
from transforms.reading.inputs import InputChangedError, InputFile, check_unchanged, list_inputs
from transforms.reading.record_formats import EXCERPT_CHARS, MISSING_SOURCE, SourceLabel, rejection
from transforms.reading.record_policy import RecordPolicy
from transforms.reading.splits import DEFAULT_SPLIT_BYTES, RANGE_LINES, FixLinePositions, ReadTask, as_task, tasks_of

__all__ = [
    "EXCERPT_CHARS",
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
    "file_format",
    "record_fields",
    "rejection",
]

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
            task=task, source_field=self._source_field, size=listed.size if listed is not None else None,
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
    given: a triple from :func:`_tasks_of`, an :class:`~transforms.reading.inputs.InputFile`, a task or a
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

    Files are read in tasks below the file level where they can be (:mod:`transforms.reading.splits`:
    byte ranges of uncompressed text and JSONL larger than ``split_bytes``, Parquet row
    groups), so one large file is read in parallel; what is read, and the positions of
    rejected records, do not depend on ``split_bytes``.

    Args:
        files: concrete file paths, or :class:`~transforms.reading.inputs.InputFile` s (from
            :func:`list_inputs`): a file that then changes size or modification time before its
            reading ends fails the job with :class:`~transforms.reading.inputs.InputChangedError`.
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
