"""An example as named lines of :class:`Segment` runs, its noise made explicit: the pieces an
objective's :meth:`~transforms.objectives.base.Objective.example_lines` hook builds what
``lmshards show`` and the report print from (``loaders.inspection.render`` turns segments into
plain text, ANSI colour or HTML; it knows the segment kinds below, never an objective).

- :class:`Marks` breaks a token sequence into segments: special tokens, sentinels (each in its
  sentinel's colour), the objective's own tokens (``mode``), ``<mask>`` tokens, padding, and
  the rest as ``text`` (or another base kind, ``prefix`` say); :meth:`Marks.restored` puts the
  sentinel spans of ``targets`` back in place in ``inputs``.
- :func:`with_markers` inserts boundaries between tokens (``[/doc]``, ``[/prefix]``, ``[#k]``).
- :func:`row_line` is a decoder row of document segments with their prefixes and padding;
  :func:`layout_facts` the header facts every example has (lengths, prefix, documents, padding);
  :func:`family_shown` what an objective without a hook of its own shows.

Plain records and numpy only, like every hook (no loader import).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy as np

from transforms.objectives.common import SpecialIds

__all__ = ["MARKERS", "Marks", "Segment", "Shown", "family_shown", "layout_facts", "merge", "row_line",
           "with_markers"]

#: Kinds without tokens of their own: markers between tokens.
MARKERS = frozenset({"boundary", "sentence"})


@dataclass
class Segment:
    """A run of tokens shown one way.

    Attributes:
        kind: ``text``, ``prefix``, ``special``, ``pad``, ``mode`` (a token of the objective's
            own), ``mask``, ``random``, ``kept``, ``sentinel``, ``span``, ``hidden`` (targets
            tokens the noise hid), ``insert`` (inserted noise), ``deleted`` (no ids:
            ``original`` was removed), or a marker: ``boundary`` or ``sentence`` (no tokens).
        ids: the token ids shown.
        original: ids the model must predict where they differ from ``ids`` (selected tokens;
            what a ``<mask>`` or random token hides, or what was deleted).
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


class Shown(NamedTuple):
    """What :meth:`~transforms.objectives.base.Objective.example_lines` gives: the header's
    facts after the example's place (``name=value`` strings, :func:`layout_facts` and the
    objective's own) and the named lines of segments."""

    facts: list[str]
    lines: list[tuple[str, list[Segment]]]


class Marks:
    """How the tokens of one dataset are shown (its special ids, sentinels and own tokens)."""

    def __init__(self, special: SpecialIds):
        self.special = set(int(i) for i in special.special_array())
        self.sentinels = {int(t): k for k, t in enumerate(special.sentinels)}
        self.modes = {int(i): t for t, i in special.mode_tokens.items()}
        self.pad = special.pad
        self.mask = special.mask

    def kinds(self, ids: np.ndarray, base: str, span_of: dict[int, int] | None = None,
              hidden: set[int] | None = None) -> list[Segment]:
        """Segments of a plain sequence: specials, sentinels and own tokens broken out; the
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
        return merge(out)

    def spans_in_targets(self, targets: np.ndarray) -> dict[int, int]:
        """Position -> sentinel index of every token that follows a sentinel in ``targets``."""
        span_of, current = {}, -1
        for position, token in enumerate(int(t) for t in targets):
            if token in self.sentinels:
                current = self.sentinels[token]
            elif current >= 0:
                span_of[position] = current
        return span_of

    def restored(self, inputs: np.ndarray, targets: np.ndarray) -> list[Segment]:
        """``inputs`` with each sentinel replaced by its span of ``targets`` (which end with EOS)."""
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


def with_markers(segments: list[Segment], cuts: dict[int, tuple[str, str]]) -> list[Segment]:
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


def merge(segments: list[Segment]) -> list[Segment]:
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


def row_line(marks: Marks, a: Any, ids: np.ndarray) -> list[Segment]:
    """A decoder row (``a``: its ``Anatomy``): its document segments with ``[/doc]`` between
    them, each one's prefix (``prefix_lengths``; one ``prefix_length`` over the whole row; none)
    shown as ``prefix`` up to a ``[/prefix]`` boundary, and its padding."""
    length = int(a.doc_lengths.sum()) if a.doc_lengths is not None else ids.size
    docs = a.doc_lengths.tolist() if a.doc_lengths is not None else [length]
    if a.prefix_lengths is not None and len(a.prefix_lengths) == len(docs):
        prefixes = a.prefix_lengths.tolist()
    elif a.prefix_length is not None:  # one prefix over the whole row
        docs, prefixes = [length], [a.prefix_length]
    else:
        prefixes = [0] * len(docs)
    segments: list[Segment] = []
    cuts = {int(c): ("boundary", "doc") for c in np.cumsum(a.doc_lengths)[:-1]} if a.doc_lengths is not None else {}
    start = 0
    for d, p in zip(docs, prefixes, strict=True):  # each document segment: its prefix, then its suffix
        segments += marks.kinds(ids[start : start + p], "prefix") + marks.kinds(ids[start + p : start + d], "text")
        if 0 < p < d:
            cuts[start + p] = ("boundary", "prefix")
        start += d
    segments = with_markers(segments, cuts)
    return segments + ([Segment("pad", [marks.pad] * (ids.size - length))] if ids.size > length else [])


def layout_facts(a: Any, after_lengths: Iterable[str] = ()) -> list[str]:
    """The header facts of an example taken apart (``a``): the length of each token column, then
    ``after_lengths`` (an objective's own counts), the prefix, documents and padding."""
    facts = [f"{column}={length}" for column, length in a.lengths.items()]
    facts += list(after_lengths)
    if a.prefix_length is not None:
        facts.append(f"prefix_length={a.prefix_length}")
    if a.doc_lengths is not None and a.doc_lengths.size > 1:
        facts.append(f"documents={a.doc_lengths.size}")
    if a.padding:
        facts.append(f"padding={a.padding}")
    return facts


def family_shown(ctx: Any) -> Shown:
    """What an example shows by its family alone (``ctx``: an ``InspectionContext``): seq2seq
    ``inputs`` and ``targets``, sentinel spans coloured; a decoder row with its documents and
    prefixes; an encoder's ``input_ids``."""
    a, marks = ctx.anatomy, Marks(ctx.special)
    lines: list[tuple[str, list[Segment]]] = []
    if a.inputs is not None:  # seq2seq columns, or one seq2seq example in a decoder row
        lines += [("inputs", marks.kinds(a.inputs, "text")),
                  ("targets", marks.kinds(a.targets, "text", marks.spans_in_targets(a.targets)))]
    elif a.doc_lengths is not None:
        lines.append(("input_ids", row_line(marks, a, np.asarray(ctx.example["input_ids"]))))
    elif "input_ids" in a.lengths:  # an encoder row (none of a row whose columns are broken)
        lines.append(("input_ids", marks.kinds(np.asarray(ctx.example["input_ids"])[: a.lengths["input_ids"]],
                                               "text")))
    return Shown(layout_facts(a), lines)
