"""One run on a local engine (:mod:`pipelines.engines`): its Beam flags and its processes.

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

The job server's four ports are chosen together (distinct), and a Flink or Spark job server
that exits at startup, as one does when another process took one of its ports meanwhile, is
started once more on fresh ports (:meth:`LocalEngine._wait_for_job_server`).

An SDK worker that dies (killed, out of memory) ends the run in one line naming it: a watchdog
thread sees the pool's child exit (a stop's SIGTERM aside) and cancels the job through Beam's
job API. Without it Flink waited for ever for a worker killed before it connected, and Prism a
minute; a worker killed later failed the job with a gRPC ``CANCELLED`` that did not say why.
A job that fails on the engine is one line too (the first line of the engine's error) naming
the folder of the engine's logs, which is kept; after a run that succeeded, or one that failed
one of the job's own checks (its line says what to fix), it is removed. A bug in the workers'
Python code (an exception outside lmshards' hierarchy) is a traceback, as in-process
(:meth:`LocalEngine.job_error`).
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import shutil
import signal
import site
import socket
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass

import pipelines
from pipelines.engines import ENGINES, Engine, fetch, last_error_line
from pipelines.failures import job_error
from pipelines.parallelism import RunnerSetup, usable_cores
from schemas.errors import ConfigError, JobFailedError

__all__ = ["EngineStartError", "LocalEngine", "local_engine"]

_STARTUP_SECONDS = 180
#: How a worker's Python traceback starts in the text of a job the engine failed.
_PYTHON_TRACEBACK = "Traceback (most recent call last):"
#: A frame of lmshards' own packages in that traceback (a checkout's or an installed wheel's path).
_OUR_FRAME = re.compile(r'File "[^"\n]*[/\\](?:pipelines|transforms|loaders|schemas)[/\\][^"\n]*\.py", line')
_CANCEL_SECONDS = 30
#: How long Flink and Spark keep an idle SDK worker for the next stage (the run ends them all).
_ENVIRONMENT_CACHE_MILLIS = 3_600_000


class EngineStartError(JobFailedError):
    """An engine's job server or worker pool did not start (exit 1; its log is named)."""


def _free_ports(count: int) -> list[int]:
    """``count`` distinct ports free now: bound together, so that the kernel cannot hand out one
    twice (a job server given the same port for two of its services exits at startup)."""
    with contextlib.ExitStack() as stack:
        sockets = [stack.enter_context(socket.socket()) for _ in range(count)]
        for sock in sockets:
            sock.bind(("localhost", 0))
        return [sock.getsockname()[1] for sock in sockets]


def _listening(port: int) -> bool:
    with socket.socket() as sock:
        sock.settimeout(0.5)
        return sock.connect_ex(("localhost", port)) == 0


