"""Throughput of ``lmshards materialize`` as a ratio to the encoders' own ceilings.

One run, one corpus, one tokenizer:

1. ceilings: each exact encoder over every document already in memory, batches of 512, all
   cores: fastokens' ``encode_batch_flat`` (the fastest any pipeline could tokenize this
   corpus: the ratios are to it) and HF tokenizers' ``encode_batch_fast`` (the reference,
   and the ceiling of earlier benchmark runs: its ratio is printed beside);
2. ``materialize`` wall time (reading, decompressing, hashing, tokenizing, packing, building
   examples, writing Arrow and WebDataset shards and the manifest, Beam start-up included)
   per objective, runner mode and ``--encoder`` (``--encoders auto,tokenizers``), as tokens/s
   and as ratios to the two ceilings;
3. the HF ``datasets.map(batched=True, num_proc=2)`` + ``group_texts`` idiom on the same
   corpus and tokenizer, as a ratio (``--hf-idiom``);
4. time per token and peak resident memory (whole process tree) of ``materialize`` runs on
   corpora of several sizes (``--sizes 20,80,320``), each in its own process.

The machine may be shared and noisy, so only ratios measured in the same run mean much.

    python -m benchmarks.bench_materialize --megabytes 60 --objectives clm,ul2 --hf-idiom --sizes 20,80,320
    python -m benchmarks.bench_materialize --objectives clm --encoders auto,tokenizers --repeats 3
    python -m benchmarks.bench_materialize --corpus 'DIR/*.jsonl.gz' --tokenizer tok.json --repeats 3

The ceiling and the materialize runs are measured in interleaved rounds (``--repeats N``
rounds, at least 2 for the ceiling): each round measures the ceiling once and then every
materialize run once, so a phase of a shared machine slows both alike; the fastest of each
counts.

Every measurement runs in a fresh Python process, as a user's job would, timed from inside
it (imports excluded, Beam start-up included): a process that has just run the encoder over
the whole corpus, ``encode_batch`` above all, leaves its heap in a state that made a
following 60 MB clm run about 10% slower (12.5 to 13.0 s against 11.1 to 11.8 s in a fresh
process, same machine, alternating), which measured the benchmark, not the pipeline.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

from benchmarks.corpus import write_corpus
from benchmarks.memory import run_and_measure
from pipelines.train_tokenizer import train_tokenizer
from transforms.reading.read import iter_file_records

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CACHE = os.path.join(ROOT, "benchmarks", ".cache")
MODES = {
    "in_process": [],
    "multi_processing": ["--direct_running_mode=multi_processing", "--direct_num_workers=2"],
}


def load_texts(pattern: str) -> list[str]:
    texts = []
    for path in sorted(glob.glob(pattern)):
        texts.extend(r[2] for r in iter_file_records(path, text_field="text") if not isinstance(r, dict))
    return texts


def corpus_of(megabytes: float) -> str:
    directory = os.path.join(CACHE, f"docstrings-{megabytes:g}mb")
    if not os.path.isdir(directory):
        write_corpus(directory + ".partial", megabytes)
        os.rename(directory + ".partial", directory)
    return os.path.join(directory, "*.jsonl.gz")


#: Ceiling methods: a backend's batch call, as the pipeline makes it ("</s>" in a text is text).
CEILINGS = {
    "fastokens": "fastokens encode_batch_flat",
    "encode_batch_fast": "tokenizers encode_batch_fast",
    "encode_batch": "tokenizers encode_batch (offsets and word ids)",
}


def ceiling(tokenizer_path: str, texts: list[str], batch_size: int = 512, repeats: int = 2,
            method: str = "fastokens") -> tuple[float, int]:
    """Tokens/s of one encoder method over ``texts`` (best of ``repeats``) and the token count."""
    with open(tokenizer_path, encoding="utf-8") as handle:
        data = handle.read()
    if method == "fastokens":
        import fastokens

        tokenizer = fastokens.Tokenizer.from_json_str(data)

        def count(batch):
            ids, _ = tokenizer.encode_batch_flat(batch, add_special_tokens=False, split_special_tokens=True)
            return len(ids) // 4
    else:
        from tokenizers import Tokenizer

        tokenizer = Tokenizer.from_str(data)
        tokenizer.encode_special_tokens = True
        encode = getattr(tokenizer, method)

        def count(batch):
            return sum(len(encoding.ids) for encoding in encode(batch, add_special_tokens=False))
    best = float("inf")
    tokens = 0
    for _ in range(repeats):
        start = time.perf_counter()
        tokens = sum(count(texts[i : i + batch_size]) for i in range(0, len(texts), batch_size))
        best = min(best, time.perf_counter() - start)
    return tokens / best, tokens


def default_tokenizer(texts: list[str]) -> str:
    """The benchmarks' tokenizer: a 32k byte-level BPE with 128 sentinels and the UL2 mode
    tokens, trained on the first half of ``texts`` once and cached."""
    tokenizer = os.path.join(CACHE, "bpe32k.json")
    if not os.path.exists(tokenizer):
        trained = train_tokenizer(texts[: len(texts) // 2], vocab_size=32000, num_sentinels=128,
                                  extra_tokens=("[R]", "[S]", "[X]", "[NLU]", "[S2S]", "[NLG]"))
        trained.save(tokenizer)
    return tokenizer


def objective_args(objective: str, seq_len: int) -> list[str]:
    if objective in ("span_corruption", "ul2"):
        return ["--objective", objective, "--inputs-length", "512"]
    return ["--objective", objective, "--seq-len", str(seq_len)]


def run_materialize(args: list[str]) -> tuple[float, int]:
    from pipelines.materialize import run

    start = time.perf_counter()
    manifest = run(args)
    wall = time.perf_counter() - start
    tokens = sum(s["document_tokens"] for s in manifest.splits.values()) - manifest.counts["documents_written"]
    return wall, tokens


def _child(spec: dict) -> dict:
    """One measurement, in this (fresh) process: see :func:`measure`."""
    if spec["kind"] == "ceiling":
        rate, tokens = ceiling(spec["tokenizer"], load_texts(spec["corpus"]), repeats=1, method=spec["method"])
        return {"rate": rate, "tokens": tokens}
    if spec["kind"] == "hf_idiom":
        from benchmarks.hf_idiom import run_hf_idiom

        wall, tokens = run_hf_idiom(spec["corpus"], spec["tokenizer"], spec["seq_len"])
        return {"wall": wall, "tokens": tokens}
    wall, tokens = run_materialize(spec["args"])
    return {"wall": wall, "tokens": tokens}


def child_env() -> dict[str, str]:
    """The environment of every measured process: this one's as it started, with the repository
    on ``PYTHONPATH``.

    Always passed explicitly: the Rust tokenizer sets ``TOKENIZERS_PARALLELISM=false`` in the
    C environment of a process that forked after encoding in parallel (the HF idiom's
    ``num_proc``), which ``os.environ`` does not show but a child inherits by default; an
    in-process run then encodes on one thread (measured: 80 MB clm 31.2 s instead of 17.1 s).
    """
    return {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [ROOT, os.environ.get("PYTHONPATH")]))}


def measure(spec: dict, env: dict[str, str] | None = None, root: str = ROOT,
            module: str = "benchmarks.bench_materialize") -> dict:
    """Run one measurement (``{"kind": "ceiling", "corpus", "tokenizer", "method"}``,
    ``{"kind": "materialize", "args"}`` or ``{"kind": "hf_idiom", "corpus", "tokenizer",
    "seq_len"}``) in a fresh Python process; its result dict.

    ``env``: variables added to the process's environment; ``root``: the checkout whose code
    runs (default this one); ``module``: the benchmark whose ``--child`` runs it (one that
    prints its result after :data:`RESULT_PREFIX`, as this one does)."""
    environ = {**child_env(), **(env or {})}
    if root != ROOT:
        environ["PYTHONPATH"] = os.pathsep.join(filter(None, [root, os.environ.get("PYTHONPATH")]))
    done = subprocess.run([sys.executable, "-m", module, "--child", json.dumps(spec)],
                          cwd=root, env=environ, capture_output=True, text=True)
    lines = done.stdout.strip().splitlines()
    if done.returncode != 0 or not lines or not lines[-1].startswith(RESULT_PREFIX):
        raise SystemExit(f"measurement {spec} failed (exit {done.returncode}):\n"
                         f"{done.stdout[-2000:]}{done.stderr[-4000:]}")
    return json.loads(lines[-1][len(RESULT_PREFIX):])


#: What a measuring child prints before its result's JSON, on its last line.
RESULT_PREFIX = "bench-result "


def line(label: str, rate: float, ceilings: tuple[float, float], extra: str = "") -> None:
    fast, reference = ceilings
    print(f"{label:<60} {rate:>12,.0f} tokens/s   {rate / fast:6.3f}   {rate / reference:6.2f}   {extra}",
          flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--corpus", help="glob of corpus files (default: build a docstring corpus)")
    parser.add_argument("--megabytes", type=float, default=60, help="size of the built corpus")
    parser.add_argument("--tokenizer", help="tokenizer.json (default: train a 32k byte-level BPE on the corpus)")
    parser.add_argument("--seq-len", type=int, default=1024)
    parser.add_argument("--objectives", default="clm", help="comma-separated objectives to time")
    parser.add_argument("--modes", default="in_process,multi_processing", help="runner modes to time")
    parser.add_argument("--encoders", default="auto",
                        help="comma-separated --encoder values of the materialize runs (auto, fastokens, tokenizers)")
    parser.add_argument("--hf-idiom", action="store_true", help="also time the HF datasets.map idiom")
    parser.add_argument("--sizes", default="", help="corpus sizes in MB for time/token and memory, e.g. 20,80,320")
    parser.add_argument("--with-offsets", action="store_true",
                        help="also time encode_batch (offsets, word ids: unneeded with a byte-level BPE)")
    parser.add_argument("--repeats", type=int, default=1,
                        help="rounds of materialize runs, each after one ceiling measurement (the fastest of "
                             "each counts; the ceiling gets at least 2 rounds)")
    parser.add_argument("--child", help=argparse.SUPPRESS)  # one measurement, in a fresh process
    args = parser.parse_args()

    if args.child:
        print(RESULT_PREFIX + json.dumps(_child(json.loads(args.child))), flush=True)
        return
    corpus = args.corpus or corpus_of(args.megabytes)
    texts = load_texts(corpus)
    size = sum(len(t.encode("utf-8")) for t in texts) / 2**20
    tokenizer = args.tokenizer or default_tokenizer(texts)
    print(f"corpus: {corpus}: {len(texts):,} documents, {size:.1f} MB of text; tokenizer {tokenizer}")
    print(f"cores: {os.cpu_count()}; columns: tokens/s, ratio to the fastokens ceiling, ratio to the tokenizers "
          "ceiling")
    # Rounds: each measures the ceilings once and then every materialize run once, so that all
    # of them sample the same phases of a shared, noisy machine; each figure printed is the
    # best of its rounds.
    methods = ["fastokens", "encode_batch_fast"] + (["encode_batch"] if args.with_offsets else [])
    runs = [(objective, mode, encoder) for objective in args.objectives.split(",")
            for mode in args.modes.split(",") for encoder in args.encoders.split(",")]
    rates = dict.fromkeys(methods, 0.0)
    tokens = None
    walls = {run: float("inf") for run in runs}
    rounds = max(2, args.repeats)
    for round_index in range(rounds):
        for method in methods:
            result = measure({"kind": "ceiling", "corpus": corpus, "tokenizer": tokenizer, "method": method})
            if tokens is not None and result["tokens"] != tokens:
                raise SystemExit(f"the {method} ceiling saw {result['tokens']} tokens, another {tokens}")
            rates[method], tokens = max(rates[method], result["rate"]), result["tokens"]
        if round_index >= max(1, args.repeats):
            continue  # the ceilings get at least two rounds, like before
        for objective, mode, encoder in runs:
            out = tempfile.mkdtemp(prefix="lmshards-bench-")
            try:
                result = measure({"kind": "materialize", "args": [
                    "--input", corpus, "--tokenizer", tokenizer, "--output", out, "--formats", "arrow,webdataset",
                    "--validation-fraction", "0.01", "--overwrite", "--progress-seconds", "0",
                    "--encoder", encoder, *objective_args(objective, args.seq_len), *MODES[mode]]})
                run_wall, got = result["wall"], result["tokens"]
            finally:
                shutil.rmtree(out, ignore_errors=True)
            if got != tokens:
                raise SystemExit(f"materialize saw {got} tokens, the ceiling run {tokens}")
            walls[objective, mode, encoder] = min(walls[objective, mode, encoder], run_wall)
    del texts
    print(f"best of {rounds} rounds (ceilings) and {max(1, args.repeats)} (materialize), interleaved")
    ceilings = (rates["fastokens"], rates["encode_batch_fast"])
    for method in methods:
        line(f"ceiling: {CEILINGS[method]}", rates[method], ceilings, f"({tokens / rates[method]:.2f} s)")
    for (objective, mode, encoder), wall in walls.items():
        line(f"materialize {objective} ({mode}, --encoder {encoder})", tokens / wall, ceilings, f"({wall:.1f} s)")
    for objective, mode in dict.fromkeys((o, m) for o, m, _ in runs):
        by_encoder = {e: walls[o, m, e] for o, m, e in runs if (o, m) == (objective, mode)}
        if "tokenizers" in by_encoder and len(by_encoder) > 1:
            others = ", ".join(f"--encoder {e} {by_encoder['tokenizers'] / w:.2f}x"
                               for e, w in by_encoder.items() if e != "tokenizers")
            print(f"speed-up over --encoder tokenizers, {objective} ({mode}): {others}")
    if args.hf_idiom:
        result = measure({"kind": "hf_idiom", "corpus": corpus, "tokenizer": tokenizer, "seq_len": args.seq_len})
        line("HF datasets.map(num_proc=2) + group_texts", result["tokens"] / result["wall"], ceilings,
             f"({result['wall']:.1f} s)")
    if args.sizes:
        print("\nscaling (clm, in_process, each run in its own process; wall includes interpreter start-up):")
        results = []
        for megabytes in [float(s) for s in args.sizes.split(",")]:
            pattern = corpus_of(megabytes)
            out = tempfile.mkdtemp(prefix="lmshards-bench-")
            try:
                for mode, beam_args in MODES.items():
                    code, wall, peak = run_and_measure(
                        [sys.executable, "-m", "pipelines.materialize", "--input", pattern, "--tokenizer", tokenizer,
                         "--output", out, "--overwrite", "--formats", "arrow,webdataset", "--progress-seconds", "0",
                         *objective_args("clm", args.seq_len), *beam_args],
                        stdout=subprocess_devnull(), stderr=subprocess_devnull(), env=child_env())
                    if code != 0:
                        raise SystemExit(f"materialize failed on the {megabytes:g} MB corpus ({mode})")
                    with open(os.path.join(out, "manifest.json")) as handle:
                        manifest = json.load(handle)
                    got = sum(s["document_tokens"] for s in manifest["splits"].values())
                    results.append((megabytes, mode, wall, got, peak))
                    print(f"  {megabytes:>6g} MB  {mode:<17} {wall:7.1f} s  {got:>12,} tokens  "
                          f"{wall / got * 1e6:6.2f} us/token  peak RSS {peak / 2**20:7.0f} MiB", flush=True)
            finally:
                shutil.rmtree(out, ignore_errors=True)
        for mode in MODES:
            rows = [r for r in results if r[1] == mode]
            if len(rows) >= 2:
                small, large = rows[0], rows[-1]
                ratio = (large[2] / large[3]) / (small[2] / small[3])
                print(f"  time per token, largest / smallest corpus ({mode}): {ratio:.2f}")
                # Start-up and other fixed costs weigh on the small corpus: the slope between the two
                # largest is the time each further token costs.
                before = rows[-2]
                slope = (large[2] - before[2]) / (large[3] - before[3]) * 1e6
                print(f"  time per further token, {before[0]:g} -> {large[0]:g} MB ({mode}): {slope:.2f} us "
                      f"({slope / (large[2] / large[3] * 1e6):.2f} of the largest corpus's average)")


def subprocess_devnull():
    return open(os.devnull, "wb")


if __name__ == "__main__":
    main()
