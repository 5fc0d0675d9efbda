"""What verifying compressed inputs before their records count costs.

The reader decompresses a compressed file once to check every gzip CRC and zstd checksum
before any of its records is used (:func:`transforms.reading.archives.verify_archive`), and reads it
again: a file of more than :data:`transforms.reading.file_records.VERIFY_FIRST_BYTES` is verified by a
thread beside its reading (its records held until the check ends); a smaller one is verified
first and read from the kept bytes of that pass. Measured in one run, on the same files:

1. ``one pass``: decompress and parse the records once, as a reader that trusted the
   archive would (the records before a fault would count);
2. ``verified``: :func:`transforms.reading.file_records.iter_file_records`, verification beside the reading;
3. ``verified first``: the same, the verification pass first (as for a small file; the files
   are read again after it, as they exceed :data:`transforms.reading.archives.KEEP_BYTES`);
4. ``verify only``: the verification pass alone;
5. ``materialize``: a whole clm run over the files (``--materialize``), so the verification
   pass can be put beside what a job spends anyway.

Ratios against ``one pass`` (and the verification pass as a share of the materialize run)
are printed; only ratios measured in the same run mean much on a shared machine.

    python -m benchmarks.bench_read --megabytes 120 --files 2 --materialize
"""

from __future__ import annotations

import argparse
import gzip
import os
import shutil
import subprocess
import sys
import tempfile
import time

import zstandard

from benchmarks.corpus import write_corpus
from transforms.reading.archives import KEEP_BYTES, open_decompressed, verify_archive
from transforms.reading.file_records import file_format, iter_file_records
from transforms.reading.record_formats import records_of
from transforms.reading.record_policy import RecordPolicy

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _one_pass(paths: list[str]) -> float:
    start = time.perf_counter()
    for path in paths:
        with open_decompressed(path) as stream:
            for _ in records_of(path, file_format(path), stream, "line", "text", RecordPolicy()):
                pass
    return time.perf_counter() - start


def _verified(paths: list[str], size: int | None = None) -> float:
    start = time.perf_counter()
    for path in paths:
        for _ in iter_file_records(path, size=size):  # size 0: listed as small, so verified first
            pass
    return time.perf_counter() - start


def _verify_only(paths: list[str], kind: str) -> float:
    start = time.perf_counter()
    for path in paths:
        assert verify_archive(path, kind).error is None
    return time.perf_counter() - start


def _materialize(pattern: str, out: str) -> float:
    start = time.perf_counter()
    subprocess.run([sys.executable, "-m", "pipelines.materialize", "--input", pattern, "--output", out,
                    "--tokenizer", os.path.join(ROOT, "data", "tokenizer.json"), "--seq-len", "1024"],
                   check=True, cwd=ROOT, capture_output=True)
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--megabytes", type=float, default=120, help="corpus size (decompressed)")
    parser.add_argument("--files", type=int, default=2, help="files (each should exceed KEEP_BYTES)")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--materialize", action="store_true", help="also time a whole clm run")
    args = parser.parse_args()
    work = tempfile.mkdtemp(prefix="lmshards-bench-read-")
    try:
        gz_paths = write_corpus(os.path.join(work, "gz"), args.megabytes, files=args.files)
        zst_dir = os.path.join(work, "zst")
        os.makedirs(zst_dir)
        zst_paths = []
        for path in gz_paths:
            target = os.path.join(zst_dir, os.path.basename(path)[: -len(".gz")] + ".zst")
            with gzip.open(path) as source, open(target, "wb") as sink:
                zstandard.ZstdCompressor(write_checksum=True).copy_stream(source, sink)
            zst_paths.append(target)
        sizes = [os.path.getsize(p) for p in gz_paths]
        with gzip.open(gz_paths[0]) as stream:
            first = len(stream.read())
        print(f"{len(gz_paths)} files, {sum(sizes) / 1e6:.1f} MB gzip; the first is {first / 1e6:.1f} MB "
              f"decompressed (kept in memory only up to {KEEP_BYTES / 1e6:.1f} MB)")
        for kind, paths in (("gzip", gz_paths), ("zstd", zst_paths)):
            best = {"one pass": float("inf"), "verified": float("inf"), "verified first": float("inf"),
                    "verify only": float("inf")}
            for _ in range(args.repeats):  # interleaved rounds: a slow phase of the machine slows all three
                best["one pass"] = min(best["one pass"], _one_pass(paths))
                best["verified"] = min(best["verified"], _verified(paths))
                best["verified first"] = min(best["verified first"], _verified(paths, size=0))
                best["verify only"] = min(best["verify only"], _verify_only(paths, kind))
            base = best["one pass"]
            print(f"{kind}: " + ", ".join(f"{name} {t:.2f} s ({t / base:.2f}x)" for name, t in best.items()))
            if args.materialize:
                out = os.path.join(work, f"out-{kind}")
                pattern = os.path.join(os.path.dirname(paths[0]), "*")
                seconds = _materialize(pattern, out)
                shutil.rmtree(out, ignore_errors=True)
                print(f"{kind}: materialize clm {seconds:.1f} s; the verification pass is "
                      f"{best['verify only'] / seconds:.1%} of it")
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
