"""The local engines behind ``--runner PrismRunner``, ``FlinkRunner`` and ``SparkRunner``.

Beam's Python runners for these engines fetch what they run at an unannounced moment: the
Prism binary from a GitHub release, the Flink and Spark job-server jars from Maven Central,
and fail with a bare ``urlopen`` error where those are out of reach. Here each engine is
fetched or built once, by :func:`fetch`, into the cache (``$LMSHARDS_CACHE/engines``, else
``~/.cache/lmshards/engines``), announced in one line on stderr; what cannot be fetched is a
:class:`~schemas.errors.ConfigError` naming what is missing and the command that gets it.

- **Prism**: ``go install github.com/apache/beam/sdks/v2/go/cmd/prism@v<Beam's version>``.
- **Flink** (1.19) and **Spark** (3, Spark 3.5): Beam's runner library
  (``org.apache.beam:beam-runners-flink-1.19``, ``beam-runners-spark-3``) at
  :data:`JOB_SERVER_BEAM_VERSION` with the engine's own jars, resolved by Maven
  (``mvn dependency:copy-dependencies`` over a small pom written here) into the cache, and
  run as ``java -cp 'lib/*' <the runner's JobServerDriver>``. Beam publishes that job server
  as one shaded jar too; the library and its dependencies are the same classes.

A run on one of these engines (:class:`LocalEngine`) owns two processes, started by
:meth:`LocalEngine.running` around the pipeline and stopped when it ends, also on a failure
or Ctrl-C (each in a session of its own, so a terminal's Ctrl-C reaches only this process,
and each told by the kernel to end if this process dies): the engine's job server, and a
Beam worker pool (``apache_beam.runners.worker.worker_pool_main``) whose SDK workers are
processes of this interpreter, run in this directory, importing the lmshards imported here.
Beam is pointed at them with its public options only: ``--job_endpoint``,
``--environment_type=EXTERNAL``, ``--environment_config``. A user who passes
``--job_endpoint`` brings their own engine: nothing is fetched or started then, and a user's
``--environment_type`` is kept (no worker pool is started).
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field

from schemas.errors import ConfigError, JobFailedError

__all__ = ["ENGINES", "JOB_SERVER_BEAM_VERSION", "EngineStartError", "LocalEngine", "cache_root", "fetch",
           "local_engine", "main"]

#: Beam's Java runner libraries the Flink and Spark job servers are made of. The Python SDK
#: speaks to them through Beam's portable job API; the newest version whose dependencies every
#: registry serves (2.70.0's ``beam-runners-java-job-service`` is not on every mirror).
JOB_SERVER_BEAM_VERSION = "2.62.0"
_FLINK_VERSION = "1.19.0"
_SPARK_VERSION = "3.5.1"
#: Spark on Java 17 needs these, as Beam's own Spark job server launcher passes them.
_SPARK_JVM_ARGS = ("--add-opens=java.base/sun.nio.ch=ALL-UNNAMED", "--add-opens=java.base/java.nio=ALL-UNNAMED",
                   "--add-opens=java.base/java.util=ALL-UNNAMED",
                   "--add-opens=java.base/java.lang.invoke=ALL-UNNAMED")
_PRISM_PACKAGE = "github.com/apache/beam/sdks/v2/go/cmd/prism"
_STARTUP_SECONDS = 180
_CANCEL_SECONDS = 30
#: How long Flink and Spark keep an idle SDK worker for the next stage (the run ends them all).
_ENVIRONMENT_CACHE_MILLIS = 3_600_000


class EngineStartError(JobFailedError):
    """An engine's job server or worker pool did not start (exit 1; its log is named)."""


@dataclass(frozen=True)
class Engine:
    """One engine: how it is fetched and how its job server starts."""

    name: str  #: ``prism``, ``flink``, ``spark``
    runner: str  #: Beam's runner class name
    title: str  #: for messages
    dependencies: tuple[tuple[str, str, str], ...] = ()  #: Maven ``(group, artifact, version)``
    driver: str = ""  #: the job server's main class (Java engines)
    jvm_args: tuple[str, ...] = field(default=())

    @property
    def cache_name(self) -> str:
        if self.name == "prism":
            return f"prism-{_beam_version()}"
        return f"{self.name}-beam-{JOB_SERVER_BEAM_VERSION}"


