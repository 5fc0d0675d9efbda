"""The invariants one example must satisfy, and the replay of its objective.

Invariants (references in :mod:`transforms.objectives`). Those of the
layouts' structure is checked here (:func:`~loaders.inspection.anatomy.take_apart`); each
objective's own invariants and replay come from its class (``Objective.example_problems``;
the T5 span checks and replay shared by span corruption and UL2 in
:mod:`transforms.objectives.spans`):

- every example: a key without dots that names its split; token ids inside the vocabulary
  (labels: -100 or a token id); the structure :func:`~loaders.inspection.anatomy.take_apart` checks;
- prefix_lm: each segment's ``prefix_lengths`` in ``[1, d-1]``;
- mlm: the exact selection budget (BERT's ``max(1, round(len * p))`` of the ``len`` tokens,
  at most the ``n`` non-special ones; at most that under whole-word masking), the 80/10/10
  split within one token of its ratios, labels and random replacements never special;
- span corruption / UL2 span denoisers: noise and span counts of T5's
  ``random_spans_noise_mask`` for the restored chunk length, which must not exceed the raw length;
- UL2: the recorded denoiser is the one the packer planned from the chunk key;
- bart: ``<s> ... </s>`` framing, no ``<mask>`` in targets, lengths within their budgets.

Replay: noise is a pure function of ``(seed, example key, chunk)`` (docs/design.md section 3),
so where the chunk can be restored from the example (prefix_lm, mlm without whole words,
span corruption, UL2) the objective is run again on it, as a block of one
(:func:`transforms.objectives.base.build_example`), and must give the stored example back
token for token. BART (it needs word and sentence starts the shards do not keep) and
whole-word MLM are checked by their invariants only.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from loaders.inspection.anatomy import Anatomy, ObjectiveView
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


def example_problems(split: str, example: dict[str, Any], a: Anatomy, view: ObjectiveView, seed: int) -> list[str]:
    """Everything wrong with one example (empty when it is sound)."""
    key = a.key
    out = list(a.issues)
    if "." in key or not key.startswith(f"{split}-"):
        out.append(f"key {key!r} has a dot or does not start with its split {split!r}")
    out += _ids_in_range(example, view)
    if out:
        return out
    # The objective's own invariants and replay (Objective.example_problems).
    out += view.objective.example_problems(example, a, view.special, seed)
    return out
