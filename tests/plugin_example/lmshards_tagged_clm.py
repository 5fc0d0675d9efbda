"""``tagged_clm``: an example objective of another package, found by lmshards through its entry point.

Every example is a decoder row of ``seq_len`` tokens: a token of the objective's own (``--tagged-token``,
default ``[TAGGED]``) and then ``seq_len - 1`` tokens of the packed stream, padded when short. The
tag belongs to the row's first document segment, so ``doc_lengths`` add up to the unpadded row as
for clm. The token is declared by :meth:`TaggedCLM.token_needs`: ``lmshards train-tokenizer`` makes
it, and ``materialize`` refuses a tokenizer without it unless ``--add-special-tokens`` adds it.

The package's ``pyproject.toml`` declares the class in the group ``lmshards.objectives``; once the
package is installed (and on Beam's workers too: they unpickle the objective by reference to this
module), ``lmshards materialize --objective tagged_clm`` works like a built-in objective.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from transforms.objectives.base import Block, Built, InspectionContext, Objective, TokenNeeds, flat_rows, padded_rows
from transforms.objectives.common import SpecialIds
from transforms.objectives.flags import flag


@dataclass(frozen=True)
class TaggedCLMConfig:
    """Settings of tagged_clm: ``--seq-len`` (shared with the built-in objectives) and ``--tagged-token``."""

    seq_len: int = flag(64, "tokens per example")
    token: str = flag("[TAGGED]", "the token every example starts with", name="--tagged-token")

    def __post_init__(self) -> None:
        if not isinstance(self.seq_len, int) or self.seq_len < 2:
            raise ValueError(f"tagged_clm needs at least 2 tokens per example, got {self.seq_len!r}")


class TaggedCLM(Objective):
    """clm with a token of its own first (see the module docstring)."""

    name = "tagged_clm"
    family = "decoder"
    config_class = TaggedCLMConfig

    def __init__(self, config: TaggedCLMConfig):
        self.config = config
        self.fixed_raw_length = config.seq_len - 1

    def token_needs(self) -> TokenNeeds:
        return TokenNeeds(0, (self.config.token,))

    def build(self, block: Block, special: SpecialIds) -> Built:
        tag = special.mode_tokens[self.config.token]
        rows = [np.r_[tag, block.tokens[block.offsets[i] : block.offsets[i + 1]]] for i in range(block.count)]
        values, offsets, padding = padded_rows(*flat_rows(rows), self.config.seq_len, special.pad)
        doc_lengths = block.doc_lengths.copy()
        doc_lengths[block.doc_offsets[:-1]] += 1  # the tag joins each row's first document segment
        counters = {"examples": block.count, "tokens": int(block.offsets[-1]), "padding_tokens": padding}
        return Built({"input_ids": (values, offsets), "doc_lengths": (doc_lengths, block.doc_offsets)}, {}, {},
                     counters)

    def schema_kwargs(self) -> dict[str, Any]:
        return {"seq_len": self.config.seq_len}

    def params(self) -> dict[str, Any]:
        return {"seq_len": self.config.seq_len, "token": self.config.token}

    def take_apart(self, ctx: InspectionContext) -> None:
        tag = ctx.special.mode_tokens.get(self.config.token)
        if not len(ctx.example["input_ids"]) or int(ctx.example["input_ids"][0]) != tag:
            ctx.anatomy.issues.append(f"the row does not start with {self.config.token}")
        ctx.anatomy.raw_tokens = max(int(np.sum(ctx.anatomy.doc_lengths)) - 1, 0)
