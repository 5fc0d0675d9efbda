"""BuildExamples: apply the objective to each chunk, ``draws`` times, into columnar batches.

Draw ``d`` of chunk ``C`` has the example key ``C-dD`` and draws its noise from
``example_rng(seed, key)`` only, like BERT's ``dupe_factor`` static masking: K draws give K
differently noised copies of the same chunk.

Per-example counters are taken here, where the special ids are known: the objective's own
counters plus ``chunk_tokens`` (the source tokens the example was made from) and
``padding_tokens``. Short rows of fixed-length columns (a padded final chunk) are
right-padded with the pad id.

Each example's shard is decided here (:func:`transforms.objectives.layout.shard_of`, with
the split's shard count from :func:`transforms.objectives.layout.shard_count`), and examples leave
this stage as :class:`ExampleBatch` elements of up to :data:`BATCH_ROWS` rows of one
shard (columnar numpy buffers, one shuffle element instead of hundreds of dicts), each row
with its row-order key already computed; the counters leave summed, per split, on the
:attr:`BuildExamples.STATS` output. Batching depends on bundles, but nothing written does:
the writer sorts every shard's rows by their order key, and counters are integers that add
up in any order.
"""

from __future__ import annotations

import inspect

import apache_beam as beam
import numpy as np
from apache_beam.transforms.window import GlobalWindows

from schemas.examples import ExampleSchema
from transforms.objectives.common import LazyGenerator, digest_u64
from transforms.objectives.counters import add_counters
from transforms.objectives.layout import SHARD_SALT, row_order_key, shard_count, shard_key
from transforms.shard_format import ExampleColumns

__all__ = ["BATCH_ROWS", "STATS_KEY", "BuildExamples", "ExampleBatch", "example_key"]

STATS_KEY = "_stats"
#: Rows per ExampleBatch a Build bundle emits (per shard; the last ones of a bundle are shorter).
BATCH_ROWS = 512
#: Rows a Build bundle holds at most, over all shards, before it emits them.
MAX_BUFFERED_ROWS = 4 * BATCH_ROWS


def example_key(chunk_key: str, draw: int) -> str:
    """Key of draw ``draw`` of a chunk (no dots: it is also the WebDataset ``__key__``)."""
    return f"{chunk_key}-d{draw}"


def _order_of(orders: np.ndarray) -> np.ndarray:
    """Stable ascending order of ``(n, 16)`` uint8 keys compared bytewise."""
    high = orders[:, :8].copy().view(">u8").reshape(-1)
    low = orders[:, 8:].copy().view(">u8").reshape(-1)
    return np.lexsort((low, high))


class ExampleBatch:
    """Rows of one split on their way to the shard writers.

    Attributes:
        orders: ``(n, 16)`` uint8 row-order keys (:func:`transforms.objectives.layout.row_order_key`).
        shard_hashes: ``(n,)`` uint64; a row's shard is ``shard_hashes % num_shards``.
        chunk_tokens: ``(n,)`` int64 source tokens of each row.
        columns: the rows' :class:`~transforms.shard_format.ExampleColumns`.
    """

    __slots__ = ("orders", "shard_hashes", "chunk_tokens", "columns")

    def __init__(self, orders, shard_hashes, chunk_tokens, columns: ExampleColumns):
        self.orders, self.shard_hashes, self.chunk_tokens, self.columns = orders, shard_hashes, chunk_tokens, columns

    @property
    def count(self) -> int:
        return self.columns.count

    @classmethod
    def merge_sorted(cls, parts: list[ExampleBatch], schema: ExampleSchema) -> ExampleBatch:
        """The rows of all ``parts`` in ascending order of their order keys (bytewise, like sorting
        ``bytes``), copied once."""
        if not parts:
            return cls(np.zeros((0, 16), np.uint8), np.zeros(0, np.uint64), np.zeros(0, np.int64),
                       ExampleColumns.from_examples([], schema))
        orders = np.concatenate([p.orders for p in parts])
        order = _order_of(orders)
        part = np.repeat(np.arange(len(parts)), [p.count for p in parts])[order]
        starts = np.zeros(len(parts) + 1, dtype=np.int64)
        np.cumsum([p.count for p in parts], out=starts[1:])
        row = order - starts[part]
        return cls(
            orders[order],
            np.concatenate([p.shard_hashes for p in parts])[order],
            np.concatenate([p.chunk_tokens for p in parts])[order],
            ExampleColumns.gather([p.columns for p in parts], part, row, schema),
        )

    def encode(self) -> tuple:
        """Bytes, ints, lists and dicts only: Beam's default coder handles them without pickling."""
        return (self.orders.tobytes(), self.shard_hashes.tobytes(), self.chunk_tokens.tobytes(),
                self.columns.encode())

    @classmethod
    def decode(cls, encoded: tuple, schema: ExampleSchema) -> ExampleBatch:
        orders, hashes, tokens, columns = encoded
        return cls(
            np.frombuffer(orders, dtype=np.uint8).reshape(-1, 16),
            np.frombuffer(hashes, dtype=np.uint64),
            np.frombuffer(tokens, dtype=np.int64),
            ExampleColumns.decode(columns, schema),
        )


