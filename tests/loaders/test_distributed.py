"""A real two-process torch.distributed (gloo) run: ranks detect their place, read disjoint
slices of the epoch with equal batch counts, and agree on the resumable state."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from conftest import ROOT, expected_keys

WORKER = os.path.join(os.path.dirname(__file__), "dist_worker.py")


# Two real processes joined by gloo, like torchrun's: the split itself is checked without them
# in test_state.py and test_dataset.py (ranks given explicitly).
@pytest.mark.e2e
def test_two_gloo_ranks_split_the_epoch(small_dataset, tmp_path):
    path, rows = small_dataset
    out = tmp_path / "result.json"
    env = {**os.environ, "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    procs = [
        subprocess.Popen([sys.executable, WORKER, str(rank), "2", str(tmp_path / "init"), path, str(out)], env=env,
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        for rank in range(2)
    ]
    logs = [p.communicate(timeout=120)[0] for p in procs]
    assert all(p.returncode == 0 for p in procs), "\n".join(logs)[-3000:]
    result = json.loads(out.read_text())
    rank0, rank1 = result["keys"]
    assert len(rank0) == len(rank1) == 76 and result["steps"] == 19  # 151 rows -> 2 x 76 (wrap), batches of 4
    merged = [key for pair in zip(rank0, rank1, strict=True) for key in pair]
    order = expected_keys(rows, seed=3, epoch=0, block_size=64)
    assert merged == (order + order)[:152]
    assert len(set(rank0) & set(rank1)) == 1  # only the one wrapped sample repeats
    assert result["states"][0] == result["states"][1] and result["states"][0]["samples"] == 3 * 4 * 2


def test_the_topology_comes_from_rank_and_world_size_in_the_environment(small_dataset, monkeypatch):
    """Without a process group, a dataset built under RANK/WORLD_SIZE (as torchrun sets them) reads
    the slice the same rank given by hand reads."""
    from loaders import ShardedDataset

    path, _ = small_dataset
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "2")
    detected = ShardedDataset(path, batch_size=4, seed=3, shuffle_block_size=64, uneven="wrap")
    given = ShardedDataset(path, batch_size=4, seed=3, shuffle_block_size=64, uneven="wrap", rank=1, world_size=2)
    assert (detected.rank, detected.world_size) == (1, 2)
    assert [e["key"] for e in detected] == [e["key"] for e in given] and len(given) == 76