ENGINES = {
    engine.runner: engine for engine in (
        Engine("prism", "PrismRunner", "Beam's Prism runner"),
        Engine("flink", "FlinkRunner", f"Beam's Flink {_FLINK_VERSION.rsplit('.', 1)[0]} job server",
               (("org.apache.beam", "beam-runners-flink-1.19", JOB_SERVER_BEAM_VERSION),
                ("org.slf4j", "slf4j-jdk14", "1.7.30")),
               "org.apache.beam.runners.flink.FlinkJobServerDriver"),
        Engine("spark", "SparkRunner", f"Beam's Spark {_SPARK_VERSION} job server",
               (("org.apache.beam", "beam-runners-spark-3", JOB_SERVER_BEAM_VERSION),
                ("org.apache.spark", "spark-core_2.12", _SPARK_VERSION),
                ("org.apache.spark", "spark-streaming_2.12", _SPARK_VERSION)),
               "org.apache.beam.runners.spark.SparkJobServerDriver", _SPARK_JVM_ARGS),
    )
}
_BY_NAME = {engine.name: engine for engine in ENGINES.values()}


def _beam_version() -> str:
    from apache_beam.version import __version__

    return __version__


def cache_root() -> str:
    """Where engines are cached: ``$LMSHARDS_CACHE/engines``, else ``~/.cache/lmshards/engines``."""
    base = os.environ.get("LMSHARDS_CACHE") or os.path.join(os.path.expanduser("~"), ".cache", "lmshards")
    return os.path.join(base, "engines")


def _announce(line: str) -> None:
    print(f"lmshards: {line}", file=sys.stderr, flush=True)


def _last_error_line(output: str) -> str:
    """The most telling line of a failed tool's output, without terminal colours."""
    lines = [re.sub(r"\x1b\[[0-9;]*m", "", line).strip() for line in output.splitlines()]
    lines = [line for line in lines if line and not line.startswith("[ERROR] -> [Help")]
    errors = [line for line in lines if line.startswith("[ERROR]") and len(line) > len("[ERROR] ")]
    return (errors[0] if errors else lines[-1] if lines else "no output")[:400]


def _install(engine: Engine, build) -> str:
    """Build ``engine`` with ``build(directory)`` into a fresh folder of the cache and move it into
    place (a concurrent build of the same engine leaves one of the two); its final folder."""
    final = os.path.join(cache_root(), engine.cache_name)
    if os.path.isfile(os.path.join(final, "ready")):
        return final
    os.makedirs(cache_root(), exist_ok=True)
    work = tempfile.mkdtemp(prefix=f".{engine.cache_name}-", dir=cache_root())
    try:
        build(work)
        open(os.path.join(work, "ready"), "w").close()
        try:
            os.rename(work, final)
        except OSError:  # another process finished first, or an unfinished folder is in the way
            if not os.path.isfile(os.path.join(final, "ready")):
                shutil.rmtree(final, ignore_errors=True)
                os.rename(work, final)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return final


def _build_prism(engine: Engine, directory: str) -> None:
    go = shutil.which("go")
    version = _beam_version()
    command = f"go install {_PRISM_PACKAGE}@v{version}"
    if go is None:
        raise ConfigError(f"--runner {engine.runner}: building {engine.title} needs Go, and `go` is not on PATH; "
                          f"install Go (https://go.dev/doc/install) and run `{command}`, or pass "
                          "--prism_location=PATH of a prism binary")
    _announce(f"building {engine.title} {version} into {cache_root()} (go install, once)")
    done = subprocess.run([go, "install", f"{_PRISM_PACKAGE}@v{version}"], env={**os.environ, "GOBIN": directory},
                          stdin=subprocess.DEVNULL, capture_output=True, text=True)
    if done.returncode != 0 or not os.path.isfile(os.path.join(directory, "prism")):
        why = _last_error_line(done.stderr + done.stdout)
        raise ConfigError(f"--runner {engine.runner}: `{command}` failed: {why}")


