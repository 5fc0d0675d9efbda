"""Collators: exact tensors on small inputs, for every layout."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from loaders.collate import CausalCollator, MLMCollator, PrefixLMCollator, Seq2SeqCollator, collator_for
from loaders.errors import UnsupportedSchemaError

X = -100
PAD = 0


def ex(ids, **kw):
    return {"key": "k", "input_ids": np.array(ids, np.int32), **{k: np.asarray(v) for k, v in kw.items()}}


CLM_BATCH = [ex([5, 6, 7, 8, 9, 0], doc_lengths=[2, 3]), ex([11, 12, 13, 14, 15, 16], doc_lengths=[6])]


def t(rows):
    return torch.tensor(rows, dtype=torch.int64)


def test_causal_cu_seqlens():
    out = CausalCollator(PAD)(CLM_BATCH)
    assert torch.equal(out["input_ids"], t([[5, 6, 7, 8, 9, 0], [11, 12, 13, 14, 15, 16]]))
    assert torch.equal(out["attention_mask"], t([[1, 1, 1, 1, 1, 0], [1, 1, 1, 1, 1, 1]]))
    # labels[t] = token t+1; none across the document boundary (after 6), none into padding
    assert torch.equal(out["labels"], t([[6, X, 8, 9, X, X], [12, 13, 14, 15, 16, X]]))
    assert torch.equal(out["position_ids"], t([[0, 1, 0, 1, 2, 0], [0, 1, 2, 3, 4, 5]]))
    assert torch.equal(out["cu_seqlens"], torch.tensor([0, 2, 5, 6, 12], dtype=torch.int32))
    assert out["max_seqlen"] == 6


def test_causal_block_mask():
    out = CausalCollator(PAD, documents="mask")(CLM_BATCH[:1])
    expected = torch.tensor([
        [1, 0, 0, 0, 0, 0],
        [1, 1, 0, 0, 0, 0],
        [0, 0, 1, 0, 0, 0],
        [0, 0, 1, 1, 0, 0],
        [0, 0, 1, 1, 1, 0],
        [0, 0, 0, 0, 0, 1],
    ], dtype=torch.bool)
    assert out["attention_mask"].shape == (1, 1, 6, 6) and out["attention_mask"].dtype == torch.bool
    assert torch.equal(out["attention_mask"][0, 0], expected)
    assert torch.equal(out["position_ids"], t([[0, 1, 0, 1, 2, 0]]))


def test_causal_plain_and_unshifted():
    plain = CausalCollator(PAD, documents="none")(CLM_BATCH)
    assert torch.equal(plain["labels"], t([[6, 7, 8, 9, X, X], [12, 13, 14, 15, 16, X]]))
    assert torch.equal(plain["position_ids"], t([[0, 1, 2, 3, 4, 5]] * 2))
    assert "cu_seqlens" not in plain
    unshifted = CausalCollator(PAD, shift_labels=False)(CLM_BATCH)  # Hugging Face models shift inside
    assert torch.equal(unshifted["labels"], t([[5, 6, X, 8, 9, X], [11, 12, 13, 14, 15, 16]]))
    kept = CausalCollator(PAD, mask_document_boundaries=False)(CLM_BATCH[:1])
    assert torch.equal(kept["labels"], t([[6, 7, 8, 9, X, X]]))


def test_causal_pads_variable_rows():
    out = CausalCollator(PAD, pad_to_multiple_of=4)([ex([3, 4, 5]), ex([6, 7])])
    assert torch.equal(out["input_ids"], t([[3, 4, 5, 0], [6, 7, 0, 0]]))
    assert torch.equal(out["labels"], t([[4, 5, X, X], [7, X, X, X]]))
    assert torch.equal(out["position_ids"], t([[0, 1, 2, 0], [0, 1, 0, 1]]))
    assert torch.equal(out["cu_seqlens"], torch.tensor([0, 3, 4, 6, 8], dtype=torch.int32))
    with pytest.raises(ValueError, match="pad id"):
        CausalCollator(None)([ex([3, 4, 5]), ex([6, 7])])


def test_prefix_lm():
    batch = [ex([21, 22, 23, 24, 0], prefix_length=2, doc_lengths=[4]), ex([31, 32, 33])]
    out = PrefixLMCollator(PAD)(batch)
    assert torch.equal(out["input_ids"], t([[21, 22, 23, 24, 0], [31, 32, 33, 0, 0]]))
    # loss on the suffix only: position 1 (end of the prefix) predicts 23
    assert torch.equal(out["labels"], t([[X, 23, 24, X, X], [32, 33, X, X, X]]))
    assert torch.equal(out["prefix_length"], t([2, 0]))
    expected = torch.tensor([
        [1, 1, 0, 0, 0],
        [1, 1, 0, 0, 0],
        [1, 1, 1, 0, 0],
        [1, 1, 1, 1, 0],
        [1, 1, 1, 1, 1],  # padding row: the real tokens and itself
    ], dtype=torch.bool)
    assert torch.equal(out["attention_mask"][0, 0], expected)
    assert torch.equal(out["attention_mask"][1, 0, :3, :3], torch.tril(torch.ones(3, 3, dtype=torch.bool)))
    unshifted = PrefixLMCollator(PAD, shift_labels=False)(batch[:1])
    assert torch.equal(unshifted["labels"], t([[X, X, 23, 24, X]]))


def test_mlm():
    batch = [ex([7, 4, 9, 0], labels=[X, 8, X, X]), ex([4, 5], labels=[6, X])]
    out = MLMCollator(PAD)(batch)
    assert torch.equal(out["input_ids"], t([[7, 4, 9, 0], [4, 5, 0, 0]]))
    assert torch.equal(out["attention_mask"], t([[1, 1, 1, 0], [1, 1, 0, 0]]))
    assert torch.equal(out["labels"], t([[X, 8, X, X], [6, X, X, X]]))
    assert torch.equal(out["position_ids"], t([[0, 1, 2, 3]] * 2))


def test_seq2seq():
    batch = [{"inputs": np.array([8, 5, 1]), "targets": np.array([5, 6, 7, 1])},
             {"inputs": np.array([9, 1]), "targets": np.array([3, 1])}]
    out = Seq2SeqCollator(PAD)(batch)
    assert torch.equal(out["input_ids"], t([[8, 5, 1], [9, 1, 0]]))
    assert torch.equal(out["attention_mask"], t([[1, 1, 1], [1, 1, 0]]))
    assert torch.equal(out["labels"], t([[5, 6, 7, 1], [3, 1, X, X]]))
    assert torch.equal(out["decoder_input_ids"], t([[0, 5, 6, 7], [0, 3, 1, 0]]))
    assert torch.equal(out["decoder_attention_mask"], t([[1, 1, 1, 1], [1, 1, 1, 0]]))
    assert torch.equal(out["position_ids"], t([[0, 1, 2]] * 2))
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
    assert type(collator_for(_Described("decoder", ["input_ids", "prefix_length"]))) is PrefixLMCollator
    assert type(collator_for(_Described("encoder", ["input_ids", "labels"]))) is MLMCollator
    t5 = collator_for(_Described("seq2seq", ["inputs", "targets"]))
    bart = collator_for(_Described("seq2seq", ["inputs", "targets"], objective="bart"))
    assert (t5.decoder_start_id, bart.decoder_start_id) == (0, 1)
    assert collator_for(_Described("decoder", ["input_ids"]), documents="mask").documents == "mask"
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
            prefix = int(example.get("prefix_length", 0))
            expected = [row[t + 1] if prefix <= t + 1 < real else X for t in range(len(row) - 1)] + [X]
            assert ids[i, : len(row)].tolist() == row.tolist() and labels[i, : len(row)].tolist() == expected
            if "prefix_length" in example:  # the prefix is bidirectional, the rest causal
                mask = out["attention_mask"][i, 0].numpy()
                assert mask[:prefix, :prefix].all() and not mask[prefix - 1, prefix:].any()
                assert mask[real - 1, :real].all() and not mask[prefix, prefix + 1 :].any()
