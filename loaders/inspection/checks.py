"""The invariants one example must satisfy, and the replay of its objective.

Every example: a key without dots that names its split; token ids inside the vocabulary
(labels: -100 or a token id); the structure :func:`~loaders.inspection.anatomy.take_apart`
checks (the family's and the objective's layout). Then, for a structurally sound example, the
objective's own invariants and replay (``Objective.example_problems``, docs/design.md section 4;
the references are in :mod:`transforms.objectives`).

Replay: noise is a pure function of ``(seed, example key, chunk)`` (docs/design.md section 3),
so where the chunk can be restored from the example the objective is run again on it, as a
block of one (:func:`transforms.objectives.base.build_example`), and must give the stored
example back token for token; an objective whose noise needs what the shards do not keep
(word or sentence starts) is checked by its invariants only.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from loaders.inspection.anatomy import Anatomy, ObjectiveView
from transforms.objectives.base import InspectionContext
from transforms.objectives.common import IGNORE_INDEX

__all__ = ["example_problems"]


def _ids_in_range(example: dict[str, Any], view: ObjectiveView) -> list[str]:
    out = []
    for column in view.schema.token_columns:
        values = np.asarray(example.get(column, []))
        if column == "labels":
            values = values[values != IGNORE_INDEX]
        if values.size and (values.min() < 0 or values.max() >= view.special.vocab_size):
            out.append(f"{column} holds ids outside [0, {view.special.vocab_size}): {values.min()}..{values.max()}")
    return out


def example_problems(split: str, example: dict[str, Any], a: Anatomy, view: ObjectiveView, seed: int,
                     context: InspectionContext | None = None) -> list[str]:
    """Everything wrong with one example (empty when it is sound); the objective's hook gets
    ``context`` (default the view's for ``split``) with the example and its anatomy."""
    key = a.key
    out = list(a.issues)
    if "." in key or not key.startswith(f"{split}-"):
        out.append(f"key {key!r} has a dot or does not start with its split {split!r}")
    out += _ids_in_range(example, view)
    if out:
        return out
    # The objective's own invariants and replay (Objective.example_problems).
    ctx = (context or view.context(split)).known(seed=seed, example=example, anatomy=a)
    return view.objective.example_problems(ctx)
