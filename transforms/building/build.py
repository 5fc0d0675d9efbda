"""BuildExamples: apply the objective to each chunk, ``draws`` times, into columnar batches.

Draw ``d`` of chunk ``C`` has the example key ``C-dD``, and its noise is a pure function of
``(seed, key)`` (counter-based, :mod:`transforms.objectives.randoms`), like BERT's
``dupe_factor`` static masking: K draws give K differently noised copies of the same chunk.

The objective builds chunks in blocks of :data:`transforms.building.parallel.BLOCK_ROWS` rows, one call
each, and returns their columns (fixed-length ones padded with the pad id) and summed counters;
the builder adds ``chunk_tokens`` (the source tokens the examples were made from).

Each example's shard is decided here (:func:`transforms.objectives.layout.example_digests`,
with the split's shard count from :func:`transforms.objectives.layout.shard_count`), and
examples leave this stage as :class:`~transforms.elements.ShardPiece` elements of one block's rows of one shard
(columnar numpy buffers, one shuffle element instead of hundreds of dicts), each row with its
row-order key already computed; the counters leave summed, per split, on the
:attr:`BuildExamples.STATS` output. Blocks depend on bundles, but nothing written does: the
writer sorts every shard's rows by their order key, and counters are integers that add up in
any order.

The per-chunk work itself is :class:`transforms.building.parallel.ChunkBuilder` (no Beam).
"""

from __future__ import annotations

import apache_beam as beam
from apache_beam.transforms.window import GlobalWindows

from schemas.errors import ConfigError
from transforms.building.parallel import (
    BLOCK_ROWS,
    TASK_TOKENS,
    BuildConfig,
    ChunkBuilder,
    decode_chunks,
    encode_chunks,
    example_key,
)
from transforms.free_memory import return_freed_memory
from transforms.objectives.layout import shard_count

__all__ = ["BuildExamples", "example_key"]


class _Build(beam.DoFn):
    def __init__(self, objective, special, schema, seed, draws, sizing, block_rows):
        self._config = BuildConfig(objective, special, schema, seed, draws, block_rows=block_rows)
        self._sizing = sizing

    def setup(self):
        self._examples = beam.metrics.Metrics.counter("lmshards", "examples")

    def start_bundle(self):
        return_freed_memory()  # the documents' holes, freed as Pack cut these chunks
        self._builder = ChunkBuilder(self._config)
        self._counts: dict[str, int] = {}

    def process(self, chunk, split_tokens):
        split = chunk.split
        count = self._counts.get(split)
        if count is None:
            count = self._counts[split] = shard_count(split, split_tokens.get(split, 0), **self._sizing)
        yield from self._builder.add(chunk, count)

    def finish_bundle(self):
        for piece in self._builder.finish():
            yield GlobalWindows.windowed_value(piece)
        self._examples.inc(self._builder.built)
        for split, stats in sorted(self._builder.stats.items()):
            yield beam.pvalue.TaggedOutput(BuildExamples.STATS, GlobalWindows.windowed_value((split, stats)))
        self._builder = None


class _BlockChunks(beam.DoFn):
    """Chunks -> blocks of about :data:`transforms.building.parallel.TASK_TOKENS` tokens, each as one
    array per column (:func:`transforms.building.parallel.encode_chunks`): what crosses the
    redistributing shuffle costs a copy of its tokens, not a pickle per chunk."""

    def start_bundle(self):
        return_freed_memory()  # the documents' holes, freed as Pack cut these chunks
        self._chunks, self._tokens = [], 0

    def process(self, chunk):
        self._chunks.append(chunk)
        self._tokens += len(chunk.piece)
        if self._tokens >= TASK_TOKENS:
            yield self._block()

    def _block(self):
        block = encode_chunks(self._chunks)
        self._chunks, self._tokens = [], 0
        return block

    def finish_bundle(self):
        if self._chunks:
            yield GlobalWindows.windowed_value(self._block())


class BuildExamples(beam.PTransform):
    """:class:`~transforms.elements.Chunk` -> ``((split, shard, shard count), encoded ShardPiece)``.

    Args:
        objective: object implementing :class:`transforms.objectives.base.Objective`.
        special: resolved :class:`transforms.objectives.common.SpecialIds`.
        schema: the :class:`schemas.examples.ExampleSchema` the examples are written with.
        seed: global seed.
        draws: independent noisings per chunk (>= 1).
        sizing: keyword arguments of :func:`transforms.objectives.layout.shard_count` after ``split`` and
            ``tokens`` (``num_shards``, ``tokens_per_example``, ``draws``, ``bytes_per_example``,
            ``shard_bytes``).
        separate: run the objective in a stage of its own: the chunks are gathered into blocks
            and spread over the workers by a shuffle (``Reshuffle``) first, so that building
            is not bound to the workers that packed the chunks (one per pack group). The
            output is the same either way.
        block_rows: rows (chunks times draws) the objective builds in one call
            (``--block-rows``); the output does not depend on it.

    Input: ``(chunks, split_tokens)``, the latter a PCollection of ``(split, document tokens)``
    (one element per split, used as a side input to size the splits' shards).

    Returns ``(batches, stats)``: ``stats`` holds ``(split, counters)`` elements (one per
    bundle and split; sum them per split).
    """

    STATS = "stats"

    def __init__(self, objective, special, schema, *, seed: int, draws: int = 1, sizing: dict,
                 separate: bool = False, block_rows: int = BLOCK_ROWS):
        super().__init__()
        self._separate = separate
        if draws < 1:
            raise ConfigError(f"--draws {draws}: must be >= 1")
        if block_rows < 1:
            raise ConfigError(f"--block-rows {block_rows}: must be >= 1")
        self._fn = _Build(objective, special, schema, seed, draws, sizing, block_rows)

    def expand(self, inputs):
        chunks, split_tokens = inputs
        if self._separate:
            chunks = (
                chunks
                | "BlockChunks" >> beam.ParDo(_BlockChunks())
                | "SpreadBlocks" >> beam.Reshuffle()
                | "UnblockChunks" >> beam.FlatMap(decode_chunks)
            )
        outputs = chunks | "ApplyObjective" >> beam.ParDo(
            self._fn, split_tokens=beam.pvalue.AsDict(split_tokens)
        ).with_outputs(self.STATS, main="batches")
        return outputs.batches, outputs[self.STATS]
