"""Masked language modelling (BERT/RoBERTa): select a fixed share of the tokens, corrupt them.

Reference semantics (see shared/reference/bart_mlm_megatron.md sections 2 and 3.4, and Google
BERT's ``create_pretraining_data.py``):

- Selection size: BERT's ``min(max_predictions_per_seq, max(1, round(len(tokens) * p)))``,
  where ``len(tokens)`` counts every token of the sequence, special ones included (BERT's
  ``[CLS]`` and ``[SEP]``; here also an EOS between packed documents) but not the padding.
  ``max_predictions`` is None by default (no cap, as HF's collators), and the count never
  exceeds the candidates. Candidates are the non-special positions
  (``special.special_flags()``: PAD, EOS, CLS, SEP, MASK, sentinels, ...), chosen uniformly
  without replacement (BERT, Megatron and T5 use exact counts; HF's
  ``DataCollatorForLanguageModeling`` draws a Bernoulli per token instead).
- Corruption of the selected positions: ``mask_ratio`` -> ``special.mask``, ``random_ratio``
  -> a uniform random *non-special* id, ``keep_ratio`` -> unchanged. ``labels`` hold the
  original id at selected positions and -100 elsewhere.
- Whole-word masking (``whole_word_mask=True``) follows HF ``DataCollatorForWholeWordMask``
  and BERT: words (the tokenizer's pre-tokenizer word starts, ``word_starts``, which split
  punctuation like BERT's basic tokenizer, for BPE, Unigram and WordPiece alike) are visited
  in a random order and taken whole while the token budget allows; a word that would
  overflow the budget is skipped and the scan goes on, so the selection can fall short of
  the budget when only long words remain. The 80/10/10 corruption is then decided per
  *token*, as in HF's legacy collator, Google BERT and Megatron.
- Framing (``frame=True``): ``[CLS] chunk [SEP]`` like the BERT template; the raw chunk is
  ``seq_len - 2`` tokens. A shorter chunk is right-padded with ``special.pad`` (label -100).
  With 512 tokens framed and one EOS inside, BERT's rule selects ``round(512 * .15) = 77``.

Deliberate differences from the references:

- Rounding is half-up on the product rounded to 9 decimals, as Python 2's ``round`` that
  BERT was first run with (Python 3's, which HF uses, rounds ties to even: at p = .15 the
  two differ for lengths 30, 70, 110, ...).
- The 80/10/10 split is exact per example, not a Bernoulli per token: the selected count
  ``k`` is cut at ``floor(k * c + u)`` for the cumulative ratios ``c`` and one ``u ~ U[0, 1)``
  (systematic randomised rounding). Each count is within 1 of ``k * ratio``, the three
  sum to ``k`` and their expectations are exactly ``k * ratio``, so ratios are unbiased
  even though every example has the same ``k`` (plain rounding would bias them, e.g.
  k=77 -> 62/8/7).
- Random replacements never produce a special or added token (HF draws from the whole
  vocabulary). A random draw may equal the original token, as in every reference.
- Whole words never span a special token: a token right after a special token starts a
  new word (as in HF's offset-based whole-word masking).

Randomness (counter-based, :mod:`transforms.objectives.randoms`): the selection is a
uniformly random ordered sample of the candidates (whole words: a random order of the words,
then of the selected tokens) from :data:`SELECT_STREAM`; its first ``n_mask`` become masks,
the next ``n_random`` random ids (:data:`IDS_STREAM`); ``u`` is the first number of
:data:`SPLIT_STREAM`.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from transforms.objectives.base import Block, Built, InspectionContext, Objective, build_example
from transforms.objectives.common import IGNORE_INDEX, SpecialIds, ids_out_of_range
from transforms.objectives.flags import flag
from transforms.objectives.layout import example_randoms
from transforms.objectives.lines import Chart, ChartSeries, number
from transforms.objectives.randoms import Randoms, first_distinct, random_ids
from transforms.objectives.shown import Marks, Segment, Shown, layout_facts, merge
from transforms.objectives.summary import ratio, summarize_mlm

__all__ = ["IDS_STREAM", "IGNORE_INDEX", "MLM", "SELECT_STREAM", "SPLIT_STREAM", "MLMConfig", "MaskedParts",
           "exact_split", "selection_budget"]
SELECT_STREAM, SPLIT_STREAM, IDS_STREAM, ORDER_STREAM = 1, 2, 3, 4


@dataclass(frozen=True)
class MLMConfig:
    """Parameters of the MLM objective.

    Attributes:
        seq_len: length of ``input_ids`` and ``labels`` (framing included).
        mlm_probability: share of the sequence's tokens selected, in (0, 1).
        mask_ratio: share of selected tokens replaced by the mask id.
        random_ratio: share of selected tokens replaced by a random non-special id.
        keep_ratio: share of selected tokens left unchanged.
        whole_word_mask: select whole words (needs the ``word_starts`` feature).
        frame: wrap the chunk as ``[CLS] chunk [SEP]``.
        max_predictions: cap on the selected tokens per example (BERT's
            ``max_predictions_per_seq``); None: no cap.
    """

    seq_len: int = flag(512, "tokens per example")
    mlm_probability: float = flag(0.15, "share of tokens selected")
    mask_ratio: float = flag(0.8, "selected tokens replaced by the mask token")
    random_ratio: float = flag(0.1, "selected tokens replaced by a random token")
    keep_ratio: float = flag(0.1, "selected tokens left unchanged")
    whole_word_mask: bool = flag(False, "select whole words (pre-tokenizer words)")
    frame: bool = flag(False, "frame each example with CLS ... SEP")
    max_predictions: int | None = flag(None, "cap on selected tokens per example",
                                       shown_default="BERT's max_predictions_per_seq; default: no cap")

    def __post_init__(self) -> None:
        min_len = 3 if self.frame else 1
        if not isinstance(self.seq_len, int) or self.seq_len < min_len:
            raise ValueError(f"seq_len must be an int >= {min_len} (frame={self.frame}), got {self.seq_len!r}")
        if not 0.0 < self.mlm_probability < 1.0:
            raise ValueError(f"mlm_probability must be in (0, 1), got {self.mlm_probability!r}")
        for name in ("mask_ratio", "random_ratio", "keep_ratio"):
            value = getattr(self, name)
            if not 0.0 <= value <= 1.0:
                raise ValueError(f"{name} must be in [0, 1], got {value!r}")
        total = self.mask_ratio + self.random_ratio + self.keep_ratio
        if abs(total - 1.0) > 1e-9:
            raise ValueError(
                f"mask_ratio + random_ratio + keep_ratio must be 1, got "
                f"{self.mask_ratio!r} + {self.random_ratio!r} + {self.keep_ratio!r} = {total!r}"
            )
        if self.max_predictions is not None and (
                not isinstance(self.max_predictions, int) or isinstance(self.max_predictions, bool)
                or self.max_predictions < 1):
            raise ValueError(f"max_predictions must be None or an int >= 1, got {self.max_predictions!r}")

    @property
    def raw_length(self) -> int:
        """Raw chunk length the packer cuts: ``seq_len`` minus the framing tokens."""
        return self.seq_len - 2 if self.frame else self.seq_len


def selection_budget(sequence_lengths: np.ndarray, candidates: np.ndarray, config: MLMConfig) -> np.ndarray:
    """Tokens to select per row: ``min(cap, max(1, length * p rounded half up))``, at most the
    candidates (0 without any), for rows of ``sequence_lengths`` tokens (framing included)."""
    products = np.round(np.asarray(sequence_lengths, dtype=np.float64) * config.mlm_probability, 9)
    budget = np.maximum(np.floor(products + 0.5).astype(np.int64), 1)
    if config.max_predictions is not None:
        np.minimum(budget, config.max_predictions, out=budget)
    return np.minimum(budget, candidates)


def exact_split(counts: np.ndarray, ratios: tuple[float, ...], uniforms: np.ndarray) -> np.ndarray:
    """Split each of ``counts`` into ``len(ratios)`` exact integer parts: ``(rows, parts)`` int64.

    Systematic randomised rounding: cut points ``floor(count * cumsum(ratios) + u)`` with one
    ``u ~ U[0, 1)`` per row. Every part is within 1 of ``count * ratio``, the parts sum to
    ``count`` and ``E[part] == count * ratio``.
    """
    counts = np.asarray(counts, dtype=np.int64).reshape(-1)
    cumulative = np.cumsum(ratios)
    cuts = np.floor(np.round(counts[:, None] * cumulative[None, :], 9) + np.asarray(uniforms).reshape(-1, 1))
    cuts = np.minimum(cuts.astype(np.int64), counts[:, None])
    cuts[:, -1] = counts
    return np.diff(cuts, axis=1, prepend=0)


def _word_order_selection(candidate_row: np.ndarray, starts: np.ndarray, budget: np.ndarray,
                          randoms: Randoms, count: int) -> np.ndarray:
    """Whole-word selection, as flags over the candidates (``candidate_row``: each one's row,
    ``starts``: it starts a word): each row's words in a random order, taken while they fit
    its budget; a word that would overflow is skipped and the scan goes on."""
    word_row = candidate_row[starts]
    word_of = np.cumsum(starts) - 1  # word index of each candidate
    word_length = np.bincount(word_of, minlength=word_row.shape[0])
    words_per_row = np.bincount(word_row, minlength=count)
    order, first_word = first_distinct(randoms, SELECT_STREAM, words_per_row, words_per_row)
    row_of = np.repeat(np.arange(count), words_per_row)
    visit = order + first_word[row_of]  # global word indices in visiting order
    lengths = word_length[visit]
    position = np.arange(visit.shape[0]) - first_word[row_of]
    running = np.cumsum(lengths)
    row_totals = np.bincount(row_of, weights=lengths, minlength=count).astype(np.int64)
    within = running - np.repeat(np.cumsum(row_totals) - row_totals, words_per_row)
    taken = within <= budget[row_of]  # the longest prefix that fits (lengths >= 1: sums increase)
    passed = np.bincount(row_of[taken], minlength=count)  # words of the order scanned so far
    room = budget - np.bincount(row_of[taken], weights=lengths[taken], minlength=count).astype(np.int64)
    # Then, round after round, each row's next word that fits what is left (a few rounds: the
    # room is below the length of the word that overflowed). Only words that fit the room left
    # now can ever be taken, as it only shrinks: the rounds look at those alone.
    later = np.flatnonzero((lengths <= room[row_of]) & (position >= passed[row_of]))
    while later.size:
        rows = row_of[later]
        fits = later[(lengths[later] <= room[rows]) & (position[later] >= passed[rows])]
        if not fits.size:
            break
        first = fits[np.r_[True, row_of[fits[1:]] != row_of[fits[:-1]]]]  # the first per row
        taken[first] = True
        room[row_of[first]] -= lengths[first]
        passed[row_of[first]] = position[first] + 1
        later = later[position[later] >= passed[row_of[later]]]
    chosen = np.zeros(word_row.shape[0], dtype=bool)
    chosen[visit[taken]] = True
    return chosen[word_of]


@dataclass
class MaskedParts:
    """The selection of one stored example (``Anatomy.parts``): bool masks over its positions
    (``selected``: labels != -100, split into ``masked`` (a ``<mask>``), ``random`` and ``kept``),
    ``candidates``: its non-special tokens, ``restored``: the row with every label back in place,
    and the stored ``input_ids`` and ``labels``."""

    selected: np.ndarray
    masked: np.ndarray
    random: np.ndarray
    kept: np.ndarray
    candidates: int
    restored: np.ndarray
    input_ids: np.ndarray
    labels: np.ndarray


class MLM(Objective):
    """The MLM objective for the pipeline and the loader (:class:`~transforms.objectives.base.Objective`).

    Args:
        config: objective parameters.
    """

    name = "mlm"
    family = "encoder"
    config_class = MLMConfig
    exact_counters = frozenset({"selected", "masked", "maskable_tokens"})
    summarize = staticmethod(summarize_mlm)

    def __init__(self, config: MLMConfig | None = None) -> None:
        self.config = config or MLMConfig()
        self.features = frozenset({"word_starts"}) if self.config.whole_word_mask else frozenset()
        roles = {"mask", "pad"} | ({"cls", "sep"} if self.config.frame else set())
        self.required_specials = frozenset(roles)
        self.fixed_raw_length = self.config.raw_length

    # Inspection hooks (transforms/objectives/base.py).

    def take_apart(self, ctx: InspectionContext) -> None:
        """The selected positions split into ``<mask>``, random and kept (``labels`` != -100),
        and the chunk inside the ``[CLS] ... [SEP]`` framing."""
        a, special = ctx.anatomy, ctx.special
        ids, labels = np.asarray(ctx.example["input_ids"]), np.asarray(ctx.example["labels"])
        length = a.lengths["input_ids"]
        selected = labels != IGNORE_INDEX
        masked = selected & (ids == special.mask)
        kept = selected & (ids == labels)
        restored = np.where(selected, labels, ids)[:length]
        a.raw_tokens = length - (2 if self.config.frame else 0)
        a.parts = MaskedParts(selected, masked, selected & ~masked & ~kept, kept,
                              int((~np.isin(restored, special.special_array())).sum()), restored, ids, labels)

    def example_problems(self, ctx: InspectionContext) -> list[str]:
        """The exact selection budget, no special token selected or drawn, the 80/10/10 split
        within one token of its ratios, and (without whole words, whose word starts the shards
        do not keep) the replay of the restored chunk."""
        config, out, special, a = self.config, [], ctx.special, ctx.anatomy
        m: MaskedParts = a.parts
        n, k = m.candidates, int(m.selected.sum())
        budget = int(selection_budget(np.array([a.lengths["input_ids"]]), np.array([n]), config)[0])
        if k > budget or (k != budget and not config.whole_word_mask):
            out.append(f"{k} tokens selected, the budget for {n} candidates is {budget}")
        specials = special.special_array()
        if np.isin(m.labels[m.selected], specials).any():
            out.append("a special token is selected (labels hold a special id)")
        if np.isin(m.input_ids[m.random], specials).any():
            out.append("a random replacement is a special token")
        masked, random, kept = (int(part.sum()) for part in (m.masked, m.random, m.kept))
        # Each part is within one token of k * ratio; a random draw equal to the original looks kept.
        near = [k * r for r in (config.mask_ratio, config.random_ratio, config.keep_ratio)]
        if abs(masked - near[0]) >= 1 + 1e-9 or random >= near[1] + 1 + 1e-9 or kept <= near[2] - 1 - 1e-9:
            out.append(f"mask/random/kept split {[masked, random, kept]} of {k} is not within one token of "
                       f"{[round(x, 2) for x in near]}")
        if not config.whole_word_mask and not out:
            chunk = m.restored[1:-1] if config.frame else m.restored
            replay, _ = build_example(self, chunk, special, example_randoms(ctx.seed, [a.key]))
            if not (np.array_equal(replay["input_ids"], m.input_ids) and np.array_equal(replay["labels"], m.labels)):
                out.append("input_ids/labels differ from the objective replayed with the example's seed")
        return out

    def shard_counters(self, ctx: InspectionContext) -> dict[str, int]:
        """Selected and masked tokens, and the maskable ones."""
        m: MaskedParts = ctx.anatomy.parts
        return {"selected": int(m.selected.sum()), "masked": int(m.masked.sum()), "maskable_tokens": m.candidates}

    def count_measured(self, ctx: InspectionContext) -> None:
        """Selected tokens and their replacement split, and the maskable ones."""
        m: MaskedParts = ctx.anatomy.parts
        counts = ctx.stats.record("mlm", Counter)
        counts.update(selected=int(m.selected.sum()), masked=int(m.masked.sum()), random=int(m.random.sum()),
                      kept=int(m.kept.sum()))
        counts["candidates"] += m.candidates

    def measured_summary(self, ctx: InspectionContext) -> dict[str, Any]:
        """Measured selection density and replacement split next to the configured ones."""
        config, m = self.config, ctx.stats.record("mlm", Counter)
        return {"mlm": {
            **{k: m[k] for k in ("candidates", "selected", "masked", "random", "kept")},
            "density": ratio(m["selected"], m["candidates"]), "configured_density": config.mlm_probability,
            "split": {k: ratio(m[k], m["selected"]) for k in ("masked", "random", "kept")},
            "configured_split": {"masked": config.mask_ratio, "random": config.random_ratio,
                                 "kept": config.keep_ratio},
        }}

    def measured_lines(self, ctx: InspectionContext) -> list[str]:
        """Selected share and replacement split, measured beside configured and the manifest's exact split."""
        lines, ms = [], ctx.manifest_summary or {}
        m = ctx.measured["mlm"]
        split, cfg = m["split"], m["configured_split"]
        lines.append(f"  selected {m['selected']:,} of {m['candidates']:,} maskable = {number(m['density'])} "
                     f"(configured {number(m['configured_density'])})")
        # Named, never in dict order: a manifest's dicts come back with sorted keys (keep, mask, random).
        parts = ("masked", "random", "kept")
        lines.append("  replacement mask/random/kept " + " / ".join(number(split[k]) for k in parts)
                     + "  (configured " + " / ".join(number(cfg[k]) for k in parts) + ")")
        if "replacement" in ms:
            exact = " / ".join(number(ms["replacement"][k]) for k in ("mask", "random", "keep"))
            lines.append(f"  manifest (exact) mask/random/kept {exact}")
        return lines

    def measured_charts(self, ctx: InspectionContext) -> list[Any]:
        """The replacement split against the configured ratios."""
        m, parts = ctx.measured, ["masked", "random", "kept"]
        return [Chart("share of selected tokens; dots: configured ratios", f"{ctx.split}: MLM replacement split",
                      parts, [
                          ChartSeries("measured", [m["mlm"]["split"][p] for p in parts], "measured"),
                          ChartSeries("configured", [m["mlm"]["configured_split"][p] for p in parts], "expected",
                                      "points"),
                      ], x_label="selected tokens", y_label="share", width=460)]

    def example_lines(self, ctx: InspectionContext) -> Shown:
        """``input_ids`` with every selected token as ``mask``, ``random`` or ``kept`` and the
        original it must be predicted as."""
        m: MaskedParts = ctx.anatomy.parts
        marks, out = Marks(ctx.special), []
        for position, token in enumerate(int(t) for t in m.input_ids):
            kind = next((name for name, where in (("mask", m.masked), ("random", m.random), ("kept", m.kept))
                         if where[position]), None)
            if kind is None:
                out += marks.kinds(np.array([token]), "text")
            else:
                out.append(Segment(kind, [token], original=[int(m.labels[position])]))
        return Shown(layout_facts(ctx.anatomy), [("input_ids", merge(out))])

    def build(self, block: Block, special: SpecialIds) -> Built:
        """Mask every chunk of ``block``.

        Counters: ``examples``, ``tokens`` (non-pad positions, framing included),
        ``padding_tokens``, ``maskable_tokens`` (non-special positions, the candidates of
        selection), ``selected``, ``masked``, ``random`` (a random id that drew the original
        still counts) and ``kept``.

        Raises:
            ValueError: a missing special id or feature, or a chunk that does not fit.
        """
        config = self.config
        if special.mask is None:
            raise ValueError("mlm needs a mask token id (special.mask is None)")
        if config.frame and (special.cls is None or special.sep is None):
            raise ValueError(f"frame=True needs cls and sep ids, got cls={special.cls} sep={special.sep}")
        lengths = block.lengths
        count = block.count
        if count and int(lengths.max()) > config.raw_length:
            raise ValueError(f"chunk of {int(lengths.max())} tokens exceeds the raw length {config.raw_length}")
        if block.tokens.size and ids_out_of_range(block.tokens, special.vocab_size):
            raise ValueError(f"token ids must be in [0, {special.vocab_size}), got "
                             f"[{block.tokens.min()}, {block.tokens.max()}]")
        word_starts = block.features.get("word_starts") if config.whole_word_mask else None
        if config.whole_word_mask and word_starts is None:
            raise ValueError("whole_word_mask=True needs the word_starts feature")
        seq_len, frame = config.seq_len, int(config.frame)
        # The rows in place in a (count, seq_len) matrix: [CLS] chunk [SEP] or the chunk, then padding.
        sizes = lengths + 2 * frame
        slots = np.arange(seq_len)
        in_chunk = (slots >= frame) & (slots < (lengths + frame)[:, None])
        input_ids = np.full((count, seq_len), special.pad, dtype=np.int32)
        input_ids[in_chunk] = block.tokens
        if frame:
            input_ids[:, 0] = special.cls
            input_ids[np.arange(count), lengths + 1] = special.sep
        candidate = in_chunk.copy()
        candidate[in_chunk] = ~special.special_flags()[block.tokens]
        positions = np.flatnonzero(candidate)  # row * seq_len + slot
        candidates = np.count_nonzero(candidate, axis=1)
        budget = selection_budget(sizes, candidates, config)
        first_candidate = np.zeros(count + 1, dtype=np.int64)
        np.cumsum(candidates, out=first_candidate[1:])
        if word_starts is None:
            sample, sample_offsets = first_distinct(block.randoms, SELECT_STREAM, candidates, budget)
            selected = positions[sample + np.repeat(first_candidate[:-1], budget)]
        else:
            flags = np.zeros((count, seq_len), dtype=bool)
            flags[in_chunk] = word_starts
            starts = flags.reshape(-1)[positions]
            candidate_row = positions // seq_len
            # a word also starts at a row's first candidate and after a special token
            starts[1:] |= (positions[1:] - positions[:-1] != 1) | (candidate_row[1:] != candidate_row[:-1])
            if starts.size:
                starts[0] = True
            chosen = _word_order_selection(candidate_row, starts, budget, block.randoms, count)
            picked = positions[chosen]
            per_row = np.bincount(picked // seq_len, minlength=count)
            order, sample_offsets = first_distinct(block.randoms, ORDER_STREAM, per_row, per_row)
            first_picked = np.zeros(count + 1, dtype=np.int64)
            np.cumsum(per_row, out=first_picked[1:])
            selected = picked[order + np.repeat(first_picked[:-1], per_row)]
        selected_per_row = np.diff(sample_offsets)
        ratios = (config.mask_ratio, config.random_ratio, config.keep_ratio)
        parts = exact_split(selected_per_row, ratios, block.randoms.uniforms(SPLIT_STREAM, 1))
        rank = np.arange(selected.shape[0]) - np.repeat(sample_offsets[:-1], selected_per_row)
        row_of = np.repeat(np.arange(count), selected_per_row)
        masked = rank < parts[row_of, 0]
        random = ~masked & (rank < parts[row_of, 0] + parts[row_of, 1])
        flat_ids = input_ids.reshape(-1)
        labels = np.full(count * seq_len, IGNORE_INDEX, dtype=np.int32)
        labels[selected] = flat_ids[selected]
        flat_ids[selected[masked]] = special.mask
        flat_ids[selected[random]] = random_ids(block.randoms, IDS_STREAM, parts[:, 1], special)
        tokens = int(sizes.sum())
        counters = {
            "examples": count,
            "tokens": tokens,
            "padding_tokens": count * seq_len - tokens,
            "maskable_tokens": int(candidates.sum()),
            "selected": int(selected.shape[0]),
            "masked": int(parts[:, 0].sum()),
            "random": int(parts[:, 1].sum()),
            "kept": int(parts[:, 2].sum()),
        }
        offsets = np.arange(count + 1, dtype=np.int64) * seq_len
        return Built({"input_ids": (flat_ids, offsets), "labels": (labels, offsets)}, {}, {}, counters)

    def schema_kwargs(self) -> dict[str, Any]:
        """``input_ids`` and ``labels`` are ``fixed_size_list<int32>[seq_len]``."""
        return {"seq_len": self.config.seq_len}

    def params(self) -> dict[str, Any]:
        """The configuration, for the manifest."""
        return {"objective": self.name, **asdict(self.config)}
