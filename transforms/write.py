"""WriteShards and WriteRejected: the file-writing stages.

WriteShards (DESIGN.md section 2.5): the shard of an example is a salted digest of its
key modulo the split's shard count (decided in BuildExamples, see
:func:`transforms.objectives.layout.shard_count`); a shard's pieces are grouped, its rows
sorted by a seeded digest of their key (this is the global shuffle), and written once per
format to a temporary name under ``OUT/.tmp/`` through ``FileSystems``, then renamed to
the final name. A retried bundle rewrites the same bytes; a killed run leaves only
temporary files and no manifest. Every shard index exists, empty shards included, so
names are dense.
"""

from __future__ import annotations

import json
import uuid

import apache_beam as beam
from apache_beam.io.filesystems import FileSystems

from schemas.examples import ExampleSchema
from schemas.manifest import ShardFile, ShardInfo, shard_name
from transforms.build import ExampleBatch
from transforms.objectives.layout import shard_count
from transforms.shard_format import HashingWriter, write_arrow_columns, write_tar_columns

__all__ = ["WriteRejected", "WriteShards", "join_path", "shard_count", "write_atomic"]

WRITERS = {"arrow": write_arrow_columns, "webdataset": write_tar_columns}
TMP_DIR = ".tmp"


def join_path(root: str, relative: str) -> str:
    return FileSystems.join(root, *relative.split("/"))


def write_atomic(root: str, relative: str, write) -> ShardFile:
    """Write ``root/relative`` via a unique temporary file and a rename.

    Args:
        write: callable taking a binary handle.
    """
    final = join_path(root, relative)
    temp = join_path(root, f"{TMP_DIR}/{uuid.uuid4().hex}-{relative.replace('/', '-')}")
    handle = FileSystems.create(temp)
    hashing = HashingWriter(handle, background=True)
    try:
        write(hashing)
        hashing.finish()
    finally:
        hashing.stop()  # never close the handle under a write in flight
        handle.close()
    FileSystems.rename([temp], [final])
    return ShardFile(path=relative, bytes=hashing.bytes, sha256=hashing.sha256.hexdigest())


class _WriteShard(beam.DoFn):
    def __init__(self, output, schema: ExampleSchema, formats):
        self._output, self._schema, self._formats = output, schema, tuple(formats)

    def process(self, element):
        (split, index, count), pieces = element
        parts = [ExampleBatch.decode(p, self._schema) for p in pieces if p is not None]  # None: the empty-shard marker
        if parts:
            batch = ExampleBatch.concat(parts, self._schema).sorted_by_order()
        else:
            batch = ExampleBatch.concat([], self._schema)
        files = {}
        for fmt in self._formats:
            relative = shard_name(split, fmt, index, count)
            files[fmt] = write_atomic(self._output, relative, lambda h, w=WRITERS[fmt]: w(h, batch.columns))
        info = ShardInfo(split=split, index=index, rows=batch.count, tokens=int(batch.chunk_tokens.sum()), files=files)
        yield info.to_json()


class WriteShards(beam.PTransform):
    """Shard pieces -> written shard files; outputs one ShardInfo dict per shard.

    Input: ``(pieces, split_tokens)``: ``((split, shard, count), encoded ExampleBatch)`` from
    :class:`transforms.build.BuildExamples` and the ``(split, document tokens)`` it was sized
    with (every shard index of a split is written, empty ones included).

    Args:
        output: dataset directory (any Beam filesystem).
        schema: the example schema.
        formats: ``arrow`` and/or ``webdataset``.
        sizing: the same ``shard_count`` arguments BuildExamples got.
    """

    def __init__(self, output, schema, *, formats, sizing: dict):
        super().__init__()
        self._output, self._schema, self._formats, self._sizing = output, schema, formats, sizing

    def expand(self, inputs):
        pieces, split_tokens = inputs
        sizing = self._sizing

        def all_shards(element):
            split, tokens = element
            count = shard_count(split, tokens, **sizing)
            return [((split, i, count), None) for i in range(count)]

        empty = split_tokens | "EveryShard" >> beam.FlatMap(all_shards)
        return (
            (pieces, empty)
            | "WithEmptyShards" >> beam.Flatten()
            | "GroupByShard" >> beam.GroupByKey()
            | "WriteShardFiles" >> beam.ParDo(_WriteShard(self._output, self._schema, self._formats))
        )


class _WriteRejectedFile(beam.DoFn):
    def __init__(self, output):
        self._output = output

    def process(self, element):
        _, records = element
        rows = sorted(records, key=lambda r: (r["source"], r["position"], r["reason"], r["excerpt"]))

        def write(handle):
            for row in rows:
                handle.write((json.dumps(row, ensure_ascii=False, sort_keys=True) + "\n").encode("utf-8"))

        info = write_atomic(self._output, "rejected/rejected.jsonl", write)
        yield {"path": info.path, "bytes": info.bytes, "sha256": info.sha256, "records": len(rows)}


class WriteRejected(beam.PTransform):
    """Rejected-record dicts -> ``OUT/rejected/rejected.jsonl`` (sorted) and counts by reason.

    Returns ``(file info PCollection, reason counts PCollection)``.
    """

    def __init__(self, output):
        super().__init__()
        self._output = output

    def expand(self, rejected):
        files = (
            rejected
            | "KeyRejected" >> beam.Map(lambda r: (0, r))
            | "GroupRejected" >> beam.GroupByKey()
            | "WriteRejectedFile" >> beam.ParDo(_WriteRejectedFile(self._output))
        )
        reasons = (
            rejected
            | "ReasonOf" >> beam.Map(lambda r: r["reason"])
            | "CountReasons" >> beam.combiners.Count.PerElement()
        )
        return files, reasons
