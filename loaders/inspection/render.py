"""Examples decoded with their corruption made visible, for ``lmshards show`` and the report.

An example becomes a few named lines (``input_ids``; or ``inputs``, ``targets`` and the
``restored`` chunk with every noise span back in place) of :class:`Segment` runs. The
same segments print as plain text (markers a pipe or ``grep`` can read), as ANSI colour on
a terminal, or as HTML:

- ``[MASK:orig]``, ``[RAND:shown->orig]``, ``[KEEP:orig]``: MLM's selected tokens;
- ``<extra_id_k>``: sentinels (each span in its sentinel's colour; ``[<extra_id_k>: span]``
  in the restored chunk);
- ``[/prefix]``: the prefix/suffix boundary; ``[/doc]``: a document boundary;
- ``[R]``, ``[S]``, ``[X]``: the UL2 mode token; ``<pad>*N``: padding;
- control characters are escaped (``\\n``), so one sequence is one line.

With ``ids=True`` segments show token ids instead of text.
"""

from __future__ import annotations

import html
from dataclasses import dataclass
from typing import Any

import numpy as np

from loaders.inspection.anatomy import Anatomy, ObjectiveView
from loaders.inspection.source import Located

__all__ = ["RenderedExample", "Segment", "render_example", "to_html", "to_text"]

_PALETTE = ("33", "35", "36", "32", "34", "31")
_HTML_PALETTE = ("#b58900", "#d33682", "#2aa198", "#859900", "#268bd2", "#dc322f")
_ANSI = {"mask": "1;37;41", "random": "30;43", "kept": "4;32", "prefix": "36", "mode": "1;37;44",
         "special": "2", "pad": "2", "boundary": "1;35"}


@dataclass
class Segment:
    """A run of tokens shown one way.

    Attributes:
        kind: ``text``, ``prefix``, ``special``, ``pad``, ``mode``, ``mask``, ``random``,
            ``kept``, ``sentinel``, ``span`` or ``boundary`` (no tokens).
        ids: the token ids shown.
        original: ids the model must predict, where they differ (MLM).
        group: sentinel index of a sentinel or span.
        label: boundary name or span sentinel.
    """

    kind: str
    ids: list[int]
    original: list[int] | None = None
    group: int = 0
    label: str = ""


@dataclass
class RenderedExample:
    """A header and named lines of segments."""

    header: str
    lines: list[tuple[str, list[Segment]]]


def _escape(text: str) -> str:
    return "".join(c if c.isprintable() or c == " " else repr(c)[1:-1] for c in text)


class _Builder:
    def __init__(self, view: ObjectiveView):
        self.view = view
        self.special = set(int(i) for i in view.special.special_array())
        self.sentinels = view.sentinel_index
        self.modes = view.mode_names
        self.pad = view.special.pad
        self.mask = view.special.mask

    def kinds(self, ids: np.ndarray, base: str, span_of: dict[int, int] | None = None) -> list[Segment]:
        """Segments of a plain sequence: specials, sentinels and mode tokens broken out."""
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
            else:
                kind, group = (("span", span_of[position]) if span_of and position in span_of else (base, 0))
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


def _with_boundaries(segments: list[Segment], cuts: dict[int, str]) -> list[Segment]:
    """Insert boundary segments before the token positions in ``cuts``."""
    out, position = [], 0
    for segment in segments:
        start = 0
        for offset in range(len(segment.ids)):
            if position + offset in cuts and position + offset > 0:
                if offset > start:
                    out.append(Segment(segment.kind, segment.ids[start:offset], group=segment.group))
                out.append(Segment("boundary", [], label=cuts[position + offset]))
                start = offset
        out.append(Segment(segment.kind, segment.ids[start:], group=segment.group, label=segment.label))
        position += len(segment.ids)
    return out


def _decoder_line(b: _Builder, a: Anatomy, ids: np.ndarray) -> list[Segment]:
    length = int(a.doc_lengths.sum()) if a.doc_lengths is not None else ids.size
    prefix = a.prefix_length if a.kind == "prefix_lm" else 0
    segments = b.kinds(ids[:prefix], "prefix") + b.kinds(ids[prefix:length], "text")
    cuts = {int(c): "doc" for c in np.cumsum(a.doc_lengths)[:-1]} if a.doc_lengths is not None else {}
    if prefix:
        cuts[prefix] = "prefix"
    segments = _with_boundaries(segments, cuts)
    return segments + ([Segment("pad", [b.pad] * (ids.size - length))] if ids.size > length else [])


