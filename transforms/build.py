"""BuildExamples: apply the objective to each chunk, ``draws`` times.

Draw ``d`` of chunk ``C`` has the example key ``C-dD`` and draws its noise from
``example_rng(seed, key)`` only, like BERT's ``dupe_factor`` static masking: K draws give K
differently noised copies of the same chunk.
"""

from __future__ import annotations

import apache_beam as beam

from transforms.objectives.common import example_rng

__all__ = ["BuildExamples", "example_key"]


def example_key(chunk_key: str, draw: int) -> str:
    """Key of draw ``draw`` of a chunk (no dots: it is also the WebDataset ``__key__``)."""
    return f"{chunk_key}-d{draw}"


class _Build(beam.DoFn):
    def __init__(self, objective, special, seed, draws):
        self._objective, self._special, self._seed, self._draws = objective, special, seed, draws

    def setup(self):
        self._examples = beam.metrics.Metrics.counter("lmshards", "examples")

    def process(self, chunk):
        split, chunk_key, plan, piece = chunk
        features = dict(piece.features)
        features["doc_lengths"] = piece.doc_lengths
        for draw in range(self._draws):
            key = example_key(chunk_key, draw)
            example = self._objective.build(piece.tokens, example_rng(self._seed, key), plan, self._special, features)
            example["key"] = key
            yield split, example
        self._examples.inc(self._draws)


class BuildExamples(beam.PTransform):
    """``(split, chunk_key, plan, Piece)`` -> ``(split, example dict)``.

    Args:
        objective: object implementing :class:`transforms.objectives.base.Objective`.
        special: resolved :class:`transforms.objectives.common.SpecialIds`.
        seed: global seed.
        draws: independent noisings per chunk (>= 1).
    """

    def __init__(self, objective, special, *, seed: int, draws: int = 1):
        super().__init__()
        if draws < 1:
            raise ValueError(f"--draws {draws}: must be >= 1")
        self._fn = _Build(objective, special, seed, draws)

    def expand(self, chunks):
        return chunks | "ApplyObjective" >> beam.ParDo(self._fn)
