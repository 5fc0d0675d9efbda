"""A whole materialize run over hostile files stays under 2 GB of memory with default flags.

Peak RSS of the run's process (the in-process runner runs every stage there) is read with
``resource.getrusage(RUSAGE_CHILDREN)`` in a fresh wrapper interpreter: Linux carries a
process's peak RSS across fork and exec, so the run must be forked from that small wrapper,
not from the (large) test process.
The files are generated here, streaming (never stored in the repository).
"""

from __future__ import annotations

import gzip
import json
import random
import subprocess
import sys
from pathlib import Path

import pytest
from lmshards_testing import ROOT, SAMPLE_GLOB, TOKENIZER

LIMIT_MB = 2048
_MEASURE = """
import resource, subprocess, sys
proc = subprocess.run([sys.executable, "-m", "pipelines.materialize", *sys.argv[1:]], capture_output=True, text=True)
print(proc.returncode)
print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss // 1024)
sys.stderr.write(proc.stdout + proc.stderr)
"""


def _run_measured(*args: str) -> tuple[int, int, str]:
    proc = subprocess.run([sys.executable, "-c", _MEASURE, *args], capture_output=True, text=True, cwd=ROOT)
    code, peak = proc.stdout.split()
    return int(code), int(peak), proc.stderr


def _words() -> list[str]:
    words = []
    for path in sorted(Path(SAMPLE_GLOB).parent.glob("*.jsonl")):
        for line in path.read_text(encoding="utf-8").splitlines():
            words += json.loads(line)["text"].split()
    return words


@pytest.mark.e2e
def test_an_8_gib_gz_bomb_is_rejected_within_2_gb(tmp_path):
    bomb = tmp_path / "corpus" / "bomb.txt.gz"
    bomb.parent.mkdir()
    member = gzip.compress(b"\0" * (64 << 20), compresslevel=9, mtime=0)
    with open(bomb, "wb") as handle:
        for _ in range(128):  # concatenated members: 8 GiB of NUL bytes on one line, from 8 MB
            handle.write(member)
    good = tmp_path / "corpus" / "good.jsonl"
    good.write_bytes(Path(SAMPLE_GLOB).with_name("faq.jsonl").read_bytes())
    out = tmp_path / "out"
    code, peak, log = _run_measured("--input", str(tmp_path / "corpus" / "*"), "--tokenizer", TOKENIZER,
                                    "--output", str(out), "--seq-len", "128")
    assert code == 0, log
    assert peak < LIMIT_MB, f"peak RSS {peak} MB"
    manifest = json.loads((out / "manifest.json").read_text())
    # The bomb is 128 records of 64 MiB (--max-record-bytes), each rejected for its NUL bytes; the
    # good file's documents are all there.
    assert manifest["counts"]["rejected_by_reason"] == {"nul_bytes": 128}
    assert manifest["counts"]["documents_written"] == 185 and manifest["counts"]["reconciled"]


@pytest.mark.e2e
def test_a_200_mb_line_is_split_and_tokenized_within_2_gb(tmp_path):
    words, rng = _words(), random.Random(0)
    line = tmp_path / "line.txt"
    size = 0
    with open(line, "w", encoding="utf-8") as handle:
        while size < 200 << 20:
            chunk = " ".join(rng.choice(words) for _ in range(50_000)) + " "
            handle.write(chunk)
            size += len(chunk.encode())
        handle.write("\n")
    out = tmp_path / "out"
    code, peak, log = _run_measured("--input", str(line), "--tokenizer", TOKENIZER, "--output", str(out))
    assert code == 0, log
    assert peak < LIMIT_MB, f"peak RSS {peak} MB"
    manifest = json.loads((out / "manifest.json").read_text())
    counts = manifest["counts"]
    pieces = -(-size // (64 << 20))  # pieces of at most 64 MiB
    assert counts["records_read"] == 1 and counts["documents_written"] == pieces
    assert counts["repaired"]["long_documents_split"] == 1 and counts["repaired"]["split_pieces"] == pieces