def _pom(engine: Engine) -> str:
    dependencies = "".join(
        f"<dependency><groupId>{group}</groupId><artifactId>{artifact}</artifactId><version>{version}</version>"
        "</dependency>\n" for group, artifact, version in engine.dependencies)
    return ("<project xmlns=\"http://maven.apache.org/POM/4.0.0\">\n<modelVersion>4.0.0</modelVersion>\n"
            f"<groupId>lmshards.engines</groupId><artifactId>{engine.name}-job-server</artifactId>"
            f"<version>1</version><packaging>pom</packaging>\n<dependencies>\n{dependencies}</dependencies>\n"
            "</project>\n")


def _build_job_server(engine: Engine, directory: str) -> None:
    missing = [tool for tool in ("java", "mvn") if shutil.which(tool) is None]
    coordinates = ", ".join(":".join(d) for d in engine.dependencies)
    if missing:
        raise ConfigError(f"--runner {engine.runner}: fetching {engine.title} needs Java 11+ and Maven, and "
                          f"{' and '.join(f'`{t}`' for t in missing)} is not on PATH; install them (for example "
                          "`apt-get install openjdk-17-jre-headless maven`) and run `python -m pipelines.engines "
                          f"fetch {engine.name}`")
    _announce(f"fetching {engine.title} (Beam {JOB_SERVER_BEAM_VERSION}) into {cache_root()} (Maven, once)")
    with open(os.path.join(directory, "pom.xml"), "w") as handle:
        handle.write(_pom(engine))
    done = subprocess.run([shutil.which("mvn"), "-B", "-q", "-f", os.path.join(directory, "pom.xml"),
                           "dependency:copy-dependencies", f"-DoutputDirectory={os.path.join(directory, 'lib')}"],
                          stdin=subprocess.DEVNULL, capture_output=True, text=True)
    if done.returncode != 0:
        raise ConfigError(f"--runner {engine.runner}: Maven could not fetch {coordinates}: "
                          f"{_last_error_line(done.stdout + done.stderr)}")


def fetch(name: str) -> str:
    """Fetch or build engine ``name`` (``prism``, ``flink``, ``spark``) into the cache, once; the
    folder it is in.

    Raises:
        ConfigError: a tool it needs is missing, or the fetch or build failed (one line).
    """
    engine = _BY_NAME[name]
    builder = _build_prism if name == "prism" else _build_job_server
    return _install(engine, lambda directory: builder(engine, directory))


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("localhost", 0))
        return sock.getsockname()[1]


def _listening(port: int) -> bool:
    with socket.socket() as sock:
        sock.settimeout(0.5)
        return sock.connect_ex(("localhost", port)) == 0


#: Run a command as a child that the kernel ends (SIGTERM) when this process dies, however it dies.
_ORPHAN_GUARD = ("import ctypes, os, sys; ctypes.CDLL(None).prctl(1, 15); "  # PR_SET_PDEATHSIG
                 "os.execvp(sys.argv[1], sys.argv[1:])")


@dataclass
class _Process:
    role: str
    popen: subprocess.Popen
    log: str


