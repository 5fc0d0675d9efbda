"""Does a change leave every output byte as it was? Two checkouts, the same runs, compared.

A restructuring must not change what ``materialize`` writes. This script runs the same
``materialize`` commands with the code of two checkouts (``--before``: say a worktree at the
commit before the change; ``--after``: default this one) and compares every file each run
wrote, by sha256, except ``manifest.json``, whose run section (times, the command line, the
code version) differs by nature; of the manifest it compares the deterministic view
(``Manifest.deterministic_view``: counts, statistics, shard digests).

Runs: the bundled sample corpus under every objective this checkout registers (plugins
installed here included) and every packing mode (the project's tokenizer, each objective's
length parameter at 128: seq-len or inputs-length), and, with ``--corpus``, a real corpus for clm, bart
and ul2 (the benchmarks' 32k BPE). Each run is a fresh ``python -m pipelines.materialize``
process with the checkout first on its path; FnApiRunner in-process unless ``--beam-args``
says otherwise.

    python -m benchmarks.same_bytes --before /tmp/before
    python -m benchmarks.same_bytes --before /tmp/before \\
        --corpus 'benchmarks/.cache/docstrings-60mb/docstrings-0[0-2].jsonl.gz'

Exit status 0 when every pair of runs wrote the same bytes, 1 otherwise (the differing files
are listed).
"""

from __future__ import annotations

import argparse
import glob
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PACKING_MODES = ("concat", "best_fit", "none")
REAL_OBJECTIVES = ("clm", "bart", "ul2")


def _length_flags() -> dict[str, str | None]:
    """Every objective this checkout registers -> the flag of the parameter that sizes it (its
    class's ``length_parameter``; None if it has none), so that a new objective is compared
    without a line here."""
    sys.path.insert(0, ROOT)
    from transforms.objectives.registry import OBJECTIVES, objective_flags

    flags = objective_flags()
    return {name: next((f.flag for f in flags if f.dest == cls.length_parameter and name in f.objectives), None)
            for name, cls in OBJECTIVES.items()}


def _objective_args(objective: str, length: int) -> list[str]:
    flag = _length_flags().get(objective)
    return ["--objective", objective, *([flag, str(length)] if flag else [])]


def _run(tree: str, args: list[str], output: str) -> tuple[int, str]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [tree, os.environ.get("PYTHONPATH")]))}
    done = subprocess.run([sys.executable, "-m", "pipelines.materialize", *args, "--output", output,
                           "--progress-seconds", "0"], cwd=tree, env=env, capture_output=True, text=True)
    return done.returncode, (done.stdout + done.stderr)[-2000:]


def _written(output: str) -> dict[str, str]:
    """sha256 of every file under ``output`` but the manifest, and the manifest's deterministic view."""
    out = {}
    for directory, _, names in os.walk(output):
        for name in names:
            path = os.path.join(directory, name)
            relative = os.path.relpath(path, output)
            if relative == "manifest.json":
                continue
            with open(path, "rb") as handle:
                out[relative] = hashlib.file_digest(handle, "sha256").hexdigest()
    manifest = os.path.join(output, "manifest.json")
    if os.path.exists(manifest):
        sys.path.insert(0, ROOT)
        from schemas.manifest import Manifest

        with open(manifest, encoding="utf-8") as handle:
            view = Manifest.loads(handle.read()).deterministic_view()
        out["manifest.json (deterministic view)"] = hashlib.sha256(
            json.dumps(view, sort_keys=True, default=str).encode()).hexdigest()
    return out


def compare(before: str, after: str, label: str, args: list[str]) -> str:
    """``same``, ``refused`` (both checkouts refused the run) or ``DIFFERENT``, as printed."""
    outputs = {}
    scratch = tempfile.mkdtemp(prefix="lmshards-same-bytes-")
    try:
        for name, tree in (("before", before), ("after", after)):
            output = os.path.join(scratch, name)
            code, tail = _run(tree, args, output)
            outputs[name] = (code, _written(output) if code == 0 else tail.strip().splitlines()[-1:])
        (code_b, got_b), (code_a, got_a) = outputs["before"], outputs["after"]
        # Both refusing the run is no difference of bytes (exit codes and messages may differ).
        same = (code_b == code_a == 0 and got_b == got_a) or (code_b != 0 and code_a != 0)
        files = len(got_a) if code_a == 0 else 0
        verdict = ("same" if code_a == 0 else "refused") if same else "DIFFERENT"
        print(f"{label:40s} {verdict:9s} exit {code_b}/{code_a}, {files} files", flush=True)
        if not same:
            if code_b == 0 and code_a == 0:
                for path in sorted(set(got_b) | set(got_a)):
                    if got_b.get(path) != got_a.get(path):
                        print(f"    {path}: {got_b.get(path, '-')[:12]} -> {got_a.get(path, '-')[:12]}")
            else:
                print(f"    before: {got_b}\n    after: {got_a}")
        return verdict
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--before", required=True, help="the checkout before the change")
    parser.add_argument("--after", default=ROOT, help="the checkout after it (default this one)")
    parser.add_argument("--corpus", help="a real corpus (glob) for clm, bart and ul2")
    parser.add_argument("--corpus-tokenizer", default=os.path.join(ROOT, "benchmarks", ".cache", "bpe32k.json"))
    parser.add_argument("--beam-args", default="", help="comma-separated Beam flags for every run")
    parser.add_argument("--objectives", default=",".join(_length_flags()))
    args = parser.parse_args()
    if args.corpus and not os.path.isfile(args.corpus_tokenizer):  # else every corpus run is refused alike
        parser.error(f"--corpus-tokenizer {args.corpus_tokenizer}: no such file (name one, e.g. data/tokenizer.json)")
    before, after = os.path.abspath(args.before), os.path.abspath(args.after)
    beam_args = [a for a in args.beam_args.split(",") if a]
    sample = os.path.join(ROOT, "data", "sample", "*")
    tokenizer = os.path.join(ROOT, "data", "tokenizer.json")
    results = []
    for objective in args.objectives.split(","):
        for packing in PACKING_MODES:
            run_args = ["--input", sample, "--tokenizer", tokenizer, *_objective_args(objective, 128),
                        "--packing", packing, "--formats", "arrow,webdataset", *beam_args]
            results.append(compare(before, after, f"sample, {objective}, {packing}", run_args))
    if args.corpus:
        files = sorted(glob.glob(args.corpus))
        size = sum(os.path.getsize(f) for f in files) / 2**20
        print(f"real corpus: {len(files)} files, {size:.1f} MB on disk", flush=True)
        for objective in REAL_OBJECTIVES:
            run_args = ["--input", args.corpus, "--tokenizer", args.corpus_tokenizer,
                        *_objective_args(objective, 512 if objective == "ul2" else 1024),
                        "--formats", "arrow,webdataset", "--validation-fraction", "0.01", *beam_args]
            results.append(compare(before, after, f"corpus, {objective}", run_args))
    print(f"{results.count('same')} of {len(results)} runs wrote the same bytes, {results.count('refused')} were "
          f"refused by both checkouts, {results.count('DIFFERENT')} differ")
    sys.exit(0 if "DIFFERENT" not in results else 1)


if __name__ == "__main__":
    main()
