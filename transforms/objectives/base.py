"""The interface every objective implements, so the pipeline and the loader can drive any
of them the same way.

Flow for one chunk (DESIGN.md sections 2 and 4):

1. The packer asks :meth:`Objective.plan_chunk` how many raw tokens the next chunk needs.
   Most objectives always answer the same length; UL2 draws its denoiser first (from a
   generator seeded by the chunk key) because the raw length depends on it. The answer is
   ``(raw_length, plan)``, and ``plan`` (an int, e.g. the denoiser index) travels with the
   chunk.
2. :meth:`Objective.build` turns ``tokens`` (int32, exactly ``raw_length`` long, or
   shorter for a padded final chunk) into one example dict, drawing noise only from the
   ``rng`` it is given (seeded by the example key). ``features`` holds optional per-token
   boolean arrays aligned with ``tokens``: ``word_starts`` and ``sentence_starts``
   (requested through :attr:`Objective.features`).
3. :meth:`Objective.stats` returns integer counters of one example (never floats, so the
   sums are exact whatever the order) that the manifest adds up.

Optional fast paths the pipeline's builder (:class:`transforms.parallel.ChunkBuilder`) uses
when an objective has them; each must give exactly the rows and summed counters of
:meth:`Objective.build` and :meth:`Objective.stats` (property tests hold them to it):

- ``build_block(tokens, doc_lengths)``: full chunks without noise, all at once (CLM).
- ``build_many(pieces, plans, rngs, special)``: chunks a few dozen rows at a time, each row
  from its own generator (``example_rngs``), returning :data:`BuiltRows`; rows of fixed-length
  columns come padded (every objective but CLM). With ``builds_many(piece, plan)`` it takes
  only the chunks that method accepts (BART: full chunks with both features).
"""

from __future__ import annotations

from typing import Any, Protocol

import numpy as np

from transforms.objectives.common import SpecialIds

__all__ = ["BuiltRows", "Objective"]

#: What ``build_many`` returns: array columns (name -> ``(flat int32 values, int64 row
#: offsets)``), scalar columns (name -> int32 values), string columns other than the key
#: (name -> values), and the rows' summed counters.
BuiltRows = tuple[dict[str, tuple[np.ndarray, np.ndarray]], dict[str, np.ndarray], dict[str, list[str]],
                  dict[str, int]]


class Objective(Protocol):
    """What the pipeline needs of an objective.

    Attributes:
        name: objective name as on the command line (``clm``, ``mlm``, ...).
        family: example family of :mod:`schemas.examples` (``decoder``, ``encoder``, ``seq2seq``).
        features: per-token features ``build`` needs (subset of ``{"word_starts", "sentence_starts"}``).
        required_specials: special-token roles the objective needs (``"eos"``, ``"mask"``, ...).
    """

    name: str
    family: str
    features: frozenset[str]
    required_specials: frozenset[str]

    def plan_chunk(self, rng: np.random.Generator) -> tuple[int, int]:
        """Raw token length of the next chunk and an int plan carried to :meth:`build`."""

    def build(
        self,
        tokens: np.ndarray,
        rng: np.random.Generator,
        plan: int,
        special: SpecialIds,
        features: dict[str, np.ndarray],
    ) -> dict[str, Any]:
        """One example: column name -> int32 array, int or str."""

    def stats(self, example: dict[str, Any]) -> dict[str, int]:
        """Integer counters of one example, summed into the manifest."""

    def schema_kwargs(self) -> dict[str, Any]:
        """Keyword arguments of :func:`schemas.examples.example_schema` for this objective."""

    def max_sentinels(self) -> int:
        """Largest number of distinct sentinels one example may use (0 if none)."""

    def params(self) -> dict[str, Any]:
        """JSON-able parameters recorded in the manifest."""
