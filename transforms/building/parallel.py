"""The work of :class:`transforms.building.build.BuildExamples` without Beam: chunks -> encoded
:class:`~transforms.elements.ShardPiece` elements and summed counters.

:class:`ChunkBuilder` gathers chunks into blocks of :data:`BLOCK_ROWS` rows and has the
objective build each block in one call. Nothing written depends on how chunks fall into
blocks or bundles: an example's noise, shard and row order come from its key, the writer
sorts every shard's rows, and counters are integers that add up in any order.
:func:`encode_chunks` lays chunks out as a few columns, the way they cross the shuffle of
``--build-stage separate``.

This module imports no Beam (the objectives' benchmarks and tests build with it alone).
"""

from __future__ import annotations

import numpy as np

from schemas.examples import ExampleSchema
from transforms.elements import Chunk, ShardPiece
from transforms.free_memory import return_freed_memory
from transforms.objectives.base import Block
from transforms.objectives.counters import add_counters
from transforms.objectives.layout import example_digests
from transforms.objectives.packing import Piece
from transforms.writing.columns import ExampleColumns

__all__ = [
    "BLOCK_ROWS",
    "TASK_TOKENS",
    "BuildConfig",
    "ChunkBuilder",
    "decode_chunks",
    "encode_chunks",
    "example_key",
]

#: Chunk tokens per block of chunks that crosses the shuffle of ``--build-stage separate``: a few
#: hundred chunks, so that an element costs little beside the chunks it holds.
TASK_TOKENS = 1 << 18
#: Rows (chunks times draws) a builder gathers before the objective builds them in one call:
#: enough that numpy's cost per call is spread thin, few enough that a block's arrays stay small.
BLOCK_ROWS = 512


def example_key(chunk_key: str, draw: int) -> str:
    """Key of draw ``draw`` of a chunk (no dots: it is also the WebDataset ``__key__``)."""
    return f"{chunk_key}-d{draw}"


class BuildConfig:
    """What building a chunk's examples takes besides the chunk and its split's shard count.

    Args:
        objective: an :class:`transforms.objectives.base.Objective`.
        special: resolved :class:`transforms.objectives.common.SpecialIds`.
        schema: the :class:`schemas.examples.ExampleSchema` the examples are written with.
        seed: global seed.
        draws: independent noisings per chunk.
        block_rows: rows (chunks times draws) per block the objective builds at once (default
            :data:`BLOCK_ROWS`); each block leaves as one ShardPiece per shard it touches.
    """

    def __init__(self, objective, special, schema: ExampleSchema, seed: int, draws: int, *,
                 block_rows: int | None = None):
        self.objective, self.special, self.schema, self.seed, self.draws = objective, special, schema, seed, draws
        self.block_rows = BLOCK_ROWS if block_rows is None else block_rows


class ChunkBuilder:
    """Builds the examples of chunks in blocks, into per-shard batches, summing their counters.

    Chunks wait until their rows (chunks times draws) fill a block of ``block_rows``; the
    objective builds a block in one call (:meth:`~transforms.objectives.base.Objective.build`),
    each row's noise from the digest of its example key, so nothing depends on how chunks
    fall into blocks.

    Attributes:
        stats: split -> summed counters of the examples built so far.
        built: number of examples built so far.
    """

    def __init__(self, config: BuildConfig):
        self._config = config
        self._waiting: list[tuple[Chunk, int]] = []
        self.stats: dict[str, dict[str, int]] = {}
        self.built = 0

    def add(self, chunk: Chunk, shard_count: int) -> list[tuple]:
        """Take ``chunk``; return the ``((split, shard, shard count), encoded ShardPiece)``
        elements of a block it completes."""
        self._waiting.append((chunk, shard_count))
        if len(self._waiting) * self._config.draws >= self._config.block_rows:
            return self._build()
        return []

    def finish(self) -> list[tuple]:
        """The pieces of every chunk still waiting."""
        return self._build() if self._waiting else []

    def _build(self) -> list[tuple]:
        config = self._config
        block, self._waiting = self._waiting, []
        out = []
        for split, count, chunks in _by_split(block):
            rows = [(chunk, draw) for chunk in chunks for draw in range(config.draws)]
            keys = [example_key(chunk.key, draw) for chunk, draw in rows]
            digests = example_digests(config.seed, keys)
            pieces = [chunk.piece for chunk, _ in rows]
            examples = Block.of_rows(pieces, [chunk.plan for chunk, _ in rows], digests.randoms)
            built = config.objective.build(examples, config.special)
            strings = {"key": keys, **built.strings}
            columns = ExampleColumns(config.schema, len(keys), built.arrays, built.scalars, strings)
            counters = dict(built.counters)
            counters["chunk_tokens"] = int(examples.offsets[-1])
            add_counters(self.stats.setdefault(split, {}), counters)
            out.extend(_shard_pieces(split, count, digests, columns, examples.lengths))
        self.built += len(block) * config.draws
        del block
        # Pack and the builders run side by side (a fused stage): the documents' and chunks' holes
        # go back to the system as the examples are made, not after the last one.
        return_freed_memory()
        return out


