"""How lmshards scales: Pack + Build peak memory per pack group, and throughput with 1 and 2 workers.

Memory (``--memory``): one pack group of N tokens is made of synthetic documents (random
ids, a log-normal length of mean ~600 tokens, 16-byte keys, and the word and sentence
starts bart asks for) and handed to the Pack stage's DoFn and the BuildExamples worker
code exactly as the runner hands a grouped key over (a list of the group's documents);
the encoded example batches are dropped, as a runner sends them on to the shuffle. Each
(objective, N) runs in a fresh process; the figure is its peak resident memory (VmHWM)
less its resident memory before the group was made, so it counts the group itself, what
Pack holds while packing it, and what Build holds, and nothing of the interpreter and its
imports. This is what one worker thread holds for one group; ``bytes/token`` lets the
default ``--pack-group-tokens`` be chosen for a worker's memory (README, "How large a
corpus").

Throughput (``--throughput``): ``materialize`` on one corpus with Beam's multi-processing
runner and 1, then 2, worker processes, each run in a fresh process, interleaved in
rounds; the ratio of the two is the parallel speed-up on this machine (2 cores, shared:
compare ratios of one run, not seconds across runs).

Remainders (``--remainders N``): the remainders of N groups (one per group, shorter than a
chunk) re-packed on one key per split and built, measured like a group: the one stage whose
input grows with the number of groups.

    python -m benchmarks.bench_scale --memory --objectives clm,bart --group-tokens 4,16,64
    python -m benchmarks.bench_scale --remainders 2000,20000 --objectives clm,bart
    python -m benchmarks.bench_scale --throughput --megabytes 60
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SAMPLE = os.path.join(ROOT, "data", "sample", "faq.jsonl")
TOKENIZER = os.path.join(ROOT, "data", "tokenizer.json")
_RESULT = "bench-result "
#: Mean and spread of the synthetic documents' log-normal length, in tokens.
MEAN_TOKENS, SIGMA = 600, 1.0


def _status_bytes(field: str) -> int:
    with open("/proc/self/status") as handle:
        for line in handle:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    raise RuntimeError(f"no {field} in /proc/self/status")


def _objective_args(objective: str, seq_len: int) -> list[str]:
    if objective in ("span_corruption", "ul2"):
        return ["--objective", objective, "--inputs-length", str(seq_len)]
    return ["--objective", objective, "--seq-len", str(seq_len)]


def synthetic_group(tokens: int, features: frozenset, vocab: int, seed: int = 0,
                    mean_tokens: int = MEAN_TOKENS) -> tuple[list, int]:
    """Documents of about ``tokens`` tokens in all (EOS included), as AssignGroups sends them to
    Pack: ``(encoded DocumentBatch blocks of about BLOCK_BYTES of ids each, documents)`` (16-byte
    keys, ids uint16 when they fit, a bool per token and feature); lengths log-normal of mean
    ``mean_tokens``."""
    import numpy as np

    from transforms.elements import DocumentBatch, narrow_ids
    from transforms.packing.group import BLOCK_BYTES

    rng = np.random.default_rng(seed)
    mu = np.log(mean_tokens) - SIGMA**2 / 2
    blocks, lengths, total, documents, held = [], [], 0, 0, 0

    def block() -> None:
        offsets = np.zeros(len(lengths) + 1, dtype=np.int64)
        np.cumsum(lengths, out=offsets[1:])
        count, size = len(lengths), int(offsets[-1])
        flags = {}
        if "word_starts" in features:
            flags["word_starts"] = rng.random(size) < 0.75
        if "sentence_starts" in features:
            flags["sentence_starts"] = rng.random(size) < 0.05
        ids, _ = narrow_ids(rng.integers(10, vocab, size=size, dtype=np.int32))  # as Tokenize sends them
        blocks.append(DocumentBatch(np.frombuffer(rng.bytes(16 * count), np.uint8).reshape(-1, 16),
                                    np.zeros(count, np.uint64), offsets, ids, flags).encode())
        lengths.clear()

    while total < tokens:
        length = int(min(max(1, rng.lognormal(mu, SIGMA)), tokens - total))
        lengths.append(length)
        documents += 1
        total += length + 1
        held += length
        if held * 2 >= BLOCK_BYTES:
            block()
            held = 0
    if lengths:
        block()
    return blocks, documents


def measure_group(objective: str, group_tokens: int, seq_len: int, mean_tokens: int = MEAN_TOKENS) -> dict:
    """Peak memory of Pack + Build on one synthetic group (run in a fresh process)."""
    from pipelines.options import parse_args
    from pipelines.plan import plan_run
    from transforms.building.parallel import BuildConfig, ChunkBuilder
    from transforms.packing.pack import Pack, _PackBucket

    options = parse_args(["--input", SAMPLE, "--tokenizer", TOKENIZER, "--output", tempfile.mkdtemp(),
                          *_objective_args(objective, seq_len), "--add-special-tokens"])
    plan = plan_run(options)
    special = plan.resolved.special
    pack = _PackBucket(plan.objective, "concat", 0, special.eos)
    config = BuildConfig(plan.objective, special, plan.schema, 0, 1)
    builder = ChunkBuilder(config)
    with open("/proc/self/clear_refs", "w") as handle:
        handle.write("5")  # reset the peak (VmHWM) to what is resident now
    before = _status_bytes("VmRSS")
    start = time.perf_counter()
    group, documents = synthetic_group(group_tokens, frozenset(plan.objective.features), special.vocab_size - 200,
                                       mean_tokens=mean_tokens)
    chunks = examples = 0
    for output in pack.process((("train", 0), group)):
        if getattr(output, "tag", None) in (Pack.STATS, Pack.REST):
            continue
        chunks += 1
        builder.add(output, 1)  # the encoded batches go to the shuffle: dropped here
    builder.finish()
    examples = builder.built
    del group
    peak = _status_bytes("VmHWM") - before
    return {"objective": objective, "group_tokens": group_tokens, "documents": documents, "chunks": chunks,
            "examples": examples, "peak_bytes": peak, "seconds": time.perf_counter() - start}


def measure_remainders(objective: str, groups: int, seq_len: int) -> dict:
    """Peak memory of re-packing the remainders of ``groups`` pack groups (one per group, each
    shorter than a chunk, as Pack leaves them) and building their examples (a fresh process)."""
    import numpy as np

    from pipelines.options import parse_args
    from pipelines.plan import plan_run
    from transforms.building.parallel import BuildConfig, ChunkBuilder
    from transforms.objectives.packing import document_piece
    from transforms.packing.pack import Pack, _RepackRest

    options = parse_args(["--input", SAMPLE, "--tokenizer", TOKENIZER, "--output", tempfile.mkdtemp(),
                          *_objective_args(objective, seq_len), "--add-special-tokens"])
    plan = plan_run(options)
    special = plan.resolved.special
    repack = _RepackRest(plan.objective, "concat", 0, "drop")
    builder = ChunkBuilder(BuildConfig(plan.objective, special, plan.schema, 0, 1))
    features = frozenset(plan.objective.features)
    with open("/proc/self/clear_refs", "w") as handle:
        handle.write("5")
    before = _status_bytes("VmRSS")
    start = time.perf_counter()
    rng = np.random.default_rng(0)
    rests, tokens = [], 0
    for group in range(groups):
        length = int(rng.integers(1, seq_len))
        flags = {name: rng.random(length - 1) < 0.5 for name in features}
        rests.append((group, [document_piece(rng.integers(10, special.vocab_size - 200, length - 1, dtype=np.int32),
                                             special.eos,
                                             flags)]))
        tokens += length
    chunks = 0
    for output in repack.process(("train", rests)):
        if getattr(output, "tag", None) == Pack.STATS:
            continue
        chunks += 1
        builder.add(output, 1)
    builder.finish()
    del rests
    return {"objective": objective, "groups": groups, "tokens": tokens, "chunks": chunks,
            "peak_bytes": _status_bytes("VmHWM") - before, "seconds": time.perf_counter() - start}


def _child(spec: dict) -> dict:
    if spec["kind"] == "group":
        return measure_group(spec["objective"], spec["group_tokens"], spec["seq_len"],
                             spec.get("mean_tokens", MEAN_TOKENS))
    if spec["kind"] == "remainders":
        return measure_remainders(spec["objective"], spec["groups"], spec["seq_len"])
    from pipelines.materialize import run

    start = time.perf_counter()
    manifest = run(spec["args"])
    wall = time.perf_counter() - start
    tokens = sum(s["document_tokens"] for s in manifest.splits.values())
    return {"wall": wall, "tokens": tokens}


def measure(spec: dict) -> dict:
    """One measurement in a fresh Python process (the repository first on its path)."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [ROOT, os.environ.get("PYTHONPATH")]))}
    done = subprocess.run([sys.executable, "-m", "benchmarks.bench_scale", "--child", json.dumps(spec)],
                          cwd=ROOT, env=env, capture_output=True, text=True)
    lines = done.stdout.strip().splitlines()
    if done.returncode != 0 or not lines or not lines[-1].startswith(_RESULT):
        raise SystemExit(f"measurement {spec} failed (exit {done.returncode}):\n{done.stdout[-2000:]}"
                         f"{done.stderr[-4000:]}")
    return json.loads(lines[-1][len(_RESULT):])


