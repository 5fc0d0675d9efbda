"""One stored example taken apart: what statistics, rendering and validation all need.

:func:`take_apart` reads an example as the writer stored it (fixed-length columns padded
with ``pad``) and returns an :class:`Anatomy`. The family's columns (:mod:`schemas.examples`)
give the parts every objective has: the unpadded length of every token column, the padding,
the document segments of a decoder row and their prefixes (``prefix_lengths``, or one
``prefix_length``), the unpadded ``inputs`` and ``targets`` of a seq2seq example (split from
a decoder row at its prefix where the objective keeps one seq2seq example in a decoder row).
Then the objective's hook (``Objective.take_apart``, docs/design.md section 4) reads its own
layout: the chunk tokens the example was made from, its noise (kept in ``Anatomy.parts``, a
record of the objective's own) and its structural faults.

Structural faults (a missing EOS, sentinels out of order, a missing column) are collected in
:attr:`Anatomy.issues` instead of raised, so one bad example never hides the rest of a report.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from schemas.examples import example_schema
from transforms.objectives.base import InspectionContext
from transforms.objectives.common import IGNORE_INDEX, SpecialIds

__all__ = ["Anatomy", "ObjectiveView", "take_apart"]


class ObjectiveView:
    """What taking an example apart needs to know about its dataset.

    Args:
        objective: the objective object (see :func:`loaders.inspection.source.objective_from_manifest`).
        special: the dataset's special ids.
        packing: the packing mode (``concat`` chunks cut one stream of documents, each ended by EOS;
            ``joined`` for documents joined without a separator).
        seed: the dataset's seed.
    """

    def __init__(self, objective: Any, special: SpecialIds, packing: str = "concat", seed: int = 0):
        self.objective = objective
        self.special = special
        self.packing = packing
        self.seed = seed
        self.name: str = objective.name
        self.schema = example_schema(objective.family, **objective.schema_kwargs())
        self.fixed = {c: self.schema.fixed_length(c) for c in self.schema.token_columns}
        self.decoder_layout: bool = objective.seq2seq_in_decoder_rows

    def context(self, split: str = "", **facts: Any) -> InspectionContext:
        """The :class:`~transforms.objectives.base.InspectionContext` the objective's hooks get
        for ``split``, with ``facts`` (``counters``, ``manifest_summary``, ``stats``, ...) known."""
        return InspectionContext(**{"special": self.special, "seed": self.seed, "split": split, **facts})


@dataclass
class Anatomy:
    """The parts of one example (see the module docstring).

    Attributes:
        key: the example key.
        lengths: unpadded length per token column.
        padding: pad positions of the fixed-length columns.
        raw_tokens: tokens of the source chunk the example was made from.
        doc_lengths: document segment lengths (decoder family).
        prefix_length: prefix tokens of the row (over all its document segments; one seq2seq
            example in a decoder row: its inputs).
        prefix_lengths: the prefix of each document segment (a ``prefix_lengths`` column; None
            for a single ``prefix_length``).
        inputs: unpadded inputs (seq2seq; split from ``input_ids`` where a decoder row holds one
            seq2seq example).
        targets: unpadded targets, likewise.
        parts: the objective's own record of the example (its ``take_apart`` sets it).
        complete: the family's columns and the objective's ``take_apart`` gave every part; the
            hooks of one example (statistics, counters, rendering) run only then.
        issues: structural faults found.
    """

    key: str
    lengths: dict[str, int] = field(default_factory=dict)
    padding: int = 0
    raw_tokens: int = 0
    doc_lengths: np.ndarray | None = None
    prefix_length: int | None = None
    prefix_lengths: np.ndarray | None = None
    inputs: np.ndarray | None = None
    targets: np.ndarray | None = None
    parts: Any = None
    complete: bool = False
    issues: list[str] = field(default_factory=list)


def _unpad(values: np.ndarray, special: SpecialIds, fixed: int | None) -> np.ndarray:
    """Drop the writer's right padding of a fixed-length seq2seq column, which ends with EOS.

    With a tokenizer that has no pad token the pipeline pads with EOS; one EOS is then kept.
    """
    values = np.asarray(values)
    if fixed is None or values.size == 0:
        return values
    real = np.flatnonzero(values != special.pad)
    end = real[-1] + 1 if real.size else 0
    return values[: min(end + 1, values.size)] if special.pad == special.eos else values[:end]


def take_apart(example: dict[str, Any], view: ObjectiveView, context: InspectionContext | None = None) -> Anatomy:
    """Take one stored example apart (see :class:`Anatomy`); never raises on bad content.

    The family's columns are read here; then the objective's hook (``Objective.take_apart``,
    given ``context``, by default the view's, with the example and its anatomy) reads its own
    layout (an exception it raises is an issue).
    """
    a = Anatomy(key=str(example.get("key", "")))
    if _family_parts(example, view, a):
        ctx = (context or view.context()).known(example=example, anatomy=a)
        try:
            view.objective.take_apart(ctx)
        except Exception as exc:  # noqa: BLE001 - bad content must become an issue, never an exception
            a.issues.append(f"objective {view.name} cannot take it apart: {exc!r}")
        else:
            a.complete = True
    return a


def _family_parts(example: dict[str, Any], view: ObjectiveView, a: Anatomy) -> bool:
    """Fill in the parts the family's columns give; False when a column is missing or misshapen."""
    special = view.special
    for column, fixed in view.fixed.items():
        if column not in example:
            a.issues.append(f"column {column!r} is missing")
            return False
        values = np.asarray(example[column])
        if fixed is not None and values.shape != (fixed,):
            a.issues.append(f"{column} has shape {values.shape}, the schema says ({fixed},)")
            return False
    if view.schema.family == "decoder":
        ids = np.asarray(example["input_ids"])
        a.doc_lengths = np.asarray(example.get("doc_lengths", [ids.size]), dtype=np.int64)
        length = int(a.doc_lengths.sum())
        if (a.doc_lengths <= 0).any() or length > ids.size:
            a.issues.append(f"doc_lengths {a.doc_lengths.tolist()} are not positive or exceed {ids.size} tokens")
            length = min(max(length, 0), ids.size)
        if (ids[length:] != special.pad).any():
            a.issues.append("positions past sum(doc_lengths) are not padding")
        ends = np.cumsum(a.doc_lengths)[:-1] - 1
        concat = view.packing == "concat" and not view.decoder_layout and not a.issues
        if concat and ends.size and (ids[ends] != special.eos).any():
            # concat packing cuts one stream of documents each followed by its EOS
            a.issues.append("a document segment other than the last does not end with EOS")
        a.lengths, a.padding, a.raw_tokens = {"input_ids": length}, ids.size - length, length
        if "prefix_lengths" in example:
            a.prefix_lengths = np.asarray(example["prefix_lengths"], dtype=np.int64)
            a.prefix_length = int(a.prefix_lengths.sum())
            if a.prefix_lengths.shape != a.doc_lengths.shape:
                a.issues.append(f"prefix_lengths has {a.prefix_lengths.size} entries for {a.doc_lengths.size} "
                                "document segments")
            elif not ((a.prefix_lengths > 0) & (a.prefix_lengths <= np.maximum(a.doc_lengths - 1, 1))).all():
                a.issues.append(f"prefix_lengths {a.prefix_lengths.tolist()} outside [1, d-1] of their segments "
                                f"{a.doc_lengths.tolist()}")
        elif "prefix_length" in example:  # format 2: one prefix for the whole row
            a.prefix_length = int(example["prefix_length"])
            if not 0 < a.prefix_length <= max(length - 1, 1):
                a.issues.append(f"prefix_length {a.prefix_length} outside [1, {max(length - 1, 1)}]")
        if view.decoder_layout:  # one segment: its prefix is the inputs
            cut = min(max(a.prefix_length or 0, 0), length)
            a.inputs, a.targets = ids[:cut], ids[cut:length]
        return True
    if view.schema.family == "encoder":
        ids, labels = np.asarray(example["input_ids"]), np.asarray(example["labels"])
        real = np.flatnonzero((ids != special.pad) | (labels != IGNORE_INDEX))
        # Padding is pad with label -100; when pad is EOS (no pad token) rows are taken as full.
        length = int(real[-1]) + 1 if real.size and special.pad != special.eos else ids.size
        a.lengths, a.padding, a.raw_tokens = {"input_ids": length, "labels": length}, ids.size - length, length
        return True
    a.inputs = _unpad(example["inputs"], special, view.fixed.get("inputs"))
    a.targets = _unpad(example["targets"], special, view.fixed.get("targets"))
    a.lengths = {"inputs": int(a.inputs.size), "targets": int(a.targets.size)}
    a.padding = sum((view.fixed[c] or 0) - a.lengths[c] for c in ("inputs", "targets") if view.fixed.get(c))
    return True
