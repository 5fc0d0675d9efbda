"""What a run shows while it runs: input bytes, documents, tokens, ETA, later stages; a bar on a
terminal. Wall-clock time decides only when a line is printed, never a number in it."""

from __future__ import annotations

import fcntl
import io
import os
import pty
import struct
import subprocess
import sys
import termios

import pytest
from lmshards_testing import ROOT, SAMPLE_GLOB, TOKENIZER, materialize_command

from transforms.progress import Progress


def _run(argv, **kwargs):
    return subprocess.run([sys.executable, "-m", "pipelines.materialize", *argv], cwd=ROOT, **kwargs)


def test_lines_report_the_share_of_input_bytes_tokens_and_the_later_stages(tmp_path):
    done = materialize_command("--input", SAMPLE_GLOB, "--tokenizer", TOKENIZER, "--output", str(tmp_path / "o"),
                               "--progress-seconds", "0.000001", "--input-split-mb", "0.2")
    assert done.returncode == 0, done.stderr
    lines = [line for line in done.stderr.splitlines() if line.startswith("lmshards: ")]
    reading = [line for line in lines if line.startswith("lmshards: reading: ")]
    assert reading and all(" of 1.2 MB read, " in line and " tokens/s" in line for line in reading)
    shares = [int(line.split("lmshards: reading: ")[1].split("%")[0]) for line in reading]
    assert shares == sorted(shares) and shares[-1] == 100 and shares[0] < 100  # grows with the ranges read
    assert any(", ETA 0:" in line for line in reading)
    final = next(i for i, line in enumerate(lines) if line.startswith("lmshards: tokenized: 100% of 1.2 MB read, "
                                                                       "682 documents, "))
    assert lines[final + 1:final + 3] == ["lmshards: packing and building examples", "lmshards: writing shards"]


@pytest.mark.parametrize("seconds", [0, 60])
def test_nothing_is_shown_when_off_or_before_the_interval_has_passed(seconds):
    """--progress-seconds 0 (off), or a run shorter than the interval: no line, no stage, no total
    (the run above hands its --progress-seconds to the same Progress)."""
    stream = io.StringIO()
    progress = Progress(stream)
    progress.configure(1_200_000, seconds)
    progress.add_bytes(600_000)
    progress.add(341, 150_000)
    progress.add_bytes(600_000)
    progress.stage("packing and building examples")
    progress.stage("writing shards")
    progress.close()
    assert stream.getvalue() == ""
    assert (progress.bytes, progress.documents, progress.tokens) == (1_200_000, 341, 150_000)


@pytest.mark.e2e
def test_a_terminal_gets_a_bar(tmp_path):
    primary, secondary = pty.openpty()
    fcntl.ioctl(secondary, termios.TIOCSWINSZ, struct.pack("HHHH", 40, 120, 0, 0))  # a terminal 120 wide
    try:
        done = _run(["--input", SAMPLE_GLOB, "--tokenizer", TOKENIZER, "--output", str(tmp_path / "o"),
                     "--progress-seconds", "0.001", "--input-split-mb", "0.2"], stdout=subprocess.DEVNULL,
                    stderr=secondary)
        os.close(secondary)
        chunks = []
        while True:
            try:
                data = os.read(primary, 65536)
            except OSError:
                break
            if not data:
                break
            chunks.append(data)
    finally:
        os.close(primary)
    shown = b"".join(chunks).decode("utf-8", "replace")
    assert done.returncode == 0
    assert "lmshards: reading: 100%|" in shown and "tokens/s" in shown  # tqdm's bar, with the token rate
    assert "lmshards: packing and building examples" in shown


def test_a_worker_process_reports_its_own_share_without_a_total():
    stream = io.StringIO()
    progress = Progress(stream)
    progress.configure(0, 1e-9, owner=False)
    progress.add_bytes(3 << 20)
    progress.add(10, 1000)
    progress.stage("writing shards")
    shown = stream.getvalue().splitlines()
    assert shown[0].startswith("lmshards: reading: 3.0 MB read, 0 documents, 0 tokens, 0 tokens/s (pid ")
    assert shown[-2].startswith("lmshards: tokenized: 3.0 MB read, 10 documents, 1,000 tokens, ")
    assert shown[-1] == f"lmshards: writing shards (pid {os.getpid()})"
    assert "%" not in "".join(shown) and "ETA" not in "".join(shown)