#: Run a command as a child that the kernel ends (SIGTERM) when this process dies, however it dies.
_ORPHAN_GUARD = ("import ctypes, os, sys\n"
                 "try:\n    ctypes.CDLL(None).prctl(1, 15)\n"  # PR_SET_PDEATHSIG (Linux only)
                 "except (AttributeError, OSError):\n    pass\n"
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

        def given(flag: str) -> bool:
            return any(a.split("=", 1)[0] == flag for a in beam_args)

        portable = options.view_as(PortableOptions)
        # the job server's job, artifact and expansion services and the worker pool: four distinct ports
        self._job_port, self._artifact_port, self._expansion_port, pool_port = _free_ports(4)
        self._pool_port = None
        added = [f"--job_endpoint=localhost:{self._job_port}"]
        if not portable.environment_type:
            self._pool_port = pool_port
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
            if not given("--flink_master"):
                self._master = "[local]"
            parallelism = options.view_as(FlinkRunnerOptions).parallelism
            if parallelism is None or parallelism < 1:
                parallelism = usable_cores()
                added.append(f"--parallelism={parallelism}")
            if not given("--sdk_worker_parallelism"):  # an SDK worker per task slot, not one shared by all
                added.append(f"--sdk_worker_parallelism={parallelism}")
        if engine.name == "spark":
            self._master = options.view_as(SparkRunnerOptions).spark_master_url
            if not given("--spark_master_url"):
                self._master = f"local[{usable_cores()}]"
            if not given("--sdk_worker_parallelism"):
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
                f"--artifact-port={self._artifact_port}", f"--expansion-port={self._expansion_port}",
                f"--artifacts-dir={artifacts}"]

    def _pool_command(self) -> list[str]:
        return [sys.executable, "-m", "apache_beam.runners.worker.worker_pool_main",
                f"--service_port={self._pool_port}"]

    def _worker_env(self) -> dict[str, str]:
        """The pool starts each SDK worker as ``python``: this interpreter, importing this lmshards."""
        env = dict(os.environ)
        env["PATH"] = os.pathsep.join([os.path.dirname(sys.executable), env.get("PATH", "")])
        root = os.path.dirname(os.path.dirname(os.path.abspath(pipelines.__file__)))
        if root not in {os.path.abspath(p) for p in site.getsitepackages()}:  # a checkout, not an install
            env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH")) if p)
        return env

    def _start(self, role: str, command: list[str], env: dict[str, str] | None = None) -> None:
        self._processes.append(self._launch(role, command, env))

    def _launch(self, role: str, command: list[str], env: dict[str, str] | None = None) -> _Process:
        log = os.path.join(self._logs, f"{role.replace(' ', '-')}.log")
        with open(log, "wb") as handle:
            popen = subprocess.Popen([sys.executable, "-c", _ORPHAN_GUARD, *command], stdin=subprocess.DEVNULL,
                                     stdout=handle, stderr=subprocess.STDOUT, env=env, start_new_session=True)
        return _Process(role, popen, log)

    def _wait_for_job_server(self) -> None:
        """Wait until the job server listens. One that exits at startup is started once more, its
        first log kept beside (``job-server.log.1``), on fresh ports for its artifact and expansion
        services: another process may have taken one since they were chosen, and Flink's and
        Spark's job servers then exit with status 0 without a word (their logger is a no-op)."""
        try:
            self._wait_until_listening(self._processes[0], self._job_port)
            return
        except EngineStartError:
            first = self._processes[0]
            if self.engine.name == "prism" or first.popen.poll() is None:
                raise  # Prism's own error is in its log; a server still running did not listen in time
        os.replace(first.log, first.log + ".1")
        taken = {self._job_port, self._pool_port}
        self._artifact_port, self._expansion_port = [p for p in _free_ports(4) if p not in taken][:2]
        self._processes[0] = self._launch("job server", self._job_server_command(os.path.join(self._logs, "artifacts")))
        self._wait_until_listening(self._processes[0], self._job_port)

    def _wait_until_listening(self, process: _Process, port: int) -> None:
        deadline = time.monotonic() + _STARTUP_SECONDS
        while not _listening(port):
            code = process.popen.poll()
            if code is not None:
                raise EngineStartError(f"--runner {self.engine.runner}: the {process.role} exited at startup "
                                       f"(status {code}): {last_error_line(_read(process.log))}; its log: "
                                       f"{process.log}")
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
                        time.sleep(0.5)  # for Beam's readers of the job's streams to see them end
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
        On a failure the engine's logs are kept (:meth:`job_error` names them, or removes them
        for a failure of the job's own checks), else (success, Ctrl-C) removed.
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
            self._wait_for_job_server()
            watchdog = threading.Thread(target=self._watch_workers, name="lmshards-engine-watchdog", daemon=True)
            watchdog.start()
            try:
                yield self
            except KeyboardInterrupt:  # reported without the logs: they go
                self._cancel_jobs()
                failed = False
                raise
            except BaseException:
                if self.worker_death is None:  # the engine may have failed the job before the watchdog looked
                    self._found_worker_death()
                # Ctrl-C or a failure here: the job ends first, so that Beam's wait for its messages
                # ends with the stream, not with a job server gone under it
                self._cancel_jobs()
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
        """Like :func:`pipelines.failures.job_error`, with the engine's logs named where they help.

        - A failure of the job's own checks (too many rejected records, an input that changed) or
          another error of lmshards' hierarchy is its one line, which names no logs: the logs are
          removed, as after a run that succeeded (the line says what to fix).
        - Any other exception raised in an SDK worker through lmshards' code (its DoFns, an
          objective plugin they call) is a bug, reported as in-process (a traceback, exit 3): the
          engine sends the worker's traceback as text, the last error line of which names the
          error (:func:`~pipelines.failures.job_error`); the error raised here names it and the
          engine's logs, which are kept, and has the engine's text as its cause.
        - A job the engine failed otherwise (its own error, or one of Beam's worker harness with
          no frame of lmshards' packages in its traceback) is one line naming the engine's logs,
          which are kept."""
        if isinstance(exc, EngineStartError):
            return exc, False
        if self.worker_death is not None and isinstance(exc, Exception):
            return JobFailedError(self._death_message()), False
        error, chained = job_error(exc)
        if not chained:
            if self._logs is not None:
                shutil.rmtree(self._logs, ignore_errors=True)
            return error, chained
        text = str(exc).strip()
        if error is not exc and _PYTHON_TRACEBACK in text and _OUR_FRAME.search(text):
            # an exception raised through lmshards' code in an SDK worker: a bug, with its traceback
            # (a failure of Beam's own harness, a gRPC error, has no frame of ours: the engine's line)
            return RuntimeError(f"{error} (on {self.engine.runner}; the engine's logs: {self._logs})"), True
        first = text.splitlines()[0] if text else type(exc).__name__
        return JobFailedError(f"the pipeline failed on {self.engine.runner}: {first[:500]}; "
                              f"the engine's logs: {self._logs}"), False


def local_engine(beam_args: list[str]) -> LocalEngine | None:
    """The engine that runs ``beam_args``' runner here, fetched if need be; None for a runner that is
    not one of :data:`~pipelines.engines.ENGINES`, or when ``--job_endpoint`` names an engine the user runs."""
    engine = ENGINES.get(RunnerSetup.from_beam_args(beam_args).runner)
    if engine is None or any(a.split("=", 1)[0] == "--job_endpoint" for a in beam_args):
        return None
    if engine.name == "prism" and any(a.split("=", 1)[0] == "--prism_location" for a in beam_args):
        return LocalEngine(engine, beam_args, "")
    return LocalEngine(engine, beam_args, fetch(engine.name))


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
