"""Pack + Build hold one copy of a pack group, measured in a fresh process.

The figure is the peak resident memory of packing and building one synthetic group of 16 Mi
clm tokens (benchmarks/bench_scale.py), less what the process held before the group was
made. The group's token ids alone are 4 bytes per token; packing them by concatenating the
whole group while the documents were still held took 9.1 bytes per token, that is two
copies and more. Memory, not time, is the criterion, and it is measured in a subprocess.
"""

from __future__ import annotations

import pytest

from benchmarks.bench_scale import measure


@pytest.mark.e2e
def test_pack_and_build_hold_less_than_two_copies_of_a_group():
    result = measure({"kind": "group", "objective": "clm", "group_tokens": 16 * 2**20, "seq_len": 1024})
    assert result["examples"] == 16 * 2**20 // 1024
    ids_bytes = 4 * result["group_tokens"]
    assert result["peak_bytes"] < 2 * ids_bytes, result
