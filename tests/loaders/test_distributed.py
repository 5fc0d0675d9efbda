"""A real two-process torch.distributed (gloo) run: ranks detect their place, read disjoint
slices of the epoch with equal batch counts, and agree on the resumable state."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from conftest import ROOT, expected_keys

WORKER = os.path.join(os.path.dirname(__file__), "dist_worker.py")


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
