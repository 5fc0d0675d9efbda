"""One rank of the torchrun test of HF Trainer through loaders.integrations.hf (run by test_hf_trainer.py).

Three trainings on the same data, each recording the batches it trained on (the first token of
each row names its sample): A, one uninterrupted epoch; B, the same run stopped after
``STOP`` steps (checkpoints every 4 steps); C, a fresh trainer resuming B's last checkpoint
with another number of DataLoader workers.
"""

from __future__ import annotations

import json
import os
import sys

os.environ.setdefault("HF_HUB_OFFLINE", "1")
sys.path.insert(0, os.path.dirname(__file__))

import torch  # noqa: E402
import transformers  # noqa: E402
from hf_models import tiny_model  # noqa: E402

from loaders import ShardedDataset  # noqa: E402
from loaders.integrations.hf import LOADER_STATE_NAME, LMShardsTrainer  # noqa: E402

STOP = 8


class RecordingTrainer(LMShardsTrainer):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.seen: list[int] = []

    def training_step(self, model, inputs, num_items_in_batch=None):
        # tensors, and the one model argument clm batches carry (use_cache=False: positions separate documents)
        assert all(torch.is_tensor(v) or (k, v) == ("use_cache", False) for k, v in inputs.items()), sorted(inputs)
        self.seen += inputs["input_ids"][:, 0].tolist()
        return super().training_step(model, inputs, num_items_in_batch)


class StopAt(transformers.TrainerCallback):
    def on_step_end(self, args, state, control, **kwargs):
        if state.global_step == STOP:
            control.should_training_stop = True


def train(path: str, output: str, workers: int, *, stop: bool = False, resume: str | None = None) -> list[int]:
    dataset = ShardedDataset(path, batch_size=4, seed=7, shuffle_block_size=64, uneven="drop")
    args = transformers.TrainingArguments(
        output_dir=output, per_device_train_batch_size=4, num_train_epochs=1, use_cpu=True, ddp_backend="gloo",
        report_to=[], save_strategy="steps", save_steps=4, logging_steps=1000, dataloader_num_workers=workers,
        learning_rate=1e-3, seed=0, disable_tqdm=True)
    trainer = RecordingTrainer(model=tiny_model("gpt2", "sdpa").train(), args=args, train_dataset=dataset,
                               callbacks=[StopAt()] if stop else None)
    trainer.train(resume_from_checkpoint=resume)
    return trainer.seen


def main(path: str, work: str) -> None:
    rank = int(os.environ["RANK"])
    result = {"A": train(path, os.path.join(work, "a"), workers=1)}
    result["B"] = train(path, os.path.join(work, "b"), workers=1, stop=True)
    checkpoint = os.path.join(work, "b", f"checkpoint-{STOP}")
    with open(os.path.join(checkpoint, LOADER_STATE_NAME), encoding="utf-8") as handle:
        result["saved"] = json.load(handle)
    result["C"] = train(path, os.path.join(work, "b"), workers=0, resume=checkpoint)
    with open(os.path.join(work, f"rank{rank}.json"), "w", encoding="utf-8") as handle:
        json.dump(result, handle)
    if torch.distributed.is_initialized():  # as a torchrun script should: gloo's threads stopped before exit
        torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