def _shard_pieces(split: str, count: int, digests, columns: ExampleColumns, chunk_tokens: np.ndarray) -> list[tuple]:
    """The rows of a block as one ``((split, shard, count), encoded ShardPiece)`` element per shard."""
    hashes, orders = digests.shard_hashes, np.ascontiguousarray(digests.orders)
    shards = hashes % np.uint64(count)
    present = np.unique(shards).tolist()
    out = []
    for shard in present:
        if len(present) == 1:  # every row: no copy
            batch = ShardPiece(orders, hashes, chunk_tokens, columns)
        else:
            rows = np.flatnonzero(shards == shard)
            batch = ShardPiece(orders[rows], hashes[rows], chunk_tokens[rows], columns.take(rows))
        out.append(((split, shard, count), batch.encode()))
    return out


def _by_split(block: list[tuple[Chunk, int]]) -> list[tuple[str, int, list[Chunk]]]:
    """``(split, shard count, chunks)`` of a block of ``(chunk, shard count)``, by split name."""
    by_split: dict[str, tuple[int, list[Chunk]]] = {}
    for chunk, shard_count in block:
        by_split.setdefault(chunk.split, (shard_count, []))[1].append(chunk)
    return [(split, count, chunks) for split, (count, chunks) in sorted(by_split.items())]


def encode_chunks(chunks: list[Chunk]) -> tuple:
    """Chunks as a few lists and one array per column:
    encoding a block then costs about a copy of its tokens, not a pickle of every chunk's small
    arrays (and as much again to decode). :func:`decode_chunks` inverts it."""
    pieces = [chunk.piece for chunk in chunks]
    names = sorted(pieces[0].features) if pieces else []
    if not pieces or any(sorted(piece.features) != names for piece in pieces):
        return ("chunks", chunks)  # no chunk, or chunks with different features: as they are
    return (
        "columns",
        [chunk.split for chunk in chunks], [chunk.key for chunk in chunks], [chunk.plan for chunk in chunks],
        [piece.tokens.shape[0] for piece in pieces], [piece.doc_lengths.shape[0] for piece in pieces],
        np.concatenate([piece.tokens for piece in pieces]).astype(np.int32, copy=False),
        np.concatenate([piece.doc_lengths for piece in pieces]).astype(np.int32, copy=False),
        {name: np.concatenate([piece.features[name] for piece in pieces]).astype(bool, copy=False) for name in names},
    )


def decode_chunks(encoded: tuple) -> list[Chunk]:
    """The chunks of :func:`encode_chunks` (their arrays are slices of one array per column)."""
    if encoded[0] == "chunks":
        return encoded[1]
    _, splits, keys, plans, lengths, segments, tokens, doc_lengths, features = encoded
    ends = np.cumsum(lengths).tolist()
    segment_ends = np.cumsum(segments).tolist()
    chunks, start, segment_start = [], 0, 0
    for split, key, plan, end, segment_end in zip(splits, keys, plans, ends, segment_ends):
        piece = Piece(tokens[start:end], doc_lengths[segment_start:segment_end],
                      {name: flags[start:end] for name, flags in features.items()})
        chunks.append(Chunk(split, key, plan, piece))
        start, segment_start = end, segment_end
    return chunks
