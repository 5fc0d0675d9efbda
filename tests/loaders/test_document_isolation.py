"""Packed documents stay apart with ``model(**batch)`` alone: tiny HF models (built from configs,
or saved and loaded with ``from_pretrained``; nothing downloaded), eager and sdpa attention (flex
in tests/loaders/test_flex_attention.py), train and eval mode, the collators' default batches.

For each layout one document (or, for prefix-LM, one packed segment) is changed and every
other document's logits must stay what they were to 1e-5, while the changed document's own
logits move; the loss equals a cross-entropy computed here from the logits and the targets
taken from the examples. clm's default batch has no 4-D mask: transformers' own mask code
(``masking_utils``) derives the per-document mask from the restarting ``position_ids``, and
only does so without a cache, which the batch's ``use_cache=False`` guarantees in train mode too.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from conftest import SPECIAL_IDS, TOKENIZER
from hf_models import PAD, VOCAB, tiny_model

from loaders.collation.collate_decoder import CausalCollator, PrefixLMCollator
from loaders.dynamic import special_ids_from_tokenizer
from transforms.objectives.base import build_example
from transforms.objectives.layout import example_randoms
from transforms.objectives.registry import make_objective

ATOL = 1e-5


def model_for(kind, implementation, mode, tmp_path=None):
    """The tiny model, in ``mode`` (train/eval), built from a config or (``tmp_path``) saved and reloaded."""
    model = tiny_model(kind, implementation, dropout=False)
    if tmp_path is not None:
        import transformers as hf

        model.save_pretrained(tmp_path / kind)
        cls = type(model)
        model = cls.from_pretrained(tmp_path / kind, attn_implementation=implementation)
        assert hf.__version__ and model.config._attn_implementation == implementation
    return model.train() if mode == "train" else model.eval()


def logits_of(model, batch):
    with torch.no_grad():
        return model(**batch)


def clm_rows():
    """Three packed rows: documents of 5, 9 and 4 tokens + padding; 1 and 19; 20 (one document)."""
    rng = np.random.default_rng(3)
    rows = []
    for docs in ([5, 9, 4], [1, 19], [20]):
        ids = np.zeros(20, np.int32)
        ids[: sum(docs)] = rng.integers(10, VOCAB, size=sum(docs))
        rows.append({"input_ids": ids, "doc_lengths": np.array(docs, np.int32)})
    return rows


def spans(example):
    lengths = np.asarray(example["doc_lengths"]).tolist()
    starts = np.cumsum([0, *lengths[:-1]]).tolist()
    return list(zip(starts, lengths, strict=True))


def perturbed(examples, row, start, length):
    """The examples with every token of one document (row, start, length) replaced."""
    out = [dict(e, input_ids=np.asarray(e["input_ids"]).copy()) for e in examples]
    ids = out[row]["input_ids"]
    ids[start : start + length] = (ids[start : start + length] + 997) % (VOCAB - 10) + 10
    return out


def assert_isolated(model, collate, examples, row, start, length):
    """Changing one document moves its own logits and nothing else's (padding aside)."""
    before = logits_of(model, collate(examples)).logits
    after = logits_of(model, collate(perturbed(examples, row, start, length))).logits
    for b, example in enumerate(examples):
        for s, n in spans(example):
            same = torch.allclose(before[b, s : s + n], after[b, s : s + n], atol=ATOL)
            if (b, s) == (row, start):
                assert not same, "the changed document's logits did not move"
            else:
                assert same, f"row {b} document at {s} moved when row {row}'s document at {start} changed"


def cross_entropy(logits, pairs):
    index = torch.tensor([(b, t) for b, t, _ in pairs])
    return F.cross_entropy(logits[index[:, 0], index[:, 1]].float(), torch.tensor([y for _, _, y in pairs]))


@pytest.mark.parametrize("kind", ["gpt2", "llama"])
@pytest.mark.parametrize("implementation", ["eager", "sdpa"])
@pytest.mark.parametrize("mode", ["train", "eval"])
@pytest.mark.parametrize("loaded", [False, True], ids=["from_config", "from_pretrained"])
def test_clm_default_batch_keeps_documents_apart(kind, implementation, mode, loaded, tmp_path):
    model = model_for(kind, implementation, mode, tmp_path if loaded else None)
    collate = CausalCollator(PAD)
    examples = clm_rows()
    batch = collate(examples)
    assert "attention_mask" not in batch  # O(L): positions only
    for row, start, length in [(0, 0, 5), (0, 5, 9), (1, 0, 1), (1, 1, 19)]:
        assert_isolated(model, collate, examples, row, start, length)
    out = logits_of(model, batch)
    pairs = [(b, s + r, int(e["input_ids"][s + r + 1])) for b, e in enumerate(examples) for s, n in spans(e)
             for r in range(n - 1)]
    assert torch.allclose(out.loss, cross_entropy(out.logits, pairs), atol=1e-6)
    # the 4-D mask (documents="mask") gives the same logits: both equal each document run alone
    masked = logits_of(model, CausalCollator(PAD, documents="mask")(examples)).logits
    real = torch.from_numpy(np.arange(20)[None, :] < np.array([18, 20, 20])[:, None])
    assert torch.allclose(out.logits[real], masked[real], atol=ATOL)


