"""The collators' batches meet real HF models (tiny configs, untrained, nothing downloaded).

Nothing is trained: for each objective and layout ``model(**batch)`` runs and its loss equals
the loss computed by hand from the logits with the targets taken from the examples themselves
(next tokens within a document, the suffix of a prefix, the masked positions, the targets);
eager and sdpa attention give the same logits under the collators' masks, and those equal
running each document (or each row) alone. Document isolation in train and eval mode, for
models loaded with ``from_pretrained`` too, is tests/loaders/test_document_isolation.py's; flex
attention's, tests/loaders/test_flex_attention.py's.
"""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from conftest import SPECIAL_IDS, TOKENIZER
from hf_models import EOS, PAD, VOCAB, tiny_model

from loaders import ShardedDataset, make_dataloader
from loaders.collation.collate_decoder import CausalCollator, PrefixLMCollator
from loaders.collation.collate_encoder import MLMCollator, Seq2SeqCollator
from loaders.dynamic import special_ids_from_tokenizer
from transforms.objectives.base import build_example
from transforms.objectives.layout import example_randoms
from transforms.objectives.registry import make_objective

IMPLEMENTATIONS = ("eager", "sdpa")
ATOL = 2e-5


def tokens(rng, n):
    return rng.integers(10, VOCAB, size=n).astype(np.int32)


def packed_rows():
    """Packed clm rows (documents of 5, 9, 2 + padding; one document; 1 + 19 tokens), width 20."""
    rng = np.random.default_rng(0)
    rows = []
    for docs in ([5, 9, 2], [20], [1, 19], [3, 3, 3]):
        ids = np.zeros(20, np.int32)
        ids[: sum(docs)] = tokens(rng, sum(docs))
        rows.append({"input_ids": ids, "doc_lengths": np.array(docs, np.int32)})
    return rows


def documents(example):
    """``(start, length)`` of each document of a row."""
    lengths = np.asarray(example["doc_lengths"]).tolist()
    starts = np.cumsum([0, *lengths[:-1]]).tolist()
    return list(zip(starts, lengths, strict=True))


def hand_loss(logits, pairs):
    """Mean cross-entropy of ``logits[b, t]`` against ``target`` over ``pairs`` of ``(b, t, target)``."""
    index = torch.tensor([(b, t) for b, t, _ in pairs])
    targets = torch.tensor([target for _, _, target in pairs])
    return F.cross_entropy(logits[index[:, 0], index[:, 1]].float(), targets)


def next_token_pairs(examples, *, across_documents=False):
    """Position t predicts token t+1 of the same document (any document with ``across_documents``)."""
    pairs = []
    for b, example in enumerate(examples):
        ids = np.asarray(example["input_ids"]).tolist()
        spans = documents(example) if not across_documents else [(0, int(np.sum(example["doc_lengths"])))]
        for start, length in spans:
            pairs += [(b, t, ids[t + 1]) for t in range(start, start + length - 1)]
    return pairs


def run(model, batch, **kwargs):
    with torch.no_grad():
        return model(**batch, **kwargs)


@pytest.mark.parametrize("kind", ["gpt2", "llama"])
@pytest.mark.parametrize("documents", ["mask", "position_ids", "none"])
def test_causal_loss_is_next_token_cross_entropy(kind, documents):
    examples = packed_rows()
    batch = CausalCollator(PAD, documents=documents)(examples)
    pairs = next_token_pairs(examples, across_documents=documents == "none")
    for impl in IMPLEMENTATIONS:
        # position_ids batches carry use_cache=False: HF derives packed documents from positions only without a cache
        out = run(tiny_model(kind, impl), batch)
        assert torch.allclose(out.loss, hand_loss(out.logits, pairs), atol=1e-6), (impl, documents)


@pytest.mark.parametrize("kind", ["gpt2", "llama"])
def test_document_masks_equal_running_each_document_alone(kind):
    examples = packed_rows()
    masked = CausalCollator(PAD, documents="mask")(examples)
    flat = CausalCollator(PAD)(examples)
    logits = {impl: run(tiny_model(kind, impl), masked).logits for impl in IMPLEMENTATIONS}
    assert torch.allclose(logits["eager"], logits["sdpa"], atol=ATOL)
    by_positions = run(tiny_model(kind, "sdpa"), flat).logits
    model = tiny_model(kind, "eager")
    for b, example in enumerate(examples):
        for start, length in documents(example):
            alone = run(model, {"input_ids": torch.from_numpy(example["input_ids"][start : start + length][None])})
            for got in (logits["eager"], logits["sdpa"], by_positions):
                assert torch.allclose(got[b, start : start + length], alone.logits[0], atol=ATOL), (b, start)
    assert not torch.isnan(logits["eager"]).any()  # padding rows are never fully masked


