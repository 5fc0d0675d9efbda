"""Repeated ``--workers N`` runs of materialize on one corpus: rows, wall time, peak RSS per process.

Each run is a whole ``lmshards materialize`` command; while it runs, every process of its tree
is sampled for its peak resident set (``VmHWM`` of /proc/PID/status), so the launcher and each
SDK worker get a figure of their own. A run that loses rows fails its own end-to-end check
(exit 1); this script prints that too. An in-process run of the same command (``--workers 1``)
is measured in the same session as the baseline.

    python -m benchmarks.corpus --output /tmp/c320 --megabytes 320
    python -m benchmarks.bench_workers --input '/tmp/c320/*.jsonl.gz' --repeats 3
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
import time

from benchmarks.memory import _children

__all__ = ["measure_run", "sample_peaks"]


def _peak_kb(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/status") as handle:
            for line in handle:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return 0


def _role(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as handle:
            cmd = handle.read().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return "?"
    return "sdk worker" if "sdk_worker_main" in cmd else "launcher" if "materialize" in cmd else cmd[:40]


def sample_peaks(command: list[str], role) -> dict:
    """Run ``command``; its exit status ``rc``, wall ``seconds``, ``output``, and ``peaks``:
    ``{pid: (role, peak KiB)}`` of each process of its tree that ``role(pid)`` names (None: left out)."""
    start = time.monotonic()
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    peaks: dict[int, tuple[str, int]] = {}
    while proc.poll() is None:
        tree, todo = _children(), [proc.pid]
        while todo:
            pid = todo.pop()
            todo.extend(tree.get(pid, []))
            name = peaks[pid][0] if pid in peaks else role(pid)
            kb = _peak_kb(pid)
            if name and kb:
                peaks[pid] = (name, max(kb, peaks.get(pid, (name, 0))[1]))
        time.sleep(0.2)
    output = proc.stdout.read()
    return {"rc": proc.returncode, "seconds": round(time.monotonic() - start, 1), "output": output, "peaks": peaks}


def measure_run(command: list[str]) -> dict:
    """Run ``command``; its exit status, wall seconds and peak RSS (MiB) of each process of its tree."""
    result = sample_peaks(command, _role)
    result["peaks_mib"] = sorted(((role, kb // 1024) for role, kb in result.pop("peaks").values()
                                  if role in ("launcher", "sdk worker") and kb > 10 << 10),
                                 key=lambda r: (r[0], -r[1]))
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--input", required=True)
    parser.add_argument("--tokenizer", default="data/tokenizer.json")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--objective", default="clm")
    parser.add_argument("--seq-len", default="1024")
    parser.add_argument("--extra", default="", help="further materialize arguments, one string (e.g. "
                        "'--pack-group-tokens 16777216')")
    args = parser.parse_args()
    out = tempfile.mkdtemp(prefix="bench-workers-")
    base = [sys.executable, "-m", "pipelines.materialize", "--input", args.input, "--tokenizer", args.tokenizer,
            "--objective", args.objective, "--seq-len", args.seq_len, "--validation-fraction", "0.01",
            "--output", os.path.join(out, "ds"), "--overwrite", *shlex.split(args.extra)]
    try:
        runs = [("in-process", base)] + [(f"--workers {args.workers} #{i + 1}", base + ["--workers", str(args.workers)])
                                         for i in range(args.repeats)]
        for name, command in runs:
            result = measure_run(command)
            rows = None
            if result["rc"] == 0:
                with open(os.path.join(out, "ds", "manifest.json")) as handle:
                    manifest = json.load(handle)
                rows = {split: info["examples"] for split, info in manifest["splits"].items()}
            tail = "" if result["rc"] == 0 else " " + result["output"].strip().splitlines()[-1][:200]
            print(f"{name}: exit {result['rc']}, {result['seconds']} s, rows {rows}, peak RSS MiB "
                  f"{result['peaks_mib']}{tail}", flush=True)
    finally:
        shutil.rmtree(out, ignore_errors=True)


if __name__ == "__main__":
    main()
