"""WriteShards and WriteRejected: the file-writing stages.

WriteShards (docs/design.md section 2, step 6): the shard of an example is a salted digest of its
key modulo the split's shard count (decided in BuildExamples, see
:func:`transforms.objectives.layout.shard_count`); a shard's pieces are grouped, its rows
sorted by a seeded digest of their key (this is the global shuffle), and written once per
format to a temporary name under ``OUT/.tmp/`` through ``FileSystems``, then renamed to
the final name. A retried bundle rewrites the same bytes; a killed run leaves only
temporary files and no manifest. Every shard index exists, empty shards included, so
names are dense. With the run's :class:`~transforms.writing.output.RunLock`, every rename first
checks that the output's lock still names this run (:func:`write_atomic`).
"""

from __future__ import annotations

import json
import math
import uuid
from concurrent.futures import ThreadPoolExecutor

import apache_beam as beam
from apache_beam.io.filesystems import FileSystems

from schemas.errors import JobFailedError
from schemas.examples import ExampleSchema
from schemas.manifest import ShardFile, ShardInfo, shard_name
from transforms.elements import ShardPiece
from transforms.flag_values import REJECTED_PER_SHARD
from transforms.free_memory import return_freed_memory
from transforms.handoff import let_go
from transforms.objectives.common import digest_u64
from transforms.objectives.layout import shard_count
from transforms.progress import PROGRESS
from transforms.writing.hashing_writer import HashingWriter
from transforms.writing.output import TMP_DIR, RunLock
from transforms.writing.shard_format import write_arrow_columns, write_tar_columns

__all__ = ["SHARD_MARKER", "TMP_DIR", "ShardRowsError", "WriteRejected", "WriteShards",
           "join_path", "rejected_file_name", "shard_count", "write_atomic"]

WRITERS = {"arrow": write_arrow_columns, "webdataset": write_tar_columns}
def join_path(root: str, relative: str) -> str:
    return FileSystems.join(root, *relative.split("/"))


def write_atomic(root: str, relative: str, write, lock: RunLock | None = None) -> ShardFile:
    """Write ``root/relative`` via a unique temporary file and a rename.

    Args:
        write: callable taking a binary handle (what it returns is ignored).
        lock: the run's lock, checked before the rename (raises
            :class:`~transforms.writing.output.LockLostError` when another run holds the output).
    """
    final = join_path(root, relative)
    temp = join_path(root, f"{TMP_DIR}/{uuid.uuid4().hex}-{relative.replace('/', '-')}")
    try:
        return _write_and_rename(relative, final, temp, write, lock)
    except BaseException as exc:
        try:
            FileSystems.delete([temp])  # leave no temporary file behind (a full disk, a lost lock)
        except Exception:  # noqa: BLE001 - never created, or renamed already
            pass
        if isinstance(exc, OSError):
            raise OSError(exc.errno, f"cannot write {relative} under {root}: {exc.strerror or exc}") from exc
        raise


def _write_and_rename(relative: str, final: str, temp: str, write, lock: RunLock | None) -> ShardFile:
    handle = FileSystems.create(temp)
    # A local write is a copy into the page cache: hashing it inline beats handing blocks to a
    # helper thread, whose GIL hand-offs with the other format's writer cost more than they
    # overlap (measured on the write stage). A remote filesystem's upload is worth overlapping.
    hashing = HashingWriter(handle, background=FileSystems.get_scheme(final) not in (None, "file"))
    try:
        write(hashing)
        hashing.finish()
    finally:
        hashing.stop()  # never close the handle under a write in flight
        handle.close()
    if lock is not None:
        lock.check()
    FileSystems.rename([temp], [final])
    return ShardFile(path=relative, bytes=hashing.bytes, sha256=hashing.sha256.hexdigest())


class ShardRowsError(JobFailedError):
    """The files of one shard do not hold the same number of rows (a writer fault)."""


#: Stands in the shuffle for "this shard exists" (no rows): every shard index of a split gets
#: one, so that empty shards are written too and shard names stay dense.
SHARD_MARKER = None


class _WriteShard(beam.DoFn):
    def __init__(self, output, schema: ExampleSchema, formats, lock: RunLock | None = None):
        self._output, self._schema, self._formats = output, schema, tuple(formats)
        self._lock = lock

    def start_bundle(self):
        return_freed_memory()  # the chunks' holes, freed as the examples were built
        PROGRESS.stage("writing shards")

    def write(self, split: str, index: int, count: int, parts: list) -> dict:
        batch = ShardPiece.merge_sorted(parts, self._schema)

        def write_format(fmt: str) -> tuple[ShardFile, int]:
            writer, rows = WRITERS[fmt], []
            written = write_atomic(self._output, shard_name(split, fmt, index, count),
                                   lambda h: rows.append(writer(h, batch.columns)), self._lock)
            return written, rows[0]

        # The formats are written side by side: much of the work (copying, hashing, file writes,
        # Arrow's serialization) releases the GIL, so a second core shortens the stage.
        first, *others = self._formats
        with ThreadPoolExecutor(max_workers=max(1, len(others)), thread_name_prefix="lmshards-write") as pool:
            futures = [pool.submit(write_format, fmt) for fmt in others]
            results = {first: write_format(first)}
            results.update((fmt, future.result()) for fmt, future in zip(others, futures))
        rows = {fmt: result[1] for fmt, result in results.items()}
        if len(set(rows.values())) != 1:
            held = ", ".join(f"{fmt} {n:,}" for fmt, n in rows.items())
            raise ShardRowsError(f"shard {index} of {split}: its files hold different numbers of rows ({held})")
        # The rows the files hold, as the writers counted them: WriteManifest checks them
        # against the examples built.
        info = ShardInfo(split=split, index=index, rows=rows[first], tokens=int(batch.chunk_tokens.sum()),
                         files={fmt: result[0] for fmt, result in results.items()})
        return info.to_json()

    def process(self, element):
        (split, index, count), pieces = element
        pieces = [p for p in pieces if p is not SHARD_MARKER]
        parts = [ShardPiece.decode(p, self._schema) for p in pieces]
        info = self.write(split, index, count, parts)
        for piece in pieces:  # written: the run does not read these examples again
            let_go(piece)
        yield info


