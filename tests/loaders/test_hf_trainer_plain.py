"""HF ``Trainer`` in one process with a tiny model: the plain ``Trainer`` is refused at start in one
line naming LMShardsTrainer; LMShardsTrainer's batches keep ``doc_lengths``' work (positions
restarting per document, document starts without loss) whatever ``remove_unused_columns`` says,
and it reports samples per second as samples. (DDP under torchrun: test_hf_trainer.py.)"""

from __future__ import annotations

import pytest
import torch
from conftest import TOKENIZER, write_dataset
from hf_models import tiny_model

from loaders import ShardedDataset
from schemas.errors import ConfigError

# transformers (and Trainer) are imported by the tests that use them, not when the suite is
# collected: every test process collects every file, and importing Trainer takes seconds.


def arguments(tmp_path, **kwargs):
    import transformers

    options = dict(output_dir=str(tmp_path), per_device_train_batch_size=4, use_cpu=True, report_to=[],
                   save_strategy="no", logging_steps=1000, dataloader_num_workers=0, learning_rate=1e-3, seed=0,
                   disable_tqdm=True)
    return transformers.TrainingArguments(**{**options, **kwargs})


@pytest.mark.parametrize("remove_unused_columns", [True, False])
def test_plain_trainer_is_refused_at_start(small_dataset, tmp_path, remove_unused_columns):
    import transformers

    path, _ = small_dataset
    dataset = ShardedDataset(path, batch_size=4, seed=7)
    args = arguments(tmp_path, max_steps=2, remove_unused_columns=remove_unused_columns)
    with pytest.raises(ConfigError) as info:
        transformers.Trainer(model=tiny_model("llama", "sdpa"), args=args, train_dataset=dataset)
    message = str(info.value)
    assert "\n" not in message and "LMShardsTrainer" in message and message.startswith("Trainer cannot train")
    # an evaluation dataset handed to a plain Trainer's evaluate() is refused too
    trainer = transformers.Trainer(model=tiny_model("llama", "sdpa"), args=args)
    with pytest.raises(ConfigError, match="LMShardsTrainer"):
        trainer.evaluate(eval_dataset=ShardedDataset(path, batch_size=4, seed=7))
    # the dataset itself is still a plain iterable for anyone else
    assert len(dataset) == 151 and len(list(dataset)) == 151


def recording_trainer(**kwargs):
    """An LMShardsTrainer that keeps every batch the model was called with (``compute_loss`` is
    Trainer's hook for it) in ``batches``."""
    from loaders.integrations.hf import LMShardsTrainer

    class RecordingTrainer(LMShardsTrainer):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            self.batches: list[dict] = []

        def compute_loss(self, model, inputs, *args, **kwargs):
            self.batches.append({k: v.clone() if torch.is_tensor(v) else v for k, v in inputs.items()})
            return super().compute_loss(model, inputs, *args, **kwargs)

    return RecordingTrainer(**kwargs)


@pytest.fixture(scope="module")
def few_rows(tmp_path_factory) -> tuple[str, list[int]]:
    """Three uneven shards (one empty), 11 rows of 8 tokens: a few steps of training, each batch
    checked, and counts of samples that differ from counts of batches."""
    rows = [5, 0, 6]
    return write_dataset(tmp_path_factory.mktemp("few"), rows, tokenizer=TOKENIZER), rows


def test_lmshards_trainer_batches_keep_documents_apart_and_count_samples(few_rows, tmp_path):
    path, rows = few_rows
    dataset = ShardedDataset(path, batch_size=4, seed=7)
    model = tiny_model("llama", "sdpa", dropout=False).train()
    trainer = recording_trainer(model=model, args=arguments(tmp_path, num_train_epochs=1, remove_unused_columns=True),
                                train_dataset=dataset)
    metrics = trainer.train().metrics
    reference = [e for e in ShardedDataset(path, batch_size=4, seed=7)]
    assert len(trainer.batches) == -(-sum(rows) // 4) == 3
    seen = 0
    for batch in trainer.batches:
        assert set(batch) == {"input_ids", "labels", "position_ids", "use_cache"} and batch["use_cache"] is False
        for row in range(batch["input_ids"].shape[0]):
            first = int(reference[seen]["doc_lengths"][0])  # synthetic rows: two documents each
            positions = list(range(first)) + list(range(8 - first))
            assert batch["position_ids"][row].tolist() == positions
            assert batch["labels"][row, 0] == batch["labels"][row, first] == -100
            seen += 1
    assert seen == sum(rows)
    # samples per second are samples: 11 samples in 3 steps (HF counted the 3 batches as samples)
    ratio = metrics["train_samples_per_second"] / metrics["train_steps_per_second"]
    assert abs(ratio - 11 / 3) < 0.02 * 11 / 3, metrics
    assert trainer.num_examples(trainer.get_train_dataloader()) == 11
    # evaluate() and predict() read through the lmshards loader too: every sample once, as samples
    evaluation = trainer.evaluate(eval_dataset=ShardedDataset(path, batch_size=8, seed=7))
    assert evaluation["eval_samples_per_second"] / evaluation["eval_steps_per_second"] == pytest.approx(11 / 2,
                                                                                                         rel=0.02)
    predicted = trainer.predict(ShardedDataset(path, batch_size=8, seed=7))
    assert predicted.predictions.shape[:2] == (11, 8) and predicted.metrics["test_samples_per_second"] > 0


def test_lmshards_trainer_prefix_lm_batches_carry_the_models_mask(small_dataset, tmp_path):
    """Prefix-LM batches (noise applied on the fly) get the model's mask: a float32 tensor for a float32
    sdpa model, a BlockMask at the stored width for a bf16 flex one (nothing is compiled here)."""
    from torch.nn.attention.flex_attention import BlockMask

    from loaders.integrations.hf import LMShardsTrainer

    path, _ = small_dataset
    for implementation, dtype in (("sdpa", torch.float32), ("flex_attention", torch.bfloat16)):
        dataset = ShardedDataset(path, batch_size=4, seed=1, objective="prefix_lm", objective_params={"seq_len": 8})
        model = tiny_model("llama", implementation).to(dtype)
        trainer = LMShardsTrainer(model=model, args=arguments(tmp_path / implementation, max_steps=1),
                                  train_dataset=dataset)
        batch = next(iter(trainer.get_train_dataloader()))
        mask = batch["attention_mask"]
        if implementation == "sdpa":
            assert isinstance(mask, torch.Tensor) and mask.dtype == dtype and mask.shape[1:] == (1, 8, 8)
        else:
            assert isinstance(mask, BlockMask) and mask.shape == (4, 1, 8, 8)
