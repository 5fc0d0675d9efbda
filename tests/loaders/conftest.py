"""Fixtures of the loader tests: a real clm dataset (built once per session) and small
synthetic datasets written directly with the shard encoders (:mod:`transforms.writing.shard_format`)."""

from __future__ import annotations

import hashlib
import os
import pathlib

import numpy as np
import pytest
from lmshards_testing import write_arrow, write_tar

from schemas.examples import example_schema
from schemas.manifest import Manifest, shard_name

ROOT = pathlib.Path(__file__).resolve().parents[2]
SAMPLE_GLOB = str(ROOT / "data" / "sample" / "*.jsonl")
TOKENIZER = str(ROOT / "data" / "tokenizer.json")
SPECIAL_IDS = {"pad": 0, "eos": 1, "bos": 2, "unk": 3, "mask": 4}


def synthetic_example(shard: int, row: int, seq_len: int, family: str) -> dict:
    """A recognisable example: its tokens encode (shard, row)."""
    key = f"s{shard}-r{row}"
    base = 100 + 1000 * shard + 10 * row
    tokens = (base + np.arange(seq_len)).astype(np.int32) % 7000 + 100
    if family == "decoder":
        first = 1 + (row % (seq_len - 1))
        return {"key": key, "input_ids": tokens, "doc_lengths": np.array([first, seq_len - first], np.int32)}
    if family == "encoder":
        labels = np.full(seq_len, -100, np.int32)
        labels[row % seq_len] = tokens[row % seq_len]
        return {"key": key, "input_ids": tokens, "labels": labels}
    n = 1 + row % 5
    return {"key": key, "inputs": tokens[: seq_len - n], "targets": tokens[:n]}


def write_dataset(
    root,
    shard_rows,
    *,
    family: str = "decoder",
    seq_len: int = 8,
    formats=("arrow", "webdataset"),
    split: str = "train",
    objective: str = "clm",
    tokenizer: str | None = None,
) -> str:
    """Write a dataset directory with ``shard_rows[i]`` rows in shard ``i``; return its path."""
    root = str(root)
    kwargs = {"seq_len": seq_len} if family != "seq2seq" else {}
    schema = example_schema(family, **kwargs)
    shards = []
    for index, rows in enumerate(shard_rows):
        examples = [synthetic_example(index, r, seq_len, family) for r in range(rows)]
        files = {}
        for fmt in formats:
            rel = shard_name(split, fmt, index, len(shard_rows))
            path = os.path.join(root, rel)
            os.makedirs(os.path.dirname(path), exist_ok=True)
            with open(path, "wb") as handle:
                (write_arrow if fmt == "arrow" else write_tar)(handle, examples, schema)
            with open(path, "rb") as handle:
                data = handle.read()
            files[fmt] = {"path": rel, "bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()}
        shards.append({"split": split, "index": index, "rows": rows, "tokens": rows * seq_len, "files": files})
    if tokenizer is not None:
        with open(tokenizer, "rb") as src, open(os.path.join(root, "tokenizer.json"), "wb") as dst:
            dst.write(src.read())
    manifest = Manifest(
        objective={"name": objective, "family": family, "params": {}},
        config={"seed": 0, "formats": list(formats)},
        tokenizer={"file": "tokenizer.json", "vocab_size": 8000, "special_ids": dict(SPECIAL_IDS)},
        schema=schema.to_metadata(),
        counts={},
        splits={split: {"examples": sum(shard_rows), "shards": shards}},
    )
    with open(os.path.join(root, "manifest.json"), "w", encoding="utf-8") as handle:
        handle.write(manifest.dumps())
    return root


def expected_keys(shard_rows, seed: int, epoch: int, block_size: int | None, shuffle: bool = True) -> list[str]:
    """Keys of a synthetic dataset in the epoch's global order."""
    from loaders.streaming.order import EpochOrder

    order = EpochOrder(shard_rows, seed, epoch, shuffle=shuffle, block_size=block_size)
    shards, rows = order.locate(np.arange(len(order)))
    return [f"s{s}-r{r}" for s, r in zip(shards.tolist(), rows.tolist(), strict=True)]


def batch_keys(examples):
    """Collate function keeping only the keys (module level: picklable for workers)."""
    return [e["key"] for e in examples]


@pytest.fixture(scope="session")
def clm_dataset(tmp_path_factory) -> str:
    """The sample corpus materialized as clm, seq_len 128, 4 shards, arrow + webdataset."""
    from pipelines.materialize import run

    out = tmp_path_factory.mktemp("clm") / "out"
    run(["--input", SAMPLE_GLOB, "--output", str(out), "--tokenizer", TOKENIZER, "--objective", "clm",
         "--seq-len", "128", "--formats", "arrow,webdataset", "--num-shards", "4", "--validation-fraction", "0.05"])
    return str(out)


@pytest.fixture(scope="session")
def small_dataset(tmp_path_factory) -> tuple[str, list[int]]:
    """Five uneven shards (one empty), 151 rows of 8 tokens, arrow + webdataset."""
    rows = [37, 0, 50, 23, 41]
    return write_dataset(tmp_path_factory.mktemp("small"), rows, tokenizer=TOKENIZER), rows
