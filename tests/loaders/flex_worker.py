"""Run as a script by tests/loaders/test_flex_attention.py, one layout per process (flex attention
compiles; a bad mask can abort the process, and torch's CPU compiler fails on a second batch
length in one process): packed documents stay apart under
``attn_implementation="flex_attention"`` on CPU, in train and eval mode, for clm's default batch
(positions only: transformers builds the BlockMask itself), and for prefix-LM and UL2 decoder rows
from a collator told the model (:func:`loaders.collation.collate.model_mask_options`: a BlockMask).
Logits equal sdpa's under the tensor mask; prints one line per check, ``ok`` at the end."""

from __future__ import annotations

import sys

import torch
from test_document_isolation import (
    PAD,
    assert_isolated,
    clm_rows,
    cross_entropy,
    logits_of,
    model_for,
    objective_examples,
    prefix_pairs,
    spans,
)

from loaders.collation.collate import model_mask_options
from loaders.collation.collate_decoder import CausalCollator, PrefixLMCollator

FLEX_ATOL = 1e-4  # flex's kernel against sdpa's (the same math, another summation order)


def check_clm(kind: str, mode: str) -> None:
    model = model_for(kind, "flex_attention", mode)
    examples = clm_rows()
    collate = CausalCollator(PAD, **model_mask_options(model))
    for row, start, length in [(0, 0, 5), (0, 5, 9), (1, 1, 19)]:
        assert_isolated(model, collate, examples, row, start, length)
    out = logits_of(model, collate(examples))
    reference = logits_of(model_for(kind, "sdpa", mode), CausalCollator(PAD, documents="mask")(examples))
    real = torch.ones_like(out.logits[..., 0], dtype=torch.bool)
    real[0, 18:] = False
    assert torch.allclose(out.logits[real], reference.logits[real], atol=FLEX_ATOL)
    pairs = [(b, s + r, int(e["input_ids"][s + r + 1])) for b, e in enumerate(examples) for s, n in spans(e)
             for r in range(n - 1)]
    assert torch.allclose(out.loss, cross_entropy(out.logits, pairs), atol=1e-5)


def check_prefix(name: str, params: dict, rows: list, mode: str) -> None:
    from torch.nn.attention.flex_attention import BlockMask

    model = model_for("llama", "flex_attention", mode)
    examples = objective_examples(name, params, rows)
    collate = PrefixLMCollator(PAD, **model_mask_options(model))
    batch = collate(examples)
    assert isinstance(batch["attention_mask"], BlockMask)
    for row, example in enumerate(examples):
        for start, length in spans(example):
            assert_isolated(model, collate, examples, row, start, length)
    out = logits_of(model, batch)
    reference = logits_of(model_for("llama", "sdpa", mode), PrefixLMCollator(PAD)(examples))
    for b, example in enumerate(examples):
        real = int(sum(example["doc_lengths"]))
        assert torch.allclose(out.logits[b, :real], reference.logits[b, :real], atol=FLEX_ATOL)
    assert torch.allclose(out.loss, cross_entropy(out.logits, prefix_pairs(examples)), atol=1e-5)


CHECKS = {
    "clm": lambda mode: check_clm("llama", mode),  # GPT-2 has no flex attention in transformers
    "prefix_lm": lambda mode: check_prefix("prefix_lm", {"seq_len": 32}, [[7, 12, 13], [32], [3, 1, 10]], mode),
    "ul2_decoder": lambda mode: check_prefix("ul2", {"inputs_length": 24, "layout": "decoder"},
                                             [[200], [5, 6], [40]], mode),
}


def main(layout: str) -> None:
    for mode in ("eval", "train"):
        CHECKS[layout](mode)
        print(f"{layout} {mode}", flush=True)
    print("ok")


if __name__ == "__main__":
    main(sys.argv[1])
