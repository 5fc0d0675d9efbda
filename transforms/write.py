"""WriteShards and WriteRejected: the file-writing stages.

WriteShards (DESIGN.md section 2.5): the shard of an example is a salted digest of its
key modulo the split's shard count; a shard's examples are grouped, sorted by a seeded
digest of their key (this is the global shuffle), and written once per format to a
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
from apache_beam.transforms.window import GlobalWindows

from schemas.examples import ExampleSchema
from schemas.manifest import ShardFile, ShardInfo, shard_name
from transforms.build import STATS_KEY
from transforms.objectives.counters import merge_counters
from transforms.objectives.layout import row_order_key, shard_of
from transforms.shard_format import HashingWriter, write_arrow, write_tar

__all__ = ["WriteRejected", "WriteShards", "join_path", "shard_count", "write_atomic"]

WRITERS = {"arrow": write_arrow, "webdataset": write_tar}
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


#: Examples per group sent to a shard writer (one shuffle element instead of this many).
GROUP_ROWS = 512


def encode_group(rows: list[tuple[bytes, dict]], schema: ExampleSchema) -> tuple:
    """Rows bound for one shard as one compact, pickle-free shuffle element.

    Token and int-list columns travel as one int32 buffer plus lengths, scalars as one
    int32 buffer, strings as lists; the rows' counters are summed here already.
    """
    columns = {}
    for name in schema.array_columns:
        values = [np.asarray(example[name], dtype=np.int32) for _, example in rows]
        lengths = np.fromiter((len(v) for v in values), dtype=np.int64, count=len(values))
        columns[name] = (np.concatenate(values).tobytes() if values else b"", lengths.tobytes())
    for name in schema.scalar_columns:
        columns[name] = (np.fromiter((example[name] for _, example in rows), dtype=np.int32).tobytes(), b"")
    strings = {name: [example[name] for _, example in rows] for name in schema.string_columns}
    stats: dict[str, int] = {}
    for _, example in rows:
        stats = merge_counters(stats, example[STATS_KEY])
    return b"".join(order for order, _ in rows), columns, strings, stats


def decode_group(group: tuple, schema: ExampleSchema) -> tuple[list[tuple[bytes, dict]], dict[str, int]]:
    """Inverse of :func:`encode_group`: ``(rows, summed counters)``."""
    orders, columns, strings, stats = group
    count = len(orders) // 16
    examples: list[dict] = [{} for _ in range(count)]
    for name in schema.array_columns:
        values, lengths = columns[name]
        flat = np.frombuffer(values, dtype=np.int32)
        offsets = np.concatenate([[0], np.cumsum(np.frombuffer(lengths, dtype=np.int64))])
        for i, example in enumerate(examples):
            example[name] = flat[offsets[i] : offsets[i + 1]]
    for name in schema.scalar_columns:
        for example, value in zip(examples, np.frombuffer(columns[name][0], dtype=np.int32)):
            example[name] = int(value)
    for name, values in strings.items():
        for example, value in zip(examples, values):
            example[name] = value
    return [(orders[16 * i : 16 * i + 16], examples[i]) for i in range(count)], stats


class _GroupByShard(beam.DoFn):
    """Assigns each example its shard and batches the examples of a shard per bundle.

    Batching changes nothing in the output: the writer sorts every shard's rows by their
    order key; it only spares the shuffle one element (and one pickle) per example.
    """

    def __init__(self, schema: ExampleSchema, seed: int, sizing: dict):
        self._schema, self._seed, self._sizing = schema, seed, sizing

    def start_bundle(self):
        self._groups: dict[tuple, list] = {}

    def process(self, element, counts):
        split, example = element
        count = shard_count(split, counts[split], **self._sizing)
        key = example["key"]
        shard = (split, shard_of(self._seed, key, count), count)
        rows = self._groups.setdefault(shard, [])
        rows.append((row_order_key(self._seed, key), example))
        if len(rows) >= GROUP_ROWS:
            yield shard, encode_group(self._groups.pop(shard), self._schema)

    def finish_bundle(self):
        for shard, rows in sorted(self._groups.items()):
            yield GlobalWindows.windowed_value((shard, encode_group(rows, self._schema)))
        self._groups = {}


class _WriteShard(beam.DoFn):
    def __init__(self, output, schema: ExampleSchema, formats, objective, seed):
        self._output, self._schema, self._formats = output, schema, tuple(formats)
        self._objective, self._seed = objective, seed

    def process(self, element, counts):
        (split, index, count), groups = element
        rows: list[tuple[bytes, dict]] = []
        stats: dict[str, int] = {}
        for group in groups:
            if group is None:  # the marker that makes empty shards exist
                continue
            group_rows, group_stats = decode_group(group, self._schema)
            rows.extend(group_rows)
            stats = merge_counters(stats, group_stats)
        rows.sort(key=lambda row: row[0])
        examples = [example for _, example in rows]
        files = {}
        for fmt in self._formats:
            relative = shard_name(split, fmt, index, count)
            files[fmt] = write_atomic(self._output, relative, lambda h, w=WRITERS[fmt]: w(h, examples, self._schema))
        tokens = int(stats.get("chunk_tokens", 0))
        info = ShardInfo(split=split, index=index, rows=len(examples), tokens=tokens, files=files)
        yield {"shard": info.to_json(), "stats": stats}


class WriteShards(beam.PTransform):
    """``(split, example)`` -> written shard files; outputs one dict per shard.

    Args:
        output: dataset directory (any Beam filesystem).
        schema: the example schema.
        formats: ``arrow`` and/or ``webdataset``.
        objective: the objective (per-example statistics).
        seed: global seed (orders rows inside shards).
        num_shards: train shard count, or None to size shards by ``shard_bytes``.
        bytes_per_example: size estimate used with ``shard_bytes``.
        shard_bytes: target shard size.
    """

    def __init__(self, output, schema, *, formats, objective, seed, num_shards, bytes_per_example, shard_bytes):
        super().__init__()
        self._output, self._schema, self._formats = output, schema, formats
        self._objective, self._seed = objective, seed
        self._sizing = {"num_shards": num_shards, "bytes_per_example": bytes_per_example, "shard_bytes": shard_bytes}

    def expand(self, examples):
        sizing, seed = self._sizing, self._seed
        counts = examples | "CountPerSplit" >> beam.combiners.Count.PerKey()

        def all_shards(element):
            split, examples = element
            count = shard_count(split, examples, **sizing)
            return [((split, i, count), None) for i in range(count)]

        keyed = examples | "AssignShard" >> beam.ParDo(
            _GroupByShard(self._schema, seed, sizing), counts=beam.pvalue.AsDict(counts)
        )
        empty = counts | "EveryShard" >> beam.FlatMap(all_shards)
        return (
            (keyed, empty)
            | "WithEmptyShards" >> beam.Flatten()
            | "GroupByShard" >> beam.GroupByKey()
            | "WriteShardFiles"
            >> beam.ParDo(
                _WriteShard(self._output, self._schema, self._formats, self._objective, seed),
                counts=beam.pvalue.AsDict(counts),
            )
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
