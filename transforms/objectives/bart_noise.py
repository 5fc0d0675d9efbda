"""BART's noise recovered from a stored example: where each sentence moved, what each
``<mask>`` hides.

The shards keep ``inputs`` and ``targets`` only (:mod:`transforms.objectives.bart`):
``targets`` is ``<s> chunk </s>``; ``inputs`` is the chunk with its sentences permuted, then
noised. Both steps are recovered without the word starts the pipeline had:

1. Sentence permutation is a pure function of the example's counter-based randoms
   (:func:`transforms.objectives.bart.sentence_permutation`, from ``(seed, example key)``).
   The chunk's sentence starts are recomputed from the text the targets spell, with the
   pipeline's own rule, per document of the chunk (EOS ends one: the context's decoder,
   ``RunDecoder.sentence_starts``, does it); the draw is then replayed.
2. ``inputs`` is a monotonic edit of the permuted chunk: a masked span becomes one
   ``<mask>`` (or a random token), a zero-length span inserts a ``<mask>``; the optional
   passes mask every token of a word, delete words or insert random tokens. Aligning the two
   (:class:`difflib.SequenceMatcher`) recovers every edit.

A recovery is accepted only when every edit is one these steps can make: a wrong replay
(a chunk that starts inside a blank line, say) leaves text out of place, which no such
edit explains. Document rotation, a tokenizer that is not byte-level, or an example that is
not framed gives None, and the example is shown without the recovery.
"""

from __future__ import annotations

import difflib
import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from transforms.objectives.bart_passes import sentence_permutation
from transforms.objectives.common import SpecialIds
from transforms.objectives.layout import example_randoms
from transforms.objectives.shown import Marks, Segment, Shown, layout_facts, with_markers

__all__ = ["BartNoise", "Edit", "bart_shown", "recover_bart_noise"]

#: Longest run of inputs tokens with a random one among them that one edit may explain
#: (neighbouring spans); sentences left out of place by a wrong replay leave longer runs.
_MAX_RANDOM_RUN = 3
#: Largest inputs x targets table the exact alignment fills (about 2 x 2048 tokens).
_MAX_CELLS = 4_500_000


@dataclass(frozen=True)
class Edit:
    """One step of the alignment of ``inputs`` with the permuted targets.

    Attributes:
        kind: ``keep`` (copied), ``mask`` (masks hiding the source run; an empty run: inserted
            masks), ``random`` (random tokens, maybe beside a ``<mask>``, in place of the
            source run of neighbouring spans, or inserted) or ``delete`` (the source run removed).
        inputs: ``(start, stop)`` in ``inputs``.
        source: ``(start, stop)`` in the permuted targets (:attr:`BartNoise.permuted`).
    """

    kind: str
    inputs: tuple[int, int]
    source: tuple[int, int]


@dataclass
class BartNoise:
    """What the noise did to one example.

    Attributes:
        permuted: per position of the permuted framed sequence, the targets position it holds.
        sentence_of: per targets position, the index of its sentence (0 for ``<s>``, the last
            for ``</s>``).
        sentences: sentences in the chunk.
        order: the sentences in the order the inputs hold them.
        edits: the alignment, in order, covering ``inputs`` and ``permuted``.
    """

    permuted: np.ndarray
    sentence_of: np.ndarray
    sentences: int
    order: list[int]
    edits: list[Edit]


def _difflib_edits(inputs: np.ndarray, permuted_ids: np.ndarray, config: Any,
                   special: SpecialIds) -> list[Edit] | None:
    """The alignment difflib finds (fast; its longest-block heuristic can miss on repetitive
    text), or None when some step is not an edit BART's noise makes."""
    matcher = difflib.SequenceMatcher(None, inputs.tolist(), permuted_ids.tolist(), autojunk=False)
    specials = set(special.special_array().tolist())
    out = []
    for tag, i0, i1, p0, p1 in matcher.get_opcodes():
        shown = inputs[i0:i1]
        if tag == "equal":
            out.append(Edit("keep", (i0, i1), (p0, p1)))
        elif any(int(t) in specials for t in permuted_ids[p0:p1]):
            return None  # noise never covers <s>, </s> or a special token inside the chunk
        elif i0 == i1:
            if not _deletes(config):
                return None
            out.append(Edit("delete", (i0, i1), (p0, p1)))
        elif (shown == special.mask).all():
            out.append(Edit("mask", (i0, i1), (p0, p1)))
        elif i1 - i0 <= _MAX_RANDOM_RUN and all(int(t) == special.mask or int(t) not in specials for t in shown):
            # neighbouring spans: one replaced by a random token, the next by a <mask> or another
            out.append(Edit("random", (i0, i1), (p0, p1)))
        else:
            return None
    return out if _plausible(out, inputs, config, special) else None


