"""lmshards beside its peers on one corpus, in one session: whole commands, rounds interleaved.

Each run is a fresh process timed from its start to its exit (imports included), with the peak
resident memory of its whole process tree (:func:`benchmarks.memory.run_and_measure`):

- ``plain``: the machine's limit with no framework (:mod:`benchmarks.peers`: read, parse,
  encode with fastokens, pack to ``--seq-len`` with EOS, write Arrow, a process pool over all
  cores);
- ``idiom``: HF's run_clm recipe with fastokens (:mod:`benchmarks.peers`);
- ``<objective>``: ``lmshards materialize`` in-process, Arrow output, its defaults otherwise
  (exact dedup on, validation fraction 0.01 as the idiom has none to speak of);
- ``<objective> w2``: the same with ``--workers 2``.

The corpus should be real text of at least 300 MB (``python -m benchmarks.corpus --output DIR
--megabytes 320``, Python's docstrings). Throughput is document tokens per second of the whole
command; every ratio is against ``plain`` (and clm's against ``idiom``) of the same round, the
best round of each counted. State the machine's load with the figures: it is printed.

    python -m benchmarks.bench_peers --input '/tmp/c320/*.jsonl.gz' --rounds 2
    python -m benchmarks.bench_peers --input '/tmp/c320/docstrings-0[01].jsonl.gz' --objectives clm --workers ''
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile

from benchmarks.memory import run_and_measure

OBJECTIVE_ARGS = {
    "clm": ["--objective", "clm", "--seq-len", "1024"],
    "mlm": ["--objective", "mlm", "--seq-len", "512"],
    "span_corruption": ["--objective", "span_corruption", "--inputs-length", "512"],
    "bart": ["--objective", "bart", "--seq-len", "1024"],
    "prefix_lm": ["--objective", "prefix_lm", "--seq-len", "1024"],
    "ul2": ["--objective", "ul2", "--inputs-length", "512"],
}


def _commands(args, scratch: str) -> dict[str, list[str]]:
    python = sys.executable
    peer = [python, "-m", "benchmarks.peers"]
    common = ["--input", args.input, "--tokenizer", args.tokenizer]
    commands = {
        "plain": [*peer, "plain", *common, "--output", os.path.join(scratch, "plain"), "--seq-len", "1024"],
        "idiom": [*peer, "idiom", *common, "--output", os.path.join(scratch, "idiom"), "--seq-len", "1024"],
    }
    for objective in args.objectives.split(","):
        base = [python, "-m", "pipelines.materialize", *common, *OBJECTIVE_ARGS[objective],
                "--validation-fraction", "0.01", "--overwrite"]
        commands[objective] = [*base, "--output", os.path.join(scratch, objective)]
        if args.workers:
            commands[f"{objective} w{args.workers}"] = [*base, "--output", os.path.join(scratch, f"{objective}-w"),
                                                        "--workers", str(args.workers)]
    return commands


def _tokens(output: str) -> int | None:
    for line in output.splitlines():
        if line.startswith("tokens "):
            return int(line.split()[1])
        if " document tokens" in line:  # materialize's summary
            return int(line.split(" document tokens")[0].rsplit(", ", 1)[1].replace(",", ""))
    return None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--input", required=True)
    parser.add_argument("--tokenizer", default="data/tokenizer.json")
    parser.add_argument("--objectives", default=",".join(OBJECTIVE_ARGS))
    parser.add_argument("--workers", default="2", help="--workers of the multi-process runs ('' for none)")
    parser.add_argument("--rounds", type=int, default=1)
    args = parser.parse_args()
    scratch = tempfile.mkdtemp(prefix="bench-peers-")
    best: dict[str, tuple[float, int, int]] = {}
    try:
        commands = _commands(args, scratch)
        for round_ in range(args.rounds):
            for name, command in commands.items():
                output, code, wall, peak = _run(command)
                tokens = _tokens(output)
                status = "" if code == 0 else f" EXIT {code}: {output.strip().splitlines()[-1][:200]}"
                print(f"round {round_ + 1} {name}: {wall:.1f} s, peak {peak / 2**20:,.0f} MiB, "
                      f"tokens {tokens}, load {os.getloadavg()[0]:.1f}{status}", flush=True)
                if code == 0 and (name not in best or wall < best[name][0]):
                    best[name] = (wall, peak, tokens or 0)
                shutil.rmtree(command[command.index("--output") + 1], ignore_errors=True)
        plain = best.get("plain")
        idiom = best.get("idiom")
        print("\nbest round of each: wall, peak, throughput as a fraction of plain (and x idiom)")
        for name, (wall, peak, tokens) in best.items():
            ratio = f"{plain[0] / wall:.2f} of plain" if plain else ""
            against = f", {idiom[0] / wall:.2f}x idiom" if idiom and name not in ("plain", "idiom") else ""
            print(f"  {name:22s} {wall:6.1f} s {peak / 2**20:7,.0f} MiB  {tokens / wall / 1e6:5.2f} M tokens/s  "
                  f"{ratio}{against}")
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def _run(command: list[str]):
    """(output, exit code, wall seconds, peak tree RSS bytes) of ``command``."""
    with tempfile.TemporaryFile("w+") as log:
        code, wall, peak = run_and_measure(command, stdout=log, stderr=subprocess.STDOUT)
        log.seek(0)
        return log.read(), code, wall, peak


if __name__ == "__main__":
    main()
