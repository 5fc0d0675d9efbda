"""One stored example taken apart: what statistics, rendering and validation all need.

:func:`take_apart` reads an example as the writer stored it (fixed-length columns padded
with ``pad``) and returns an :class:`Anatomy`: the unpadded length of every token column,
the padding, the raw chunk tokens the example was made from, and per objective the parts
that show its noise (the reference semantics are those of :mod:`transforms.objectives`):

- clm / prefix_lm: ``doc_lengths`` and the prefix/suffix boundary;
- mlm: the selected positions split into ``<mask>``, random and kept (``labels`` != -100);
- span corruption and UL2 span denoisers: ``inputs = [mode] c0 <X0> c1 <X1> ... </s>``,
  ``targets = <X0> n0 <X1> n1 ... </s>``: the noise span lengths, and the chunk restored
  by interleaving them;
- UL2's S denoiser: ``inputs = [mode] prefix </s>``, ``targets = suffix </s>``; the decoder
  layout stores ``input_ids = inputs + targets`` with ``prefix_length = len(inputs)``;
- bart: ``<s>``/``</s>`` framing and the ``<mask>`` tokens of the inputs.

Structural faults (a missing EOS, sentinels out of order, an unknown denoiser) are
collected in :attr:`Anatomy.issues` instead of raised, so one bad example never hides the
rest of a report.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from schemas.examples import example_schema
from transforms.objectives.common import IGNORE_INDEX, SpecialIds

__all__ = ["Anatomy", "ObjectiveView", "take_apart"]


class ObjectiveView:
    """What taking an example apart needs to know about its objective and tokenizer.

    Args:
        objective: the objective object (see :func:`loaders.inspection.source.objective_from_manifest`).
        special: the dataset's special ids.
        packing: the packing mode (``concat`` chunks cut one stream of documents, each ended by EOS;
            ``joined`` for documents joined without a separator).
    """

    def __init__(self, objective: Any, special: SpecialIds, packing: str = "concat"):
        self.objective = objective
        self.special = special
        self.packing = packing
        self.name: str = objective.name
        self.schema = example_schema(objective.family, **objective.schema_kwargs())
        self.fixed = {c: self.schema.fixed_length(c) for c in self.schema.token_columns}
        # The objective's inspection hooks (transforms/objectives/base.py) say how its examples are laid out.
        self.decoder_layout: bool = objective.seq2seq_in_decoder_rows
        self.sentinel_index = {int(t): k for k, t in enumerate(special.sentinels)}
        self.sentinel_ids = np.array(special.sentinels, dtype=np.int64)
        self.mode_names = {int(i): t for t, i in special.mode_tokens.items()}
        self.denoisers: dict[str, tuple[Any, Any]] = objective.denoiser_table()


@dataclass
class Anatomy:
    """The parts of one example (see the module docstring).

    Attributes:
        key: the example key.
        kind: ``clm``, ``prefix_lm``, ``mlm``, ``span``, ``prefix`` (UL2's S) or ``bart``, or
            another objective's own name (taken apart by its family only), from
            ``Objective.example_kind``.
        lengths: unpadded length per token column.
        padding: pad positions of the fixed-length columns.
        raw_tokens: tokens of the source chunk the example was made from.
        denoiser: UL2 denoiser name.
        doc_lengths: document segment lengths (decoder family).
        prefix_length: prefix tokens of the row (prefix_lm: over all its document segments; UL2
            decoder layout: its inputs).
        prefix_lengths: the prefix of each document segment (format 3's ``prefix_lengths``;
            None for format 2's single ``prefix_length``).
        inputs: unpadded inputs (seq2seq; split from ``input_ids`` in the UL2 decoder layout).
        targets: unpadded targets, likewise.
        offset: leading mode tokens of ``inputs`` (1 for UL2, else 0).
        span_lengths: noise span lengths (span denoisers), the suffix length (S).
        noise_tokens: noise tokens (span noise, the S suffix, MLM selected tokens).
        mlm: MLM position masks ``selected``, ``masked``, ``random``, ``kept``, the count ``candidates``
            of non-special tokens, the ``restored`` chunk and the stored ``input_ids`` and ``labels``.
        mask_tokens: ``<mask>`` tokens in BART inputs.
        issues: structural faults found.
    """

    key: str
    kind: str
    lengths: dict[str, int] = field(default_factory=dict)
    padding: int = 0
    raw_tokens: int = 0
    denoiser: str | None = None
    doc_lengths: np.ndarray | None = None
    prefix_length: int | None = None
    prefix_lengths: np.ndarray | None = None
    inputs: np.ndarray | None = None
    targets: np.ndarray | None = None
    offset: int = 0
    span_lengths: np.ndarray | None = None
    noise_tokens: int = 0
    mlm: dict[str, Any] = field(default_factory=dict)
    mask_tokens: int = 0
    issues: list[str] = field(default_factory=list)

    def restored_chunk(self, special: SpecialIds) -> np.ndarray | None:
        """The raw chunk rebuilt from a span or S example (None for other kinds or a broken one),
        with the sentinels of ``special``."""
        if self.issues or self.inputs is None:
            return None
        body, targets = self.inputs[self.offset : -1], self.targets[:-1]
        if self.kind == "prefix":
            return np.concatenate([body, targets]).astype(np.int32)
        if self.kind != "span":
            return None
        sentinel_ids = special.sentinel_array()
        pieces = np.split(targets, np.flatnonzero(np.isin(targets, sentinel_ids)))[1:]
        out, start = [], 0
        for position in np.flatnonzero(np.isin(body, sentinel_ids)):
            out += [body[start:position], pieces[special.sentinels.index(int(body[position]))][1:]]
            start = position + 1
        out.append(body[start:])
        return np.concatenate(out).astype(np.int32) if out else np.zeros(0, np.int32)


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


def _sentinel_order(ids: np.ndarray, view: ObjectiveView, where: str, issues: list[str]) -> np.ndarray:
    """Positions of sentinels in ``ids``; an issue unless they are ``<extra_id_0>``, 1, 2... in order."""
    positions = np.flatnonzero(np.isin(ids, view.sentinel_ids))
    order = [view.sentinel_index[int(t)] for t in ids[positions]]
    if order != list(range(len(order))):
        shown = ", ".join(f"<extra_id_{k}>" for k in order[:8]) + (" ..." if len(order) > 8 else "")
        issues.append(f"{where}: sentinels out of order ({shown}); expected <extra_id_0>, <extra_id_1>, ...")
    return positions


def _span_parts(a: Anatomy, view: ObjectiveView) -> None:
    eos, issues = view.special.eos, a.issues
    body, targets = a.inputs[a.offset :], a.targets
    if body.size == 0 or body[-1] != eos:
        issues.append("inputs do not end with EOS")
    if targets.size == 0 or targets[-1] != eos:
        issues.append("targets do not end with EOS")
    in_pos = _sentinel_order(body, view, "inputs", issues)
    out_pos = _sentinel_order(targets, view, "targets", issues)
    if in_pos.size != out_pos.size:
        issues.append(f"inputs hold {in_pos.size} sentinels but targets {out_pos.size}")
    if out_pos.size and out_pos[0] != 0:
        issues.append("targets do not start with a sentinel")
    lengths = np.diff(np.append(out_pos, max(targets.size - 1, 0))) - 1
    if (lengths < 1).any():
        issues.append("targets hold an empty noise span (two sentinels, or a sentinel and EOS, side by side)")
    a.span_lengths = np.maximum(lengths, 0)
    a.noise_tokens = int(max(targets.size - 1 - out_pos.size, 0))
    a.raw_tokens = int(max(body.size - 1 - in_pos.size, 0)) + a.noise_tokens


def _seq2seq_parts(a: Anatomy, view: ObjectiveView) -> None:
    special = view.special
    if a.kind == "bart":
        a.raw_tokens = max(a.targets.size - 2, 0)
        a.mask_tokens = int((a.inputs == special.mask).sum())
        for name, ids in (("inputs", a.inputs), ("targets", a.targets)):
            if ids.size < 2 or ids[0] != special.bos or ids[-1] != special.eos:
                a.issues.append(f"{name} are not framed by <s> ... </s>")
        return
    if a.offset:
        mode = view.denoisers[a.denoiser][0].mode_token if a.denoiser in view.denoisers else None
        first = view.mode_names.get(int(a.inputs[0])) if a.inputs.size else None
        if first != mode:
            a.issues.append(f"inputs start with {first or 'no mode token'}, denoiser {a.denoiser} uses {mode}")
    if a.kind == "span":
        _span_parts(a, view)
        return
    eos = special.eos
    if a.inputs.size < a.offset + 1 or a.inputs[-1] != eos:
        a.issues.append("inputs do not end with EOS")
    if a.targets.size == 0 or a.targets[-1] != eos:
        a.issues.append("targets do not end with EOS")
    a.noise_tokens = max(a.targets.size - 1, 0)
    a.span_lengths = np.array([a.noise_tokens])
    a.raw_tokens = max(a.inputs.size - a.offset - 1, 0) + a.noise_tokens


#: The seq2seq layouts parsed here; another objective's examples get lengths and padding only.
_SEQ2SEQ_LAYOUTS = ("bart", "span", "prefix")


def _kind(view: ObjectiveView, example: dict[str, Any], a: Anatomy) -> str:
    kind = view.objective.example_kind(example)
    a.denoiser, a.offset = kind.denoiser, kind.lead
    if kind.issue:
        a.issues.append(kind.issue)
    return kind.kind


def take_apart(example: dict[str, Any], view: ObjectiveView) -> Anatomy:
    """Take one stored example apart (see :class:`Anatomy`); never raises on bad content.

    The family's columns and the known layouts are parsed here; then the objective's own hook
    (``Objective.take_apart``) completes the parts of its kind (a fault it raises is an issue).
    """
    a = Anatomy(key=str(example.get("key", "")), kind="")
    a.kind = _kind(view, example, a)
    _family_parts(example, view, a)
    if not a.issues:
        try:
            view.objective.take_apart(example, a, view.special)
        except Exception as exc:  # noqa: BLE001 - bad content must become an issue, never an exception
            a.issues.append(f"objective {view.name} cannot take it apart: {exc!r}")
    return a


def _family_parts(example: dict[str, Any], view: ObjectiveView, a: Anatomy) -> Anatomy:
    special = view.special
    for column, fixed in view.fixed.items():
        if column not in example:
            a.issues.append(f"column {column!r} is missing")
            return a
        values = np.asarray(example[column])
        if fixed is not None and values.shape != (fixed,):
            a.issues.append(f"{column} has shape {values.shape}, the schema says ({fixed},)")
            return a
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
            _seq2seq_parts(a, view)
        return a
    if view.schema.family == "encoder":
        ids, labels = np.asarray(example["input_ids"]), np.asarray(example["labels"])
        real = np.flatnonzero((ids != special.pad) | (labels != IGNORE_INDEX))
        # Padding is pad with label -100; when pad is EOS (no pad token) rows are taken as full.
        length = int(real[-1]) + 1 if real.size and special.pad != special.eos else ids.size
        selected = labels != IGNORE_INDEX
        masked = selected & (ids == special.mask)
        kept = selected & (ids == labels)
        special_ids = special.special_array()
        restored = np.where(selected, labels, ids)[:length]
        a.lengths, a.padding = {"input_ids": length, "labels": length}, ids.size - length
        a.raw_tokens = length - view.objective.framing_tokens
        a.noise_tokens = int(selected.sum())
        a.mlm = {
            "selected": selected, "masked": masked, "kept": kept, "random": selected & ~masked & ~kept,
            "candidates": int((~np.isin(restored, special_ids)).sum()), "restored": restored,
            "input_ids": ids, "labels": labels,
        }
        return a
    a.inputs = _unpad(example["inputs"], special, view.fixed.get("inputs"))
    a.targets = _unpad(example["targets"], special, view.fixed.get("targets"))
    a.lengths = {"inputs": int(a.inputs.size), "targets": int(a.targets.size)}
    a.padding = sum((view.fixed[c] or 0) - a.lengths[c] for c in ("inputs", "targets") if view.fixed.get(c))
    if a.kind in _SEQ2SEQ_LAYOUTS:
        _seq2seq_parts(a, view)
    return a