class _Build(beam.DoFn):
    def __init__(self, objective, special, schema, seed, draws, sizing):
        self._objective, self._special, self._schema = objective, special, schema
        self._seed, self._draws, self._sizing = seed, draws, sizing

    def setup(self):
        self._examples = beam.metrics.Metrics.counter("lmshards", "examples")
        parameters = inspect.signature(self._objective.stats).parameters
        self._stats_takes_special = len(parameters) >= 2
        self._fixed = {c: self._schema.fixed_length(c) for c in self._schema.token_columns}
        self._fixed = {c: n for c, n in self._fixed.items() if n is not None}

    def start_bundle(self):
        self._rows: dict[tuple, list] = {}  # (split, shard, count) -> [(example, chunk tokens, shard hash)]
        self._stats: dict[str, dict[str, int]] = {}
        self._counts: dict[str, int] = {}
        self._buffered = 0
        self._built = 0

    def _shard_count(self, split: str, split_tokens: dict) -> int:
        count = self._counts.get(split)
        if count is None:
            count = self._counts[split] = shard_count(split, split_tokens.get(split, 0), **self._sizing)
        return count

    def _finish(self, example, chunk_tokens):
        if self._stats_takes_special:
            counters = self._objective.stats(example, self._special)
        else:
            counters = self._objective.stats(example)
        example.pop(STATS_KEY, None)
        padding = 0
        for column, length in self._fixed.items():
            values = example[column]
            if len(values) < length:
                padded = np.full(length, self._special.pad, dtype=np.int32)
                padded[: len(values)] = values
                example[column] = padded
                padding += length - len(values)
        counters = dict(counters)
        counters["chunk_tokens"] = counters.get("chunk_tokens", 0) + chunk_tokens
        if padding:
            counters["padding_tokens"] = counters.get("padding_tokens", 0) + padding
        return example, counters

    def _batch(self, shard):
        rows = self._rows.pop(shard)
        orders = np.frombuffer(b"".join(row_order_key(self._seed, ex["key"]) for ex, _, _ in rows), dtype=np.uint8)
        hashes = np.fromiter((h for _, _, h in rows), dtype=np.uint64, count=len(rows))
        tokens = np.fromiter((t for _, t, _ in rows), dtype=np.int64, count=len(rows))
        columns = ExampleColumns.from_examples([example for example, _, _ in rows], self._schema)
        return shard, ExampleBatch(orders.reshape(-1, 16), hashes, tokens, columns).encode()

    def process(self, chunk, split_tokens):
        split, chunk_key, plan, piece = chunk
        features = dict(piece.features)
        features["doc_lengths"] = piece.doc_lengths
        count = self._shard_count(split, split_tokens)
        stats = self._stats.setdefault(split, {})
        full = []
        for draw in range(self._draws):
            key = example_key(chunk_key, draw)
            example = self._objective.build(piece.tokens, LazyGenerator(self._seed, key), plan, self._special, features)
            example["key"] = key
            example, counters = self._finish(example, len(piece.tokens))
            add_counters(stats, counters)
            shard_hash = digest_u64(shard_key(self._seed, key), salt=SHARD_SALT)
            shard = (split, shard_hash % count, count)
            rows = self._rows.setdefault(shard, [])
            rows.append((example, len(piece.tokens), shard_hash))
            if len(rows) == BATCH_ROWS:
                full.append(shard)
        self._built += self._draws
        self._buffered += self._draws
        if self._buffered >= MAX_BUFFERED_ROWS:  # many shards: bound memory, flush them all
            full = sorted(self._rows)
        for shard in full:
            self._buffered -= len(self._rows[shard])
            yield self._batch(shard)

    def finish_bundle(self):
        for shard in sorted(self._rows):
            yield GlobalWindows.windowed_value(self._batch(shard))
        self._buffered = 0
        self._examples.inc(self._built)
        self._built = 0
        for split, stats in sorted(self._stats.items()):
            yield beam.pvalue.TaggedOutput(BuildExamples.STATS, GlobalWindows.windowed_value((split, stats)))
        self._stats = {}


class BuildExamples(beam.PTransform):
    """``(split, chunk_key, plan, Piece)`` -> ``((split, shard, shard count), encoded ExampleBatch)``.

    Args:
        objective: object implementing :class:`transforms.objectives.base.Objective`.
        special: resolved :class:`transforms.objectives.common.SpecialIds`.
        schema: the :class:`schemas.examples.ExampleSchema` the examples are written with.
        seed: global seed.
        draws: independent noisings per chunk (>= 1).
        sizing: keyword arguments of :func:`transforms.objectives.layout.shard_count` after ``split`` and
            ``tokens`` (``num_shards``, ``tokens_per_example``, ``draws``, ``bytes_per_example``,
            ``shard_bytes``).

    Input: ``(chunks, split_tokens)``, the latter a PCollection of ``(split, document tokens)``
    (one element per split, used as a side input to size the splits' shards).

    Returns ``(batches, stats)``: ``stats`` holds ``(split, counters)`` elements (one per
    bundle and split; sum them per split).
    """

    STATS = "stats"

    def __init__(self, objective, special, schema, *, seed: int, draws: int = 1, sizing: dict):
        super().__init__()
        if draws < 1:
            raise ValueError(f"--draws {draws}: must be >= 1")
        self._fn = _Build(objective, special, schema, seed, draws, sizing)

    def expand(self, inputs):
        chunks, split_tokens = inputs
        outputs = chunks | "ApplyObjective" >> beam.ParDo(
            self._fn, split_tokens=beam.pvalue.AsDict(split_tokens)
        ).with_outputs(self.STATS, main="batches")
        return outputs.batches, outputs[self.STATS]
