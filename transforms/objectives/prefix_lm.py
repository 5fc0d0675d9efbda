"""Decoder-only prefix-LM: one packed chunk split into a bidirectional prefix and a causal suffix.

Reference: T5's ``random_prefix_noise_mask`` with density .5 (``t5/data/preprocessors.py``,
``prefix_lm``) and SeqIO's ``PrefixLMFeatureConverter`` / T5's experimental
``pack_prefix_lm_decoder_only``: the split point is uniform on ``[1, L-1]`` over the
chunk's ``L`` tokens, so the prefix and the suffix are never empty. The example keeps the
chunk as ``input_ids`` and records ``prefix_length``; the loader builds the attention mask
(bidirectional over the prefix, causal after it) and puts the loss on the suffix.

Deliberate differences from T5's encoder-decoder ``prefix_lm``: no EOS is appended (the
chunk is packed text whose documents already end with EOS), and no separate
inputs/targets columns. A chunk shorter than ``seq_len`` (a padded final chunk, or
``best_fit``/``none`` packing) is split over its own length and right-padded with
``special.pad`` to ``seq_len``, as :mod:`transforms.objectives.clm` does; the padding
belongs to no document, so ``sum(doc_lengths)`` is the unpadded length. A 1-token chunk
gets ``prefix_length = 1`` (nothing to predict).

Randomness: the split of a chunk of ``L`` tokens is ``1 + floor(u * (L - 1))`` for the row's
first number ``u`` of stream :data:`SPLIT_STREAM` (:mod:`transforms.objectives.randoms`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from transforms.objectives.base import Block, Built, Objective, padded_rows
from transforms.objectives.common import SpecialIds
from transforms.objectives.flags import flag
from transforms.objectives.layout import example_randoms
from transforms.objectives.randoms import Randoms
from transforms.objectives.summary import ratio, summarize_prefix_lm

__all__ = ["SPLIT_STREAM", "PrefixLM", "PrefixLMConfig", "prefix_lengths"]

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
    """Split points uniform on ``[1, L - 1]`` for rows of ``L`` tokens (1 where ``L`` is 1), int64.

    Raises:
        ValueError: a length below 1.
    """
    lengths = np.asarray(lengths, dtype=np.int64)
    if lengths.size and int(lengths.min()) < 1:
        raise ValueError(f"prefix-LM needs at least 1 token per chunk, got {int(lengths.min())}")
    split = randoms.integers(stream, 1, np.maximum(lengths - 1, 1)).reshape(-1)
    split += 1
    return split


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
        """Split every chunk; ``doc_lengths`` pass through.

        Counters: examples, tokens, prefix and suffix (loss) tokens, padding tokens.

        Raises:
            ValueError: an empty chunk or one longer than ``seq_len``.
        """
        lengths = block.lengths
        prefix = prefix_lengths(lengths, block.randoms)
        values, offsets, padding = padded_rows(block.tokens, block.offsets, self.config.seq_len, special.pad)
        tokens, prefix_tokens = int(block.offsets[-1]), int(prefix.sum())
        counters = {"examples": block.count, "tokens": tokens, "prefix_tokens": prefix_tokens,
                    "suffix_tokens": tokens - prefix_tokens, "padding_tokens": padding}
        arrays = {"input_ids": (values, offsets), "doc_lengths": (block.doc_lengths, block.doc_offsets)}
        return Built(arrays, {"prefix_length": prefix.astype(np.int32)}, {}, counters)

    def example_problems(self, example: Mapping[str, Any], anatomy: Any, special: SpecialIds,
                         seed: int) -> list[str]:
        """The stored split point must be the one the example's seed draws for its length."""
        length = int(anatomy.doc_lengths.sum())
        drawn = int(prefix_lengths(np.array([length]), example_randoms(seed, [anatomy.key]))[0])
        if anatomy.prefix_length != drawn:
            return [f"prefix_length {anatomy.prefix_length} differs from the objective replayed with the example's "
                    "seed"]
        return []

    def measured_summary(self, stats: Any) -> dict[str, Any]:
        """The measured prefix share (expected 0.5: split points uniform on [1, L-1]) and its tenths."""
        c = stats.counts
        return {"prefix_share": ratio(c["prefix_tokens"], c["raw_tokens"]), "configured_prefix_share": 0.5,
                "prefix_tenths": {f"{k / 10:.1f}": n for k, n in sorted(stats.prefix_tenths.items())}}

    def schema_kwargs(self) -> dict[str, Any]:
        """Fixed ``input_ids`` of ``seq_len`` plus a ``prefix_length`` column."""
        return {"seq_len": self.config.seq_len, "prefix_length": True}

    def params(self) -> dict[str, Any]:
        """Configuration for the manifest."""
        return {"reference": "t5.data.preprocessors.prefix_lm (split ~ U[1, L-1])", "seq_len": self.config.seq_len}