def memory_table(objectives: list[str], sizes_m: list[float], seq_len: int, mean_tokens: int = MEAN_TOKENS) -> None:
    print(f"Pack + Build peak memory per group (seq-len {seq_len}; synthetic documents of mean "
          f"~{mean_tokens} tokens; each in a fresh process):")
    print(f"  {'objective':<16}{'group tokens':>14}{'documents':>11}{'examples':>10}{'peak MiB':>10}"
          f"{'bytes/token':>13}{'s':>7}")
    for objective in objectives:
        for size in sizes_m:
            result = measure({"kind": "group", "objective": objective, "group_tokens": int(size * 2**20),
                              "seq_len": seq_len, "mean_tokens": mean_tokens})
            per_token = result["peak_bytes"] / result["group_tokens"]
            print(f"  {objective:<16}{result['group_tokens']:>14,}{result['documents']:>11,}{result['examples']:>10,}"
                  f"{result['peak_bytes'] / 2**20:>10,.0f}{per_token:>13.2f}{result['seconds']:>7.1f}", flush=True)


def remainders_table(objectives: list[str], groups: list[int], seq_len: int) -> None:
    print(f"re-packing the remainders of N groups, one key per split (seq-len {seq_len}; each in a fresh process):")
    print(f"  {'objective':<16}{'groups':>10}{'tokens':>14}{'peak MiB':>10}{'bytes/group':>13}{'s':>7}")
    for objective in objectives:
        for count in groups:
            result = measure({"kind": "remainders", "objective": objective, "groups": count, "seq_len": seq_len})
            print(f"  {objective:<16}{count:>10,}{result['tokens']:>14,}{result['peak_bytes'] / 2**20:>10,.0f}"
                  f"{result['peak_bytes'] / count:>13,.0f}{result['seconds']:>7.1f}", flush=True)


