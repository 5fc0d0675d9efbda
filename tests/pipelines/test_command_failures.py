"""How every command ends in an error: lmshards' own errors (bad input, a damaged dataset, a job
that failed) and I/O errors in one line with the exit status of their class; any other exception
is a bug, printed with its traceback, exit status 3 (``pipelines.terminal.report_failure``).

The bugs are made the way a user's or a plugin's code would make them: test-only objectives
registered here whose hooks fail with a plain exception, a Beam file system and an fsspec file
system (both public extension points, each under a scheme of its own) whose calls fail. Inside a
pipeline, the in-process runner re-raises the DoFn's exception; a worker process of
``--direct_running_mode=multi_processing`` sends its traceback as text
(``pipelines.failures.job_error`` reads both).
"""

from __future__ import annotations

import json
import os
import shutil
import traceback

import fsspec
import pytest
from apache_beam.io.localfilesystem import LocalFileSystem
from fsspec.implementations.memory import MemoryFileSystem
from lmshards_testing import ROOT, TOKENIZER, lmshards_command

from pipelines.failures import job_error
from schemas.errors import INTERNAL_ERROR, ConfigError, JobFailedError, ShardIntegrityError
from transforms.objectives.base import Block, Built
from transforms.objectives.clm import CLM
from transforms.objectives.common import SpecialIds
from transforms.objectives.registry import register_objective, unregister_objective
from transforms.writing.write import ShardRowsError

FAQ = str(ROOT / "data" / "sample" / "faq.jsonl")
BUG = "a bug in lmshards, not bad input"


class WrongSchema(CLM):
    """clm whose schema hook asks for rows of 0 tokens: a bug the plan meets (a plain ``ValueError``
    of ``schemas.examples``), not a configuration error."""

    name = "wrong_schema"

    def schema_kwargs(self) -> dict:
        return {"seq_len": 0}


class MissingFeature(CLM):
    """clm whose build reads a feature it never asked for: a bug in a DoFn (a ``KeyError``)."""

    name = "missing_feature"

    def build(self, block: Block, special: SpecialIds) -> Built:
        return block.features["word_starts"]


class RefusingBuild(CLM):
    """clm whose build fails with an error of lmshards' hierarchy: a job that failed, in one line."""

    name = "refusing_build"

    def build(self, block: Block, special: SpecialIds) -> Built:
        raise JobFailedError(f"--objective {self.name}: refused a block of {block.count} chunks")


@pytest.fixture(scope="module")
def objectives():
    for cls in (WrongSchema, MissingFeature, RefusingBuild):
        register_objective(cls)
    yield
    for cls in (WrongSchema, MissingFeature, RefusingBuild):
        unregister_objective(cls.name)


def _materialize(out, objective: str, *extra: str):
    return lmshards_command("materialize", "--input", FAQ, "--tokenizer", TOKENIZER, "--output", str(out),
                            "--objective", objective, "--seq-len", "32", *extra)


def _a_bug(result, command: str, error: str, bug: str = BUG) -> str:
    """The stderr of a command that met a bug: its line, then its traceback, and exit status 3."""
    err = result.stderr
    assert result.returncode == INTERNAL_ERROR, err
    first, second = err.splitlines()[:2]
    assert first.startswith(f"lmshards {command}: internal error: {error}") and first.endswith(f" ({bug}); traceback:")
    assert second == "Traceback (most recent call last):"
    return err


def test_materialize_a_bad_value_is_one_line_and_a_bug_at_planning_is_a_traceback(objectives, tmp_path):
    result = _materialize(tmp_path / "out", "clm", "--seq-len", "1")
    assert (result.returncode, result.stderr) == (2, "lmshards materialize: error: --seq-len 1: clm needs at least "
                                                     "2 tokens per example\n")
    # A plain ValueError while planning is no configuration error (it was once reported as one, exit 2).
    err = _a_bug(_materialize(tmp_path / "out", "wrong_schema"), "materialize",
                 "ValueError: fixed token length must be > 0, got 0")
    assert ", in plan_run\n" in err and ", in example_schema\n" in err
    assert err.rstrip().endswith("ValueError: fixed token length must be > 0, got 0")
    assert not (tmp_path / "out").exists()


