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
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from transforms.objectives.base import BuiltRows
from transforms.objectives.common import SpecialIds, generator_of
from transforms.objectives.packing import Piece

__all__ = ["PrefixLM", "PrefixLMConfig", "draw_prefix_length", "prefix_lm"]


@dataclass(frozen=True)
class PrefixLMConfig:
    """Parameters of the prefix-LM objective.

    Attributes:
        seq_len: tokens per example (the packed chunk length).
    """

    seq_len: int = 1024

    def __post_init__(self) -> None:
        if not isinstance(self.seq_len, int) or isinstance(self.seq_len, bool) or self.seq_len < 2:
            raise ValueError(f"seq_len must be an int >= 2, got {self.seq_len!r}")


def draw_prefix_length(length: int, rng: np.random.Generator) -> int:
    """Split point uniform on ``[1, length-1]`` (1 when ``length`` is 1).

    Raises:
        ValueError: ``length`` below 1.
    """
    if length < 1:
        raise ValueError(f"prefix-LM needs at least 1 token, got {length}")
    if length == 1:
        return 1
    return int(generator_of(rng).integers(1, length))


def prefix_lm(
    tokens: np.ndarray,
    rng: np.random.Generator,
    config: PrefixLMConfig,
    special: SpecialIds,
    doc_lengths: np.ndarray | None = None,
) -> dict[str, Any]:
    """Split one chunk for prefix-LM.

    Args:
        tokens: 1-D chunk, ``config.seq_len`` tokens (fewer for a final chunk).
        rng: the example's generator (one draw).
        config: objective parameters.
        special: ``pad`` fills the row past the chunk.
        doc_lengths: lengths of the packed documents of the chunk (default: one document).

    Returns:
        ``{"input_ids": int32 of seq_len, "prefix_length": int, "doc_lengths": int32}``.

    Raises:
        ValueError: tokens not 1-D, empty or longer than ``seq_len``, or ``doc_lengths``
            that do not add up to the chunk length.
    """
    tokens = np.asarray(tokens)
    if tokens.ndim != 1:
        raise ValueError(f"tokens must be 1-D, got shape {tokens.shape}")
    length = tokens.shape[0]
    if length > config.seq_len:
        raise ValueError(f"prefix_lm chunk has {length} tokens, more than seq_len {config.seq_len}")
    if doc_lengths is None:
        doc_lengths = np.array([length], dtype=np.int32)
    else:
        doc_lengths = np.asarray(doc_lengths, dtype=np.int32)
        if (
            doc_lengths.ndim != 1
            or int(doc_lengths.sum()) != length
            or (doc_lengths.size and int(doc_lengths.min()) <= 0)
        ):
            raise ValueError(f"doc_lengths {doc_lengths.tolist()} must be positive and add up to {length} tokens")
    input_ids = np.empty(config.seq_len, dtype=np.int32)
    input_ids[:length] = tokens
    input_ids[length:] = special.pad
    return {
        "input_ids": input_ids,
        "prefix_length": draw_prefix_length(length, rng),
        "doc_lengths": doc_lengths,
    }


class PrefixLM:
    """Prefix-LM as an :class:`~transforms.objectives.base.Objective` (decoder family).

    Args:
        config: objective parameters.
    """

    name = "prefix_lm"
    family = "decoder"
    features: frozenset[str] = frozenset()
    required_specials: frozenset[str] = frozenset({"pad"})

    def __init__(self, config: PrefixLMConfig) -> None:
        self.config = config

    def plan_chunk(self, rng: np.random.Generator) -> tuple[int, int]:
        """Always ``(seq_len, 0)``; consumes no randomness."""
        return self.config.seq_len, 0

    def build(
        self,
        tokens: np.ndarray,
        rng: np.random.Generator,
        plan: int,
        special: SpecialIds,
        features: dict[str, np.ndarray],
    ) -> dict[str, Any]:
        """Split ``tokens``; ``features["doc_lengths"]``, when present, passes through."""
        return prefix_lm(tokens, rng, self.config, special, features.get("doc_lengths"))

    def build_many(
        self,
        pieces: Sequence[Piece],
        plans: Sequence[int],
        rngs: Sequence[np.random.Generator],
        special: SpecialIds,
    ) -> BuiltRows:
        """:meth:`build` and :meth:`stats` of many chunks at once: each row's split from its own
        generator, the columns laid out and the counters summed once for the block."""
        rows, prefixes, segments = [], [], []
        for piece, rng in zip(pieces, rngs, strict=True):
            example = self.build(piece.tokens, rng, 0, special, {"doc_lengths": piece.doc_lengths})
            rows.append(example["input_ids"])
            prefixes.append(example["prefix_length"])
            segments.append(example["doc_lengths"])
        count, seq_len = len(rows), self.config.seq_len
        lengths = np.fromiter((int(piece.tokens.shape[0]) for piece in pieces), dtype=np.int64, count=count)
        prefix = np.array(prefixes, dtype=np.int32)
        segment_offsets = np.zeros(count + 1, dtype=np.int64)
        np.cumsum([len(s) for s in segments], out=segment_offsets[1:])
        if not count:
            empty = np.zeros(0, np.int32)
            return {"input_ids": (empty, segment_offsets), "doc_lengths": (empty, segment_offsets)}, \
                {"prefix_length": prefix}, {}, {}
        arrays = {
            "input_ids": (np.concatenate(rows), np.arange(count + 1, dtype=np.int64) * seq_len),
            "doc_lengths": (np.concatenate(segments).astype(np.int32, copy=False), segment_offsets),
        }
        tokens, prefix_tokens = int(lengths.sum()), int(prefix.sum(dtype=np.int64))
        counters = {"examples": count, "tokens": tokens, "prefix_tokens": prefix_tokens,
                    "suffix_tokens": tokens - prefix_tokens, "padding_tokens": count * seq_len - tokens}
        return arrays, {"prefix_length": prefix}, {}, counters

    def stats(self, example: dict[str, Any]) -> dict[str, int]:
        """Counters: examples, tokens, prefix and suffix (loss) tokens, padding tokens."""
        doc_lengths = example["doc_lengths"]
        length = int(doc_lengths.sum() if isinstance(doc_lengths, np.ndarray) else np.sum(doc_lengths))
        prefix_length = int(example["prefix_length"])
        return {
            "examples": 1,
            "tokens": length,
            "prefix_tokens": prefix_length,
            "suffix_tokens": length - prefix_length,
            "padding_tokens": self.config.seq_len - length,
        }

    def schema_kwargs(self) -> dict[str, Any]:
        """Fixed ``input_ids`` of ``seq_len`` plus a ``prefix_length`` column."""
        return {"seq_len": self.config.seq_len, "prefix_length": True}

    def max_sentinels(self) -> int:
        """Prefix-LM uses no sentinels."""
        return 0

    def params(self) -> dict[str, Any]:
        """Configuration for the manifest."""
        return {"reference": "t5.data.preprocessors.prefix_lm (split ~ U[1, L-1])", "seq_len": self.config.seq_len}