class LocalEngine:
    """One run's engine: the Beam flags that point at it, and its processes (see the module docstring)."""

    def __init__(self, engine: Engine, beam_args: list[str], home: str):
        from apache_beam.options.pipeline_options import (
            FlinkRunnerOptions,
            PipelineOptions,
            PortableOptions,
            PrismRunnerOptions,
            SparkRunnerOptions,
        )

        self.engine, self.home = engine, home
        options = PipelineOptions(beam_args)
        portable = options.view_as(PortableOptions)
        self._job_port, self._pool_port = _free_port(), None
        added = [f"--job_endpoint=localhost:{self._job_port}"]
        if not portable.environment_type:
            self._pool_port = _free_port()
            added += ["--environment_type=EXTERNAL", f"--environment_config=localhost:{self._pool_port}"]
        self._binary = os.path.join(home, "prism")
        if engine.name == "prism":
            location = options.view_as(PrismRunnerOptions).prism_location
            if location:
                if not os.path.isfile(location):
                    raise ConfigError(f"--prism_location {location}: not a file (a local prism binary)")
                self._binary = location
        self._master = ""
        if engine.name == "flink":
            self._master = options.view_as(FlinkRunnerOptions).flink_master
            if not any(a.split("=", 1)[0] == "--flink_master" for a in beam_args):
                self._master = "[local]"
            parallelism = options.view_as(FlinkRunnerOptions).parallelism
            if parallelism is None or parallelism < 1:
                parallelism = _usable_cores()
                added.append(f"--parallelism={parallelism}")
            if not portable.sdk_worker_parallelism:  # an SDK worker per task slot, not one shared by all
                added.append(f"--sdk_worker_parallelism={parallelism}")
        if engine.name == "spark":
            self._master = options.view_as(SparkRunnerOptions).spark_master_url
            if not any(a.split("=", 1)[0] == "--spark_master_url" for a in beam_args):
                self._master = f"local[{_usable_cores()}]"
            if not portable.sdk_worker_parallelism:
                match = re.fullmatch(r"local\[(\d+)\]", self._master)
                added.append(f"--sdk_worker_parallelism={match.group(1) if match else 1}")
        if engine.name != "prism" and not portable.environment_cache_millis:
            # Beam's default (0) ends an SDK worker after each stage, and the next stage starts a
            # new one: on the sample corpus most of a run (43 s against 16 s on Flink).
            added.append(f"--environment_cache_millis={_ENVIRONMENT_CACHE_MILLIS}")
        self.beam_args = [*beam_args, *added]
        self._logs: str | None = None
        self._processes: list[_Process] = []
        self._stopping = threading.Event()
        self.worker_death: str | None = None

    def _job_server_command(self, artifacts: str) -> list[str]:
        if self.engine.name == "prism":
            return [self._binary, "--job_port", str(self._job_port), "--serve_http=false", "--log_level", "warn",
                    "--log_kind", "text"]
        master_flag = "--flink-master" if self.engine.name == "flink" else "--spark-master-url"
        return [shutil.which("java") or "java", *self.engine.jvm_args, "-cp", os.path.join(self.home, "lib", "*"),
                self.engine.driver, f"{master_flag}={self._master}", f"--job-port={self._job_port}",
                f"--artifact-port={_free_port()}", f"--expansion-port={_free_port()}", f"--artifacts-dir={artifacts}"]

    def _pool_command(self) -> list[str]:
        return [sys.executable, "-m", "apache_beam.runners.worker.worker_pool_main",
                f"--service_port={self._pool_port}"]

    def _worker_env(self) -> dict[str, str]:
        """The pool starts each SDK worker as ``python``: this interpreter, importing this lmshards."""
        import pipelines

        env = dict(os.environ)
        env["PATH"] = os.pathsep.join([os.path.dirname(sys.executable), env.get("PATH", "")])
        root = os.path.dirname(os.path.dirname(os.path.abspath(pipelines.__file__)))
        env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH")) if p)
        return env

    def _start(self, role: str, command: list[str], env: dict[str, str] | None = None) -> None:
        log = os.path.join(self._logs, f"{role.replace(' ', '-')}.log")
        with open(log, "wb") as handle:
            popen = subprocess.Popen([sys.executable, "-c", _ORPHAN_GUARD, *command], stdin=subprocess.DEVNULL,
                                     stdout=handle, stderr=subprocess.STDOUT, env=env, start_new_session=True)
        self._processes.append(_Process(role, popen, log))

    def _wait_until_listening(self, process: _Process, port: int) -> None:
        deadline = time.monotonic() + _STARTUP_SECONDS
        while not _listening(port):
            code = process.popen.poll()
            if code is not None:
                raise EngineStartError(f"--runner {self.engine.runner}: the {process.role} exited at startup "
                                     f"(status {code}): {_last_error_line(_read(process.log))}; its log: {process.log}")
            if time.monotonic() > deadline:
                raise EngineStartError(f"--runner {self.engine.runner}: the {process.role} did not listen on port "
                                     f"{port} within {_STARTUP_SECONDS} s; its log: {process.log}")
            time.sleep(0.1)

    def _watch_workers(self) -> None:
        """End the run when an SDK worker process dies (its exit not a stop's SIGTERM): the engines
        do not notice a worker that dies before it connects (Flink waits for it for ever, Prism a
        minute), and one that dies later fails the job with a gRPC error that does not say so."""
        while not self._stopping.wait(0.5):
            if self._found_worker_death():
                self._cancel_jobs()
                return

    def _found_worker_death(self) -> bool:
        """Whether an SDK worker of the pool died (then :attr:`worker_death` says how)."""
        if len(self._processes) < 2:
            return False
        for pid, status in _dead_children(self._processes[1].popen.pid):
            killed_by = status & 0x7F
            if (killed_by and killed_by != signal.SIGTERM) or (not killed_by and status >> 8):
                how = (f"killed by {signal.Signals(killed_by).name}" if killed_by
                       else f"exited with status {status >> 8}")
                self.worker_death = f"an SDK worker process (pid {pid}) died: {how}"
                return True
        return False

    def _cancel_jobs(self) -> None:
        """Cancel the jobs on the job server (Beam's job API; the server is this run's alone): the
        pipeline's wait then ends. Where the engine does not cancel in time, the job server is
        ended, which ends the wait too."""
        import grpc
        from apache_beam.portability.api import beam_job_api_pb2, beam_job_api_pb2_grpc

        done = (beam_job_api_pb2.JobState.CANCELLED, beam_job_api_pb2.JobState.FAILED,
                beam_job_api_pb2.JobState.DONE)
        try:
            with grpc.insecure_channel(f"localhost:{self._job_port}") as channel:
                service = beam_job_api_pb2_grpc.JobServiceStub(channel)
                jobs = [job.job_id for job in service.GetJobs(beam_job_api_pb2.GetJobsRequest(), timeout=10).job_info]
                for job in jobs:
                    service.Cancel(beam_job_api_pb2.CancelJobRequest(job_id=job), timeout=10)
                deadline = time.monotonic() + _CANCEL_SECONDS
                while time.monotonic() < deadline and not self._stopping.is_set():
                    states = [service.GetState(beam_job_api_pb2.GetJobStateRequest(job_id=job), timeout=10).state
                              for job in jobs]
                    if all(state in done for state in states):
                        return
                    time.sleep(0.5)
        except grpc.RpcError:
            pass
        if not self._stopping.is_set():
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self._processes[0].popen.pid, signal.SIGKILL)

    def stop(self) -> None:
        """End the engine's processes (SIGTERM to each one's process group, SIGKILL after 10 s)."""
        for process in self._processes:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.popen.pid, signal.SIGTERM)
        deadline = time.monotonic() + 10
        for process in self._processes:
            try:
                process.popen.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                pass
            with contextlib.suppress(ProcessLookupError):  # the pool's SDK workers share its group
                os.killpg(process.popen.pid, signal.SIGKILL)
            process.popen.wait()
        self._processes = []

    @contextlib.contextmanager
    def running(self, verbose: bool = False):
        """Start the job server (and the worker pool) for the pipeline's run; stop them after it.
        On a failure the engine's logs are kept (:meth:`job_error` names them), else removed.
        Unless ``verbose``, the engine's job messages, which Beam logs on the root logger, stay
        unseen meanwhile (a filter on that logger: records of other loggers pass): the error
        that ends a failed run is reported once."""
        self._logs = tempfile.mkdtemp(prefix=f"lmshards-{self.engine.name}-")
        failed = True
        root = logging.getLogger()
        if not verbose:
            root.addFilter(_drop_job_messages)
        try:
            self._start("job server", self._job_server_command(os.path.join(self._logs, "artifacts")))
            if self._pool_port is not None:
                self._start("worker pool", self._pool_command(), self._worker_env())
                self._wait_until_listening(self._processes[1], self._pool_port)
            self._wait_until_listening(self._processes[0], self._job_port)
            watchdog = threading.Thread(target=self._watch_workers, name="lmshards-engine-watchdog", daemon=True)
            watchdog.start()
            try:
                yield self
            except BaseException:
                if self.worker_death is None:  # the engine may have failed the job before the watchdog looked
                    self._found_worker_death()
                raise
            if self.worker_death is not None:  # the job was cancelled: Beam's wait returned
                raise JobFailedError(self._death_message())
            failed = False
        finally:
            self._stopping.set()
            root.removeFilter(_drop_job_messages)
            self.stop()
            if not failed:
                shutil.rmtree(self._logs, ignore_errors=True)

    def _death_message(self) -> str:
        return f"the pipeline failed on {self.engine.runner}: {self.worker_death}; the engine's logs: {self._logs}"

    def job_error(self, exc: BaseException) -> tuple[BaseException, bool]:
        """Like :func:`pipelines.failures.job_error`, except that a job the engine failed (not one
        of the job's own checks) is one line naming the engine's logs, which are kept, without
        the runner's traceback."""
        from pipelines.failures import job_error

        if isinstance(exc, EngineStartError):
            return exc, False
        if self.worker_death is not None and isinstance(exc, Exception):
            return JobFailedError(self._death_message()), False
        error, chained = job_error(exc)
        if not chained:
            return error, chained
        text = str(exc).strip()
        first = text.splitlines()[0] if text else type(exc).__name__
        return JobFailedError(f"the pipeline failed on {self.engine.runner}: {first[:500]}; "
                              f"the engine's logs: {self._logs}"), False


