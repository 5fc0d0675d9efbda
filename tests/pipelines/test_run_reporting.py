"""What a run shows a person: names escaped everywhere, one line for a job failure or a Ctrl-C on
every local runner, the whole run's progress with local workers, the command's wall time.

Runs are real CLI processes; a Ctrl-C is a real SIGINT sent mid-run (once progress shows the run
is reading a corpus of distinct copies of the sample, large enough to be still running).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from lmshards_testing import ROOT, SAMPLE_GLOB, TOKENIZER, default_sigint, lmshards_command, materialize_command

from schemas.names import shown_name

BASE = ["--tokenizer", TOKENIZER, "--seq-len", "128", "--runner=FnApiRunner"]
INTERRUPTED = "lmshards materialize: interrupted; no manifest written, what the run wrote is removed"


def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "pipelines.materialize", *args], capture_output=True, text=True,
                          cwd=ROOT)


def test_shown_names_escape_controls_and_bidi_overrides_only():
    assert shown_name("plain/dir/ünïcode 名前.jsonl") == "plain/dir/ünïcode 名前.jsonl"
    assert shown_name("a\x1b]0;pwned\x07b") == "a\\x1b]0;pwned\\x07b"
    assert shown_name("evil\u202etxt.exe\n") == "evil\\u202etxt.exe\\x0a"
    assert shown_name("bad\udcff") == "bad\\udcff"  # a non-UTF-8 byte, as os.fsdecode gives it


def test_control_characters_in_file_names_never_reach_the_terminal_raw(tmp_path):
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    sample = sorted(Path(SAMPLE_GLOB).parent.glob("*.jsonl"))
    retitle = "a\x1b]0;pwned\x07b.jsonl"
    (corpus / retitle).write_bytes(sample[0].read_bytes())
    (corpus / "c\u202elmsj.txt.jsonl").write_bytes(sample[1].read_bytes())
    (corpus / "d\x1b[31m.jsonl").mkdir()  # skipped: named in the summary
    out = tmp_path / "out"
    done = materialize_command("--input", str(corpus / "*.jsonl"), "--output", str(out), *BASE)
    assert done.returncode == 0, done.stderr
    assert "\x1b" not in done.stdout and "\x07" not in done.stdout
    assert "d\\x1b[31m.jsonl (directory)" in done.stdout
    failed = materialize_command("--input", str(corpus / "x\x1b]0;t\x07*.jsonl"), "--output", str(tmp_path / "o2"),
                                 *BASE)
    assert failed.returncode == 2 and "x\\x1b]0;t\\x07*.jsonl: matches no file" in failed.stderr
    assert "\x1b" not in failed.stderr and "\x07" not in failed.stderr
    report = tmp_path / "report.html"
    made = lmshards_command("report", str(out), "-o", str(report))
    assert made.returncode == 0, made.stderr
    page = report.read_text(encoding="utf-8")
    assert "\x1b" not in page and "\u202e" not in page and "\x07" not in page
    assert "a\\x1b]0;pwned\\x07b.jsonl" in page and "c\\u202elmsj.txt.jsonl" in page
    manifest = json.loads((out / "manifest.json").read_text())  # what is stored keeps the name exactly
    assert any(f["path"].endswith(retitle) for f in manifest["run"]["input_files"])


@pytest.mark.e2e
def test_a_job_failure_with_local_workers_is_one_line(tmp_path):
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    sample = Path(SAMPLE_GLOB).with_name("howto.jsonl").read_text()
    (corpus / "half.jsonl").write_text('{"text":\n' * 300 + sample)
    out = tmp_path / "out"
    done = _cli("--input", str(corpus / "*.jsonl"), "--output", str(out), *BASE, "--workers", "2",
                "--max-rejected-fraction", "0.1")
    assert done.returncode == 1
    lines = [line for line in done.stderr.strip().splitlines() if not line.startswith("lmshards: ")]  # progress
    assert len(lines) == 1 and "Traceback" not in done.stderr, done.stderr
    assert lines[0].startswith("lmshards materialize: error: --max-rejected-fraction 0.1 exceeded: ")


@pytest.fixture(scope="module")
def copied_corpus(tmp_path_factory):
    """20 distinct copies of the sample (24 MB): a run that is still reading when interrupted."""
    texts = [json.loads(line)["text"] for path in sorted(Path(SAMPLE_GLOB).parent.glob("*.jsonl"))
             for line in path.read_text(encoding="utf-8").splitlines()]
    path = tmp_path_factory.mktemp("copies") / "copies.jsonl"
    with open(path, "w", encoding="utf-8") as handle:
        for copy in range(20):
            for text in texts:
                handle.write(json.dumps({"text": f"{text}\n\n(copy {copy})"}) + "\n")
    return str(path)


@pytest.mark.e2e
@pytest.mark.parametrize("workers", ["1", "2"])
def test_ctrl_c_mid_run_is_one_line_and_publishes_nothing(tmp_path, copied_corpus, workers):
    out = tmp_path / "out"
    proc = subprocess.Popen([sys.executable, "-m", "pipelines.materialize", "--input", copied_corpus, "--output",
                             str(out), *BASE, "--workers", workers, "--progress-seconds", "0.000001",
                             "--input-split-mb", "1"], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, start_new_session=True, preexec_fn=default_sigint)
    try:
        seen = []
        for line in proc.stderr:  # the first progress line: the pipeline runs
            seen.append(line)
            if line.startswith("lmshards: reading: "):
                os.kill(proc.pid, signal.SIGINT)  # lmshards alone, as `kill -INT` does (not its workers)
                break
        rest = proc.stderr.read()
        proc.wait(timeout=300)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert any(line.startswith("lmshards: reading: ") for line in seen), "".join(seen)
    assert proc.returncode == 130, rest
    lines = [line for line in rest.strip().splitlines() if not line.startswith("lmshards: ")]
    assert lines == [INTERRUPTED] and "Traceback" not in rest, rest
    assert not out.exists()


@pytest.mark.e2e
def test_local_workers_show_the_whole_runs_progress_and_the_summary_the_commands_time(tmp_path):
    done = _cli("--input", SAMPLE_GLOB, "--output", str(tmp_path / "out"), *BASE, "--workers", "2",
                "--progress-seconds", "0.000001", "--input-split-mb", "0.2")
    assert done.returncode == 0, done.stderr
    lines = [line for line in done.stderr.splitlines() if line.startswith("lmshards: ")]
    reading = [line for line in lines if line.startswith("lmshards: reading: ")]
    assert reading and all(" of 1.2 MB read, " in line and "(pid " not in line for line in reading), lines
    assert "lmshards: packing and building examples" in lines and "lmshards: writing shards" in lines
    assert any(line.startswith("lmshards: tokenized: 100% of 1.2 MB read, 682 documents") for line in lines), lines
    wall = next(line for line in done.stdout.splitlines() if line.startswith("wall time "))
    command, pipeline = float(wall.split()[2]), float(wall.split("(the pipeline ")[1].split()[0])
    assert command > pipeline > 0  # the command's time includes start-up and planning