def throughput_table(corpus: str, tokenizer: str, objectives: list[str], seq_len: int, rounds: int) -> None:
    best: dict[tuple[str, int], float] = {}
    tokens = {}
    for _ in range(rounds):
        for objective in objectives:
            for workers in (1, 2):
                out = tempfile.mkdtemp(prefix="lmshards-scale-")
                try:
                    result = measure({"kind": "materialize", "args": [
                        "--input", corpus, "--tokenizer", tokenizer, "--output", out, "--overwrite",
                        "--formats", "arrow,webdataset", "--validation-fraction", "0.01", "--progress-seconds", "0",
                        *_objective_args(objective, seq_len), "--direct_running_mode=multi_processing",
                        f"--direct_num_workers={workers}"]})
                finally:
                    shutil.rmtree(out, ignore_errors=True)
                key = (objective, workers)
                best[key] = min(best.get(key, float("inf")), result["wall"])
                tokens[objective] = result["tokens"]
    print(f"throughput, multi-processing runner (best of {rounds}; corpus {corpus}):")
    for objective in objectives:
        one, two = best[objective, 1], best[objective, 2]
        print(f"  {objective:<16} 1 worker {tokens[objective] / one:>11,.0f} tokens/s ({one:.1f} s)   "
              f"2 workers {tokens[objective] / two:>11,.0f} tokens/s ({two:.1f} s)   2 / 1: {one / two:.2f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--memory", action="store_true", help="Pack + Build peak memory per group size")
    parser.add_argument("--throughput", action="store_true", help="materialize with 1 and 2 worker processes")
    parser.add_argument("--remainders", default="", metavar="N,...",
                        help="also measure re-packing the remainders of N pack groups (the one single-keyed "
                        "stage whose size grows with the corpus: one remainder per group)")
    parser.add_argument("--objectives", default="clm,bart", help="comma-separated objectives")
    parser.add_argument("--group-tokens", default="4,16,64", help="group sizes in Mi tokens (2**20)")
    parser.add_argument("--seq-len", type=int, default=1024)
    parser.add_argument("--mean-tokens", type=int, default=MEAN_TOKENS, help="--memory: mean document length")
    parser.add_argument("--corpus", help="corpus glob for --throughput (default: the 60 MB docstring corpus)")
    parser.add_argument("--megabytes", type=float, default=60, help="size of the default corpus")
    parser.add_argument("--tokenizer", help="tokenizer for --throughput (default: bench_materialize's 32k BPE)")
    parser.add_argument("--rounds", type=int, default=2, help="rounds of throughput runs (best counts)")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(_RESULT + json.dumps(_child(json.loads(args.child))), flush=True)
        return
    objectives = [o for o in args.objectives.split(",") if o]
    if args.memory:
        memory_table(objectives, [float(s) for s in args.group_tokens.split(",")], args.seq_len, args.mean_tokens)
    if args.remainders:
        remainders_table(objectives, [int(n) for n in args.remainders.split(",")], args.seq_len)
    if args.throughput:
        from benchmarks.bench_materialize import CACHE, corpus_of

        corpus = args.corpus or corpus_of(args.megabytes)
        tokenizer = args.tokenizer or os.path.join(CACHE, "bpe32k.json")
        if not os.path.exists(tokenizer):
            raise SystemExit(f"{tokenizer}: no tokenizer; run benchmarks.bench_materialize once or pass --tokenizer")
        throughput_table(corpus, tokenizer, objectives, args.seq_len, args.rounds)
    if not (args.memory or args.throughput or args.remainders):
        parser.error("choose --memory, --remainders and/or --throughput")


if __name__ == "__main__":
    main()
