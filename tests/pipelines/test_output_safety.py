"""Safety of the output: the run's lock, --overwrite only after every check and only over an
lmshards dataset, inputs that change under a run, failures that leave no debris.

Runs are ``lmshards materialize`` commands, in this process where what they check is decided in
it, and real processes for the concurrent runs, the lock's holder and the failing writes.
"""

from __future__ import annotations

import datetime
import json
import os
import resource
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import zstandard
from lmshards_testing import ROOT, SAMPLE_GLOB, TOKENIZER, file_digests, materialize_command

from transforms.writing.output import LOCK_NAME, LockLostError, RunLock, acquire_lock, foreign_files
from transforms.writing.write import write_atomic

BASE = ["--tokenizer", TOKENIZER, "--seq-len", "128", "--num-buckets", "4", "--formats", "arrow,webdataset"]


def _cmd(out: Path, *extra: str, inputs: str = SAMPLE_GLOB) -> list[str]:
    return [sys.executable, "-m", "pipelines.materialize", "--input", inputs, "--output", str(out), *BASE, *extra]


def _run(out: Path, *extra: str, process: bool = False, **kwargs) -> subprocess.CompletedProcess:
    """The command in this process, or (``process``) in one of its own, whose stderr also shows
    the log's warnings (the concurrent runs and the failing writes below start processes too)."""
    if process:
        return subprocess.run(_cmd(out, *extra, **kwargs), capture_output=True, text=True, cwd=ROOT)
    return materialize_command(*_cmd(out, *extra, **kwargs)[3:])


def _one_line(proc: subprocess.CompletedProcess) -> str:
    lines = [line for line in proc.stderr.strip().splitlines() if not line.startswith("WARNING:root:")]
    assert len(lines) == 1 and "Traceback" not in proc.stderr, proc.stderr
    return lines[0]


def _validate(out: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "pipelines.cli", "validate", str(out), "--quiet"],
                          capture_output=True, text=True, cwd=ROOT)


def _listed_files(out: Path) -> set[str]:
    manifest = json.loads((out / "manifest.json").read_text())
    files = {"manifest.json", "tokenizer.json"} | {f["path"] for f in manifest["counts"]["rejected_files"]}
    for split, info in manifest["splits"].items():
        for shard in info["shards"]:
            files |= {f["path"] for f in shard["files"].values()}
        if "arrow" in manifest["config"]["formats"]:
            files |= {f"{split}/{where}{name}" for where in ("arrow/", "") for name in ("state.json",
                                                                                       "dataset_info.json")}
    if "arrow" in manifest["config"]["formats"]:
        files.add("dataset_dict.json")  # datasets.load_from_disk(OUT): a DatasetDict of the splits
    return files


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    out = tmp_path_factory.mktemp("reference") / "ds"
    proc = _run(out, "--num-shards", "4")
    assert proc.returncode == 0, proc.stderr
    return out


def _copy(reference: Path, to: Path) -> Path:
    shutil.copytree(reference, to)
    return to


@pytest.mark.e2e
def test_two_concurrent_overwrite_runs_one_wins_and_the_dataset_validates(reference, tmp_path):
    for trial, delay in enumerate((0.0, 0.3, 1.0)):
        out = _copy(reference, tmp_path / f"ds{trial}")
        first = subprocess.Popen(_cmd(out, "--overwrite", "--num-shards", "2"), cwd=ROOT, stdout=subprocess.PIPE,
                                 stderr=subprocess.PIPE, text=True)
        time.sleep(delay)
        second = subprocess.Popen(_cmd(out, "--overwrite", "--num-shards", "3"), cwd=ROOT, stdout=subprocess.PIPE,
                                  stderr=subprocess.PIPE, text=True)
        results = [(p.wait(), p.stderr.read()) for p in (first, second)]
        codes = sorted(code for code, _ in results)
        assert codes in ([0, 0], [0, 2]), results  # both (one after the other) or one refused
        for code, stderr in results:
            if code == 2:
                assert "another run is writing there" in stderr and LOCK_NAME in stderr, stderr
        # The surviving dataset is one run's, whole: it validates and holds no file of the other run.
        assert _validate(out).returncode == 0, _validate(out).stdout
        on_disk = {str(p.relative_to(out)) for p in out.rglob("*") if p.is_file()}
        assert on_disk == _listed_files(out)
        assert not (out / LOCK_NAME).exists() and not (out / ".tmp").exists()


