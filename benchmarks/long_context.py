"""A long-context dataset through the loader: every stored row comes out once, at its length.

For one dataset (say clm 4096 on hundreds of MB), one epoch of ``make_dataloader`` per stored
format and worker count: the multiset of row digests must equal that of the Arrow files read
directly with pyarrow, every row has the stored length; then a tiny Llama (built from a config,
nothing downloaded) takes the first batch with its ``position_ids`` and labels, and its loss must
be finite (at initialisation, near ln V). Prints the time of each epoch.

    python -m pipelines.materialize --input '/tmp/c320/docstrings-0[01].jsonl.gz' \\
        --tokenizer data/tokenizer.json --seq-len 4096 --num-shards 8 --formats arrow,webdataset \\
        --validation-fraction 0.01 --output /tmp/l4096
    python -m benchmarks.long_context /tmp/l4096
"""

from __future__ import annotations

import argparse
import collections
import glob
import hashlib
import math
import os
import time

import numpy as np
import pyarrow as pa


def _digest(row: np.ndarray) -> str:
    return hashlib.sha1(np.ascontiguousarray(row, dtype=np.int32).tobytes()).hexdigest()


def stored_rows(path: str, split: str) -> tuple[collections.Counter, int]:
    """Digests of the ``input_ids`` rows of the split's Arrow files, and the row length."""
    rows: collections.Counter = collections.Counter()
    length = 0
    for name in sorted(glob.glob(os.path.join(path, split, "arrow", "*.arrow"))):
        with pa.memory_map(name) as source:
            column = pa.ipc.open_stream(source).read_all().column("input_ids").combine_chunks()
        if len(column) == 0:
            continue
        flat = column.flatten().to_numpy()
        length = len(flat) // len(column)
        rows.update(_digest(row) for row in flat.reshape(-1, length))
    return rows, length


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("path")
    parser.add_argument("--split", default="train")
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--workers", default="0,2")
    args = parser.parse_args(argv)

    import torch

    from loaders import ShardedDataset, make_dataloader

    truth, length = stored_rows(args.path, args.split)
    print(f"stored: {sum(truth.values()):,} rows of {length} tokens")
    formats = [fmt for fmt, folder in (("arrow", "arrow"), ("webdataset", "wds"))
               if os.path.isdir(os.path.join(args.path, args.split, folder))]
    first = None
    for fmt in formats:
        for workers in (int(w) for w in args.workers.split(",")):
            dataset = ShardedDataset(args.path, args.split, batch_size=args.batch_size, seed=1, fmt=fmt)
            seen: collections.Counter = collections.Counter()
            lengths = set()
            start = time.perf_counter()
            for batch in make_dataloader(dataset, num_workers=workers):
                first = first or batch
                ids = batch["input_ids"].numpy()
                lengths.add(ids.shape[1])
                seen.update(_digest(row) for row in ids)
            seconds = time.perf_counter() - start
            same = seen == truth and lengths == {length}
            print(f"{fmt}, {workers} workers: {sum(seen.values()):,} rows in {seconds:.1f} s "
                  f"({sum(seen.values()) * length / seconds / 1e6:.1f} M tokens/s); every stored row once, "
                  f"{length} tokens each: {same}; batch keys {sorted(first)}")
            if not same:
                raise SystemExit("the loader's rows differ from the stored rows")

    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    vocab = int(first["input_ids"].max()) + 1000
    model = LlamaForCausalLM(LlamaConfig(vocab_size=vocab, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                         num_attention_heads=4, num_key_value_heads=4,
                                         max_position_embeddings=length))
    inputs = {k: v.long() if v.dtype == torch.int32 else v for k, v in first.items()
              if k in ("input_ids", "labels", "position_ids", "attention_mask")}
    start = time.perf_counter()
    loss = model(**inputs).loss
    loss.backward()
    print(f"tiny Llama on a batch {tuple(first['input_ids'].shape)}: loss {loss.item():.4f} "
          f"(ln V = {math.log(vocab):.4f}), forward and backward {time.perf_counter() - start:.1f} s")
    if not torch.isfinite(loss):
        raise SystemExit("the loss is not finite")


if __name__ == "__main__":
    main()
