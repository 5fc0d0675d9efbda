"""The two peers lmshards is measured beside, each a whole command of its own (``python -m
benchmarks.peers {plain,idiom} ...``), so that its time includes its imports as lmshards' does.

- ``plain``: the limit of this machine with no framework. A process pool over all cores, one
  task per input file: read it (gzip, one ``json.loads`` per line), encode its texts with
  fastokens in batches, append EOS to each document, cut the concatenation into rows of
  ``--seq-len`` (the file's remainder dropped) and write them as one Arrow IPC file of a
  fixed-size-list int32 column. Nothing else: no dedup, no validation split, no shuffle, no
  checksums, no manifest.
- ``idiom``: HF's run_clm recipe as a user who knows fastokens writes it: ``load_dataset("json")``
  -> ``map(tokenize, batched=True, num_proc=N)`` with fastokens -> ``map(group_texts,
  batched=True, num_proc=N)`` -> ``save_to_disk`` (:mod:`benchmarks.hf_idiom`, the encoder
  swapped).

Each prints one line: ``tokens <document tokens> rows <rows written>``.
"""

from __future__ import annotations

import argparse
import glob
import gzip
import json
import os
import sys
import tempfile
from multiprocessing import Pool

BATCH = 1024  # texts per encode call


def _open(path: str):
    return gzip.open(path, "rt", encoding="utf-8") if path.endswith(".gz") else open(path, encoding="utf-8")


def _plain_file(task: tuple[str, str, str, int, int]) -> tuple[int, int]:
    path, tokenizer_path, out, seq_len, eos = task
    import fastokens
    import numpy as np
    import pyarrow as pa

    with open(tokenizer_path, encoding="utf-8") as handle:
        tokenizer = fastokens.Tokenizer.from_json_str(handle.read())
    pieces, tokens, texts = [], 0, []

    def encode():
        nonlocal tokens
        ids, offsets = tokenizer.encode_batch_flat(texts, add_special_tokens=False, split_special_tokens=True)
        ids = np.frombuffer(ids, dtype=np.int32)
        offsets = np.frombuffer(offsets, dtype=np.uint64).astype(np.int64)
        tokens += len(ids)
        # EOS after each document: insert at each document's end offset
        pieces.append(np.insert(ids, offsets[1:], eos))
        texts.clear()

    with _open(path) as handle:
        for line in handle:
            texts.append(json.loads(line)["text"])
            if len(texts) == BATCH:
                encode()
    if texts:
        encode()
    flat = np.concatenate(pieces) if pieces else np.zeros(0, np.int32)
    rows = len(flat) // seq_len
    column = pa.FixedSizeListArray.from_arrays(pa.array(flat[: rows * seq_len]), seq_len)
    table = pa.table({"input_ids": column})
    with pa.OSFile(out, "wb") as sink, pa.ipc.new_file(sink, table.schema) as writer:
        writer.write_table(table, max_chunksize=1024)
    return tokens, rows


def plain(files: list[str], tokenizer: str, output: str, seq_len: int, eos: int) -> tuple[int, int]:
    os.makedirs(output, exist_ok=True)
    tasks = [(path, tokenizer, os.path.join(output, f"part-{i:05d}.arrow"), seq_len, eos)
             for i, path in enumerate(files)]
    with Pool(os.cpu_count()) as pool:
        results = pool.map(_plain_file, tasks, chunksize=1)
    return sum(t for t, _ in results), sum(r for _, r in results)


_LOADED: dict = {}


def _fastokens(path: str):
    if path not in _LOADED:
        import fastokens

        with open(path, encoding="utf-8") as handle:
            _LOADED[path] = fastokens.Tokenizer.from_json_str(handle.read())
    return _LOADED[path]


def idiom(files: list[str], tokenizer_path: str, output: str, seq_len: int, eos: int, num_proc: int) -> tuple[int, int]:
    import datasets

    def tokenize(batch):
        import numpy as np

        tokenizer = _fastokens(tokenizer_path)  # loaded once per map worker
        ids, offsets = tokenizer.encode_batch_flat(batch["text"], add_special_tokens=False, split_special_tokens=True)
        ids = np.frombuffer(ids, dtype=np.int32)
        offsets = np.frombuffer(offsets, dtype=np.uint64).astype(np.int64)
        return {"input_ids": [ids[a:b].tolist() + [eos] for a, b in zip(offsets[:-1], offsets[1:])]}

    def group_texts(batch):
        concatenated = [token for ids in batch["input_ids"] for token in ids]
        total = (len(concatenated) // seq_len) * seq_len
        return {"input_ids": [concatenated[i: i + seq_len] for i in range(0, total, seq_len)]}

    with tempfile.TemporaryDirectory(prefix="lmshards-idiom-") as cache:
        raw = datasets.load_dataset("json", data_files=files, split="train", cache_dir=os.path.join(cache, "c"))
        tokenized = raw.map(tokenize, batched=True, num_proc=num_proc, remove_columns=raw.column_names)
        grouped = tokenized.map(group_texts, batched=True, num_proc=num_proc)
        grouped.save_to_disk(output)
        tokens = sum(len(ids) - 1 for ids in tokenized["input_ids"])
        return tokens, len(grouped)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("peer", choices=("plain", "idiom"))
    parser.add_argument("--input", required=True, help="a glob of .jsonl or .jsonl.gz files with a 'text' field")
    parser.add_argument("--tokenizer", required=True)
    parser.add_argument("--output", required=True)
    parser.add_argument("--seq-len", type=int, default=1024)
    parser.add_argument("--eos", type=int, default=1, help="the EOS id (the bundled tokenizer's </s> is 1)")
    parser.add_argument("--num-proc", type=int, default=os.cpu_count())
    args = parser.parse_args(argv)
    files = sorted(glob.glob(args.input))
    if not files:
        parser.error(f"no file matches {args.input}")
    if args.peer == "plain":
        tokens, rows = plain(files, args.tokenizer, args.output, args.seq_len, args.eos)
    else:
        tokens, rows = idiom(files, args.tokenizer, args.output, args.seq_len, args.eos, args.num_proc)
    print(f"tokens {tokens} rows {rows}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
