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

from dataclasses import dataclass
from typing import Any

from transforms.objectives.base import Block, Built, InspectionContext, Objective, padded_rows
from transforms.objectives.common import SpecialIds
from transforms.objectives.flags import flag
from transforms.objectives.summary import summarize_clm

__all__ = ["CLM", "CLMConfig"]


@dataclass(frozen=True)
class CLMConfig:
    """Settings of the clm objective.

    Attributes:
        seq_len: tokens per example (>= 2).
    """

    seq_len: int = flag(1024, "tokens per example")

    def __post_init__(self):
        if not isinstance(self.seq_len, int) or self.seq_len < 2:
            raise ValueError(f"--seq-len {self.seq_len}: clm needs at least 2 tokens per example")


class CLM(Objective):
    """The clm objective (see module docstring)."""

    name = "clm"
    family = "decoder"
    config_class = CLMConfig
    required_specials = frozenset({"eos"})
    copies_chunks = True
    exact_counters = frozenset({"tokens", "documents_segments"})
    summarize = staticmethod(summarize_clm)

    def __init__(self, config: CLMConfig):
        self.config = config
        self.fixed_raw_length = config.seq_len

    def build(self, block: Block, special: SpecialIds) -> Built:
        """The chunks as ``input_ids`` (padded to ``seq_len``) and ``doc_lengths``; no randomness.

        Counters: ``examples``, ``tokens`` (unpadded), ``padding_tokens``, ``documents_segments``.

        Raises:
            ValueError: a chunk longer than ``seq_len``.
        """
        values, offsets, padding = padded_rows(block.tokens, block.offsets, self.config.seq_len, special.pad)
        counters = {"examples": block.count, "tokens": int(block.offsets[-1]), "padding_tokens": padding,
                    "documents_segments": int(block.doc_offsets[-1])}
        return Built({"input_ids": (values, offsets), "doc_lengths": (block.doc_lengths, block.doc_offsets)}, {}, {},
                     counters)

    def schema_kwargs(self) -> dict[str, Any]:
        return {"seq_len": self.config.seq_len}

    def shard_counters(self, ctx: InspectionContext) -> dict[str, int]:
        """Tokens and document segments of the row."""
        a = ctx.anatomy
        return {"tokens": a.raw_tokens, "documents_segments": int(a.doc_lengths.size)}

    def params(self) -> dict[str, Any]:
        return {"seq_len": self.config.seq_len}
