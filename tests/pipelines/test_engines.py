"""The real engines (Prism, Flink, Spark: :mod:`pipelines.engines`) write the bytes of the
in-process runner, and a run whose SDK worker is killed either retries to those bytes or
fails in one line with nothing published.

Each engine is started once for the module's runs of the bundled sample corpus (a run given
``--job_endpoint`` uses it as the user's own engine); one run per engine goes through the
command line as a user's does, starting and stopping the engine itself, and so does the run
whose worker is killed. The engines come from the cache that ``python -m pipelines.engines
fetch`` fills (CI warms it before the tests; here the first test fetches what is missing).
Without the tools an engine needs, a run fails before any work in one line naming them (the
quick tests at the end, which need no engine).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time

import pytest
from lmshards_testing import ROOT, SAMPLE_GLOB, TOKENIZER, default_sigint, file_digests, materialize

from schemas.manifest import Manifest

OBJECTIVE_ARGS = {
    "clm": ["--objective", "clm", "--seq-len", "512"],
    "bart": ["--objective", "bart", "--seq-len", "256"],
    "ul2": ["--objective", "ul2", "--inputs-length", "128"],
}
COMMON = ["--input", SAMPLE_GLOB, "--tokenizer", TOKENIZER, "--formats", "arrow,webdataset",
          "--validation-fraction", "0.05", "--num-buckets", "8", "--num-shards", "2"]
#: --workers per engine: Flink and Spark run two SDK worker processes side by side; Prism runs one.
WORKERS = {"PrismRunner": 1, "FlinkRunner": 2, "SparkRunner": 2}
RUN_SECONDS = 600


def _args(objective: str) -> list[str]:
    return [*COMMON, *OBJECTIVE_ARGS[objective]]


@pytest.fixture(scope="module")
def references(tmp_path_factory):
    """The in-process runner's output for each objective: ``{objective: (folder, manifest)}``."""
    root = tmp_path_factory.mktemp("in-process")
    return {objective: (root / objective, materialize(root / objective, *_args(objective)))
            for objective in OBJECTIVE_ARGS}


@pytest.fixture(scope="module", params=sorted(WORKERS))
def runner(request):
    return request.param


@pytest.fixture(scope="module")
def engine_flags(runner):
    """An engine started once for the module: the Beam flags that point a run at it."""
    from pipelines.engine_run import local_engine
    from pipelines.parallelism import worker_flags

    beam_args = [f"--runner={runner}"]
    engine = local_engine([*beam_args, *worker_flags(WORKERS[runner], beam_args)])
    with engine.running():
        yield engine.beam_args


@pytest.fixture(scope="module")
def longer_corpus(tmp_path_factory):
    """Ten distinct copies of the sample (12 MB): a run that an interrupt 2 s after its first
    SDK worker starts still finds mid-way, on a loaded machine too (the sample alone can be done
    by then, and a signal that lands as the interpreter exits kills it without a word)."""
    texts = [json.loads(line)["text"] for path in sorted((ROOT / "data" / "sample").glob("*.jsonl"))
             for line in path.read_text(encoding="utf-8").splitlines()]
    path = tmp_path_factory.mktemp("longer") / "copies.jsonl"
    with open(path, "w", encoding="utf-8") as handle:
        for copy in range(10):
            for text in texts:
                handle.write(json.dumps({"text": f"{text}\n\n(copy {copy})"}) + "\n")
    return str(path)


@pytest.fixture(scope="module")
def longer_reference(tmp_path_factory, longer_corpus):
    """The in-process runner's clm output for the sample with :func:`longer_corpus` added."""
    out = tmp_path_factory.mktemp("in-process-longer") / "clm"
    return out, materialize(out, *_args("clm"), "--input", longer_corpus)


def _same_dataset(out, reference) -> None:
    reference_out, reference_manifest = reference
    assert file_digests(out) == file_digests(reference_out)
    manifest = Manifest.loads((out / "manifest.json").read_text())
    assert manifest.deterministic_view() == reference_manifest.deterministic_view()


