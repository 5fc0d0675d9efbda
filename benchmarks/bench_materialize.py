"""Throughput of ``lmshards materialize`` as a ratio to the tokenizer's own ceiling.

One run, one corpus, one tokenizer:

1. ceiling: the Rust batch encoder (``encode_batch_fast``, batches of 512, all cores) over
   every document already in memory: the fastest any pipeline could tokenize this corpus;
2. ``materialize`` wall time (reading, decompressing, hashing, tokenizing, packing, building
   examples, writing shards and manifest, Beam start-up included) for each configuration,
   printed as tokens/s and as a ratio to the ceiling.

The machine may be shared and noisy, so only the ratios measured in the same run mean much.

    python -m benchmarks.bench_materialize --megabytes 30
    python -m benchmarks.bench_materialize --corpus 'DIR/*.jsonl.gz' --tokenizer tok.json
"""

from __future__ import annotations

import argparse
import glob
import os
import shutil
import tempfile
import time

from benchmarks.corpus import write_corpus
from pipelines.train_tokenizer import train_tokenizer
from transforms.read import iter_file_records

CACHE = os.path.join(os.path.dirname(os.path.abspath(__file__)), ".cache")


def load_texts(pattern: str) -> list[str]:
    texts = []
    for path in sorted(glob.glob(pattern)):
        texts.extend(r[2] for r in iter_file_records(path, text_field="text") if not isinstance(r, dict))
    return texts


def ceiling(tokenizer_path: str, texts: list[str], batch_size: int = 512, repeats: int = 2) -> tuple[float, int]:
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(tokenizer_path)
    tokenizer.encode_special_tokens = True  # as the pipeline does: "</s>" in a text is text
    best = float("inf")
    tokens = 0
    for _ in range(repeats):
        start = time.perf_counter()
        tokens = 0
        for i in range(0, len(texts), batch_size):
            for encoding in tokenizer.encode_batch_fast(texts[i : i + batch_size], add_special_tokens=False):
                tokens += len(encoding.ids)
        best = min(best, time.perf_counter() - start)
    return tokens / best, tokens


def run_materialize(args: list[str]) -> tuple[float, int]:
    from pipelines.materialize import run

    start = time.perf_counter()
    manifest = run(args)
    wall = time.perf_counter() - start
    tokens = sum(s["document_tokens"] for s in manifest.splits.values()) - manifest.counts["documents_written"]
    return wall, tokens


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--corpus", help="glob of corpus files (default: build a docstring corpus)")
    parser.add_argument("--megabytes", type=float, default=30, help="size of the built corpus")
    parser.add_argument("--tokenizer", help="tokenizer.json (default: train a 32k byte-level BPE on the corpus)")
    parser.add_argument("--seq-len", type=int, default=1024)
    parser.add_argument("--objectives", default="clm", help="comma-separated objectives to time")
    parser.add_argument("--modes", default="in_process,multi_processing", help="runner modes to time")
    args = parser.parse_args()

    corpus = args.corpus
    if corpus is None:
        directory = os.path.join(CACHE, f"docstrings-{args.megabytes:g}mb")
        if not os.path.isdir(directory):
            write_corpus(directory, args.megabytes)
        corpus = os.path.join(directory, "*.jsonl.gz")
    texts = load_texts(corpus)
    size = sum(len(t.encode("utf-8")) for t in texts) / 2**20
    tokenizer = args.tokenizer
    if tokenizer is None:
        tokenizer = os.path.join(CACHE, f"bpe32k-{args.megabytes:g}mb.json")
        if not os.path.exists(tokenizer):
            trained = train_tokenizer(texts[: len(texts) // 2], vocab_size=32000, num_sentinels=128,
                                      extra_tokens=("[R]", "[S]", "[X]", "[NLU]", "[S2S]", "[NLG]"))
            trained.save(tokenizer)
    print(f"corpus: {corpus}: {len(texts):,} documents, {size:.1f} MB of text; tokenizer {tokenizer}")
    print(f"cores: {os.cpu_count()}")
    rate, tokens = ceiling(tokenizer, texts)
    print(f"{'tokenizer ceiling (encode_batch_fast, all cores)':<58} {rate:>12,.0f} tokens/s   1.00")
    del texts
    modes = {
        "in_process": [],
        "multi_processing": ["--direct_running_mode=multi_processing", "--direct_num_workers=2"],
    }
    for objective in args.objectives.split(","):
        for mode in args.modes.split(","):
            out = tempfile.mkdtemp(prefix="lmshards-bench-")
            try:
                extra = ["--seq-len", str(args.seq_len)]
                if objective in ("span_corruption", "ul2"):
                    extra = ["--inputs-length", "512"]
                wall, got = run_materialize(["--input", corpus, "--tokenizer", tokenizer, "--output", out,
                                             "--objective", objective, "--formats", "arrow,webdataset",
                                             "--validation-fraction", "0.01", *extra, *modes[mode]])
            finally:
                shutil.rmtree(out, ignore_errors=True)
            assert got == tokens, f"materialize saw {got} tokens, the ceiling run {tokens}"
            label = f"materialize {objective} ({mode})"
            print(f"{label:<58} {got / wall:>12,.0f} tokens/s   {got / wall / rate:.2f}   ({wall:.1f} s)")


if __name__ == "__main__":
    main()