def _dead_children(parent: int) -> list[tuple[int, int]]:
    """``(pid, wait status)`` of the exited, not yet reaped children of ``parent`` (Linux /proc)."""
    found = []
    for name in os.listdir("/proc") if os.path.isdir("/proc") else ():
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat") as handle:
                fields = handle.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        # fields[0] is the state (3rd field of stat), fields[1] the parent, fields[-1] the exit status
        if len(fields) > 40 and fields[0] == "Z" and int(fields[1]) == parent:
            found.append((int(name), int(fields[-1])))
    return found


def _drop_job_messages(record: logging.LogRecord) -> bool:
    return False


def _read(path: str) -> str:
    with open(path, errors="replace") as handle:
        return handle.read()


def _usable_cores() -> int:
    from pipelines.parallelism import _usable_cores as cores

    return cores()


def local_engine(beam_args: list[str]) -> LocalEngine | None:
    """The engine that runs ``beam_args``' runner here, fetched if need be; None for a runner that is
    not one of :data:`ENGINES`, or when ``--job_endpoint`` names an engine the user runs."""
    from pipelines.parallelism import RunnerSetup

    engine = ENGINES.get(RunnerSetup.from_beam_args(beam_args).runner)
    if engine is None or any(a.split("=", 1)[0] == "--job_endpoint" for a in beam_args):
        return None
    if engine.name == "prism" and any(a.split("=", 1)[0] == "--prism_location" for a in beam_args):
        return LocalEngine(engine, beam_args, "")
    return LocalEngine(engine, beam_args, fetch(engine.name))


def main(argv: list[str] | None = None) -> int:
    """``python -m pipelines.engines fetch prism|flink|spark ...``: fill the cache (CI warms it so)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    names = argv[1:] or list(_BY_NAME)
    if not argv or argv[0] != "fetch" or any(name not in _BY_NAME for name in names):
        print(f"usage: python -m pipelines.engines fetch [{'|'.join(_BY_NAME)} ...]", file=sys.stderr)
        return 2
    for name in names:
        try:
            print(fetch(name))
        except ConfigError as exc:
            print(f"lmshards engines: error: {exc}", file=sys.stderr)
            return exc.exit_code
    return 0


if __name__ == "__main__":
    sys.exit(main())