def _shard_markers(element, sizing: dict):
    split, tokens = element
    count = shard_count(split, tokens, **sizing)
    for index in range(count):
        yield (split, index, count), SHARD_MARKER


class WriteShards(beam.PTransform):
    """Shard pieces -> written shard files; outputs one ShardInfo dict per shard.

    Input: ``(pieces, ..., split_tokens)``: one or more PCollections of ``((split, shard,
    count), encoded ShardPiece)`` elements from :class:`transforms.building.build.BuildExamples`,
    and the ``(split, document tokens)`` they were sized with.

    All pieces and one marker per shard index of every split (:data:`SHARD_MARKER`, so that
    empty shards are written as well) are flattened into one shuffle by shard: the graph
    uses only what the Beam model guarantees of Flatten and GroupByKey, never the timing of
    a side input (Beam's BundleBasedDirectRunner hands a side input made by a multi-output
    DoFn over empty at times; re-packed examples once reached the writers that way and were
    lost).

    Args:
        output: dataset directory (any Beam filesystem).
        schema: the example schema.
        formats: ``arrow`` and/or ``webdataset``.
        sizing: the same ``shard_count`` arguments BuildExamples got.
        lock: the run's lock (checked before every rename), or None.
    """

    def __init__(self, output, schema, *, formats, sizing: dict, lock: RunLock | None = None):
        super().__init__()
        self._output, self._schema, self._formats, self._sizing = output, schema, formats, sizing
        self._lock = lock

    def expand(self, inputs):
        *pieces, split_tokens = inputs
        markers = split_tokens | "ShardMarkers" >> beam.FlatMap(_shard_markers, sizing=self._sizing)
        return (
            (*pieces, markers)
            | "AllPieces" >> beam.Flatten()
            | "GroupByShard" >> beam.GroupByKey()
            | "WriteShardFiles" >> beam.ParDo(_WriteShard(self._output, self._schema, self._formats, self._lock))
        )




def rejected_file_name(index: int, count: int) -> str:
    """``rejected/rejected.jsonl`` when the records fit one file, else
    ``rejected/rejected-00003-of-00012.jsonl``."""
    return "rejected/rejected.jsonl" if count == 1 else f"rejected/rejected-{index:05d}-of-{count:05d}.jsonl"


def _json_line(record: dict) -> str:
    return json.dumps(record, ensure_ascii=False, sort_keys=True)


def _key_rejected(record: dict, total: int, per_file: int):
    count = max(1, math.ceil(total / per_file))
    return (digest_u64(_json_line(record), salt=b"lmshards-rejected") % count, count), record


class _WriteRejectedFile(beam.DoFn):
    def __init__(self, output, lock: RunLock | None = None):
        self._lock = lock
        self._output = output

    def process(self, element):
        (index, count), records = element
        rows = sorted((r["source"], r["position"], r["reason"], r["excerpt"], _json_line(r)) for r in records)

        def write(handle):
            for row in rows:
                handle.write((row[-1] + "\n").encode("utf-8"))

        info = write_atomic(self._output, rejected_file_name(index, count), write, self._lock)
        yield {"path": info.path, "bytes": info.bytes, "sha256": info.sha256, "records": len(rows)}


class WriteRejected(beam.PTransform):
    """Rejected-record dicts -> ``OUT/rejected/`` files and counts by reason.

    The records are counted, and each goes to file ``digest(record) % files`` of
    ``ceil(records / per_file)`` (:func:`rejected_file_name`), where they are sorted by
    source, position, reason and excerpt: what one worker sorts is bounded, the files are a
    pure function of the records, and a run with up to ``per_file`` of them writes the one
    ``rejected/rejected.jsonl``. No record, no file (also for a file index no record hashes to:
    the manifest's ``rejected_files`` lists those written).

    Args:
        output: dataset directory.
        per_file: most records per file (default :data:`REJECTED_PER_SHARD`).
        lock: the run's lock, or None.

    Returns ``(file info PCollection, reason counts PCollection)``.
    """

    def __init__(self, output, per_file: int | None = None, lock: RunLock | None = None):
        super().__init__()
        self._output, self._lock = output, lock
        self._per_file = per_file or REJECTED_PER_SHARD

    def expand(self, rejected):
        # The count as a view (0 for none): Count.Globally would add a Create and a stage for its default.
        total = rejected | "CountRejected" >> beam.CombineGlobally(beam.combiners.CountCombineFn()).as_singleton_view()
        files = (
            rejected
            | "KeyRejected" >> beam.Map(_key_rejected, total=total, per_file=self._per_file)
            | "GroupRejected" >> beam.GroupByKey()
            | "WriteRejectedFile" >> beam.ParDo(_WriteRejectedFile(self._output, self._lock))
        )
        reasons = (
            rejected
            | "ReasonOf" >> beam.Map(lambda r: r["reason"])
            | "CountReasons" >> beam.combiners.Count.PerElement()
        )
        return files, reasons
