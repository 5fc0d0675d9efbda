"""WriteShards and WriteRejected: the file-writing stages.

WriteShards (DESIGN.md section 2.5): the shard of an example is a salted digest of its
key modulo the split's shard count; batches are cut into per-shard pieces, a shard's
pieces are grouped, its rows sorted by a seeded digest of their key (this is the global
shuffle), and written once per format to a
temporary name under ``OUT/.tmp/`` through ``FileSystems``, then renamed to the final
name. A retried bundle rewrites the same bytes; a killed run leaves only temporary files
and no manifest. Every shard index exists, empty shards included, so names are dense.

The shard count of a split is ``--num-shards`` for train, otherwise the smallest count that
keeps shards under ``--shard-size-mb``, from the split's example count (a side input).
"""

from __future__ import annotations

import json
import math
import uuid

import apache_beam as beam
import numpy as np
from apache_beam.io.filesystems import FileSystems

from schemas.examples import ExampleSchema
from schemas.manifest import ShardFile, ShardInfo, shard_name
from transforms.build import ExampleBatch
from transforms.shard_format import HashingWriter, write_arrow_columns, write_tar_columns

__all__ = ["WriteRejected", "WriteShards", "batch_rows", "join_path", "shard_count", "write_atomic"]

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
    hashing = HashingWriter(handle)
    try:
        write(hashing)
    finally:
        handle.close()
    FileSystems.rename([temp], [final])
    return ShardFile(path=relative, bytes=hashing.bytes, sha256=hashing.sha256.hexdigest())


def shard_count(split: str, examples: int, *, num_shards: int | None, bytes_per_example: int, shard_bytes: int) -> int:
    """Number of shards of a split (see module docstring)."""
    if split == "train" and num_shards:
        return num_shards
    return max(1, math.ceil(examples * bytes_per_example / shard_bytes))


class _SplitByShard(beam.DoFn):
    """Cuts each batch into one piece per shard its rows belong to (vectorized)."""

    def __init__(self, schema: ExampleSchema, sizing: dict):
        self._schema, self._sizing = schema, sizing

    def process(self, element, counts):
        split, encoded = element
        batch = ExampleBatch.decode(encoded, self._schema)
        count = shard_count(split, counts[split], **self._sizing)
        shards = (batch.shard_hashes % np.uint64(count)).astype(np.int64)
        order = np.argsort(shards, kind="stable")
        present, starts = np.unique(shards[order], return_index=True)
        stops = list(starts[1:]) + [len(order)]
        for shard, start, stop in zip(present.tolist(), starts.tolist(), stops):
            yield (split, shard, count), batch.take(order[start:stop]).encode()


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
    """``(split, encoded ExampleBatch)`` -> written shard files; outputs one ShardInfo dict per shard.

    Args:
        output: dataset directory (any Beam filesystem).
        schema: the example schema.
        formats: ``arrow`` and/or ``webdataset``.
        num_shards: train shard count, or None to size shards by ``shard_bytes``.
        bytes_per_example: size estimate used with ``shard_bytes``.
        shard_bytes: target shard size.

    Rows carry their shard hash and order key (see :class:`transforms.build.ExampleBatch`), so
    neither the seed nor the objective is needed here.
    """

    def __init__(self, output, schema, *, formats, num_shards, bytes_per_example, shard_bytes):
        super().__init__()
        self._output, self._schema, self._formats = output, schema, formats
        self._sizing = {"num_shards": num_shards, "bytes_per_example": bytes_per_example, "shard_bytes": shard_bytes}

    def expand(self, batches):
        sizing = self._sizing
        counts = (
            batches
            | "RowsPerBatch" >> beam.Map(lambda element: (element[0], batch_rows(element[1])))
            | "CountPerSplit" >> beam.CombinePerKey(sum)
        )

        def all_shards(element):
            split, examples = element
            count = shard_count(split, examples, **sizing)
            return [((split, i, count), None) for i in range(count)]

        keyed = batches | "AssignShard" >> beam.ParDo(
            _SplitByShard(self._schema, sizing), counts=beam.pvalue.AsDict(counts)
        )
        empty = counts | "EveryShard" >> beam.FlatMap(all_shards)
        return (
            (keyed, empty)
            | "WithEmptyShards" >> beam.Flatten()
            | "GroupByShard" >> beam.GroupByKey()
            | "WriteShardFiles" >> beam.ParDo(_WriteShard(self._output, self._schema, self._formats))
        )


def batch_rows(encoded: tuple) -> int:
    """Rows of an encoded :class:`~transforms.build.ExampleBatch` (without decoding it)."""
    return encoded[3][0]


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