def test_materialize_a_bug_in_a_dofn_is_a_traceback_and_nothing_is_published(objectives, tmp_path):
    out = tmp_path / "out"
    err = _a_bug(_materialize(out, "missing_feature"), "materialize", "KeyError: ")
    assert "[while running '" in err.splitlines()[0]  # Beam names the step
    assert ", in build\n" in err and "KeyError: 'word_starts'" in err
    assert not (out / "manifest.json").exists()


def test_materialize_an_error_of_the_hierarchy_in_a_dofn_is_one_line(objectives, tmp_path):
    out = tmp_path / "out"
    result = _materialize(out, "refusing_build")
    assert result.returncode == 1
    assert result.stderr.startswith("lmshards materialize: error: --objective refusing_build: refused a block of ")
    assert len(result.stderr.splitlines()) == 1 and "[while running" not in result.stderr
    assert not (out / "manifest.json").exists()


@pytest.mark.e2e
@pytest.mark.parametrize(("objective", "code", "start"), [
    ("missing_feature", INTERNAL_ERROR, "lmshards materialize: internal error: RuntimeError: KeyError: "),
    ("refusing_build", 1, "lmshards materialize: error: --objective refusing_build: refused a block of "),
])
def test_a_worker_process_s_failure_is_read_from_its_text(objectives, tmp_path, monkeypatch, objective, code, start):
    """Worker processes send a failure as the text of its traceback: the last error line names
    it, a bug (its traceback follows) or an error of lmshards' (one line)."""
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(ROOT / "tests" / "pipelines"), str(ROOT / "tests"),
                                                      str(ROOT)]))  # the workers unpickle the objective
    out = tmp_path / "out"
    result = _materialize(out, objective, "--workers", "2")
    assert result.returncode == code, result.stderr
    lines = [line for line in result.stderr.splitlines() if not line.startswith("lmshards: ")]  # progress aside
    assert lines[0].startswith(start), result.stderr
    if code == 1:
        assert len(lines) == 1 and "[while running" not in lines[0]
    else:
        assert lines[0].endswith(f" ({BUG}); traceback:") and "KeyError: 'word_starts'" in result.stderr
    assert not (out / "manifest.json").exists()


@pytest.mark.e2e
@pytest.mark.parametrize(("runner", "workers"), [("PrismRunner", "1"), ("FlinkRunner", "2"), ("SparkRunner", "2")])
def test_a_bug_in_an_engine_s_worker_is_a_traceback(objectives, tmp_path, monkeypatch, runner, workers):
    """On Prism, Flink and Spark (started by the command) a bug in a worker's Python code is
    reported as in-process: the error's type and message, the worker's traceback from the
    engine's text, exit status 3; the engine's logs are kept and named; nothing is published."""
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(ROOT / "tests" / "pipelines"), str(ROOT / "tests"),
                                                      str(ROOT)]))  # the workers unpickle the objective
    out = tmp_path / "out"
    result = _materialize(out, "missing_feature", "--runner", runner, "--workers", workers)
    lines = [line for line in result.stderr.splitlines() if not line.startswith("lmshards: ")]  # progress aside
    assert result.returncode == INTERNAL_ERROR, result.stderr
    first = lines[0]
    assert first.startswith('lmshards materialize: internal error: RuntimeError: KeyError: "word_starts '), first
    assert f" (on {runner}; the engine's logs: " in first and first.endswith(f" ({BUG}); traceback:"), first
    assert lines[1] == "Traceback (most recent call last):"
    # the worker's own frames, from the engine's text: the objective's build and the line that failed
    assert 'test_command_failures.py", line ' in result.stderr and ", in build\n" in result.stderr
    assert "KeyError: 'word_starts'" in result.stderr
    logs = first.split("the engine's logs: ", 1)[1].split(")", 1)[0]
    assert os.path.isdir(logs) and os.listdir(logs)
    shutil.rmtree(logs)
    assert not (out / "manifest.json").exists()


