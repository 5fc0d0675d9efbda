"""The fixed cost of a run: a small ``materialize`` job, repeated in one process, two checkouts.

On the bundled sample (a few hundred kB) a run's time is almost all fixed cost: planning (flag
parsing, the tokenizer, the encoder's parity probe), building Beam's graph (Beam inspects every
DoFn's methods several times per ParDo) and the FnApiRunner's stages. The test suite pays it
once per whole run (about a hundred runs in the fast selection), a user once per job.

Each checkout runs in its own fresh process: one warm-up run, then ``--runs`` timed runs of
the same job, each into a new output directory; the median wall time, the median time of
``pipeline.run`` alone (the manifest's ``pipeline_seconds``) and the number of the runner's
stages are printed. The processes of the two checkouts alternate over ``--rounds`` rounds, so
a phase of a shared machine slows both alike; the ratio is after / before.

    python -m benchmarks.fixed_cost --before /tmp/before
    python -m benchmarks.fixed_cost --before /tmp/before --args='--objective bart --seq-len 128'
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import statistics
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

_CHILD = r"""
import json, logging, os, statistics, sys, tempfile, time
root, runs, args = sys.argv[1], int(sys.argv[2]), sys.argv[3:]
sys.path.insert(0, root)
os.chdir(root)
from pipelines import materialize

stages = []
class _Stages(logging.Handler):
    def emit(self, record):
        if record.getMessage().startswith("Running bundle for stage"):
            stages.append(1)
logger = logging.getLogger("apache_beam.runners.portability.fn_api_runner.fn_runner.run_bundle")

def once():
    out = os.path.join(tempfile.mkdtemp(), "o")
    argv = ["--input", "data/sample/*", "--tokenizer", "data/tokenizer.json", "--output", out, *args]
    start = time.perf_counter()
    manifest, _ = materialize.run_job(argv)
    return time.perf_counter() - start, manifest.run["pipeline_seconds"]

once()
walls, pipelines = zip(*(once() for _ in range(runs)))
stages.clear()
logger.addHandler(_Stages()); logger.setLevel(logging.DEBUG); logger.propagate = False
once()
print(json.dumps({"wall": statistics.median(walls), "pipeline": statistics.median(pipelines), "stages": len(stages)}))
"""


def measure(root: str, runs: int, args: list[str]) -> dict:
    done = subprocess.run([sys.executable, "-c", _CHILD, root, str(runs), *args], capture_output=True, text=True,
                          check=False)
    if done.returncode != 0:
        raise SystemExit(f"{root}: the run failed:\n{done.stderr[-2000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--before", required=True, help="the checkout before the change")
    parser.add_argument("--after", default=ROOT, help="the checkout after it (default this one)")
    parser.add_argument("--args", default="--seq-len 128", help="materialize flags besides input, tokenizer, output")
    parser.add_argument("--runs", type=int, default=5, help="timed runs per process")
    parser.add_argument("--rounds", type=int, default=3, help="alternating processes per checkout")
    options = parser.parse_args()
    args = shlex.split(options.args)
    results: dict[str, list[dict]] = {"before": [], "after": []}
    for _ in range(options.rounds):
        for name in ("before", "after"):
            results[name].append(measure(os.path.abspath(getattr(options, name)), options.runs, args))
    medians = {}
    for name, rows in results.items():
        medians[name] = {key: statistics.median(row[key] for row in rows) for key in ("wall", "pipeline")}
        stages = sorted({row["stages"] for row in rows})
        print(f"{name:6s} wall {medians[name]['wall']:.3f} s, pipeline.run {medians[name]['pipeline']:.3f} s, "
              f"{'/'.join(map(str, stages))} stages  ({getattr(options, name)})")
    print(f"after / before: wall {medians['after']['wall'] / medians['before']['wall']:.2f}, "
          f"pipeline.run {medians['after']['pipeline'] / medians['before']['pipeline']:.2f}")


if __name__ == "__main__":
    main()