@pytest.mark.e2e
def test_a_live_lock_refuses_even_with_overwrite_and_a_stale_one_is_removed(reference, tmp_path):
    out = _copy(reference, tmp_path / "ds")
    before = file_digests(out)
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        now = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
        lock = RunLock(str(out), "live-run", socket.gethostname(), sleeper.pid, now)
        (out / LOCK_NAME).write_bytes(lock.to_bytes())
        proc = _run(out, "--overwrite")
        assert proc.returncode == 2 and f"pid {sleeper.pid}" in _one_line(proc)
        assert file_digests(out) == {**before, LOCK_NAME: file_digests(out)[LOCK_NAME]}
    finally:
        sleeper.send_signal(signal.SIGKILL)
        sleeper.wait()
    # A lock older than the process with its pid: the pid was reused, the lock is stale (tested below).
    # Another host's lock cannot be judged from here: refused.
    (out / LOCK_NAME).write_bytes(RunLock(str(out), "far", "another-host", 1, "2020-01-01T00:00:00+00:00").to_bytes())
    assert "another-host" in _one_line(_run(out, "--overwrite"))
    # A lock whose process is gone (the sleeper, killed) is stale: without --overwrite the directory is
    # not empty; with it, the lock goes with a warning and the run replaces the dataset.
    (out / LOCK_NAME).write_bytes(lock.to_bytes())
    assert "not empty" in _one_line(_run(out))
    proc = _run(out, "--overwrite", "--num-shards", "4", process=True)
    assert proc.returncode == 0, proc.stderr
    assert "stale lock" in proc.stderr
    assert file_digests(out) == before and not (out / LOCK_NAME).exists()


@pytest.mark.parametrize("case", ["bogus runner", "non-UTF-8 input name", "unknown flag", "missing input"])
def test_overwrite_deletes_nothing_before_every_check_passed(reference, tmp_path, case):
    out = _copy(reference, tmp_path / "ds")
    before = file_digests(out)
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    shutil.copy(Path(SAMPLE_GLOB).with_name("faq.jsonl"), corpus / "faq.jsonl")
    extra, inputs = {
        "bogus runner": (["--runner", "BogusRunner"], SAMPLE_GLOB),
        "non-UTF-8 input name": ([], str(corpus / "*.jsonl")),
        "unknown flag": (["--seq-lne", "5"], SAMPLE_GLOB),
        "missing input": ([], str(tmp_path / "nothing" / "*.jsonl")),
    }[case]
    if case == "non-UTF-8 input name":
        shutil.copy(corpus / "faq.jsonl", os.fsencode(str(corpus)) + b"/bad\xff.jsonl")
    proc = _run(out, "--overwrite", *extra, inputs=inputs)
    assert proc.returncode == 2, proc.stderr
    _one_line(proc)
    assert file_digests(out) == before


def test_output_that_is_a_file_or_holds_foreign_files(tmp_path):
    target = tmp_path / "a-file"
    target.write_text("not a directory")
    assert "is a file, not a directory" in _one_line(_run(target))
    assert _run(target).returncode == 2 and target.read_text() == "not a directory"
    nested = tmp_path / "ds"
    (nested / "train" / "arrow").mkdir(parents=True)
    (nested / "train" / "arrow" / "my-notes.txt").write_text("mine")
    (nested / "manifest.json").write_text("{}")
    proc = _run(nested, "--overwrite")
    assert proc.returncode == 2 and "train/arrow/my-notes.txt is not part of one" in _one_line(proc)
    assert (nested / "train" / "arrow" / "my-notes.txt").read_text() == "mine"
    assert foreign_files(["manifest.json", ".tmp/x", "train/wds/data-00000-of-00002.tar", "rejected/r.jsonl",
                          ".lmshards.lock", "validation/arrow/state.json", "notes.md", "train/x.arrow"]) == [
        "notes.md", "train/x.arrow"]


def test_a_lost_lock_stops_the_rename(tmp_path):
    lock = acquire_lock(str(tmp_path))
    write_atomic(str(tmp_path), "a.txt", lambda h: h.write(b"mine"), lock)
    (tmp_path / LOCK_NAME).write_bytes(RunLock(str(tmp_path), "other", "h", 1, "x").to_bytes())
    with pytest.raises(LockLostError, match="lock of another run"):
        write_atomic(str(tmp_path), "b.txt", lambda h: h.write(b"mine"), lock)
    assert not (tmp_path / "b.txt").exists() and not list((tmp_path / ".tmp").iterdir())
    assert (tmp_path / "a.txt").read_bytes() == b"mine"