def test_without_use_cache_false_positions_alone_do_not_separate_documents():
    """Why the batch carries ``use_cache=False``: with a cache (the config's default, train mode
    included) transformers ignores the restarting positions and attends across documents."""
    model = model_for("llama", "sdpa", "train")
    examples = clm_rows()
    collate = CausalCollator(PAD)
    strip = lambda batch: {k: v for k, v in batch.items() if k != "use_cache"}  # noqa: E731
    before = logits_of(model, strip(collate(examples))).logits
    after = logits_of(model, strip(collate(perturbed(examples, 0, 0, 5)))).logits
    assert not torch.allclose(before[0, 5:14], after[0, 5:14], atol=ATOL)


def objective_examples(name, params, doc_lengths_per_row, seed=0):
    """Examples the objective builds from chunks with these document segments (as the pipeline does)."""
    objective = make_objective(name, params)
    special = special_ids_from_tokenizer(TOKENIZER, {"special_ids": SPECIAL_IDS, "vocab_size": VOCAB}, objective)
    rng = np.random.default_rng(seed)
    raws, plans = objective.plan(rng.random(len(doc_lengths_per_row)))
    out = []
    for index, docs in enumerate(doc_lengths_per_row):
        n = min(int(raws[index]), sum(docs))
        docs = np.diff(np.minimum(np.cumsum([0, *docs]), n)).astype(np.int32)
        chunk = rng.integers(10, VOCAB, size=n).astype(np.int32)
        example, _ = build_example(objective, chunk, special, example_randoms(seed, [f"row-{index}"]),
                                   plan=int(plans[index]), doc_lengths=docs[docs > 0])
        out.append(example)
    return out


def prefix_pairs(examples):
    """Each segment's suffix tokens, predicted from the position before them."""
    pairs = []
    for b, e in enumerate(examples):
        ids = np.asarray(e["input_ids"]).tolist()
        for (s, n), p in zip(spans(e), np.asarray(e["prefix_lengths"]).tolist(), strict=True):
            pairs += [(b, s + r - 1, ids[s + r]) for r in range(max(p, 1), n)]
    return pairs


@pytest.mark.parametrize("implementation", ["eager", "sdpa"])
@pytest.mark.parametrize("mode", ["train", "eval"])
@pytest.mark.parametrize("loaded", [False, True], ids=["from_config", "from_pretrained"])
def test_prefix_lm_packed_segments_stay_apart(implementation, mode, loaded, tmp_path):
    model = model_for("llama", implementation, mode, tmp_path if loaded else None)
    examples = objective_examples("prefix_lm", {"seq_len": 32}, [[7, 12, 13], [32], [3, 1, 10]])
    assert [len(e["prefix_lengths"]) for e in examples] == [3, 1, 3]
    collate = PrefixLMCollator(PAD)
    for row, (start, length) in [(0, (0, 7)), (0, (7, 12)), (0, (19, 13)), (2, (3, 1)), (2, (4, 10))]:
        assert_isolated(model, collate, examples, row, start, length)
    out = logits_of(model, collate(examples))
    assert torch.allclose(out.loss, cross_entropy(out.logits, prefix_pairs(examples)), atol=1e-6)
    # within a segment the prefix is bidirectional: its first position sees the prefix's last token
    start, length = spans(examples[0])[1]
    prefix = int(examples[0]["prefix_lengths"][1])
    if prefix > 1:
        changed = perturbed(examples, 0, start + prefix - 1, 1)
        moved = logits_of(model, collate(changed)).logits
        assert not torch.allclose(moved[0, start], out.logits[0, start], atol=ATOL)
        assert torch.allclose(moved[0, :start], out.logits[0, :start], atol=ATOL)


@pytest.mark.parametrize("implementation", ["eager", "sdpa"])
@pytest.mark.parametrize("mode", ["train", "eval"])
def test_ul2_decoder_rows_stay_apart(implementation, mode):
    model = model_for("llama", implementation, mode)
    examples = objective_examples("ul2", {"inputs_length": 24, "layout": "decoder"}, [[200], [5, 6], [200], [40]])
    collate = PrefixLMCollator(PAD)
    batch = collate(examples)
    assert batch["input_ids"].shape[1] == max(int(np.sum(e["doc_lengths"])) for e in examples)
    for row in range(len(examples)):
        (start, length), = spans(examples[row])
        assert_isolated(model, collate, examples, row, start, length)
    out = logits_of(model, batch)
    assert torch.allclose(out.loss, cross_entropy(out.logits, prefix_pairs(examples)), atol=1e-6)
    # the row's targets never see later targets; its inputs (the prefix) are seen whole
    (start, length), = spans(examples[0])
    prefix = int(examples[0]["prefix_lengths"][0])
    later = logits_of(model, collate(perturbed(examples, 0, start + length - 1, 1))).logits
    assert torch.allclose(later[0, : length - 1], out.logits[0, : length - 1], atol=ATOL)
    first = logits_of(model, collate(perturbed(examples, 0, prefix - 1, 1))).logits
    assert not torch.allclose(first[0, 0], out.logits[0, 0], atol=ATOL)