def _merge(segments: list[Segment]) -> list[Segment]:
    """Join neighbouring segments of the same kind and group (single tokens stay apart where they mean one thing)."""
    out: list[Segment] = []
    for segment in segments:
        last = out[-1] if out else None
        if last and last.kind == segment.kind and last.group == segment.group and not segment.label \
                and segment.kind not in ("sentinel", "special", "mode", "boundary"):
            last.ids += segment.ids
            if last.original is not None:
                last.original += segment.original or []
        else:
            out.append(segment)
    return out


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


def render_example(located: Located, a: Anatomy, view: ObjectiveView) -> RenderedExample:
    """The lines that show one example (see the module docstring)."""
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
    if a.kind in ("clm", "prefix_lm"):
        lines.append(("input_ids", _decoder_line(b, a, np.asarray(example["input_ids"]))))
    elif a.kind == "mlm":
        lines.append(("input_ids", _mlm_line(b, a)))
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


def _segment_text(segment: Segment, tokenizer: Any, ids: bool) -> str:
    def show(tokens: list[int]) -> str:
        if ids:
            return " ".join(str(t) for t in tokens)
        return _escape(tokenizer.decode(tokens, skip_special_tokens=False))

    kind = segment.kind
    if kind == "boundary":
        return f"[/{segment.label}]"
    if kind == "pad":
        return f"{show(segment.ids[:1]).strip()}*{len(segment.ids)}"
    if kind == "mask":
        return f"[MASK:{show(segment.original)}]" if segment.original is not None else show(segment.ids)
    if kind == "random":
        return f"[RAND:{show(segment.ids)}->{show(segment.original)}]"
    if kind == "kept":
        return f"[KEEP:{show(segment.original)}]"
    if kind == "span" and segment.label:
        return f"[{segment.label}:{show(segment.ids)}]"
    return show(segment.ids)


def _ansi(segment: Segment) -> str | None:
    if segment.kind in ("sentinel", "span"):
        return ("1;" if segment.kind == "sentinel" else "") + _PALETTE[segment.group % len(_PALETTE)]
    return _ANSI.get(segment.kind)


def to_text(rendered: RenderedExample, tokenizer: Any, *, color: bool = False, ids: bool = False) -> str:
    """Plain or ANSI-coloured text; with ``ids``, an id line follows each text line."""
    bold = "\x1b[1m" if color else ""
    reset = "\x1b[0m" if color else ""
    out = [f"{bold}── {rendered.header}{reset}"]
    width = max((len(name) for name, _ in rendered.lines), default=0)
    for name, segments in rendered.lines:
        for show_ids in (False, True) if ids else (False,):
            parts = []
            for segment in segments:
                text = _segment_text(segment, tokenizer, show_ids)
                code = _ansi(segment) if color else None
                parts.append(f"\x1b[{code}m{text}\x1b[0m" if code else text)
            label = name if not show_ids else "ids"
            out.append(f"{label:>{width}}: " + (" " if show_ids else "").join(parts))
    return "\n".join(out) + "\n"


def to_html(rendered: RenderedExample, tokenizer: Any) -> str:
    """An HTML fragment (``<div class="example">``) with the segments as styled ``<span>``s."""
    rows = []
    for name, segments in rendered.lines:
        parts = []
        for segment in segments:
            text = html.escape(_segment_text(segment, tokenizer, False))
            style = ""
            if segment.kind in ("sentinel", "span"):
                style = f' style="color:{_HTML_PALETTE[segment.group % len(_HTML_PALETTE)]}"'
            parts.append(f'<span class="seg {segment.kind}"{style}>{text}</span>')
        rows.append(f'<div class="line"><span class="name">{html.escape(name)}</span>{"".join(parts)}</div>')
    return f'<div class="example"><div class="header">{html.escape(rendered.header)}</div>{"".join(rows)}</div>'