def _deletes(config: Any) -> bool:
    return config.replace_length == 0 or config.token_delete > 0


def _plausible(edits: list[Edit], inputs: np.ndarray, config: Any, special: SpecialIds) -> bool:
    """Few enough random tokens for the configuration: text left out of place by a wrong
    replay needs many (each input token that matches nothing is one)."""
    randoms = sum(int((inputs[e.inputs[0]:e.inputs[1]] != special.mask).sum()) for e in edits if e.kind == "random")
    noise = sum(e.inputs[1] - e.inputs[0] for e in edits if e.kind in ("mask", "random"))
    inserted = math.ceil(inputs.size * config.insert)
    return randoms <= 2 + 2 * math.ceil(config.mask_random * noise) + inserted


def _exact_edits(inputs: np.ndarray, source: np.ndarray, config: Any, special: SpecialIds) -> list[Edit] | None:
    """The cheapest monotonic alignment by dynamic programming: every ``<mask>`` stands for a
    run of zero or more non-special source tokens, a random token for one at a cost of 1,
    any other input token must equal its source token; deletions (only where the
    configuration deletes) cost 1 per token. None when none is plausible or it is too large."""
    n, m = inputs.size, source.size
    if n * m > _MAX_CELLS:
        return None
    specials = special.special_array()
    barrier = np.isin(source, specials)
    random_ok = ~np.isin(inputs, specials)
    # q may start a wildcard run ending at p only if source[q:p] holds no special token
    run_start = np.zeros(m + 1, dtype=np.int64)
    last = 0
    for p in range(1, m + 1):
        if barrier[p - 1]:
            last = p
        run_start[p] = last
    segments = np.flatnonzero(np.diff(run_start, prepend=-1))  # where a new run_start begins
    big = np.int64(1 << 40)
    cost = np.full((n + 1, m + 1), big, dtype=np.int64)
    cost[0, 0] = 0
    deletes = _deletes(config)
    for i in range(1, n + 1):
        prev, row, token = cost[i - 1], cost[i], int(inputs[i - 1])
        match = np.flatnonzero(source == token) + 1
        row[match] = prev[match - 1]
        if token == special.mask or random_ok[i - 1]:
            step = 0 if token == special.mask else 1
            wild = np.empty(m + 1, dtype=np.int64)
            for a, b in zip(segments, [*segments[1:], m + 1]):
                wild[a:b] = np.minimum.accumulate(prev[a:b])
            np.minimum(row, wild + step, out=row)
        if deletes:
            for p in range(1, m + 1):
                if not barrier[p - 1] and row[p - 1] + 1 < row[p]:
                    row[p] = row[p - 1] + 1
    if cost[n, m] >= big:
        return None
    steps: list[Edit] = []  # backwards
    i, p = n, m
    while i or p:
        token = int(inputs[i - 1]) if i else None
        if i and p and source[p - 1] == token and cost[i - 1, p - 1] == cost[i, p]:
            steps.append(Edit("keep", (i - 1, i), (p - 1, p)))
            i, p = i - 1, p - 1
            continue
        if i and (token == special.mask or random_ok[i - 1]):
            step = 0 if token == special.mask else 1
            q = next((q for q in range(p, int(run_start[p]) - 1, -1) if cost[i - 1, q] + step == cost[i, p]), None)
            if q is not None:
                steps.append(Edit("mask" if token == special.mask else "random", (i - 1, i), (q, p)))
                i, p = i - 1, q
                continue
        steps.append(Edit("delete", (i, i), (p - 1, p)))  # the only way left: deletions reached (i, p)
        p -= 1
    return _merged(steps[::-1])


