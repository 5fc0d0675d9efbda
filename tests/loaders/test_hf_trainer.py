"""HF Trainer under real torchrun (2 gloo processes) through loaders.integrations.hf: the ranks
train on disjoint streams covering the epoch, and a run resumed from a checkpoint trains on
exactly the batches the uninterrupted run trained on."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from conftest import ROOT, expected_keys

WORKER = os.path.join(os.path.dirname(__file__), "hf_trainer_worker.py")


def first_token_key(rows):
    """Key of each synthetic row by its first token (conftest.synthetic_example: unique per sample)."""
    out = {}
    for shard, count in enumerate(rows):
        for row in range(count):
            out[(100 + 1000 * shard + 10 * row) % 7000 + 100] = f"s{shard}-r{row}"
    return out


@pytest.mark.e2e
def test_trainer_under_torchrun_sees_every_sample_once_and_resumes_exactly(small_dataset, tmp_path):
    path, rows = small_dataset
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false", "OMP_NUM_THREADS": "1",
           "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", WORKER, path,
               str(tmp_path)]
    done = subprocess.run(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-5000:]
    results = [json.loads((tmp_path / f"rank{rank}.json").read_text()) for rank in range(2)]
    names = first_token_key(rows)
    runs = [{run: [names[token] for token in result[run]] for run in ("A", "B", "C")} for result in results]
    epoch = expected_keys(rows, seed=7, epoch=0, block_size=64)
    # each rank trained on its own stream: rank r has global samples r, r + 2, ... (uneven="drop")
    assert runs[0]["A"] == epoch[0:150:2] and runs[1]["A"] == epoch[1:150:2]
    seen = runs[0]["A"] + runs[1]["A"]
    assert len(seen) == len(set(seen)) == len(epoch) - 1  # every sample once, but the one dropped (151 = 2 * 75 + 1)
    for rank in range(2):
        saved = results[rank]["saved"]
        assert (saved["epoch"], saved["samples"]) == (0, 8 * 4 * 2)  # 8 steps of 4 samples on 2 ranks
        assert runs[rank]["B"] == runs[rank]["A"][: 8 * 4]
        assert runs[rank]["B"] + runs[rank]["C"] == runs[rank]["A"]  # resumed exactly, with other workers