def test_packed_batch_matches_hf_data_collator_with_flattening():
    from transformers import DataCollatorWithFlattening

    rng = np.random.default_rng(1)
    docs = [tokens(rng, n) for n in (4, 1, 7, 3)]
    hf = DataCollatorWithFlattening(return_flash_attn_kwargs=True)([{"input_ids": d.tolist()} for d in docs])
    ours = CausalCollator(PAD, flash_attention_kwargs=True)(
        [{"input_ids": np.concatenate(docs), "doc_lengths": np.array([len(d) for d in docs], np.int32)}])
    assert sorted(ours) == sorted([*hf, "use_cache"]) and ours["use_cache"] is False
    for key in ("input_ids", "labels", "position_ids", "cu_seq_lens_q", "cu_seq_lens_k"):
        assert torch.equal(ours[key], hf[key].to(ours[key].dtype)), key
    assert ours["max_length_q"] == hf["max_length_q"] == ours["max_length_k"] == hf["max_length_k"] == 7
    masked = CausalCollator(PAD, documents="mask")(
        [{"input_ids": np.concatenate(docs), "doc_lengths": [len(d) for d in docs]}])
    assert torch.equal(masked["labels"], hf["labels"]) and torch.equal(masked["position_ids"], hf["position_ids"])
    for impl in IMPLEMENTATIONS:
        model = tiny_model("llama", impl)
        theirs = run(model, {k: hf[k] for k in ("input_ids", "labels", "position_ids")}, use_cache=False)
        mine = run(model, masked)
        assert torch.allclose(mine.logits, theirs.logits, atol=ATOL) and torch.allclose(mine.loss, theirs.loss)


def test_real_dataset_batch_through_the_loader(clm_dataset):
    examples = list(itertools.islice(iter(ShardedDataset(clm_dataset, batch_size=4, seed=2)), 4))
    batch = next(iter(make_dataloader(ShardedDataset(clm_dataset, batch_size=4, seed=2), num_workers=0)))
    assert torch.equal(batch["input_ids"], torch.from_numpy(np.stack([e["input_ids"] for e in examples])).long())
    out = run(tiny_model("gpt2", "sdpa"), batch)
    assert torch.allclose(out.loss, hand_loss(out.logits, next_token_pairs(examples)), atol=1e-6)


def objective_examples(name, params, lengths, seed=0):
    """Examples built by an objective as the pipeline builds them, from chunks of the given lengths."""
    objective = make_objective(name, params)
    special = special_ids_from_tokenizer(TOKENIZER, {"special_ids": SPECIAL_IDS, "vocab_size": VOCAB}, objective)
    rng = np.random.default_rng(seed)
    out = []
    raws, plans = objective.plan(rng.random(len(lengths)))
    for index, n in enumerate(lengths):
        chunk = tokens(rng, min(int(raws[index]), n))
        starts = np.zeros(len(chunk), bool)
        starts[::6] = True
        features = {"word_starts": rng.random(len(chunk)) < 0.6, "space_starts": rng.random(len(chunk)) < 0.4,
                    "sentence_starts": starts}
        example, _ = build_example(objective, chunk, special, example_randoms(seed, [f"row-{index}"]),
                                   plan=int(plans[index]), features=features)
        out.append(example)
    return out


def prefix_pairs(examples):
    pairs = []
    for b, example in enumerate(examples):
        ids = np.asarray(example["input_ids"]).tolist()
        starts = np.cumsum([0, *np.asarray(example["doc_lengths"]).tolist()])
        prefixes = np.asarray(example.get("prefix_lengths", np.zeros(len(starts) - 1, np.int64))).tolist()
        for start, end, prefix in zip(starts[:-1].tolist(), starts[1:].tolist(), prefixes, strict=True):
            pairs += [(b, t, ids[t + 1]) for t in range(start + max(prefix - 1, 0), end - 1)]
    return pairs


def prefix_allowed(prefix, real):
    q, k = np.arange(real)[:, None], np.arange(real)[None, :]
    return (k <= q) | (k < prefix)


@pytest.mark.parametrize("name, params", [("prefix_lm", {"seq_len": 24}),
                                          ("ul2", {"inputs_length": 24, "layout": "decoder"})])
