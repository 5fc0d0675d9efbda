"""Decoder-only prefix-LM over packed chunks: every document segment of a chunk split into a
bidirectional prefix and a causal suffix of its own.

Reference: T5's ``prefix_lm`` (``t5/data/preprocessors.py``: ``random_prefix_noise_mask`` with
density .5 on a chunk of *one* document) packed as T5's experimental
``pack_prefix_lm_decoder_only`` and SeqIO's ``PrefixLMFeatureConverter`` pack it: each packed
segment keeps its own prefix, attends only within itself and numbers its positions from 0.
Here the segments are the chunk's document segments (``doc_lengths``): a segment of ``d``
tokens is split uniformly on ``[1, d - 1]``, so its prefix and suffix are never empty
(``d = 1``: prefix 1, nothing to predict). The example keeps the chunk as ``input_ids`` and
records ``prefix_lengths``, one per document segment beside ``doc_lengths``; the loader builds
the attention mask (per segment: bidirectional over the prefix, causal after it, nothing across
segments) and puts the loss on the suffixes. One split per chunk would let attention run across
the chunk's documents in both directions.

Deliberate differences from T5's encoder-decoder ``prefix_lm``: no EOS is appended (the
documents already end with EOS), and no separate inputs/targets columns. A chunk shorter than
``seq_len`` (a padded final chunk, or ``best_fit``/``none`` packing) is right-padded with
``special.pad`` to ``seq_len``, as :mod:`transforms.objectives.clm` does; the padding belongs
to no document, so ``sum(doc_lengths)`` is the unpadded length.

Randomness: the split of the ``j``-th segment (``d`` tokens) of a row is
``1 + floor(u_j * max(d - 1, 1))`` for the row's ``j``-th number ``u_j`` of stream
:data:`SPLIT_STREAM` (:mod:`transforms.objectives.randoms`); an empty segment's prefix is 0.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Any

import numpy as np

from transforms.objectives.base import Block, Built, InspectionContext, Objective, padded_rows
from transforms.objectives.common import SpecialIds
from transforms.objectives.flags import flag
from transforms.objectives.layout import example_randoms
from transforms.objectives.lines import Chart, ChartSeries, number
from transforms.objectives.randoms import Randoms
from transforms.objectives.summary import ratio, summarize_prefix_lm

__all__ = ["SPLIT_STREAM", "PrefixLM", "PrefixLMConfig", "prefix_lengths", "segment_prefix_lengths"]

SPLIT_STREAM = 1


@dataclass(frozen=True)
class PrefixLMConfig:
    """Parameters of the prefix-LM objective.

    Attributes:
        seq_len: tokens per example (the packed chunk length).
    """

    seq_len: int = flag(1024, "tokens per example")

    def __post_init__(self) -> None:
        if not isinstance(self.seq_len, int) or isinstance(self.seq_len, bool) or self.seq_len < 2:
            raise ValueError(f"seq_len must be an int >= 2, got {self.seq_len!r}")


def prefix_lengths(lengths: np.ndarray, randoms: Randoms, stream: int = SPLIT_STREAM) -> np.ndarray:
    """Split points uniform on ``[1, L - 1]`` for rows of ``L`` tokens (1 where ``L`` is 1), int64:
    the split of a row that is one segment (the first number of the row's stream).

    Raises:
        ValueError: a length below 1.
    """
    lengths = np.asarray(lengths, dtype=np.int64)
    if lengths.size and int(lengths.min()) < 1:
        raise ValueError(f"prefix-LM needs at least 1 token per chunk, got {int(lengths.min())}")
    split = randoms.integers(stream, 1, np.maximum(lengths - 1, 1)).reshape(-1)
    split += 1
    return split


def segment_prefix_lengths(doc_lengths: np.ndarray, doc_offsets: np.ndarray, randoms: Randoms,
                           stream: int = SPLIT_STREAM) -> np.ndarray:
    """The prefix of every document segment of every row (aligned with ``doc_lengths``, int32).

    Segment ``j`` of a row (``d`` tokens) is split at ``1 + floor(u_j * max(d - 1, 1))``, ``u_j``
    the row's ``j``-th number of ``stream``; an empty segment's prefix is 0.
    """
    doc_lengths = np.asarray(doc_lengths, dtype=np.int64)
    counts = np.diff(doc_offsets)
    widest = int(counts.max(initial=0))
    if not doc_lengths.size or not widest:
        return np.zeros(doc_lengths.size, dtype=np.int32)
    uniforms = randoms.uniforms(stream, widest)
    rows = np.repeat(np.arange(counts.size), counts)
    column = np.arange(doc_lengths.size) - np.repeat(doc_offsets[:-1], counts)
    split = (uniforms[rows, column] * np.maximum(doc_lengths - 1, 1)).astype(np.int64) + 1
    split[doc_lengths == 0] = 0
    return split.astype(np.int32)


class PrefixLM(Objective):
    """Prefix-LM as an :class:`~transforms.objectives.base.Objective` (decoder family).

    Args:
        config: objective parameters.
    """

    name = "prefix_lm"
    family = "decoder"
    config_class = PrefixLMConfig
    required_specials: frozenset[str] = frozenset({"pad"})
    exact_counters = frozenset({"tokens", "documents_segments", "prefix_tokens", "suffix_tokens"})
    summarize = staticmethod(summarize_prefix_lm)

    def __init__(self, config: PrefixLMConfig) -> None:
        self.config = config
        self.fixed_raw_length = config.seq_len

    def build(self, block: Block, special: SpecialIds) -> Built:
        """Split every document segment of every chunk; ``doc_lengths`` pass through.

        Counters: examples, tokens, prefix and suffix (loss) tokens, padding tokens.

        Raises:
            ValueError: an empty chunk or one longer than ``seq_len``.
        """
        lengths = block.lengths
        if lengths.size and int(lengths.min()) < 1:
            raise ValueError(f"prefix-LM needs at least 1 token per chunk, got {int(lengths.min())}")
        prefix = segment_prefix_lengths(block.doc_lengths, block.doc_offsets, block.randoms)
        values, offsets, padding = padded_rows(block.tokens, block.offsets, self.config.seq_len, special.pad)
        tokens, prefix_tokens = int(block.offsets[-1]), int(prefix.sum())
        counters = {"examples": block.count, "tokens": tokens, "prefix_tokens": prefix_tokens,
                    "suffix_tokens": tokens - prefix_tokens, "padding_tokens": padding}
        arrays = {"input_ids": (values, offsets), "doc_lengths": (block.doc_lengths, block.doc_offsets),
                  "prefix_lengths": (prefix, block.doc_offsets)}
        return Built(arrays, {}, {}, counters)

    # Inspection hooks (transforms/objectives/base.py): a decoder row's prefix_lengths column gives the
    # split points (taken apart and shown by the family: no take_apart or example_lines of its own).

    def example_problems(self, ctx: InspectionContext) -> list[str]:
        """The stored split points must be the ones the example's seed draws for its segments."""
        a = ctx.anatomy
        docs = np.asarray(a.doc_lengths, dtype=np.int64)
        drawn = segment_prefix_lengths(docs, np.array([0, docs.size]), example_randoms(ctx.seed, [a.key]))
        stored = [] if a.prefix_lengths is None else np.asarray(a.prefix_lengths).tolist()
        if stored != drawn.tolist():
            return [f"prefix_lengths {stored} differ from the objective replayed with the example's seed"]
        return []

    def shard_counters(self, ctx: InspectionContext) -> dict[str, int]:
        """Tokens and document segments of the row, and its prefix and suffix tokens."""
        a = ctx.anatomy
        return {"tokens": a.raw_tokens, "documents_segments": int(a.doc_lengths.size),
                "prefix_tokens": a.prefix_length, "suffix_tokens": a.raw_tokens - a.prefix_length}

    def count_measured(self, ctx: InspectionContext) -> None:
        """Prefix tokens, and per document segment the tenth of it in its prefix, measured and
        as a split ~ U[1, d-1] would give."""
        a, stats = ctx.anatomy, ctx.stats
        if a.prefix_length is not None and a.raw_tokens:
            stats.counts["prefix_tokens"] += a.prefix_length
            if a.prefix_lengths is not None and a.prefix_lengths.shape == a.doc_lengths.shape:
                pairs = zip(a.prefix_lengths.tolist(), a.doc_lengths.tolist(), strict=True)
            else:  # format 2: one split over the whole row
                pairs = [(a.prefix_length, a.raw_tokens)]
            tenths, expected = stats.record("prefix_tenths", Counter), stats.record("prefix_expected_tenths", Counter)
            for prefix, length in pairs:
                if length >= 2:  # a 1-token segment has no split to draw
                    tenths[min(9, 10 * prefix // length)] += 1
                    for tenth, share in _uniform_tenths(length).items():
                        expected[tenth] += share

    def measured_summary(self, ctx: InspectionContext) -> dict[str, Any]:
        """The measured prefix share (expected 0.5: split points uniform on [1, d-1]) and, per document
        segment, the tenth of its length its prefix covers, beside what each segment's U[1, d-1] expects."""
        stats = ctx.stats
        c = stats.counts
        tenths, expected = stats.record("prefix_tenths", Counter), stats.record("prefix_expected_tenths", Counter)
        return {"prefix_share": ratio(c["prefix_tokens"], c["raw_tokens"]), "configured_prefix_share": 0.5,
                "prefix_tenths": {f"{k / 10:.1f}": n for k, n in sorted(tenths.items())},
                "prefix_expected_tenths": {f"{k / 10:.1f}": round(n, 3) for k, n in sorted(expected.items())}}

    def measured_lines(self, ctx: InspectionContext) -> list[str]:
        """The measured prefix share beside the share its splits give."""
        return [f"  prefix share {number(ctx.measured['prefix_share'])} (configured: splits ~ U[1, d-1]: 0.5)"]

    def measured_charts(self, ctx: InspectionContext) -> list[Any]:
        """Where the prefix ends in each document segment, against a split ~ U[1, d-1]."""
        m = ctx.measured
        tenths = [f"{k / 10:.1f}" for k in range(10)]
        expected = m.get("prefix_expected_tenths") or {}
        uniform = [float(expected.get(t, 0)) for t in tenths]
        return [Chart("prefix length over segment length; line: each split ~ U[1, d-1]",
                      f"{ctx.split}: prefix length / document segment length", tenths, [
                          ChartSeries("measured", [float(m["prefix_tenths"].get(t, 0)) for t in tenths], "measured"),
                          ChartSeries("expected U[1, d-1]", uniform, "expected", "line")], x_label="prefix share",
                      y_label="segments")]

    def schema_kwargs(self) -> dict[str, Any]:
        """Fixed ``input_ids`` of ``seq_len`` plus a ``prefix_lengths`` column (one per document)."""
        return {"seq_len": self.config.seq_len, "prefix_lengths": True}

    def params(self) -> dict[str, Any]:
        """Configuration for the manifest."""
        return {"reference": "t5.data.preprocessors.prefix_lm, packed (each document segment split ~ U[1, d-1])",
                "seq_len": self.config.seq_len}


def _uniform_tenths(length: int) -> dict[int, float]:
    """How a split ~ U[1, length - 1] falls on the tenths ``min(9, 10 * p // length)``."""
    out: dict[int, float] = {}
    for tenth in range(10):
        low = max(1, -(-tenth * length // 10))
        high = length - 1 if tenth == 9 else min(length - 1, -(-(tenth + 1) * length // 10) - 1)
        if high >= low:
            out[tenth] = (high - low + 1) / (length - 1)
    return out