def test_an_engine_s_failure_is_a_bug_only_when_it_went_through_lmshards_code(tmp_path):
    """The text an engine sends for a failed job: a worker's traceback through a frame of lmshards'
    packages ending in an error not of the hierarchy is a bug (chained, the logs kept and named);
    one of Beam's harness alone (a gRPC error) is the engine's one line; an error of the hierarchy
    is its own line, the logs removed."""
    from pipelines.engine_run import LocalEngine
    from pipelines.engines import ENGINES

    engine = LocalEngine(ENGINES["FlinkRunner"], ["--runner=FlinkRunner"], "")  # nothing is started
    head = ("Pipeline BeamApp-x failed in state FAILED: java.lang.RuntimeException: Error received from SDK harness "
            "for instruction 9: Traceback (most recent call last):\n")

    def frame(path: str) -> str:
        return f'  File "/venv/lib/python3.11/site-packages/{path}", line 62, in process\n    yield\n'

    engine._logs = str(tmp_path / "logs")
    os.makedirs(engine._logs)
    bug = head + frame("transforms/building/build.py") + 'KeyError: "word_starts [while running \'B\']"\n'
    error, chained = engine.job_error(RuntimeError(bug))
    assert chained and type(error) is RuntimeError
    assert str(error) == (f'KeyError: "word_starts [while running \'B\']" (on FlinkRunner; the engine\'s logs: '
                          f"{engine._logs})")
    harness = head + frame("apache_beam/runners/worker/data_plane.py") + "grpc.RpcError: <RPC CANCELLED>\n"
    error, chained = engine.job_error(RuntimeError(harness))
    assert not chained and type(error) is JobFailedError and os.path.isdir(engine._logs)
    assert str(error) == ("the pipeline failed on FlinkRunner: Pipeline BeamApp-x failed in state FAILED: java.lang."
                          "RuntimeException: Error received from SDK harness for instruction 9: Traceback (most recent "
                          f"call last):; the engine's logs: {engine._logs}")
    own = head + frame("transforms/writing/write.py") + "transforms.writing.write.ShardRowsError: shard 3: 7 rows\n"
    error, chained = engine.job_error(RuntimeError(own))
    assert (type(error), str(error), chained) == (ShardRowsError, "shard 3: 7 rows", False)
    assert not os.path.exists(engine._logs)


def test_job_error_reads_the_error_that_ended_the_run():
    """In this process Beam re-raises a copy of the DoFn's error naming the step, with the
    original as its context; a bug raised while an error of lmshards' was handled is the bug."""
    def raised(error: BaseException, context: BaseException | None = None) -> BaseException:
        try:
            try:
                if context is not None:
                    raise context
            finally:
                raise error
        except BaseException as exc:  # noqa: BLE001 - the test wants the exception with its context
            return exc

    found, chained = job_error(raised(ShardRowsError("shard 3: its files hold 5 and 6 rows [while running 'W']")))
    assert (type(found), str(found), chained) == (ShardRowsError, "shard 3: its files hold 5 and 6 rows", False)
    bug = raised(ZeroDivisionError("division by zero [while running 'B']"), JobFailedError("--input a: changed"))
    assert job_error(bug) == (bug, True)
    # Beam's own copy where the class takes no such message: a RuntimeError naming the error
    found, chained = job_error(RuntimeError("PermissionError: [Errno 13] Permission denied: 'x' [while running 'W']"))
    assert (type(found), str(found), chained) == (JobFailedError, "[Errno 13] Permission denied: 'x'", False)

    def worker_text(error: BaseException, context: BaseException | None = None) -> RuntimeError:
        """What a portable runner raises: the worker's traceback, the whole chain, as text."""
        return RuntimeError("".join(traceback.format_exception(raised(error, context))))

    found, chained = job_error(worker_text(ShardRowsError("shard 3: its files hold 5 and 6 rows [while running 'W']"),
                                           KeyError("rows")))
    assert (type(found), str(found), chained) == (ShardRowsError, "shard 3: its files hold 5 and 6 rows", False)
    found, chained = job_error(worker_text(KeyError("word_starts"), JobFailedError("--input a: changed")))
    assert (type(found), str(found), chained) == (RuntimeError, "KeyError: 'word_starts'", True)
    found, chained = job_error(worker_text(OSError(28, "No space left on device")))
    assert (type(found), str(found), chained) == (JobFailedError, "[Errno 28] No space left on device", False)
    interrupt = KeyboardInterrupt()
    assert job_error(interrupt) == (interrupt, False)