def test_an_input_that_changes_during_the_run_fails_it_without_a_manifest(tmp_path):
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    data = b"".join(Path(p).read_bytes() for p in sorted(Path(SAMPLE_GLOB).parent.glob("*.jsonl")))
    (corpus / "big.jsonl").write_bytes(data * 6)
    out = tmp_path / "out"
    proc = subprocess.Popen(_cmd(out, inputs=str(corpus / "*.jsonl")), cwd=ROOT, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    while not (out / "tokenizer.json").exists() and proc.poll() is None:
        time.sleep(0.002)
    with open(corpus / "big.jsonl", "ab") as handle:  # appended to while the run reads it
        handle.write(b'{"text": "late"}\n')
    assert proc.wait() == 1, proc.stderr.read()
    line = [x for x in proc.stderr.read().strip().splitlines() if not x.startswith("WARNING:root:")]
    assert len(line) == 1 and "big.jsonl: the file changed" in line[0] and "must not change under it" in line[0]
    assert not out.exists() or not any(out.iterdir())  # the failed run removed what it wrote


def _limited_file_size(limit: int):
    def apply():
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit fails with EFBIG instead
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))
    return apply


def test_a_write_that_fails_mid_run_is_one_line_and_leaves_no_debris(tmp_path):
    out = tmp_path / "full"
    # Room for the tokenizer (246 kB) but not for the largest shard: the disk "fills" mid-run.
    proc = subprocess.run(_cmd(out, "--num-shards", "1"), capture_output=True, text=True, cwd=ROOT,
                          preexec_fn=_limited_file_size(300_000))
    assert proc.returncode == 1
    line = _one_line(proc)
    assert "cannot write train/" in line and "File too large" in line
    assert not out.exists() or not any(out.iterdir())


def test_a_read_only_output_is_one_line(tmp_path):
    if os.geteuid() == 0:
        out = Path("/sys/lmshards-read-only-test")  # root ignores permissions; /sys is mounted read-only
    else:
        parent = tmp_path / "ro"
        parent.mkdir(mode=0o555)
        out = parent / "out"
    proc = _run(out)
    assert proc.returncode == 2
    assert "cannot write there" in _one_line(proc)


def test_odd_inputs_are_read_or_listed_never_dropped(tmp_path, capsys):
    from pipelines.materialize import main

    corpus = tmp_path / "corpus"
    corpus.mkdir()
    docs = [json.loads(line)["text"] for line in Path(SAMPLE_GLOB).with_name("faq.jsonl").read_text().splitlines()]
    (corpus / "a.jsonl").write_text("".join(json.dumps({"text": t}) + "\n" for t in docs[:50]))
    (corpus / "back\\slash.jsonl").write_text("".join(json.dumps({"text": t}) + "\n" for t in docs[50:60]))
    (corpus / "cr-only.jsonl").write_bytes("".join(json.dumps({"text": t}) + "\r" for t in docs[60:63]).encode())
    (corpus / "big-int.jsonl").write_text(f'{{"id": {"9" * 5000}, "text": {json.dumps(docs[63])}}}\n')
    (corpus / "empty.jsonl.gz").write_bytes(b"")
    (corpus / "empty.jsonl").write_bytes(b"")
    unchecked = "".join(json.dumps({"text": t}) + "\n" for t in docs[64:70]).encode()
    (corpus / "nocheck.jsonl.zst").write_bytes(zstandard.ZstdCompressor(write_checksum=False).compress(unchecked))
    (corpus / "dir.jsonl").mkdir()
    (corpus / "dangling.jsonl").symlink_to(corpus / "nowhere")
    out = tmp_path / "out"
    assert main(["--input", str(corpus / "*"), "--output", str(out), *BASE]) == 0
    summary = capsys.readouterr().out
    manifest = json.loads((out / "manifest.json").read_text())
    counts = manifest["counts"]
    assert counts["documents_written"] + counts["duplicates"] == 70  # every line of every file, CR-only included
    assert counts["rejected_by_reason"] == {"empty_file": 2} and counts["reconciled"]
    skipped = {os.path.basename(s["path"]): s["reason"] for s in manifest["run"]["skipped_inputs"]}
    assert skipped == {"dir.jsonl": "directory", "dangling.jsonl": "broken symbolic link"}
    assert "skipped 2 glob match(es) that are not files" in summary and "dir.jsonl (directory)" in summary
    assert any(f["path"].endswith("back\\slash.jsonl") for f in manifest["run"]["input_files"])
    assert manifest["run"]["unverified_inputs"] == [str(corpus / "nocheck.jsonl.zst")]
    assert "unverified: 1 zstd file(s) without content checksums" in summary
