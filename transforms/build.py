"""BuildExamples: apply the objective to each chunk, ``draws`` times.

Draw ``d`` of chunk ``C`` has the example key ``C-dD`` and draws its noise from
``example_rng(seed, key)`` only, like BERT's ``dupe_factor`` static masking: K draws give K
differently noised copies of the same chunk.

Per-example counters are taken here, where the special ids are known, and travel with the
example under ``_stats`` (writers take only the schema's columns): ``chunk_tokens`` (the
source tokens the example was made from) and ``padding_tokens`` are added to the
objective's own counters. Short rows of fixed-length columns (a padded final chunk) are
right-padded with the pad id.
"""

from __future__ import annotations

import inspect

import apache_beam as beam
import numpy as np

from transforms.objectives.common import LazyGenerator
from transforms.objectives.counters import merge_counters

__all__ = ["STATS_KEY", "BuildExamples", "example_key"]

STATS_KEY = "_stats"


def example_key(chunk_key: str, draw: int) -> str:
    """Key of draw ``draw`` of a chunk (no dots: it is also the WebDataset ``__key__``)."""
    return f"{chunk_key}-d{draw}"


class _Build(beam.DoFn):
    def __init__(self, objective, special, schema, seed, draws):
        self._objective, self._special, self._schema = objective, special, schema
        self._seed, self._draws = seed, draws

    def setup(self):
        self._examples = beam.metrics.Metrics.counter("lmshards", "examples")
        parameters = inspect.signature(self._objective.stats).parameters
        self._stats_takes_special = len(parameters) >= 2
        self._fixed = {c: self._schema.fixed_length(c) for c in self._schema.token_columns}
        self._fixed = {c: n for c, n in self._fixed.items() if n is not None}

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
        extra = {"chunk_tokens": chunk_tokens}
        if padding:
            extra["padding_tokens"] = padding
        example[STATS_KEY] = merge_counters(counters, extra)
        return example

    def process(self, chunk):
        split, chunk_key, plan, piece = chunk
        features = dict(piece.features)
        features["doc_lengths"] = piece.doc_lengths
        for draw in range(self._draws):
            key = example_key(chunk_key, draw)
            example = self._objective.build(piece.tokens, LazyGenerator(self._seed, key), plan, self._special, features)
            example["key"] = key
            yield split, self._finish(example, len(piece.tokens))
        self._examples.inc(self._draws)


class BuildExamples(beam.PTransform):
    """``(split, chunk_key, plan, Piece)`` -> ``(split, example dict)``.

    Args:
        objective: object implementing :class:`transforms.objectives.base.Objective`.
        special: resolved :class:`transforms.objectives.common.SpecialIds`.
        schema: the :class:`schemas.examples.ExampleSchema` the examples are written with.
        seed: global seed.
        draws: independent noisings per chunk (>= 1).
    """

    def __init__(self, objective, special, schema, *, seed: int, draws: int = 1):
        super().__init__()
        if draws < 1:
            raise ValueError(f"--draws {draws}: must be >= 1")
        self._fn = _Build(objective, special, schema, seed, draws)

    def expand(self, chunks):
        return chunks | "ApplyObjective" >> beam.ParDo(self._fn)