class _BuggyBeamFileSystem(LocalFileSystem):
    """Beam's local file system under ``lmshardsbug://``, whose ``exists`` fails as a bug would."""

    @classmethod
    def scheme(cls) -> str:
        return "lmshardsbug"

    def exists(self, path: str) -> bool:
        raise ValueError(f"a bug in a file system, asked about {path}")


def test_train_tokenizer_a_bad_value_is_one_line_and_a_bug_is_a_traceback(tmp_path):
    output = str(tmp_path / "tokenizer.json")
    result = lmshards_command("train-tokenizer", "--input", str(tmp_path / "nothing*.jsonl"), "--output", output)
    assert (result.returncode, result.stderr) == (
        2, f"lmshards train-tokenizer: error: --input {tmp_path / 'nothing*.jsonl'}: matches no file\n")
    result = lmshards_command("train-tokenizer", "--input", FAQ, "--output", f"lmshardsbug://{output}")
    err = _a_bug(result, "train-tokenizer", f"ValueError: a bug in a file system, asked about lmshardsbug://{output}")
    assert ", in exists\n" in err


class _BuggyFsspecFileSystem(MemoryFileSystem):
    """fsspec's memory file system under ``lmshardsbug://``, whose ``exists`` fails as a bug would."""

    protocol = "lmshardsbug"

    def exists(self, path, **kwargs):
        raise ValueError(f"a bug in a file system, asked about {path}")


@pytest.fixture
def buggy_fsspec():
    fsspec.register_implementation("lmshardsbug", _BuggyFsspecFileSystem, clobber=True)
    yield "lmshardsbug://bucket/dataset"


@pytest.mark.parametrize("command", ["inspect", "show", "validate", "report", "diff"])
def test_inspection_commands_a_damaged_manifest_is_one_line_and_a_bug_is_a_traceback(buggy_fsspec, tmp_path,
                                                                                      command):
    damaged = tmp_path / "damaged"
    damaged.mkdir()
    (damaged / "manifest.json").write_text(json.dumps({"format": "lmshards", "format_version": 99}))
    extra = ["-o", str(tmp_path / "r.html")] if command == "report" else []
    paths = [str(damaged), str(damaged)] if command == "diff" else [str(damaged)]
    result = lmshards_command(command, *paths, *extra)
    label = "A: " if command == "diff" else ""
    assert (result.returncode, result.stderr) == (
        1, f"lmshards {command}: error: {label}{damaged}/manifest.json: unsupported manifest format_version 99; "
           "this lmshards reads <= 3\n")
    paths = [buggy_fsspec, str(damaged)] if command == "diff" else [buggy_fsspec]
    err = _a_bug(lmshards_command(command, *paths, *extra), command,
                 f"ValueError: a bug in a file system, asked about {buggy_fsspec}/manifest.json")
    assert ", in read_manifest\n" in err


def test_report_failure_is_the_one_place_errors_become_exit_statuses(capsys):
    from pipelines.terminal import report_failure

    assert report_failure("inspect", ShardIntegrityError("shard a.arrow: truncated"), "shard a.arrow: truncated "
                          "(run 'lmshards validate d')") == 1
    assert capsys.readouterr().err == ("lmshards inspect: error: shard a.arrow: truncated (run 'lmshards validate "
                                       "d')\n")
    assert report_failure("materialize", ConfigError("--output o\x1b]0;x\x07: is a file")) == 2
    assert capsys.readouterr().err == "lmshards materialize: error: --output o\\x1b]0;x\\x07: is a file\n"
    assert report_failure("materialize", PermissionError(13, "Permission denied")) == 1
    assert capsys.readouterr().err == "lmshards materialize: error: [Errno 13] Permission denied\n"
    try:
        {}["input_ids"]
    except KeyError as exc:
        assert report_failure("show", exc, bug="a bug in lmshards or in the objective 'clm', not a damaged "
                                               "dataset") == INTERNAL_ERROR
    err = capsys.readouterr().err
    assert err.startswith("lmshards show: internal error: KeyError: 'input_ids' (a bug in lmshards or in the "
                          "objective 'clm', not a damaged dataset); traceback:\nTraceback (most recent call last):\n")
    assert err.endswith("KeyError: 'input_ids'\n")
