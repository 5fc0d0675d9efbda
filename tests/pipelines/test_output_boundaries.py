"""Nothing outside the output is touched: links inside the output are never written or deleted
through, an output holding anything is not empty, inputs inside the output are refused before
``--overwrite`` deletes anything, and every file a flag names is read as ``--input`` is (a
regular file, within a bound, one line otherwise).

Runs are ``lmshards materialize`` commands (in this process: what they refuse is decided before
Beam runs) on real files, links and FIFOs in the test's temporary directory.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import threading
from pathlib import Path

import pytest
from lmshards_testing import ROOT, SAMPLE_GLOB, TOKENIZER, file_digests, materialize_command

BASE = ["--seq-len", "128", "--num-buckets", "4", "--runner=FnApiRunner"]


def _run(out: Path, *extra: str, inputs: str = SAMPLE_GLOB, tokenizer: str = TOKENIZER,
         fifo: Path | None = None) -> subprocess.CompletedProcess:
    """The command in this process; with ``fifo``, under :func:`_never_blocked_by` it. (A device
    is read within the flag's bound even by a regression.)"""
    argv = ["--input", inputs, "--output", str(out), "--tokenizer", tokenizer, *BASE, *extra]
    with _never_blocked_by(fifo) if fifo is not None else contextlib.nullcontext():
        return materialize_command(*argv)


@contextlib.contextmanager
def _never_blocked_by(fifo: Path):
    """A regression that opened ``fifo`` to read it would wait for a writer for ever: while the
    command runs, a thread opens the FIFO's write end whenever a reader waits on it and closes it
    at once (the reader gets the end of the file), so such a run ends, and fails the test's
    assertions, instead of hanging."""
    done = threading.Event()

    def unblock() -> None:
        while not done.is_set():
            try:
                os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
            except OSError:  # ENXIO: nobody has it open to read
                done.wait(0.02)

    thread = threading.Thread(target=unblock, daemon=True)
    thread.start()
    try:
        yield
    finally:
        done.set()
        thread.join()


def _one_line(proc: subprocess.CompletedProcess) -> str:
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in proc.stderr, proc.stderr
    return lines[0]


def _victim(tmp_path: Path) -> tuple[Path, dict[str, str]]:
    """A directory of someone else's files (one in a subfolder) and their digests."""
    victim = tmp_path / "scratch"
    (victim / "sub").mkdir(parents=True)
    (victim / "notes.txt").write_text("keep me")
    (victim / "sub" / "deep.txt").write_text("keep me too")
    return victim, file_digests(victim)


@pytest.mark.parametrize("name", [".tmp", "train", "train/arrow", "rejected"])
@pytest.mark.parametrize("overwrite", [False, True])
def test_a_link_inside_the_output_is_refused_and_its_target_untouched(tmp_path, name, overwrite):
    victim, before = _victim(tmp_path)
    out = tmp_path / "out"
    (out / name).parent.mkdir(parents=True, exist_ok=True)
    (out / name).symlink_to(victim)
    proc = _run(out, *(["--overwrite"] if overwrite else []))
    assert proc.returncode == 2, proc.stderr
    line = _one_line(proc)
    assert f"{name} is a symbolic link to {victim}" in line and "never writes or deletes through one" in line
    assert file_digests(victim) == before and sorted(os.listdir(victim)) == ["notes.txt", "sub"]
    assert (out / name).is_symlink() and not (out / "manifest.json").exists()


def test_a_linked_file_or_a_fifo_in_the_output_is_refused_even_with_overwrite(tmp_path):
    victim, before = _victim(tmp_path)
    out = tmp_path / "out"
    out.mkdir()
    (out / "manifest.json").symlink_to(victim / "notes.txt")  # a name of the layout, through a link
    line = _one_line(_run(out, "--overwrite"))
    assert "manifest.json is a symbolic link to" in line
    assert file_digests(victim) == before
    (out / "manifest.json").unlink()
    os.mkfifo(out / "pipe")
    proc = _run(out, "--overwrite", fifo=out / "pipe")
    assert proc.returncode == 2 and "pipe is a special file" in _one_line(proc)


def test_an_output_holding_only_an_empty_directory_is_not_empty(tmp_path):
    out = tmp_path / "out"
    (out / "mine").mkdir(parents=True)
    proc = _run(out)
    assert proc.returncode == 2 and "directory is not empty" in _one_line(proc)
    (out / "mine" / "deeper").mkdir()  # not a directory lmshards makes: --overwrite refuses it too
    proc = _run(out, "--overwrite")
    assert proc.returncode == 2 and "mine/deeper/ is not part of one" in _one_line(proc)
    assert (out / "mine" / "deeper").is_dir()


def test_a_deleted_dataset_never_takes_a_link_planted_in_its_tmp_along(tmp_path):
    """``.tmp`` replaced by a link after the checks (here: between two runs, the second with
    --overwrite) is refused; deleting never follows one (transforms.writing.output.delete_tree)."""
    from transforms.writing.output import delete_tree

    victim, before = _victim(tmp_path)
    link = tmp_path / "out-tmp"
    link.symlink_to(victim)
    delete_tree(str(link))
    assert file_digests(victim) == before


@pytest.fixture(scope="module")
def project(tmp_path_factory) -> Path:
    """A folder of the sample corpus with the dataset made of it inside, at ``out``."""
    project = tmp_path_factory.mktemp("proj") / "proj"
    project.mkdir()
    for path in sorted(Path(SAMPLE_GLOB).parent.glob("*.jsonl")):
        (project / path.name).write_bytes(path.read_bytes())
    with open(project / "faq.jsonl", "a") as handle:
        handle.write('{"no text": 1}\n')  # one rejected record: OUT/rejected/rejected.jsonl exists
    first = _run(project / "out", inputs=str(project / "*.jsonl"))
    assert first.returncode == 0, first.stderr
    return project


@pytest.mark.parametrize("how", ["recursive glob", "the old rejected records"])
def test_inputs_inside_the_output_are_refused_before_anything_is_deleted(tmp_path, project, how):
    project = Path(shutil.copytree(project, tmp_path / "proj", symlinks=True))
    out = project / "out"
    before = file_digests(out)
    assert "rejected/rejected.jsonl" in before
    if how == "recursive glob":
        proc = _run(out, "--overwrite", inputs=str(project / "**" / "*.jsonl"))
    else:
        proc = _run(out, "--overwrite", "--text-field", "excerpt", inputs=str(out / "rejected" / "*.jsonl"))
    assert proc.returncode == 2, proc.stderr
    line = _one_line(proc)
    assert f"rejected.jsonl: is inside --output {out}" in line and "move the input out of the output" in line
    assert file_digests(out) == before  # nothing deleted


def _fifo(tmp_path: Path) -> str:
    path = tmp_path / "fifo.json"
    os.mkfifo(path)
    return str(path)


@pytest.mark.parametrize("flag, path, says", [
    ("--tokenizer", "/dev/zero", "a device, not a regular file"),
    ("--tokenizer", "FIFO", "a FIFO, not a regular file"),
    ("--tokenizer", "DIR", "a directory, not a regular file"),
    ("--config", "/dev/zero", "a device, not a regular file"),
    ("--config", "/dev/urandom", "a device, not a regular file"),
    ("--config", "FIFO", "a FIFO, not a regular file"),
])
def test_a_flags_file_must_be_a_regular_file(tmp_path, flag, path, says):
    path = {"FIFO": _fifo(tmp_path), "DIR": str(tmp_path)}.get(path, path)
    extra = [flag, path] if flag == "--config" else []
    proc = _run(tmp_path / "out", *extra, tokenizer=path if flag == "--tokenizer" else TOKENIZER,
                fifo=Path(path) if path.endswith("fifo.json") else None)
    assert proc.returncode == 2, proc.stderr
    assert _one_line(proc) == f"lmshards materialize: error: {flag} {path}: {says}"
    assert not (tmp_path / "out").exists()


def test_a_flags_file_is_read_within_a_bound():
    from transforms.reading.flag_files import read_flag_file

    with pytest.raises(ValueError, match=r"^--config .*: more than 4 bytes, larger than such a file can be$"):
        read_flag_file("--config", str(ROOT / "pyproject.toml"), 4)
    assert read_flag_file("--tokenizer", TOKENIZER, 1 << 30) == Path(TOKENIZER).read_bytes()


def test_a_compressed_config_is_bounded_after_decompressing(tmp_path):
    import gzip

    from transforms.reading.flag_files import read_flag_file

    path = tmp_path / "params.json.gz"
    path.write_bytes(gzip.compress(json.dumps({"seq_len": 64}).encode() + b" " * 100_000))  # 100 kB unpacked
    with pytest.raises(ValueError, match="more than 1,000 bytes"):
        read_flag_file("--config", str(path), 1000)
    assert json.loads(read_flag_file("--config", str(path), 1 << 20)) == {"seq_len": 64}