def test_prefix_lm_loss_masks_and_separate_rows(name, params):
    examples = objective_examples(name, params, [200, 200, 11, 200])
    width = len(examples[0]["input_ids"])
    examples.append({"input_ids": examples[0]["input_ids"].copy(), "doc_lengths": examples[0]["doc_lengths"]})  # clm
    batch = PrefixLMCollator(PAD)(examples)
    longest = max(int(np.sum(e["doc_lengths"])) for e in examples)
    assert batch["input_ids"].shape == (5, longest) and set(batch) == {"input_ids", "attention_mask", "labels",
                                                                       "position_ids"}
    if name == "ul2":
        assert longest < width  # rows stored at the longest denoiser's length are trimmed
    pairs = prefix_pairs(examples)
    logits = {}
    for impl in IMPLEMENTATIONS:
        out = run(tiny_model("llama", impl), batch)
        assert torch.allclose(out.loss, hand_loss(out.logits, pairs), atol=1e-6)
        logits[impl] = out.logits
    assert torch.allclose(logits["eager"], logits["sdpa"], atol=ATOL)
    model = tiny_model("llama", "eager")
    for b, example in enumerate(examples):
        real, prefix = int(np.sum(example["doc_lengths"])), int(np.sum(example.get("prefix_lengths", [0])))
        ids = torch.from_numpy(np.asarray(example["input_ids"][:real], np.int64))[None]
        mask = torch.where(torch.from_numpy(prefix_allowed(prefix, real)), 0.0, torch.finfo(torch.float32).min)
        alone = run(model, {"input_ids": ids, "attention_mask": mask[None, None]}).logits
        assert torch.allclose(logits["eager"][b, :real], alone[0], atol=ATOL)
        changed = ids.clone()
        changed[0, -1] = (changed[0, -1] + 1) % VOCAB  # the future never leaks into earlier positions
        later = run(model, {"input_ids": changed, "attention_mask": mask[None, None]}).logits
        assert torch.allclose(later[0, : real - 1], alone[0, : real - 1], atol=ATOL)
        if prefix > 1:  # ... but the prefix is seen whole from its first position
            changed = ids.clone()
            changed[0, prefix - 1] = (changed[0, prefix - 1] + 1) % VOCAB
            first = run(model, {"input_ids": changed, "attention_mask": mask[None, None]}).logits[0, 0]
            assert not torch.allclose(first, alone[0, 0], atol=1e-4)


def test_mlm_loss_is_masked_position_cross_entropy():
    examples = objective_examples("mlm", {"seq_len": 24}, [200, 9, 200])
    batch = MLMCollator(PAD)(examples)
    pairs = [(b, t, int(label)) for b, e in enumerate(examples) for t, label in enumerate(e["labels"]) if label != -100]
    assert len({b for b, _, _ in pairs}) == 3
    logits = {}
    for impl in IMPLEMENTATIONS:
        out = run(tiny_model("bert", impl), batch)
        assert torch.allclose(out.loss, hand_loss(out.logits, pairs), atol=1e-6)
        logits[impl] = out.logits
    real = batch["attention_mask"].bool()
    assert torch.allclose(logits["eager"][real], logits["sdpa"][real], atol=ATOL)
    short = examples[1]  # a padded row equals the row run alone
    n = int((short["input_ids"] != PAD).sum())
    ids = torch.from_numpy(short["input_ids"][:n].astype(np.int64))[None]
    alone = run(tiny_model("bert", "eager"), {"input_ids": ids})
    assert torch.allclose(logits["eager"][1, :n], alone.logits[0], atol=ATOL)


@pytest.mark.parametrize("name, params, kind", [
    ("span_corruption", {"inputs_length": 24}, "t5"),
    ("ul2", {"inputs_length": 24}, "t5"),
    ("bart", {"seq_len": 24}, "bart"),
])
def test_seq2seq_loss_is_target_cross_entropy(name, params, kind):
    from transformers.models.bart.modeling_bart import shift_tokens_right

    examples = objective_examples(name, params, [200, 12, 200])
    start = EOS if kind == "bart" else PAD
    batch = Seq2SeqCollator(PAD, decoder_start_id=start)(examples)
    assert set(batch) == {"input_ids", "attention_mask", "labels", "decoder_input_ids", "decoder_attention_mask"}
    # the decoder inputs are what the model would derive from the labels itself
    assert torch.equal(batch["decoder_input_ids"], shift_tokens_right(batch["labels"], PAD, start))
    pairs = [(b, j, int(token)) for b, e in enumerate(examples) for j, token in enumerate(e["targets"])
             if token != PAD]
    logits = {}
    for impl in IMPLEMENTATIONS:
        out = run(tiny_model(kind, impl), batch)
        assert torch.allclose(out.loss, hand_loss(out.logits, pairs), atol=1e-6)
        logits[impl] = out.logits
    assert torch.allclose(logits["eager"], logits["sdpa"], atol=ATOL)
    without = run(tiny_model(kind, "eager"), {k: v for k, v in batch.items() if k != "decoder_input_ids"})
    assert torch.allclose(without.logits, logits["eager"], atol=ATOL)  # HF's own shift agrees
