"""Causal language modelling (GPT-style): the packed chunk itself.

``input_ids`` holds ``seq_len`` tokens; ``doc_lengths`` the lengths of the document
segments in it (the EOS after a document counts in that document), from which the loader
builds per-document attention masks, position resets or FlashAttention ``cu_seqlens``.
Labels are derived by the loader (shifted ``input_ids``), as in Megatron-LM's GPT dataset
and HF's ``run_clm`` ``group_texts``. A short chunk (only the last one of a split when
``--last-chunk pad``, or any in ``best_fit``/``none`` packing) is padded with the pad id;
the padding is not part of any document, so ``sum(doc_lengths)`` is the unpadded length.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from transforms.objectives.common import SpecialIds

__all__ = ["CLM", "CLMConfig", "pad_to"]


def pad_to(tokens: np.ndarray, length: int, pad: int) -> np.ndarray:
    """``tokens`` right-padded with ``pad`` to ``length`` (ValueError if longer).

    An int32 array of exactly ``length`` tokens is returned as it is (not copied).
    """
    if len(tokens) == length and isinstance(tokens, np.ndarray) and tokens.dtype == np.int32:
        return tokens
    if len(tokens) > length:
        raise ValueError(f"{len(tokens)} tokens do not fit in {length}")
    out = np.full(length, pad, dtype=np.int32)
    out[: len(tokens)] = tokens
    return out


@dataclass(frozen=True)
class CLMConfig:
    """Settings of the clm objective.

    Attributes:
        seq_len: tokens per example (>= 2).
    """

    seq_len: int = 1024

    def __post_init__(self):
        if not isinstance(self.seq_len, int) or self.seq_len < 2:
            raise ValueError(f"--seq-len {self.seq_len}: clm needs at least 2 tokens per example")


class CLM:
    """The clm objective (see module docstring)."""

    name = "clm"
    family = "decoder"
    features: frozenset[str] = frozenset()
    required_specials = frozenset({"eos"})

    def __init__(self, config: CLMConfig):
        self.config = config

    def plan_chunk(self, rng: np.random.Generator) -> tuple[int, int]:
        return self.config.seq_len, 0

    def build(
        self,
        tokens: np.ndarray,
        rng: np.random.Generator,
        plan: int,
        special: SpecialIds,
        features: dict[str, np.ndarray],
    ) -> dict[str, Any]:
        doc_lengths = features.get("doc_lengths")
        if doc_lengths is None:
            doc_lengths = np.array([len(tokens)], dtype=np.int32)
        return {
            "input_ids": pad_to(tokens, self.config.seq_len, special.pad),
            "doc_lengths": np.asarray(doc_lengths, dtype=np.int32),
        }

    def build_block(self, tokens: np.ndarray, doc_lengths: Sequence[np.ndarray]) -> tuple[dict, dict[str, int]]:
        """:meth:`build` and :meth:`stats` of many full chunks at once (the pipeline's fast path).

        Args:
            tokens: ``(n, seq_len)`` int32 tokens, one full chunk per row.
            doc_lengths: each chunk's document segment lengths.

        Returns:
            The examples' columns (name -> ``(flat int32 values, int64 row offsets)``) and the sum
            of their :meth:`stats`.
        """
        count, length = tokens.shape
        if length != self.config.seq_len or len(doc_lengths) != count:
            raise ValueError(f"build_block needs {count} chunks of {self.config.seq_len} tokens, got "
                             f"{len(doc_lengths)} x {length}")
        segments = np.fromiter(map(len, doc_lengths), dtype=np.int64, count=count)
        offsets = np.zeros(count + 1, dtype=np.int64)
        np.cumsum(segments, out=offsets[1:])
        lengths = np.concatenate(doc_lengths).astype(np.int32, copy=False) if count else np.zeros(0, np.int32)
        real = int(lengths.sum(dtype=np.int64))
        columns = {
            "input_ids": (np.ascontiguousarray(tokens, dtype=np.int32).reshape(-1),
                          np.arange(count + 1, dtype=np.int64) * length),
            "doc_lengths": (lengths, offsets),
        }
        stats = {"examples": count, "tokens": real, "padding_tokens": count * length - real,
                 "documents_segments": int(offsets[-1])}
        return columns, stats

    def stats(self, example: dict[str, Any]) -> dict[str, int]:
        real = int(np.asarray(example["doc_lengths"]).sum())
        return {"examples": 1, "tokens": real, "padding_tokens": self.config.seq_len - real,
                "documents_segments": int(len(example["doc_lengths"]))}

    def schema_kwargs(self) -> dict[str, Any]:
        return {"seq_len": self.config.seq_len}

    def max_sentinels(self) -> int:
        return 0

    def params(self) -> dict[str, Any]:
        return {"seq_len": self.config.seq_len}
