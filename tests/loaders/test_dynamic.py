"""Dynamic noise: objectives applied on the fly, seeded by (seed, epoch, example key)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from conftest import TOKENIZER, write_dataset

from loaders import ShardedDataset, make_dataloader
from loaders.collation.collate_decoder import CausalCollator, PrefixLMCollator
from loaders.collation.collate_encoder import MLMCollator, Seq2SeqCollator
from loaders.errors import UnsupportedSchemaError
from transforms.objectives.base import Built, Objective
from transforms.objectives.common import IGNORE_INDEX
from transforms.objectives.layout import example_randoms
from transforms.objectives.registry import OBJECTIVES

# The objectives, sized to the 128-token chunks of the clm fixture.
DYNAMIC = {
    "clm": ({"seq_len": 128}, CausalCollator),
    "prefix_lm": ({"seq_len": 128}, PrefixLMCollator),
    "mlm": ({"seq_len": 128}, MLMCollator),
    "span_corruption": ({"inputs_length": 114}, Seq2SeqCollator),
    "ul2": ({"inputs_length": 64}, Seq2SeqCollator),
    "ul2-decoder": ({"inputs_length": 64, "layout": "decoder"}, PrefixLMCollator),
}


class TaggedNoise(Objective):
    """A minimal Objective: copies the chunk and records the first number of its noise."""

    name, family = "tagged", "decoder"
    fixed_raw_length = 6

    def build(self, block, special):
        noise = block.randoms.integers(1, 1, 1 << 30)[:, 0].astype(np.int32)
        arrays = {"input_ids": (block.tokens, block.offsets), "doc_lengths": (block.doc_lengths, block.doc_offsets)}
        return Built(arrays, {"noise": noise}, {}, {})

    def schema_kwargs(self):
        return {"seq_len": 6}

    def params(self):
        return {}


@pytest.mark.parametrize("name", sorted(DYNAMIC))
def test_every_objective_runs_on_the_fly_and_collates(clm_dataset, name):
    registry_name = name.split("-")[0]
    assert registry_name in OBJECTIVES
    params, collator = DYNAMIC[name]
    ds = ShardedDataset(clm_dataset, batch_size=8, seed=5, objective=registry_name, objective_params=params)
    loader = make_dataloader(ds, num_workers=0)
    assert type(loader.collate_fn) is collator
    batch = next(iter(loader))
    assert batch["input_ids"].shape[0] == 8 and batch["input_ids"].dtype == torch.int64
    assert batch["labels"].shape[0] == 8 and (batch["labels"] != IGNORE_INDEX).any()
    if collator in (CausalCollator, PrefixLMCollator):
        assert batch["position_ids"].shape == batch["input_ids"].shape
    else:  # encoders and encoder-decoders number their positions themselves
        assert "position_ids" not in batch
    if collator is Seq2SeqCollator:
        assert torch.equal(batch["decoder_input_ids"][:, 1:], batch["labels"][:, :-1].clamp(min=0))


def test_noise_is_seeded_by_seed_epoch_and_key(small_dataset):
    path, _ = small_dataset
    ds = ShardedDataset(path, batch_size=4, seed=9, objective=TaggedNoise())
    epoch0 = {e["key"]: e["noise"] for e in ds}
    epoch1 = {e["key"]: e["noise"] for e in ds}  # the next epoch
    for key, noise in epoch0.items():
        assert noise == int(example_randoms(9, [key], 0).integers(1, 1, 1 << 30)[0, 0])
        assert epoch1[key] == int(example_randoms(9, [key], 1).integers(1, 1, 1 << 30)[0, 0])
    assert all(epoch0[k] != epoch1[k] for k in epoch0)  # new noise every epoch
    # the same sample gets the same noise whichever rank and worker reads it
    for rank in range(2):
        sharded = ShardedDataset(path, batch_size=4, seed=9, objective=TaggedNoise(), rank=rank, world_size=2)
        loader = make_dataloader(sharded, num_workers=2, collate_fn=list)
        for batch in loader:
            for example in batch:
                assert example["noise"] == epoch0[example["key"]]


def test_chunks_are_cut_to_the_planned_length(small_dataset):
    path, _ = small_dataset
    example = next(iter(ShardedDataset(path, objective=TaggedNoise(), shuffle=False)))
    # synthetic row 0 of shard 0 has doc_lengths [1, 7]: cut to 6 tokens -> [1, 5]
    assert len(example["input_ids"]) == 6 and example["doc_lengths"].tolist() == [1, 5]


def test_objectives_needing_features_or_other_data_fail_clearly(clm_dataset, tmp_path):
    with pytest.raises(UnsupportedSchemaError, match="word_starts"):
        ShardedDataset(clm_dataset, objective="mlm", objective_params={"seq_len": 128, "whole_word_mask": True})
    if "bart" in OBJECTIVES:
        with pytest.raises(UnsupportedSchemaError, match="sentence_starts"):
            ShardedDataset(clm_dataset, objective="bart", objective_params={"seq_len": 128})
    seq2seq = write_dataset(tmp_path / "s2s", [3], family="seq2seq", objective="span_corruption", tokenizer=TOKENIZER)
    with pytest.raises(UnsupportedSchemaError, match="tokens dataset"):
        ShardedDataset(seq2seq, objective=TaggedNoise())
    with pytest.raises(ValueError, match="unknown objective"):
        ShardedDataset(clm_dataset, objective="gpt5")
    with pytest.warns(UserWarning, match="asks for 568-token chunks"):
        ShardedDataset(clm_dataset, objective="span_corruption", objective_params={"inputs_length": 512})


@pytest.mark.parametrize("name, params, parameter, expected", [
    ("mlm", {}, "seq_len", 128),
    ("mlm", {"frame": True}, "seq_len", 130),  # [CLS] chunk [SEP]: every stored token kept
    ("prefix_lm", {}, "seq_len", 128),
    ("span_corruption", {}, "inputs_length", 116),
    ("ul2", {}, "inputs_length", 67),
    ("ul2", {"layout": "decoder"}, "inputs_length", 67),
])
def test_dynamic_objectives_take_their_length_from_the_stored_chunks(clm_dataset, name, params, parameter,
                                                                     expected):
    import warnings

    from loaders.dynamic import max_raw_length

    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no "asks for longer chunks" warning: the default fits
        ds = ShardedDataset(clm_dataset, batch_size=8, seed=5, objective=name, objective_params=params)
    assert getattr(ds.objective.config, parameter) == expected
    assert max_raw_length(ds.objective) <= 128  # the largest length whose chunks fit the stored 128 tokens
    bigger = {**params, parameter: expected + 1}
    assert max_raw_length(ShardedDataset(clm_dataset, objective=name, objective_params=bigger).objective) > 128
    batch = next(iter(make_dataloader(ds, num_workers=0)))
    if name == "mlm" and not params:  # 128-token chunks give 128-token rows, not 512 (75 % padding)
        assert batch["input_ids"].shape == (8, 128) and (batch["attention_mask"] == 1).all()
    if name == "span_corruption":  # a full 128-token chunk: inputs exactly inputs_length
        assert batch["input_ids"].shape[1] == expected
