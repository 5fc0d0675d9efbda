"""One corpus through each local engine and the local runner's ``--workers 2`` beside in-process,
in one session: exit, wall time, rows, shard bytes against in-process, and peak RSS per role.

Each run is a whole ``lmshards materialize`` command with the engine started by lmshards itself
(cached: ``python -m pipelines.engines fetch prism flink spark`` first). While it runs, every
process of its tree is sampled for its peak resident set (``VmHWM``), and the processes are told
apart by their command line: the launcher (the ``materialize`` process), the job server (the JVM
of Flink or Spark, Prism's Go binary), the worker pool, and the SDK workers. ``sum of peaks`` adds
every process's own peak: an upper bound of what the run held at once.

    python -m benchmarks.corpus --output /tmp/c320 --megabytes 320
    python -m benchmarks.bench_engines --input '/tmp/c320/docstrings-0[01].jsonl.gz'
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile

from benchmarks.bench_workers import sample_peaks

RUNS = [("in-process", []),
        ("local --workers 2", ["--workers", "2"]),
        ("PrismRunner", ["--runner", "PrismRunner"]),
        ("FlinkRunner --workers 2", ["--runner", "FlinkRunner", "--workers", "2"]),
        ("SparkRunner --workers 2", ["--runner", "SparkRunner", "--workers", "2"])]
ROLES = ("launcher", "job server", "worker pool", "sdk worker")


def _role(pid: int) -> str | None:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as handle:
            cmd = handle.read().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return None
    if "SdkHarness" in cmd or "sdk_worker_main" in cmd:
        return "sdk worker"
    if "worker_pool_main" in cmd:
        return "worker pool"
    if "JobServerDriver" in cmd or "prism" in os.path.basename(cmd.split(" ", 1)[0]):
        return "job server"
    if "pipelines.materialize" in cmd:
        return "launcher"
    return None  # a short-lived helper (pip freeze, the orphan guard before its exec)


def _digests(folder: str) -> dict[str, str]:
    import hashlib

    found = {}
    for root, _, files in os.walk(folder):
        for name in files:
            path = os.path.join(root, name)
            rel = os.path.relpath(path, folder)
            if rel != "manifest.json":  # the only file with run metadata
                with open(path, "rb") as handle:
                    found[rel] = hashlib.sha256(handle.read()).hexdigest()
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--input", required=True)
    parser.add_argument("--tokenizer", default="data/tokenizer.json")
    parser.add_argument("--objective", default="clm")
    parser.add_argument("--seq-len", default="1024")
    parser.add_argument("--runs", default=",".join(name.split()[0] for name, _ in RUNS),
                        help="which of in-process,local,PrismRunner,FlinkRunner,SparkRunner (comma-separated; "
                             "local: the local runner's --workers 2)")
    args = parser.parse_args()
    wanted = set(args.runs.split(","))
    scratch = tempfile.mkdtemp(prefix="bench-engines-")
    reference = None
    try:
        for name, extra in RUNS:
            if name.split()[0] not in wanted:
                continue
            out = os.path.join(scratch, name.split()[0])
            result = sample_peaks([sys.executable, "-m", "pipelines.materialize", "--input", args.input,
                              "--tokenizer", args.tokenizer, "--objective", args.objective,
                              "--seq-len", args.seq_len, "--output", out, *extra], _role)
            if result["rc"] != 0:
                print(f"{name}: exit {result['rc']}, {result['seconds']} s: "
                      f"{result['output'].strip().splitlines()[-1][:300]}", flush=True)
                continue
            with open(os.path.join(out, "manifest.json")) as handle:
                rows = {split: info["examples"] for split, info in json.load(handle)["splits"].items()}
            digests = _digests(out)
            if reference is None:
                reference = digests
                same = "the reference"
            else:
                same = "identical bytes" if digests == reference else "DIFFERENT bytes"
            by_role = {role: sorted((kb // 1024 for r, kb in result["peaks"].values() if r == role), reverse=True)
                       for role in ROLES}
            total = sum(kb for _, kb in result["peaks"].values()) // 1024
            roles = "; ".join(f"{role} {', '.join(map(str, mib))}" for role, mib in by_role.items() if mib)
            print(f"{name}: {result['seconds']} s, rows {rows}, {same}; peak RSS MiB: {roles}; "
                  f"sum of peaks {total}", flush=True)
            if name != "in-process":
                shutil.rmtree(out, ignore_errors=True)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


if __name__ == "__main__":
    main()
