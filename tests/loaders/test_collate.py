"""Collators: exact tensors on small inputs, for every layout."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from loaders.collation.collate import collator_for
from loaders.collation.collate_decoder import CausalCollator, PrefixLMCollator
from loaders.collation.collate_encoder import MLMCollator, Seq2SeqCollator
from loaders.errors import UnsupportedSchemaError

X = -100
PAD = 0


def ex(ids, **kw):
    return {"key": "k", "input_ids": np.array(ids, np.int32), **{k: np.asarray(v) for k, v in kw.items()}}


CLM_BATCH = [ex([5, 6, 7, 8, 9, 0], doc_lengths=[2, 3]), ex([11, 12, 13, 14, 15, 16], doc_lengths=[6])]


def t(rows):
    return torch.tensor(rows, dtype=torch.int64)


def additive(allowed):
    """The additive float mask of a bool (L, L) pattern: 0 = attend, float32 min = not."""
    allowed = torch.tensor(allowed, dtype=torch.bool)
    return torch.where(allowed, 0.0, torch.finfo(torch.float32).min)


# [5 6 | 7 8 9 | pad] and one 6-token document: per-document causal attention
ROW0_DOCUMENTS = [
    [1, 0, 0, 0, 0, 0],
    [1, 1, 0, 0, 0, 0],
    [0, 0, 1, 0, 0, 0],
    [0, 0, 1, 1, 0, 0],
    [0, 0, 1, 1, 1, 0],
    [0, 0, 0, 0, 0, 1],  # the padding is a segment of its own: no empty softmax row
]


def test_causal_default_is_o_of_l_document_positions():
    out = CausalCollator(PAD)(CLM_BATCH)
    # no mask: transformers derives the per-document mask from the restarting positions, which it
    # does only without a cache (so the batch turns the cache off)
    assert list(out) == ["input_ids", "labels", "position_ids", "use_cache"] and out["use_cache"] is False
    assert torch.equal(out["input_ids"], t([[5, 6, 7, 8, 9, 0], [11, 12, 13, 14, 15, 16]]))
    # unshifted (the model shifts); -100 at each document's first token and on padding
    assert torch.equal(out["labels"], t([[X, 6, X, 8, 9, X], [X, 12, 13, 14, 15, 16]]))
    assert torch.equal(out["position_ids"], t([[0, 1, 0, 1, 2, 0], [0, 1, 2, 3, 4, 5]]))
    bare = CausalCollator(PAD, model_arguments=False)(CLM_BATCH)  # a forward without use_cache
    assert list(bare) == ["input_ids", "labels", "position_ids"]


def test_causal_mask_mode_is_the_per_document_4d_mask():
    out = CausalCollator(PAD, documents="mask")(CLM_BATCH)
    assert list(out) == ["input_ids", "attention_mask", "labels", "position_ids"]
    default = CausalCollator(PAD)(CLM_BATCH)
    assert torch.equal(out["labels"], default["labels"]) and torch.equal(out["position_ids"], default["position_ids"])
    mask = out["attention_mask"]
    assert mask.shape == (2, 1, 6, 6) and mask.dtype == torch.float32
    assert torch.equal(mask[0, 0], additive(ROW0_DOCUMENTS))
    assert torch.equal(mask[1, 0], additive(np.tril(np.ones((6, 6)))))
    assert not torch.isnan(mask).any() and (mask.amax(-1) == 0).all()  # every query attends somewhere


def test_causal_megatron_shift_is_an_option():
    out = CausalCollator(PAD, shift_labels=True)(CLM_BATCH)
    # labels[t] = token t+1; none across the document boundary (after 6), none into padding
    assert torch.equal(out["labels"], t([[6, X, 8, 9, X, X], [12, 13, 14, 15, 16, X]]))
    kept = CausalCollator(PAD, shift_labels=True, mask_document_boundaries=False)(CLM_BATCH[:1])
    assert torch.equal(kept["labels"], t([[6, 7, 8, 9, X]]))  # the single row is trimmed to its 5 tokens


def test_causal_position_ids_mode_and_flash_attention_kwargs():
    plain = CausalCollator(PAD, documents="position_ids")(CLM_BATCH)
    assert list(plain) == ["input_ids", "labels", "position_ids", "use_cache"]  # no mask: the model derives it
    assert torch.equal(plain["position_ids"], t([[0, 1, 0, 1, 2, 0], [0, 1, 2, 3, 4, 5]]))
    flash = CausalCollator(PAD, documents="position_ids", flash_attention_kwargs=True)(CLM_BATCH)
    assert torch.equal(flash["cu_seq_lens_q"], torch.tensor([0, 2, 5, 6, 12], dtype=torch.int32))
    assert torch.equal(flash["cu_seq_lens_k"], flash["cu_seq_lens_q"])
    assert flash["max_length_q"] == flash["max_length_k"] == 6 and type(flash["max_length_q"]) is int
    with pytest.raises(ValueError, match="documents='position_ids'"):
        CausalCollator(PAD, documents="mask", flash_attention_kwargs=True)
    with pytest.raises(ValueError, match=r"documents='cu_seqlens': expected one of \('position_ids', 'mask', 'none'\)"):
        CausalCollator(PAD, documents="cu_seqlens")
    with pytest.raises(ValueError, match="floating dtype"):
        CausalCollator(PAD, mask_dtype=torch.bool)


def test_causal_plain_attention_and_mask_dtypes():
    plain = CausalCollator(PAD, documents="none")(CLM_BATCH)
    assert torch.equal(plain["labels"], t([[5, 6, 7, 8, 9, X], [11, 12, 13, 14, 15, 16]]))
    assert torch.equal(plain["attention_mask"], t([[1, 1, 1, 1, 1, 0], [1, 1, 1, 1, 1, 1]]))
    assert torch.equal(plain["position_ids"], t([[0, 1, 2, 3, 4, 5]] * 2))
    for dtype in (torch.bfloat16, torch.float16, "float64"):
        mask = CausalCollator(PAD, documents="mask", mask_dtype=dtype, trim_padding=False)(CLM_BATCH[:1])[
            "attention_mask"]
        expected_dtype = getattr(torch, str(dtype).replace("torch.", ""))
        assert mask.dtype == expected_dtype and not torch.isinf(mask).any()
        assert torch.equal(mask[0, 0] == 0, torch.tensor(ROW0_DOCUMENTS, dtype=torch.bool))
        assert mask.min() == torch.finfo(expected_dtype).min


def test_causal_pads_variable_rows():
    out = CausalCollator(PAD, pad_to_multiple_of=4, documents="position_ids",
                         flash_attention_kwargs=True)([ex([3, 4, 5]), ex([6, 7])])
    assert torch.equal(out["input_ids"], t([[3, 4, 5, 0], [6, 7, 0, 0]]))
    assert torch.equal(out["labels"], t([[X, 4, 5, X], [X, 7, X, X]]))
    assert torch.equal(out["position_ids"], t([[0, 1, 2, 0], [0, 1, 0, 1]]))
    assert torch.equal(out["cu_seq_lens_q"], torch.tensor([0, 3, 4, 6, 8], dtype=torch.int32))
    with pytest.raises(ValueError, match="pad id"):
        CausalCollator(None)([ex([3, 4, 5]), ex([6, 7])])


def test_padding_shared_by_every_row_is_trimmed():
    batch = [ex([5, 6, 7, 0, 0, 0], doc_lengths=[3]), ex([8, 9, 0, 0, 0, 0], doc_lengths=[2])]
    assert CausalCollator(PAD)(batch)["input_ids"].shape == (2, 3)
    assert CausalCollator(PAD, pad_to_multiple_of=4)(batch)["input_ids"].shape == (2, 4)
    assert CausalCollator(PAD, trim_padding=False)(batch)["input_ids"].shape == (2, 6)
    out = PrefixLMCollator(PAD)([ex([5, 6, 7, 0, 0], prefix_lengths=[1], doc_lengths=[3])])
    assert torch.equal(out["input_ids"], t([[5, 6, 7]])) and out["attention_mask"].shape == (1, 1, 3, 3)
    mlm = MLMCollator(PAD)([ex([7, 4, 0, 0], labels=[X, 8, X, X]), ex([4, 5, 6, 0], labels=[6, X, X, X])])
    assert torch.equal(mlm["input_ids"], t([[7, 4, 0], [4, 5, 6]]))
    assert torch.equal(mlm["labels"], t([[X, 8, X], [6, X, X]]))


def test_prefix_lm():
    batch = [ex([21, 22, 23, 24, 0], prefix_lengths=[2], doc_lengths=[4]), ex([31, 32, 33])]
    out = PrefixLMCollator(PAD)(batch)
    assert list(out) == ["input_ids", "attention_mask", "labels", "position_ids"]  # only what HF models take
    assert torch.equal(out["input_ids"], t([[21, 22, 23, 24], [31, 32, 33, 0]]))  # trimmed to the longest row
    # loss on the suffix only, unshifted: token 23 (predicted from the end of the prefix) on
    assert torch.equal(out["labels"], t([[X, X, 23, 24], [X, 32, 33, X]]))
    assert torch.equal(out["attention_mask"][0, 0], additive([
        [1, 1, 0, 0],
        [1, 1, 0, 0],
        [1, 1, 1, 0],
        [1, 1, 1, 1],
    ]))
    assert torch.equal(out["attention_mask"][1, 0], additive([
        [1, 0, 0, 0],
        [1, 1, 0, 0],
        [1, 1, 1, 0],
        [0, 0, 0, 1],  # padding: a segment of its own (never an empty softmax row)
    ]))
    shifted = PrefixLMCollator(PAD, shift_labels=True, return_prefix_length=True)(batch[:1])
    assert torch.equal(shifted["labels"], t([[X, 23, 24, X]]))
    assert torch.equal(shifted["prefix_length"], t([2]))


def test_packed_prefix_lm_keeps_each_document_a_segment_of_its_own():
    # documents [21 22 23 | 24 25 26 27] with prefixes 1 and 2, then one padding token
    batch = [ex([21, 22, 23, 24, 25, 26, 27, 0], doc_lengths=[3, 4], prefix_lengths=[1, 2])]
    out = PrefixLMCollator(PAD, return_prefix_length=True, trim_padding=False)(batch)
    assert torch.equal(out["position_ids"], t([[0, 1, 2, 0, 1, 2, 3, 0]]))
    # each suffix is the loss; a segment's first token never is (nothing of its own before it)
    assert torch.equal(out["labels"], t([[X, 22, 23, X, X, 26, 27, X]]))
    assert torch.equal(out["attention_mask"][0, 0], additive([
        [1, 0, 0, 0, 0, 0, 0, 0],
        [1, 1, 0, 0, 0, 0, 0, 0],
        [1, 1, 1, 0, 0, 0, 0, 0],
        [0, 0, 0, 1, 1, 0, 0, 0],  # the second prefix is bidirectional within itself ...
        [0, 0, 0, 1, 1, 0, 0, 0],
        [0, 0, 0, 1, 1, 1, 0, 0],  # ... its suffix causal, and nothing crosses documents
        [0, 0, 0, 1, 1, 1, 1, 0],
        [0, 0, 0, 0, 0, 0, 0, 1],
    ]))
    assert torch.equal(out["prefix_length"], t([3]))
    shifted = PrefixLMCollator(PAD, shift_labels=True, trim_padding=False)(batch)
    assert torch.equal(shifted["labels"], t([[22, 23, X, X, 26, 27, X, X]]))
    # format 2's single prefix_length: the row is one segment with that prefix
    old = PrefixLMCollator(PAD)([ex([21, 22, 23, 24], doc_lengths=[2, 2], prefix_length=3)])
    assert torch.equal(old["position_ids"], t([[0, 1, 2, 3]])) and torch.equal(old["labels"], t([[X, X, X, 24]]))
    with pytest.raises(ValueError, match="prefix_lengths has 1 entries for 2 documents"):
        PrefixLMCollator(PAD)([ex([21, 22, 23, 24], doc_lengths=[2, 2], prefix_lengths=[1])])
    # a BlockMask for flex attention, the same pattern
    block = PrefixLMCollator(PAD, attn_implementation="flex_attention", trim_padding=False)(batch)["attention_mask"]
    dense = block.to_dense()[0, 0, :8, :8].bool()  # at block granularity: a single block holds the whole row
    assert dense.all() and block.mask_mod(torch.tensor(0), torch.tensor(0), torch.tensor(3), torch.tensor(4))
    assert not block.mask_mod(torch.tensor(0), torch.tensor(0), torch.tensor(3), torch.tensor(2))


def test_mlm():
    batch = [ex([7, 4, 9, 0], labels=[X, 8, X, X]), ex([4, 5], labels=[6, X])]
    out = MLMCollator(PAD, pad_to_multiple_of=4)(batch)
    assert torch.equal(out["input_ids"], t([[7, 4, 9, 0], [4, 5, 0, 0]]))
    assert torch.equal(out["attention_mask"], t([[1, 1, 1, 0], [1, 1, 0, 0]]))
    assert torch.equal(out["labels"], t([[X, 8, X, X], [6, X, X, X]]))
    assert "position_ids" not in out  # encoders number positions their own way (RoBERTa: from pad + 1)
    assert torch.equal(MLMCollator(PAD, return_position_ids=True)(batch)["position_ids"], t([[0, 1, 2]] * 2))


def test_seq2seq():
    batch = [{"inputs": np.array([8, 5, 1]), "targets": np.array([5, 6, 7, 1])},
             {"inputs": np.array([9, 1]), "targets": np.array([3, 1])}]
    out = Seq2SeqCollator(PAD)(batch)
    assert torch.equal(out["input_ids"], t([[8, 5, 1], [9, 1, 0]]))
    assert torch.equal(out["attention_mask"], t([[1, 1, 1], [1, 1, 0]]))
    assert torch.equal(out["labels"], t([[5, 6, 7, 1], [3, 1, X, X]]))
    assert torch.equal(out["decoder_input_ids"], t([[0, 5, 6, 7], [0, 3, 1, 0]]))
    assert torch.equal(out["decoder_attention_mask"], t([[1, 1, 1, 1], [1, 1, 1, 0]]))
    assert "position_ids" not in out  # T5 and BART take none
    bart = Seq2SeqCollator(PAD, decoder_start_id=1, inputs_length=4, targets_length=5)(batch)
    assert bart["input_ids"].shape == (2, 4) and bart["labels"].shape == (2, 5)
    assert torch.equal(bart["decoder_input_ids"][1], t([1, 3, 1, 0, 0]))
    with pytest.raises(ValueError, match="fixed length 3"):
        Seq2SeqCollator(PAD, targets_length=3)(batch)


def test_missing_columns_are_named():
    with pytest.raises(UnsupportedSchemaError, match=r"MLMCollator needs columns \['input_ids', 'labels'\]"):
        MLMCollator(PAD)(CLM_BATCH)
    with pytest.raises(UnsupportedSchemaError, match="Seq2SeqCollator.*missing"):
        Seq2SeqCollator(PAD)(CLM_BATCH)


class _Described:
    def __init__(self, family, columns, objective="x", special=None):
        self.family, self._columns, self.objective_name = family, columns, objective
        self.special_ids = special if special is not None else {"pad": 0, "eos": 1}

    def example_columns(self):
        return self._columns


def test_collator_for_picks_by_family_and_columns():
    assert type(collator_for(_Described("decoder", ["input_ids", "doc_lengths"]))) is CausalCollator
    assert type(collator_for(_Described("decoder", ["input_ids", "prefix_lengths"]))) is PrefixLMCollator
    assert type(collator_for(_Described("decoder", ["input_ids", "prefix_length"]))) is PrefixLMCollator  # format 2
    assert type(collator_for(_Described("encoder", ["input_ids", "labels"]))) is MLMCollator
    t5 = collator_for(_Described("seq2seq", ["inputs", "targets"]))
    bart = collator_for(_Described("seq2seq", ["inputs", "targets"], objective="bart"))
    assert (t5.decoder_start_id, bart.decoder_start_id) == (0, 1)
    assert collator_for(_Described("decoder", ["input_ids"])).documents == "position_ids"
    assert collator_for(_Described("decoder", ["input_ids"]), documents="none").documents == "none"
    with pytest.raises(UnsupportedSchemaError, match="family 'images'"):
        collator_for(_Described("images", ["pixels"]))
    with pytest.raises(UnsupportedSchemaError, match="pad id"):
        collator_for(_Described("encoder", ["input_ids", "labels"], special={}))


OBJECTIVE_PARAMS = {
    "clm": {"seq_len": 64},
    "prefix_lm": {"seq_len": 64},
    "mlm": {"seq_len": 64},
    "span_corruption": {"inputs_length": 48},
    "bart": {"seq_len": 64},
    "ul2": {"inputs_length": 48},
    "ul2-decoder": {"inputs_length": 48, "layout": "decoder"},
}


@pytest.mark.parametrize("name", sorted(OBJECTIVE_PARAMS))
def test_collators_on_examples_of_every_objective(name):
    """Each objective's own examples (built as the pipeline builds them) collate exactly."""
    from conftest import SPECIAL_IDS, TOKENIZER

    from loaders.dynamic import special_ids_from_tokenizer
    from transforms.objectives.registry import OBJECTIVES, make_objective

    registry_name = name.split("-")[0]
    assert registry_name in OBJECTIVES
    objective = make_objective(registry_name, OBJECTIVE_PARAMS[name])
    special = special_ids_from_tokenizer(TOKENIZER, {"special_ids": SPECIAL_IDS, "vocab_size": 8000}, objective)
    from transforms.objectives.base import build_example
    from transforms.objectives.layout import example_randoms

    examples, unpadded = [], []
    for seed in range(2):
        raws, plans = objective.plan(np.array([np.random.default_rng(seed).random()]))
        tokens = np.arange(200, 200 + int(raws[0]) - 5 * seed, dtype=np.int32)  # the second chunk is short
        starts = np.zeros(len(tokens), bool)
        starts[:: 7] = True
        features = {"word_starts": np.ones(len(tokens), bool), "space_starts": np.ones(len(tokens), bool),
                    "sentence_starts": starts}
        example, counters = build_example(objective, tokens, special, example_randoms(seed, [f"k{seed}"]),
                                          plan=int(plans[0]), features=features)
        examples.append(example)  # as stored: fixed-length columns padded
        unpadded.append({name: example[name][: counters[f"{name}_tokens"]] if f"{name}_tokens" in counters
                         else example[name] for name in example})

    class Described:
        family, objective_name, special_ids = objective.family, registry_name, SPECIAL_IDS

        @staticmethod
        def example_columns():
            return list(examples[0])

    out = collator_for(Described)(examples)
    ids, labels = out["input_ids"].numpy(), out["labels"].numpy()
    for i, example in enumerate(unpadded):
        if objective.family == "seq2seq":
            inputs, targets = np.asarray(example["inputs"]), np.asarray(example["targets"])
            assert ids[i, : len(inputs)].tolist() == inputs.tolist() and (ids[i, len(inputs) :] == PAD).all()
            assert labels[i, : len(targets)].tolist() == targets.tolist() and (labels[i, len(targets) :] == X).all()
            start = SPECIAL_IDS["eos"] if registry_name == "bart" else PAD
            assert out["decoder_input_ids"][i, : len(targets)].tolist() == [start, *targets[:-1].tolist()]
        elif objective.family == "encoder":
            assert ids[i].tolist() == np.asarray(example["input_ids"]).tolist()
            real = ids[i] != PAD
            assert labels[i].tolist() == np.where(real, example["labels"], X).tolist()
        else:
            row = np.asarray(example["input_ids"])
            real = int(np.sum(example["doc_lengths"]))
            docs = np.asarray(example["doc_lengths"]).tolist()
            prefixes = np.asarray(example.get("prefix_lengths", [0] * len(docs))).tolist()
            # unshifted labels (HF): each segment's suffix (prefix_lm), every token of a document but its
            # first (clm)
            expected, start = [], 0
            for d, p in zip(docs, prefixes, strict=True):
                expected += [row[start + r] if r >= max(p, 1) else X for r in range(d)]
                start += d
            assert ids[i, :real].tolist() == row[:real].tolist() and labels[i, :real].tolist() == expected
            assert (labels[i, real:] == X).all()
            if "prefix_lengths" in example:  # each segment: its prefix bidirectional, the rest causal, alone
                mask = out["attention_mask"][i, 0].numpy() == 0
                start = 0
                for d, p in zip(docs, prefixes, strict=True):
                    seg = mask[start : start + d]
                    assert seg[:p, start : start + p].all() and not seg[:p, start + p : start + d].any()
                    assert seg[d - 1, start : start + d].all() and not seg[:, :start].any()
                    assert not seg[:, start + d :].any()
                    start += d
