"""How span and prefix examples are inspected, shared by span corruption
(:mod:`transforms.objectives.span_corruption`) and UL2 (:mod:`transforms.objectives.ul2`):
the pieces of their inspection hooks (docs/design.md section 4).

Two layouts, after ``lead`` tokens of the objective's own that start the inputs (UL2's mode
token):

- ``span`` (T5 sentinels): ``inputs = c0 <X0> c1 <X1> ... </s>``, ``targets = <X0> n0 <X1> n1
  ... </s>``: the noise span lengths, and the chunk restored by interleaving them;
- ``prefix`` (UL2's S denoiser): ``inputs = prefix </s>``, ``targets = suffix </s>``; the suffix
  counts as one span.

Measured span lengths are compared with what the configured objective would give on the same
chunks: T5's ``random_spans_noise_mask`` splits ``N`` noise tokens into ``m`` spans as a
uniformly random composition, so one span has ``k`` tokens with probability
``C(N-k-1, m-2) / C(N-1, m-1)``; the expected histogram is that law summed over the
``(N, m)`` of every measured example (:func:`expected_span_lengths`).
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass
from typing import Any

import numpy as np

from transforms.objectives.base import build_example
from transforms.objectives.common import SpecialIds
from transforms.objectives.counters import SPAN_LENGTH_HISTOGRAM_CAP
from transforms.objectives.layout import example_randoms
from transforms.objectives.lines import Chart, ChartSeries, number
from transforms.objectives.shown import Marks, Segment, Shown, layout_facts
from transforms.objectives.spans import noise_counts
from transforms.objectives.summary import ratio

__all__ = [
    "NoiseStats",
    "SpanNoise",
    "SpanParts",
    "composition_pmf",
    "count_noise",
    "expected_span_lengths",
    "noise_counters",
    "noise_line",
    "noise_stats",
    "replay_problems",
    "restored_chunk",
    "span_length_chart",
    "span_problems",
    "span_shown",
    "take_apart_noise",
]


@dataclass
class SpanParts:
    """The noise of one span or prefix example (``Anatomy.parts``).

    Attributes:
        kind: ``span`` or ``prefix`` (see the module docstring).
        lead: the objective's own tokens that start the inputs (UL2's mode token: 1).
        denoiser: the example's denoiser (UL2), else None.
        span_lengths: noise span lengths; a prefix example's suffix length.
        noise_tokens: noise tokens (a prefix example: its suffix).
    """

    kind: str
    lead: int = 0
    denoiser: str | None = None
    span_lengths: np.ndarray | None = None
    noise_tokens: int = 0


def _sentinel_order(ids: np.ndarray, special: SpecialIds, where: str, issues: list[str]) -> np.ndarray:
    """Positions of sentinels in ``ids``; an issue unless they are ``<extra_id_0>``, 1, 2... in order."""
    positions = np.flatnonzero(np.isin(ids, special.sentinel_array()))
    index = special.sentinel_index()
    order = [index[int(t)] for t in ids[positions]]
    if order != list(range(len(order))):
        shown = ", ".join(f"<extra_id_{k}>" for k in order[:8]) + (" ..." if len(order) > 8 else "")
        issues.append(f"{where}: sentinels out of order ({shown}); expected <extra_id_0>, <extra_id_1>, ...")
    return positions


def take_apart_noise(a: Any, special: SpecialIds, kind: str, lead: int = 0, denoiser: str | None = None) -> SpanParts:
    """The :class:`SpanParts` of a span or prefix example taken apart by its family (``a``, an
    ``Anatomy`` with ``inputs`` and ``targets``), its ``raw_tokens`` set and its structural
    faults appended to ``a.issues``."""
    eos, issues = special.eos, a.issues
    parts = SpanParts(kind, lead, denoiser)
    if kind != "span":
        if a.inputs.size < lead + 1 or a.inputs[-1] != eos:
            issues.append("inputs do not end with EOS")
        if a.targets.size == 0 or a.targets[-1] != eos:
            issues.append("targets do not end with EOS")
        parts.noise_tokens = max(a.targets.size - 1, 0)
        parts.span_lengths = np.array([parts.noise_tokens])
        a.raw_tokens = max(a.inputs.size - lead - 1, 0) + parts.noise_tokens
        return parts
    body, targets = a.inputs[lead:], a.targets
    if body.size == 0 or body[-1] != eos:
        issues.append("inputs do not end with EOS")
    if targets.size == 0 or targets[-1] != eos:
        issues.append("targets do not end with EOS")
    in_pos = _sentinel_order(body, special, "inputs", issues)
    out_pos = _sentinel_order(targets, special, "targets", issues)
    if in_pos.size != out_pos.size:
        issues.append(f"inputs hold {in_pos.size} sentinels but targets {out_pos.size}")
    if out_pos.size and out_pos[0] != 0:
        issues.append("targets do not start with a sentinel")
    lengths = np.diff(np.append(out_pos, max(targets.size - 1, 0))) - 1
    if (lengths < 1).any():
        issues.append("targets hold an empty noise span (two sentinels, or a sentinel and EOS, side by side)")
    parts.span_lengths = np.maximum(lengths, 0)
    parts.noise_tokens = int(max(targets.size - 1 - out_pos.size, 0))
    a.raw_tokens = int(max(body.size - 1 - in_pos.size, 0)) + parts.noise_tokens
    return parts


def restored_chunk(a: Any, special: SpecialIds) -> np.ndarray | None:
    """The raw chunk rebuilt from a span or prefix example taken apart (``a``; None for a broken
    one), with the sentinels of ``special``."""
    parts = a.parts
    if a.issues or a.inputs is None or not isinstance(parts, SpanParts):
        return None
    body, targets = a.inputs[parts.lead : -1], a.targets[:-1]
    if parts.kind != "span":
        return np.concatenate([body, targets]).astype(np.int32)
    sentinel_ids = special.sentinel_array()
    pieces = np.split(targets, np.flatnonzero(np.isin(targets, sentinel_ids)))[1:]
    out, start = [], 0
    for position in np.flatnonzero(np.isin(body, sentinel_ids)):
        out += [body[start:position], pieces[special.sentinels.index(int(body[position]))][1:]]
        start = position + 1
    out.append(body[start:])
    return np.concatenate(out).astype(np.int32) if out else np.zeros(0, np.int32)


def composition_pmf(total: int, parts: int, length: int) -> float:
    """Probability that one part of a uniform random composition of ``total`` into ``parts`` has ``length``."""
    if parts < 1 or not 1 <= length <= total - parts + 1:
        return 0.0
    if parts == 1:
        return 1.0 if length == total else 0.0
    return math.comb(total - length - 1, parts - 2) / math.comb(total - 1, parts - 1)


def expected_span_lengths(compositions: Counter) -> dict[int, float]:
    """Expected span-length histogram for examples with ``(noise tokens, spans)`` counted in ``compositions``."""
    out: dict[int, float] = {}
    for (total, parts), count in compositions.items():
        for length in range(1, total - parts + 2):
            out[length] = out.get(length, 0.0) + count * parts * composition_pmf(total, parts, length)
    return dict(sorted(out.items()))


class SpanNoise:
    """Noise tokens, spans and span lengths of one group of examples."""

    def __init__(self) -> None:
        self.counts: Counter = Counter()
        self.span_lengths: Counter = Counter()
        self.compositions: Counter = Counter()

    def add(self, a: Any) -> None:
        """Count one example taken apart (``a``, its parts a :class:`SpanParts`)."""
        parts = a.parts
        self.counts.update(examples=1, raw_tokens=a.raw_tokens, noise_tokens=parts.noise_tokens,
                           inputs_tokens=a.lengths.get("inputs", 0), targets_tokens=a.lengths.get("targets", 0))
        if parts.span_lengths is not None:
            self.counts["spans"] += int(parts.span_lengths.size)  # a prefix example's suffix counts as one span
        if parts.kind == "span" and parts.span_lengths is not None:
            self.span_lengths.update(int(k) for k in parts.span_lengths)
            self.compositions[(parts.noise_tokens, int(parts.span_lengths.size))] += 1

    def summary(self, density: float | None, mean: float | None, expected: bool) -> dict[str, Any]:
        """Measured density and span lengths beside the configured ones (and T5's law when ``expected``)."""
        c = self.counts
        out = {
            "examples": c["examples"], "raw_tokens": c["raw_tokens"], "noise_tokens": c["noise_tokens"],
            "spans": c["spans"], "density": ratio(c["noise_tokens"], c["raw_tokens"]),
            "mean_span_length": ratio(c["noise_tokens"], c["spans"]),
            "configured_density": density, "configured_mean_span_length": mean,
            "span_lengths": {str(k): n for k, n in sorted(self.span_lengths.items())},
        }
        if expected:
            expected_lengths = expected_span_lengths(self.compositions)
            out["expected_span_lengths"] = {str(k): round(v, 3) for k, v in expected_lengths.items()}
        return out


class NoiseStats:
    """The noise of a split's span and prefix examples: all of them, and per denoiser."""

    def __init__(self) -> None:
        self.overall = SpanNoise()
        self.denoisers: dict[str, SpanNoise] = {}

    def add(self, a: Any) -> None:
        """Count one example, overall and under its denoiser (if any)."""
        self.overall.add(a)
        if a.parts.denoiser is not None:
            self.denoisers.setdefault(a.parts.denoiser, SpanNoise()).add(a)

    def of(self, denoiser: str) -> SpanNoise:
        """The noise of one denoiser's examples (empty if none was seen)."""
        return self.denoisers.get(denoiser, SpanNoise())


def noise_stats(stats: Any) -> NoiseStats:
    """The :class:`NoiseStats` record of a split's statistics (``SplitStats``)."""
    return stats.record("noise", NoiseStats)


def count_noise(ctx: Any) -> None:
    """Count ``ctx.anatomy`` into the noise of the split's statistics ``ctx.stats``."""
    noise_stats(ctx.stats).add(ctx.anatomy)


def noise_counters(a: Any) -> Counter:
    """The noise counters of one stored span or prefix example taken apart (``a``) that
    ``lmshards validate`` recounts: raw, noise, inputs and targets tokens, noise spans and
    (span examples) the span length histogram; an example of a denoiser counts them under
    ``denoiser/NAME/`` too, with its examples, and the histogram there only."""
    c: Counter = Counter()
    parts = a.parts
    own = Counter(raw_tokens=a.raw_tokens, noise_tokens=parts.noise_tokens,
                  noise_spans=int(parts.span_lengths.size) if parts.kind == "span" else int(parts.noise_tokens > 0),
                  inputs_tokens=int(a.inputs.size), targets_tokens=int(a.targets.size))
    if parts.kind == "span":
        own.update(f"span_len_hist_{min(int(k), SPAN_LENGTH_HISTOGRAM_CAP)}" for k in parts.span_lengths)
    if parts.denoiser is None:
        c.update(own)
    else:
        c.update({k: v for k, v in own.items() if not k.startswith("span_len_hist_")})
        c.update({f"denoiser/{parts.denoiser}/{k}": v for k, v in (own + Counter(examples=1)).items()})
    return c


def span_problems(a: Any, density: float, mean: float, raw_limit: int) -> list[str]:
    """T5's noise and span counts of a span example taken apart (``a``) for its restored chunk
    length, which must not exceed ``raw_limit``."""
    out = []
    if a.raw_tokens > raw_limit:
        out.append(f"restored chunk has {a.raw_tokens} tokens, more than the raw length {raw_limit}")
    expected = noise_counts(a.raw_tokens, density, mean)
    actual = (a.parts.noise_tokens, int(a.parts.span_lengths.size))
    if actual != expected:
        out.append(f"{actual[0]} noise tokens in {actual[1]} spans; a {a.raw_tokens}-token chunk has "
                   f"{expected[0]} in {expected[1]} at r={density}, mu={mean}")
    return out


def replay_problems(objective: Any, ctx: Any, plan: int = 0) -> list[str]:
    """The objective run again (with ``plan``) on the chunk restored from a span or prefix
    example (``ctx.anatomy``) must give the stored ``inputs`` / ``targets`` back (noise is a
    pure function of seed, key and chunk)."""
    a, special = ctx.anatomy, ctx.special
    chunk = restored_chunk(a, special)
    if chunk is None:
        return []
    replay, counters = build_example(objective, chunk, special, example_randoms(ctx.seed, [a.key]), plan=plan)
    if "input_ids" in replay:  # one seq2seq example in a decoder row: inputs then targets
        cut = int(replay["prefix_lengths"].sum())  # one segment
        inputs = replay["input_ids"][:cut]
        targets = replay["input_ids"][cut : int(replay["doc_lengths"].sum())]
    else:  # fixed-length columns come back padded
        inputs = replay["inputs"][: counters["inputs_tokens"]]
        targets = replay["targets"][: counters["targets_tokens"]]
    if not (np.array_equal(inputs, a.inputs) and np.array_equal(targets, a.targets)):
        return ["inputs/targets differ from the objective replayed with the example's seed"]
    return []


def noise_line(noise: dict[str, Any], manifest_summary: Any) -> str:
    """``inspect``'s line of the measured noise (a :meth:`SpanNoise.summary`) beside the
    configured values and the manifest's density."""
    ms = manifest_summary or {}
    return (f"  noise density {number(noise['density'])} (configured {number(noise['configured_density'])}, "
            f"manifest {number(ms.get('noise_density'))}); spans {noise['spans']:,}, mean span length "
            f"{number(noise['mean_span_length'])} (configured {number(noise['configured_mean_span_length'])})")


def span_length_chart(title: str, measured: dict[str, int], expected: dict[str, float]) -> Any:
    """The report's chart of measured noise span lengths against T5's law (a
    :class:`~transforms.objectives.lines.Chart`), or a sentence when every span has one length."""
    single = _single(measured)
    if single is not None:
        expect = _single({k: v for k, v in expected.items() if v >= 0.5})
        return (f"{title}: all {single[1]:,} spans have {single[0]} tokens"
                + (f" (the configured law gives {expect[0]} only)" if expect else ""))
    keys = {int(k) for k, v in measured.items() if v} | {int(k) for k, v in expected.items() if v >= 0.5}
    lengths = list(range(min(keys, default=1), max(keys, default=1) + 1))
    return Chart("measured span lengths; line: expected under T5's random_spans_noise_mask",
                 title, [str(k) for k in lengths], [
                     ChartSeries("measured", [float(measured.get(str(k), 0)) for k in lengths], "measured"),
                     ChartSeries("expected (configured)", [float(expected.get(str(k), 0.0)) for k in lengths],
                                 "expected", "line"),
                 ], x_label="span length (tokens)", y_label="spans")


def _single(histogram: dict[str, Any]) -> tuple[str, int] | None:
    """``(value, count)`` when the histogram holds one value only."""
    present = [(k, int(v)) for k, v in histogram.items() if v]
    return present[0] if len(present) == 1 else None


def span_shown(ctx: Any) -> Shown:
    """How ``show`` prints a span or prefix example (``ctx.anatomy``): ``inputs``, ``targets``
    (each span in its sentinel's colour) and the ``restored`` chunk with every span back in
    place; a prefix example's prefix, suffix and their boundary. Header: the denoiser, then
    the spans after the lengths."""
    a, marks = ctx.anatomy, Marks(ctx.special)
    parts: SpanParts = a.parts
    inputs, targets, lead = a.inputs, a.targets, parts.lead
    facts = [f"denoiser={parts.denoiser}"] if parts.denoiser else []
    facts += layout_facts(a, [f"spans={parts.span_lengths.size}"] if parts.kind == "span" else [])
    if parts.kind != "span":
        body = marks.kinds(inputs[:lead], "text") + marks.kinds(inputs[lead:], "prefix")
        restored = marks.kinds(inputs[lead:-1], "prefix") + [Segment("boundary", [], label="prefix")]
        return Shown(facts, [("inputs", body), ("targets", marks.kinds(targets, "text")),
                             ("restored", restored + marks.kinds(targets[:-1], "text"))])
    lines = [("inputs", marks.kinds(inputs, "text")),
             ("targets", marks.kinds(targets, "text", marks.spans_in_targets(targets)))]
    if not a.issues:
        lines.append(("restored", marks.restored(inputs[lead:], targets)))
    return Shown(facts, lines)