def _children(pid: int) -> list[int]:
    """Every process descended from ``pid`` (read from /proc)."""
    parents = {}
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                with open(f"/proc/{name}/stat") as handle:
                    parents[int(name)] = int(handle.read().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
    found, frontier = [], [pid]
    while frontier:
        parent = frontier.pop()
        kids = [child for child, ppid in parents.items() if ppid == parent]
        found += kids
        frontier += kids
    return found


def _cmdline(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as handle:
            return handle.read().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def _alive(processes: dict[int, str]) -> dict[int, str]:
    """Those of ``processes`` (pid -> command line) that still run: the pid is there with the
    same command line (a zombie has none, a reused pid another one)."""
    return {pid: cmd for pid, cmd in processes.items() if cmd and _cmdline(pid) == cmd}


def _watch(proc: subprocess.Popen, seen: dict[int, str]) -> list[int]:
    """Record the run's processes in ``seen``; the pids of its SDK workers. A process caught
    between fork and exec, or already a zombie, has no command line yet: it is recorded on a
    later look."""
    for pid in _children(proc.pid):
        if not seen.get(pid):
            seen[pid] = _cmdline(pid)
    return sorted(pid for pid in _children(proc.pid) if "SdkHarness" in seen.get(pid, ""))


def _launch(runner: str, out, *extra: str) -> subprocess.Popen:
    """The CLI on the sample (clm), its temporary files (the engine's logs) in ``tmp`` beside ``out``;
    ``extra`` flags come last (an ``--input`` among them adds to the sample)."""
    command = [sys.executable, "-m", "pipelines.materialize", "--output", str(out), *_args("clm"),
               "--runner", runner, "--workers", str(WORKERS[runner]), *extra]
    os.makedirs(out.parent / "tmp", exist_ok=True)
    return subprocess.Popen(command, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True, env={**os.environ, "TMPDIR": str(out.parent / "tmp")},
                            preexec_fn=default_sigint)


def _engine_logs(tmp_path) -> list[str]:
    """The engine log folders a run of :func:`_launch` left (Beam's own temporary files aside)."""
    return [name for name in os.listdir(tmp_path / "tmp") if name.startswith("lmshards-")]


def _finish(proc: subprocess.Popen) -> tuple[str, str]:
    try:
        return proc.communicate(timeout=RUN_SECONDS)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


@pytest.mark.e2e
@pytest.mark.parametrize("objective", sorted(OBJECTIVE_ARGS))
def test_every_objective_on_the_engine_writes_the_in_process_bytes(tmp_path, references, runner, engine_flags,
                                                                   objective):
    out = tmp_path / "out"
    materialize(out, *_args(objective), *engine_flags)
    _same_dataset(out, references[objective])


@pytest.mark.e2e
def test_the_command_line_starts_and_stops_its_own_engine(tmp_path, references, runner):
    out = tmp_path / "out"
    proc = _launch(runner, out, "--progress-seconds", "1")
    seen: dict[int, str] = {}
    try:
        while proc.poll() is None:
            _watch(proc, seen)
            time.sleep(0.2)
    finally:
        stdout, stderr = _finish(proc)
    assert proc.returncode == 0, stderr
    assert "Traceback" not in stderr
    assert stdout.splitlines()[0] == f"dataset: {out} (manifest.json)"
    # the engine's workers' progress reaches the terminal as in-process runs' does: the whole read
    assert any(line.startswith("lmshards: tokenized: 100% of 1.2 MB read, 682 documents, ")
               for line in stderr.splitlines()), stderr
    _same_dataset(out, references["clm"])
    assert not _engine_logs(tmp_path)  # the engine's logs are removed after a run that succeeded
    # SDK workers were processes of their own, as many side by side as --workers (at least) on
    # Flink, whose task slots each get one; Spark starts its second only when two of its tasks run
    # at once, which a corpus this small does not force on a loaded machine
    workers = [pid for pid, cmd in seen.items() if "SdkHarness" in cmd]
    assert len(workers) >= (1 if runner == "SparkRunner" else WORKERS[runner]), seen
    assert not _alive(seen)  # the job server, the worker pool and its workers all ended with the run


@pytest.mark.e2e
def test_a_killed_sdk_worker_gives_the_same_bytes_or_one_line_and_nothing_published(tmp_path, longer_reference,
                                                                                   runner, longer_corpus):
    # 13 MB: the sample alone can be done before a worker has been up for 2 s
    out = tmp_path / "out"
    proc = _launch(runner, out, "--input", longer_corpus)
    killed, seen, first_seen = None, {}, {}
    try:
        while proc.poll() is None and killed is None:
            now = time.monotonic()
            for pid in _watch(proc, seen):
                first_seen.setdefault(pid, now)
            # mid-run: a worker that has been up for 2 s (connected, running bundles), no manifest yet
            working = [pid for pid, since in first_seen.items() if now - since > 2 and _cmdline(pid)]
            if working and not (out / "manifest.json").exists():
                os.kill(working[0], signal.SIGKILL)
                killed = working[0]
            time.sleep(0.05)
    finally:
        stdout, stderr = _finish(proc)
    assert killed is not None, "the run ended before a worker could be killed"
    assert "Traceback" not in stderr
    if proc.returncode == 0:  # the engine retried the work of the lost worker
        _same_dataset(out, longer_reference)
    else:
        lines = [line for line in stderr.strip().splitlines() if not line.startswith("lmshards: ")]  # progress aside
        assert proc.returncode == 1, stderr
        assert len(lines) == 1, stderr
        # lmshards' watchdog names the worker, unless the engine failed the job first (Prism at times)
        assert lines[0].startswith(f"lmshards materialize: error: the pipeline failed on {runner}: "), stderr
        assert "; the engine's logs: " in lines[0]
        shutil.rmtree(lines[0].rsplit("the engine's logs: ", 1)[1], ignore_errors=True)
        assert not (out / "manifest.json").exists()
        published = [rel for rel in (file_digests(out) if out.exists() else {}) if not rel.startswith("rejected/")]
        assert published == [], published
    assert not _alive(seen)


@pytest.mark.e2e
def test_ctrl_c_stops_the_engine_and_publishes_nothing(tmp_path, runner, longer_corpus):
    out = tmp_path / "out"
    proc = _launch(runner, out, "--input", longer_corpus)
    seen, first_worker = {}, None
    try:
        while proc.poll() is None:
            if _watch(proc, seen) and first_worker is None:
                first_worker = time.monotonic()
            if first_worker is not None and time.monotonic() - first_worker > 2:
                _watch(proc, seen)
                os.kill(proc.pid, signal.SIGINT)  # what a terminal's Ctrl-C sends lmshards (not its engine)
                break
            time.sleep(0.05)
    finally:
        stdout, stderr = _finish(proc)
    assert first_worker is not None, "the run ended before it could be interrupted"
    assert proc.returncode == 130, (stdout, stderr)
    assert [line for line in stderr.strip().splitlines() if not line.startswith("lmshards: ")] == [  # progress aside
        "lmshards materialize: interrupted; no manifest written, what the run wrote is removed"], stderr
    assert not out.exists()
    assert not _engine_logs(tmp_path)  # the engine's logs went too: no error names them
    deadline = time.monotonic() + 15
    while _alive(seen) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not _alive(seen)


@pytest.mark.e2e
def test_too_many_rejections_fail_in_one_line_on_the_engine(tmp_path, runner):
    """``--max-rejected-fraction`` fails the job on an engine as in-process: exit 1, one line
    (progress lines aside) naming the share and the reason, no worker's traceback, no manifest,
    and the engine's logs removed (the line names none)."""
    corpus = tmp_path / "mixed.jsonl"
    lines = [json.dumps({"text": f"document number {i} is fine"}) for i in range(3)]
    lines += [json.dumps({"body": f"document number {i} has its text elsewhere"}) for i in range(5)]
    corpus.write_text("\n".join(lines) + "\n", encoding="utf-8")
    out = tmp_path / "out"
    os.makedirs(tmp_path / "tmp")
    proc = subprocess.Popen([sys.executable, "-m", "pipelines.materialize", "--input", str(corpus), "--tokenizer",
                             TOKENIZER, "--output", str(out), "--seq-len", "4", "--runner", runner,
                             "--workers", str(WORKERS[runner])], cwd=ROOT, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True,
                            env={**os.environ, "TMPDIR": str(tmp_path / "tmp")})
    _, stderr = _finish(proc)
    assert proc.returncode == 1, stderr
    assert "Traceback" not in stderr
    assert [line for line in stderr.strip().splitlines() if not line.startswith("lmshards: ")] == [
        "lmshards materialize: error: --max-rejected-fraction 0.5 exceeded: 62.50% of documents rejected (5 of 8 "
        "read: missing_text_field 5); mostly missing_text_field: check --text-field; no manifest written, the "
        f"rejected records are in {out}/rejected/rejected.jsonl"], stderr
    assert not (out / "manifest.json").exists()
    assert not _engine_logs(tmp_path)


@pytest.mark.e2e
@pytest.mark.parametrize("runner", ["FlinkRunner", "SparkRunner"])
def test_a_job_server_that_finds_a_port_taken_is_started_once_more(runner):
    """The ports of a job server's services are chosen before it starts; another process may take
    one meanwhile. Flink's and Spark's job servers then exit at startup (Spark without a word):
    the engine starts it once more on fresh ports, the first log kept beside."""
    import socket

    from pipelines.engine_run import local_engine
    from pipelines.parallelism import worker_flags

    beam_args = [f"--runner={runner}"]
    engine = local_engine([*beam_args, *worker_flags(WORKERS[runner], beam_args)])
    with socket.socket() as taken:
        taken.bind(("localhost", engine._artifact_port))  # what a process that came first would hold
        taken.listen()
        with engine.running():
            with socket.create_connection(("localhost", engine._job_port), timeout=5):
                pass
            assert sorted(os.listdir(engine._logs)) == ["job-server.log", "job-server.log.1", "worker-pool.log"]
            assert engine._artifact_port != taken.getsockname()[1]


# --- before any work: what an engine needs, and --workers ------------------------------------


@pytest.mark.parametrize("runner, message", [
    ("PrismRunner", "--runner PrismRunner: building Beam's Prism runner needs Go 1.26.2+, which is not on PATH, and "
                    "GOPROXY=off names no proxy; install Go 1.26.2 or newer (https://go.dev/doc/install) and run "
                    "`go install github.com/apache/beam/sdks/v2/go/cmd/prism@v"),
    ("FlinkRunner", "--runner FlinkRunner: fetching Beam's Flink 1.19 job server needs Java 11+ and Maven, and `java` "
                    "and `mvn` is not on PATH; install them (for example `apt-get install openjdk-17-jre-headless "
                    "maven`) and run `python -m pipelines.engines fetch flink`"),
    ("SparkRunner", "--runner SparkRunner: fetching Beam's Spark 3.5.1 job server needs Java 11+ and Maven"),
])
def test_an_engine_without_its_tools_fails_in_one_line_before_any_work(tmp_path, monkeypatch, capfd, runner,
                                                                       message):
    from pipelines.materialize import main

    monkeypatch.setenv("LMSHARDS_CACHE", str(tmp_path / "cache"))  # nothing cached
    monkeypatch.setenv("PATH", str(tmp_path / "no-tools"))
    monkeypatch.setenv("GOPROXY", "off")  # and Go cannot be fetched
    out = tmp_path / "out"
    assert main(["--output", str(out), *_args("clm"), "--runner", runner]) == 2
    captured = capfd.readouterr()
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1, captured.err
    assert lines[0].startswith(f"lmshards materialize: error: {message}"), lines[0]
    assert not out.exists() and not (tmp_path / "cache" / "engines").exists() or not any(
        (tmp_path / "cache" / "engines").iterdir())


def test_workers_become_each_engines_parallelism():
    from pipelines.parallelism import worker_flags

    assert worker_flags(2, ["--runner=FlinkRunner"]) == ["--parallelism=2", "--sdk_worker_parallelism=2"]
    assert worker_flags(3, ["--runner=SparkRunner"]) == ["--spark_master_url=local[3]", "--sdk_worker_parallelism=3"]
    assert worker_flags(1, ["--runner=PrismRunner"]) == []
    with pytest.raises(ValueError, match=r"--workers 2: PrismRunner runs one SDK worker process"):
        worker_flags(2, ["--runner=PrismRunner"])
    with pytest.raises(ValueError, match="--workers 2: also given --parallelism"):
        worker_flags(2, ["--runner=FlinkRunner", "--parallelism=4"])


def test_the_engine_flags_point_beam_at_the_engine_the_run_starts(tmp_path):
    from pipelines.engine_run import LocalEngine
    from pipelines.engines import ENGINES

    flink = LocalEngine(ENGINES["FlinkRunner"], ["--runner=FlinkRunner", "--parallelism=2"], str(tmp_path)).beam_args
    added = {flag.split("=", 1)[0]: flag.split("=", 1)[1] for flag in flink[2:]}
    assert added.keys() == {"--job_endpoint", "--environment_type", "--environment_config",
                            "--sdk_worker_parallelism", "--environment_cache_millis"}
    assert added["--environment_type"] == "EXTERNAL" and added["--sdk_worker_parallelism"] == "2"
    spark = LocalEngine(ENGINES["SparkRunner"], ["--runner=SparkRunner", "--spark_master_url=local[3]",
                                                 "--environment_type=LOOPBACK"], str(tmp_path)).beam_args
    assert [f.split("=", 1)[0] for f in spark[3:]] == ["--job_endpoint", "--sdk_worker_parallelism",
                                                       "--environment_cache_millis"]  # the user's environment kept
    with pytest.raises(ValueError, match="--prism_location /nowhere/prism: not a file"):
        LocalEngine(ENGINES["PrismRunner"], ["--runner=PrismRunner", "--prism_location=/nowhere/prism"], "")


def test_the_fetch_command_names_its_engines(capfd):
    from pipelines.engines import main

    assert main(["fetch", "dask"]) == 2
    assert capfd.readouterr().err.strip() == "usage: python -m pipelines.engines fetch [prism|flink|spark ...]"