def _merged(edits: list[Edit]) -> list[Edit]:
    """Neighbouring steps of one kind joined (noise steps of any kind into one: a <mask> and a
    random token side by side), source ranges made contiguous."""
    out: list[Edit] = []
    for edit in edits:
        noise = edit.kind != "keep"
        if out and (out[-1].kind == edit.kind or (noise and out[-1].kind != "keep")):
            last = out[-1]
            kind = last.kind if last.kind == edit.kind else "random"
            out[-1] = Edit(kind, (last.inputs[0], edit.inputs[1]), (last.source[0], edit.source[1]))
        else:
            out.append(edit)
    return out


def recover_bart_noise(inputs: np.ndarray, targets: np.ndarray, key: str, seed: int, config: Any,
                       special: SpecialIds, decoder: Any) -> BartNoise | None:
    """Recover the sentence moves and masks of one BART example (see the module docstring)."""
    inputs, targets = np.asarray(inputs), np.asarray(targets)
    if config.rotate > 0 or targets.size < 2 or inputs.size < 2 or targets[0] != special.bos \
            or targets[-1] != special.eos or inputs[0] != special.bos or inputs[-1] != special.eos:
        return None
    chunk = targets[1:-1]
    candidates = [np.zeros(chunk.size, dtype=bool)]
    if config.permute_sentences > 0:
        candidates = decoder.sentence_starts(chunk, special.eos)
        if candidates is None:
            return None
    for flags in candidates:
        index = sentence_permutation(chunk.size, flags, config.permute_sentences, example_randoms(seed, [key]))
        interior = np.arange(chunk.size) if index is None else np.asarray(index)
        permuted = np.concatenate([[0], interior + 1, [targets.size - 1]])
        ids = targets[permuted]
        edits = _difflib_edits(inputs, ids, config, special) or _exact_edits(inputs, ids, config, special)
        if edits is not None and not _plausible(edits, inputs, config, special):
            edits = None
        if edits is None:
            continue
        starts = flags.copy()
        if starts.size:
            starts[0] = True
        sentence_of = np.concatenate([[0], np.cumsum(starts) - 1, [max(int(starts.sum()) - 1, 0)]])
        order = list(dict.fromkeys(int(s) for s in sentence_of[permuted[1:-1]]))
        return BartNoise(permuted=permuted, sentence_of=sentence_of, sentences=int(starts.sum()), order=order,
                         edits=edits)
    return None


def _bart_lines(marks: Marks, a: Any, noise: BartNoise) -> list[tuple[str, list[Segment]]]:
    """inputs and targets with sentence markers, the hidden tokens of the targets, and the
    restored inputs (see :func:`bart_shown`)."""
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
            restored += marks.kinds(inputs[i0:i1], "text")
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
    return [("inputs", with_markers(marks.kinds(inputs, "text"), input_cuts)),
            ("targets", with_markers(marks.kinds(targets, "text", hidden=hidden), target_cuts)),
            ("restored", with_markers(restored, {p: marker(p) for p in starts}))]


def _bart_facts(noise: BartNoise | None) -> list[str]:
    if noise is None:
        return ["noise=not recovered"]
    moved = noise.order != sorted(noise.order)
    order = " ".join(f"#{k + 1}" for k in noise.order) if moved else "unchanged"
    return [f"sentences={noise.sentences}", f"order={order}"]


def bart_shown(ctx: Any, config: Any) -> Shown:
    """How ``show`` prints a BART example (``ctx``: an ``InspectionContext``; ``config`` its
    objective's): ``inputs`` and ``targets`` with ``[#k]`` where original sentence ``k`` starts,
    and the ``restored`` inputs in which every ``<mask>`` shows what it hides (the tokens the
    model must restore are ``hidden`` in the targets). The noise is recovered only with the
    dataset's tokenizer (``ctx.decoder``) and a sound example; else both are shown as they are."""
    a, marks = ctx.anatomy, Marks(ctx.special)
    noise = None
    if ctx.decoder is not None and not a.issues:
        noise = recover_bart_noise(a.inputs, a.targets, a.key, ctx.seed, config, ctx.special, ctx.decoder)
    facts = layout_facts(a) + _bart_facts(noise)
    if noise is None:
        return Shown(facts, [("inputs", marks.kinds(a.inputs, "text")), ("targets", marks.kinds(a.targets, "text"))])
    return Shown(facts, _bart_lines(marks, a, noise))
