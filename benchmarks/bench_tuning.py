"""Is a piece of runner tuning worth keeping? ``materialize`` with and without it, in pairs.

The rule: a piece of tuning stays only where it pays at least 5 % of a whole
``materialize`` run on the benchmark corpus (60 MB of docstrings, the 32k BPE: see
``bench_materialize.py``), as the median of at least 5 interleaved with/without pairs,
and every pair shows a gain. This script measures such pairs: each run in a fresh Python
process (``bench_materialize.measure``: imports excluded, Beam start-up included), the two
sides of a pair back to back, the side that goes first alternating from pair to pair, so
that a busy phase of the shared machine weighs on both alike. The outputs of the two sides
must be the same bytes (every file but ``manifest.json``), which the script checks.

The sides differ by environment variables, by ``materialize`` flags, or by the checkout
whose code runs (``--without-tree``: say, the commit before a piece was deleted)::

    python -m benchmarks.bench_tuning --objective bart --with-args=--workers=1 \\
        --without-args=--direct_running_mode=multi_processing,--direct_num_workers=2
    python -m benchmarks.bench_tuning --objective clm --without-tree /tmp/before --pairs 7

Printed per pair: both wall times, the gain ``1 - with / without`` (the share of the run's
time the piece saves; negative: it costs) and the 1-minute load average before the pair
(the machine has 2 cores); then the median gain and whether every pair gained.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import tempfile

from benchmarks.bench_materialize import CACHE, MODES, ROOT, measure, objective_args

CORPUS = os.path.join(CACHE, "docstrings-60mb", "*.jsonl.gz")
TOKENIZER = os.path.join(CACHE, "bpe32k.json")


def _digests(root: str) -> dict[str, str]:
    import hashlib

    out = {}
    for directory, _, names in os.walk(root):
        for name in names:
            path = os.path.join(directory, name)
            relative = os.path.relpath(path, root)
            if relative != "manifest.json":
                with open(path, "rb") as handle:
                    out[relative] = hashlib.file_digest(handle, "sha256").hexdigest()
    return out


def _pairs_of(values: list[str]) -> dict[str, str]:
    return dict(value.split("=", 1) for value in values)


def run_side(base: list[str], side: dict) -> tuple[float, dict[str, str]]:
    """Wall seconds of one ``materialize`` run of ``side`` and the digests of what it wrote."""
    out = tempfile.mkdtemp(prefix="lmshards-tuning-")
    try:
        result = measure({"kind": "materialize", "args": [*base, "--output", out, *side["args"]]},
                         env=side["env"], root=side["tree"])
        return result["wall"], _digests(out)
    finally:
        shutil.rmtree(out, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--objective", default="clm")
    parser.add_argument("--mode", choices=sorted(MODES), default="in_process", help="the runner mode of both sides")
    parser.add_argument("--pairs", type=int, default=5)
    parser.add_argument("--corpus", default=CORPUS)
    parser.add_argument("--tokenizer", default=TOKENIZER)
    parser.add_argument("--seq-len", type=int, default=1024)
    for side in ("with", "without"):
        parser.add_argument(f"--{side}-env", action="append", default=[], metavar="NAME=VALUE",
                            help=f"environment variable of the runs {side} the piece (repeatable)")
        parser.add_argument(f"--{side}-args", default="", metavar="FLAGS",
                            help=f"comma-separated materialize flags of the runs {side} the piece")
        parser.add_argument(f"--{side}-tree", default=ROOT, metavar="CHECKOUT",
                            help=f"the checkout whose code runs {side} the piece (default this one)")
    args = parser.parse_args()
    base = ["--input", args.corpus, "--tokenizer", args.tokenizer, "--formats", "arrow,webdataset",
            "--validation-fraction", "0.01", "--overwrite", "--progress-seconds", "0",
            *objective_args(args.objective, args.seq_len), *MODES[args.mode]]
    sides = {name: {"env": _pairs_of(getattr(args, f"{name}_env")),
                    "args": [a for a in getattr(args, f"{name}_args").split(",") if a],
                    "tree": os.path.abspath(getattr(args, f"{name}_tree"))} for name in ("with", "without")}
    print(f"{args.objective}, {args.mode}: with {sides['with']}, without {sides['without']}", flush=True)
    gains, loads, reference = [], [], None
    for index in range(args.pairs):
        load = os.getloadavg()[0]
        loads.append(load)
        walls = {}
        for name in (("with", "without") if index % 2 == 0 else ("without", "with")):
            walls[name], digests = run_side(base, sides[name])
            if reference is None:
                reference = digests
            elif digests != reference:
                raise SystemExit(f"pair {index + 1}: the run {name} the piece wrote other bytes")
        gain = 1 - walls["with"] / walls["without"]
        gains.append(gain)
        print(f"pair {index + 1}: with {walls['with']:6.2f} s, without {walls['without']:6.2f} s, "
              f"gain {gain:+6.1%}, load {load:.2f}", flush=True)
    verdict = "keep" if statistics.median(gains) >= 0.05 and all(g > 0 for g in gains) else "delete"
    print(f"median gain {statistics.median(gains):+.1%}; pairs {', '.join(f'{g:+.1%}' for g in gains)}; "
          f"every pair gained: {all(g > 0 for g in gains)}; load {min(loads):.2f}-{max(loads):.2f}; "
          f"rule (>= 5 %, every pair): {verdict}")


if __name__ == "__main__":
    main()
