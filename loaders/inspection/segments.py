"""An example as named lines of :class:`Segment` runs, its corruption made explicit.

:func:`render_example` turns one stored example (taken apart by
:mod:`loaders.inspection.anatomy`) into a header and lines:

- clm / prefix_lm: ``input_ids`` with ``[/doc]`` and ``[/prefix]`` boundaries and padding;
- mlm: ``input_ids`` with every selected token as ``mask``, ``random`` or ``kept`` and the
  original it must be predicted as;
- span corruption and UL2: ``inputs``, ``targets`` (each span in its sentinel's colour) and the
  ``restored`` chunk with every span back in place; UL2's S: the prefix and the suffix;
- bart: ``inputs`` and ``targets`` with ``[#k]`` where original sentence ``k`` starts, and the
  ``restored`` inputs in which every ``<mask>`` shows what it hides (recovered by
  :mod:`loaders.inspection.bart_noise`; the tokens the model must restore are ``hidden`` in
  the targets).

How segments become text, ANSI colour or HTML is :mod:`loaders.inspection.render`'s.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from loaders.inspection.anatomy import Anatomy, ObjectiveView
from loaders.inspection.bart_noise import BartNoise, recover_bart_noise
from loaders.inspection.source import Located

__all__ = ["RenderedExample", "Segment", "render_example"]

#: Kinds without tokens of their own: markers between tokens.
MARKERS = frozenset({"boundary", "sentence"})


@dataclass
class Segment:
    """A run of tokens shown one way.

    Attributes:
        kind: ``text``, ``prefix``, ``special``, ``pad``, ``mode``, ``mask``, ``random``,
            ``kept``, ``sentinel``, ``span``, ``hidden`` (targets tokens the noise hid),
            ``insert`` (inserted noise), ``deleted`` (no ids: ``original`` was removed), or a
            marker: ``boundary`` or ``sentence`` (no tokens).
        ids: the token ids shown.
        original: ids the model must predict where they differ from ``ids`` (MLM's selected
            tokens; what a BART ``<mask>`` or random token hides, or what was deleted).
        group: sentinel index of a sentinel or span.
        label: boundary name, sentence marker (``#3``) or span sentinel.
    """

    kind: str
    ids: list[int]
    original: list[int] | None = None
    group: int = 0
    label: str = ""

    def stream_ids(self) -> list[int]:
        """The ids this segment contributes to its line's text read in order (the original
        where the model must predict one)."""
        if self.kind in MARKERS or self.kind in ("pad", "insert"):
            return []
        if self.original is not None and self.kind in ("mask", "random", "kept", "deleted"):
            return list(self.original)
        return list(self.ids)


@dataclass
class RenderedExample:
    """A header and named lines of segments."""

    header: str
    lines: list[tuple[str, list[Segment]]]


class _Builder:
    def __init__(self, view: ObjectiveView):
        self.view = view
        self.special = set(int(i) for i in view.special.special_array())
        self.sentinels = view.sentinel_index
        self.modes = view.mode_names
        self.pad = view.special.pad
        self.mask = view.special.mask

    def kinds(self, ids: np.ndarray, base: str, span_of: dict[int, int] | None = None,
              hidden: set[int] | None = None) -> list[Segment]:
        """Segments of a plain sequence: specials, sentinels and mode tokens broken out; the
        positions in ``span_of`` are spans of that sentinel, those in ``hidden`` hidden."""
        out: list[Segment] = []
        for position, token in enumerate(int(t) for t in ids):
            if token in self.sentinels:
                kind, group = "sentinel", self.sentinels[token]
            elif token in self.modes:
                kind, group = "mode", 0
            elif token == self.mask:
                kind, group = "mask", 0
            elif token in self.special:
                kind, group = ("pad" if token == self.pad else "special"), 0
            elif span_of and position in span_of:
                kind, group = "span", span_of[position]
            else:
                kind, group = ("hidden" if hidden and position in hidden else base), 0
            out.append(Segment(kind, [token], group=group))
        return _merge(out)

    def spans_in_targets(self, targets: np.ndarray) -> dict[int, int]:
        span_of, current = {}, -1
        for position, token in enumerate(int(t) for t in targets):
            if token in self.sentinels:
                current = self.sentinels[token]
            elif current >= 0:
                span_of[position] = current
        return span_of

    def restored(self, inputs: np.ndarray, targets: np.ndarray) -> list[Segment]:
        pieces: dict[int, list[int]] = {}
        current = -1
        for token in (int(t) for t in targets[:-1]):
            if token in self.sentinels:
                current = self.sentinels[token]
                pieces[current] = []
            elif current >= 0:
                pieces[current].append(token)
        out: list[Segment] = []
        for segment in self.kinds(inputs, "text"):
            if segment.kind == "sentinel":
                k = segment.group
                out.append(Segment("span", pieces.get(k, []), group=k, label=f"<extra_id_{k}>"))
            else:
                out.append(segment)
        return out


def _with_markers(segments: list[Segment], cuts: dict[int, tuple[str, str]]) -> list[Segment]:
    """Insert marker segments (``cuts[position] = (kind, label)``) before those positions of the
    line's token stream; a noise segment that stands for hidden tokens stays whole, and a
    position inside it marks its start."""
    out, position = [], 0
    for segment in segments:
        if segment.kind in ("deleted", "insert") or (segment.kind in ("mask", "random") and segment.original):
            size = len(segment.stream_ids())
            out += [Segment(cuts[p][0], [], label=cuts[p][1]) for p in sorted(cuts)
                    if position <= p < position + size and p > 0]
            out.append(segment)
            position += size
            continue
        start = 0
        for offset in range(len(segment.ids)):
            if position + offset in cuts and position + offset > 0:
                if offset > start:
                    out.append(Segment(segment.kind, segment.ids[start:offset], group=segment.group))
                kind, label = cuts[position + offset]
                out.append(Segment(kind, [], label=label))
                start = offset
        out.append(Segment(segment.kind, segment.ids[start:], original=segment.original, group=segment.group,
                           label=segment.label))
        position += len(segment.ids)
    return out


def _merge(segments: list[Segment]) -> list[Segment]:
    """Join neighbouring segments of the same kind and group (single tokens stay apart where they mean one thing)."""
    out: list[Segment] = []
    for segment in segments:
        last = out[-1] if out else None
        if last and last.kind == segment.kind and last.group == segment.group and not segment.label \
                and segment.kind not in ("sentinel", "special", "mode", "boundary", "sentence", "insert"):
            last.ids += segment.ids
            if last.original is not None:
                last.original += segment.original or []
        else:
            out.append(segment)
    return out


def _decoder_line(b: _Builder, a: Anatomy, ids: np.ndarray) -> list[Segment]:
    length = int(a.doc_lengths.sum()) if a.doc_lengths is not None else ids.size
    docs = a.doc_lengths.tolist() if a.doc_lengths is not None else [length]
    if a.kind != "prefix_lm":
        prefixes = [0] * len(docs)
    elif a.prefix_lengths is not None and len(a.prefix_lengths) == len(docs):
        prefixes = a.prefix_lengths.tolist()
    else:  # format 2: one prefix over the whole row
        docs, prefixes = [length], [a.prefix_length or 0]
    segments: list[Segment] = []
    cuts = {int(c): ("boundary", "doc") for c in np.cumsum(a.doc_lengths)[:-1]} if a.doc_lengths is not None else {}
    start = 0
    for d, p in zip(docs, prefixes, strict=True):  # each document segment: its prefix, then its suffix
        segments += b.kinds(ids[start : start + p], "prefix") + b.kinds(ids[start + p : start + d], "text")
        if 0 < p < d:
            cuts[start + p] = ("boundary", "prefix")
        start += d
    segments = _with_markers(segments, cuts)
    return segments + ([Segment("pad", [b.pad] * (ids.size - length))] if ids.size > length else [])


def _mlm_line(b: _Builder, a: Anatomy) -> list[Segment]:
    m = a.mlm
    out: list[Segment] = []
    for position, token in enumerate(int(t) for t in m["input_ids"]):
        kind = next((k for k in ("masked", "random", "kept") if m[k][position]), None)
        if kind is None:
            out += b.kinds(np.array([token]), "text")
        else:
            out.append(Segment("mask" if kind == "masked" else kind, [token], original=[int(m["labels"][position])]))
    return _merge(out)


def _bart_lines(b: _Builder, a: Anatomy, noise: BartNoise) -> list[tuple[str, list[Segment]]]:
    """inputs and targets with sentence markers, the hidden tokens of the targets, and the
    restored inputs (see the module docstring)."""
    inputs, targets, permuted = a.inputs, a.targets, noise.permuted
    sentence_at = noise.sentence_of[permuted]  # the sentence of each permuted position
    starts = [p for p in range(1, permuted.size - 1) if p == 1 or sentence_at[p] != sentence_at[p - 1]]

    def marker(p: int) -> tuple[str, str]:
        return "sentence", f"#{sentence_at[p] + 1}"

    input_cuts: dict[int, tuple[str, str]] = {}
    restored: list[Segment] = []
    hidden: set[int] = set()
    for edit in noise.edits:
        (i0, i1), (p0, p1) = edit.inputs, edit.source
        for p in starts:
            if p0 <= p < p1:  # inside a gap: the marker goes before the noise that hides the start
                input_cuts.setdefault(i0 + (p - p0) if edit.kind == "keep" else i0, marker(p))
        if edit.kind == "keep":
            restored += b.kinds(inputs[i0:i1], "text")
            continue
        source, shown = targets[permuted[p0:p1]].tolist(), inputs[i0:i1].tolist()
        hidden.update(permuted[p0:p1].tolist())
        if edit.kind == "delete":
            restored.append(Segment("deleted", [], original=source))
        elif not source:
            restored.append(Segment("insert", shown))
        else:
            restored.append(Segment(edit.kind, shown, original=source))
    sentence_of = noise.sentence_of
    target_cuts = {t: ("sentence", f"#{sentence_of[t] + 1}") for t in range(1, targets.size - 1)
                   if t == 1 or sentence_of[t] != sentence_of[t - 1]}
    return [("inputs", _with_markers(b.kinds(inputs, "text"), input_cuts)),
            ("targets", _with_markers(b.kinds(targets, "text", hidden=hidden), target_cuts)),
            ("restored", _with_markers(restored, {p: marker(p) for p in starts}))]


def _bart_facts(noise: BartNoise | None) -> list[str]:
    if noise is None:
        return ["noise=not recovered"]
    moved = noise.order != sorted(noise.order)
    order = " ".join(f"#{k + 1}" for k in noise.order) if moved else "unchanged"
    return [f"sentences={noise.sentences}", f"order={order}"]


def render_example(located: Located, a: Anatomy, view: ObjectiveView, *, seed: int = 0,
                   decoder: Any = None) -> RenderedExample:
    """The lines that show one example (see the module docstring).

    Args:
        seed: the dataset's seed (BART's sentence permutation is replayed from it).
        decoder: a :class:`~loaders.inspection.decode.RunDecoder` of the dataset's tokenizer;
            BART's noise is recovered only with one.
    """
    b, example = _Builder(view), located.example
    facts = [f"split={located.split}", f"shard={located.shard}", f"row={located.row}"]
    if a.denoiser:
        facts.append(f"denoiser={a.denoiser}")
    facts += [f"{column}={length}" for column, length in a.lengths.items()]
    if a.span_lengths is not None and a.kind == "span":
        facts.append(f"spans={a.span_lengths.size}")
    if a.prefix_length is not None:
        facts.append(f"prefix_length={a.prefix_length}")
    if a.doc_lengths is not None and a.doc_lengths.size > 1:
        facts.append(f"documents={a.doc_lengths.size}")
    if a.padding:
        facts.append(f"padding={a.padding}")
    lines: list[tuple[str, list[Segment]]] = []
    if a.doc_lengths is not None and not view.decoder_layout:  # rows of document segments
        lines.append(("input_ids", _decoder_line(b, a, np.asarray(example["input_ids"]))))
    elif a.kind == "mlm":
        lines.append(("input_ids", _mlm_line(b, a)))
    elif a.kind == "bart" and a.inputs is not None:
        noise = None
        if decoder is not None and not a.issues:
            noise = recover_bart_noise(a.inputs, a.targets, a.key, seed, view.objective.config, view.special, decoder)
        facts += _bart_facts(noise)
        lines += _bart_lines(b, a, noise) if noise else [("inputs", b.kinds(a.inputs, "text")),
                                                         ("targets", b.kinds(a.targets, "text"))]
    elif a.inputs is not None:
        inputs, targets = a.inputs, a.targets
        if a.kind == "prefix":
            body = b.kinds(inputs[: a.offset], "text") + b.kinds(inputs[a.offset :], "prefix")
            lines += [("inputs", body), ("targets", b.kinds(targets, "text"))]
            restored = b.kinds(inputs[a.offset : -1], "prefix") + [Segment("boundary", [], label="prefix")]
            lines.append(("restored", restored + b.kinds(targets[:-1], "text")))
        else:
            lines += [("inputs", b.kinds(inputs, "text")),
                      ("targets", b.kinds(targets, "text", b.spans_in_targets(targets)))]
            if a.kind == "span" and not a.issues:
                lines.append(("restored", b.restored(inputs[a.offset :], targets)))
    if a.issues:
        facts.append("ISSUES: " + "; ".join(a.issues))
    return RenderedExample(f"{a.key}  " + "  ".join(facts), lines)
