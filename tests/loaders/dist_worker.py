"""One rank of the two-process torch.distributed (gloo) test; run by test_distributed.py."""

from __future__ import annotations

import datetime
import json
import sys

import torch
import torch.distributed as dist

from loaders import ShardedDataset, make_dataloader


def keys_only(examples):
    return [e["key"] for e in examples]


def main(rank: int, world: int, init_file: str, path: str, out: str) -> None:
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=30))
    dataset = ShardedDataset(path, batch_size=4, seed=3, shuffle_block_size=64, uneven="wrap")  # topology detected
    assert (dataset.rank, dataset.world_size) == (rank, world)
    loader = make_dataloader(dataset, collate_fn=keys_only, num_workers=1)
    keys, steps, states = [], 0, []
    for batch in loader:
        keys.extend(batch)
        steps += 1
        total = torch.tensor([len(batch)])
        dist.all_reduce(total)  # a gradient all-reduce: a rank with fewer batches would hang here
        if steps == 3:
            states.append(loader.state_dict())
    gathered_keys = [None] * world
    gathered_states = [None] * world
    dist.all_gather_object(gathered_keys, keys)
    dist.all_gather_object(gathered_states, states[0])
    if rank == 0:
        with open(out, "w") as handle:
            json.dump({"keys": gathered_keys, "states": gathered_states, "steps": steps}, handle)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main(int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4], sys.argv[5])
