"""Progress of a run as its user sees it: input bytes read, documents and tokens, stages.

One :class:`Progress` per process (:data:`PROGRESS`), fed by the stages that run there: the
reader adds the bytes of each read task as it finishes it, Tokenize its documents and
tokens, and a later stage announces itself once when it starts. An in-process runner runs
every stage in the process that planned the run, so its progress covers the whole input: a
bar on a terminal (tqdm: percent of the input bytes, tokens/s, ETA), else a line every
``seconds``. Nothing is shown before ``seconds`` have passed: a short run stays quiet. A
worker process of a multi-process or Dataflow runner reports only its own
share, in lines naming its pid (it does not know the total).

**Local worker processes report to the run.** A run on local worker processes (Beam's
``--direct_running_mode=multi_processing``, Prism, Flink, Spark: every process on this machine)
shows the same progress as an in-process run: the process that planned it makes a report
directory (:class:`ProgressRelay`) and names it in the environment (:data:`REPORT_DIR_ENV`),
which every worker process inherits; a worker then writes its counters there (a small JSON file
per process, replaced atomically at most every :data:`REPORT_SECONDS`, and at once when a stage
starts), and the relay thread of the planning process sums the files into its own
:class:`Progress`, which prints the lines or the bar as in-process. A worker reporting to a
directory prints nothing itself. The directory is the run's alone (a temporary directory, not
the output) and is removed when the run ends.

Wall-clock time only decides when something is shown, never what a dataset holds.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import tempfile
import threading
import time

__all__ = ["PROGRESS", "REPORT_DIR_ENV", "REPORT_SECONDS", "Progress", "ProgressRelay"]

#: The environment variable naming the run's report directory (set while a run goes on).
REPORT_DIR_ENV = "LMSHARDS_PROGRESS_DIR"
#: How often a worker process rewrites its report file (at most).
REPORT_SECONDS = 0.5
_REPORT_MAX_BYTES = 1 << 16


def _size(count: float) -> str:
    for unit, scale in (("GB", 2**30), ("MB", 2**20), ("kB", 2**10)):
        if count >= scale:
            return f"{count / scale:,.1f} {unit}"
    return f"{count:,.0f} B"


class Progress:
    """What one process has read and tokenized (see the module docstring)."""

    def __init__(self, stream=None):
        self._lock = threading.Lock()
        self._stream = stream
        self._joined = False  # a worker process counts for a run
        self.configure(0, 10.0, owner=False)

    def configure(self, total_bytes: int, seconds: float, *, owner: bool = True, bar: bool | None = None) -> None:
        """Start counting for a run.

        Args:
            total_bytes: bytes of every input file (0: unknown, as in a worker process).
            seconds: how often a line is printed (0: never; no bar either).
            owner: this process planned the run (the totals are the whole run's).
            bar: draw a tqdm bar (default: when the stream is a terminal and tqdm imports).
        """
        with self._lock:
            self.total_bytes, self.seconds, self.owner = total_bytes, seconds, owner
            self.bytes = self.documents = self.tokens = 0
            self.stages: list[str] = []
            self._report_dir: str | None = None  # a worker's: where it reports (the run's relay reads it)
            self._reported = 0.0
            self._start = self._last = time.monotonic()
            self._shown = False  # a line or the bar has been shown
            self._bar = None
            stream = self.stream
            if bar is None:
                bar = owner and bool(seconds) and hasattr(stream, "isatty") and stream.isatty()
            if bar:
                try:
                    from tqdm import tqdm

                    self._bar = tqdm(total=total_bytes or None, unit="B", unit_scale=True, unit_divisor=1024,
                                     desc="lmshards: reading", file=stream, dynamic_ncols=True, leave=True,
                                     delay=seconds)
                except ImportError:  # an install without tqdm: lines instead
                    self._bar = None

    @property
    def stream(self):
        return self._stream if self._stream is not None else sys.stderr

    def join_run(self, seconds: float) -> None:
        """In a worker process (not the one that planned the run): count for the run, once; a
        worker of a run with a report directory (:data:`REPORT_DIR_ENV`) reports there."""
        with self._lock:
            if self.owner:
                return
            directory = os.environ.get(REPORT_DIR_ENV) or None
            if directory is not None and directory == self._report_dir:
                return  # joined already: another DoFn instance of the same run
        if directory is None and getattr(self, "_joined", False):
            return
        self.configure(0, seconds, owner=False)
        with self._lock:
            self._report_dir = directory
            self._joined = True

    def _worker_joins(self) -> None:
        """A worker's first count of a run with a report directory joins it (before any DoFn set it up)."""
        directory = os.environ.get(REPORT_DIR_ENV)
        if not self.owner and directory and directory != self._report_dir:
            self.join_run(self.seconds)

    def add_bytes(self, count: int) -> None:
        """A read task of ``count`` input bytes is done."""
        self._worker_joins()
        with self._lock:
            self.bytes += count
            if self._bar is not None:
                self._bar.update(count)
            self._maybe_print()

    def add(self, documents: int, tokens: int) -> None:
        """Tokenize emitted ``documents`` documents of ``tokens`` tokens."""
        self._worker_joins()
        with self._lock:
            self.documents += documents
            self.tokens += tokens
            if self._bar is not None:
                self._bar.set_postfix_str(f"{self.tokens / max(time.monotonic() - self._start, 1e-9):,.0f} tokens/s",
                                          refresh=False)
            self._maybe_print()

    def stage(self, name: str) -> None:
        """A later stage starts in this process (announced once per run)."""
        self._worker_joins()
        with self._lock:
            if name in self.stages or not self.seconds:
                return
            self.stages.append(name)
            if self._report_dir is not None:
                self._report(force=True)
                return
            if self._bar is not None:
                self._shown = self._shown or bool(self._bar.n and time.monotonic() - self._start >= self.seconds)
                self._bar.close()
                self._bar = None
            if not self._shown and time.monotonic() - self._start < self.seconds:
                return  # a short run: nothing shown so far, nothing now
            self._shown = True
            if self.documents and len(self.stages) == 1:
                print(self._line(final=True), file=self.stream, flush=True)
            print(f"lmshards: {name}{'' if self.owner else f' (pid {os.getpid()})'}", file=self.stream, flush=True)

    def set_totals(self, read_bytes: int, documents: int, tokens: int) -> None:
        """The whole run's counts so far, as the relay sums them from the workers' reports."""
        with self._lock:
            if (read_bytes, documents, tokens) == (self.bytes, self.documents, self.tokens):
                return  # nothing new: as in-process, a line follows what the run did
            if self._bar is not None and read_bytes > self.bytes:
                self._bar.update(read_bytes - self.bytes)
            self.bytes, self.documents, self.tokens = max(self.bytes, read_bytes), documents, tokens
            if self._bar is not None:
                self._bar.set_postfix_str(f"{self.tokens / max(time.monotonic() - self._start, 1e-9):,.0f} tokens/s",
                                          refresh=False)
            self._maybe_print()

    def report_now(self) -> None:
        """A worker process writes its counts to its report at once (at the end of a bundle);
        nothing elsewhere."""
        with self._lock:
            if self._report_dir is not None:
                self._report(force=True)

    def _report(self, force: bool = False) -> None:
        """A worker's counts to its file in the report directory (see the module docstring)."""
        now = time.monotonic()
        if not force and now - self._reported < REPORT_SECONDS:
            return
        self._reported = now
        path = os.path.join(self._report_dir, f"{os.getpid()}.json")
        data = json.dumps({"bytes": self.bytes, "documents": self.documents, "tokens": self.tokens,
                           "stages": self.stages})
        try:
            with open(f"{path}.{threading.get_ident()}.tmp", "w", encoding="utf-8") as handle:
                handle.write(data)
            os.replace(f"{path}.{threading.get_ident()}.tmp", path)
        except OSError:
            pass  # the run is over (its directory is gone): nothing to report to

    def close(self) -> None:
        """The run is over: close the bar (the process no longer owns a run)."""
        with self._lock:
            if self._bar is not None:
                self._bar.close()
                self._bar = None
            self.owner = False

    def _line(self, final: bool = False) -> str:
        elapsed = max(time.monotonic() - self._start, 1e-9)
        rate = self.tokens / elapsed
        read, eta = _size(self.bytes), ""
        if self.owner and self.total_bytes:
            share = self.bytes / self.total_bytes
            read = f"{share:.0%} of {_size(self.total_bytes)}"
            if 0 < share < 1 and not final:
                left = elapsed * (1 - share) / share
                eta = f", ETA {int(left // 3600)}:{int(left % 3600 // 60):02d}:{int(left % 60):02d}"
        who = "" if self.owner else f" (pid {os.getpid()})"
        verb = "tokenized" if final else "reading"
        return (f"lmshards: {verb}: {read} read, {self.documents:,} documents, {self.tokens:,} tokens, "
                f"{rate:,.0f} tokens/s{eta}{who}")

    def _maybe_print(self) -> None:
        if self._report_dir is not None:
            self._report()
            return
        if self._bar is not None or not self.seconds:
            return
        now = time.monotonic()
        if now - self._last >= self.seconds:
            self._last, self._shown = now, True
            print(self._line(), file=self.stream, flush=True)


class ProgressRelay:
    """The planning process's side of a run on local workers (see the module docstring): a
    report directory named in the environment while the run goes on, and a thread that feeds
    the workers' sums into ``progress``.

    Use as a context manager around the pipeline's run; it restores the environment and
    removes the directory when it ends.
    """

    def __init__(self, progress: Progress, seconds: float):
        self._progress = progress
        self._interval = min(max(seconds, 0.05), REPORT_SECONDS) if seconds else 0.0
        self._stop = threading.Event()
        self.directory: str | None = None

    def __enter__(self) -> ProgressRelay:
        if not self._interval:
            return self
        self.directory = tempfile.mkdtemp(prefix="lmshards-progress-")
        self._previous = os.environ.get(REPORT_DIR_ENV)
        os.environ[REPORT_DIR_ENV] = self.directory
        self._thread = threading.Thread(target=self._relay, name="lmshards-progress-relay", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        if self.directory is None:
            return
        self._stop.set()
        self._thread.join()
        self.poll()
        if self._previous is None:
            os.environ.pop(REPORT_DIR_ENV, None)
        else:
            os.environ[REPORT_DIR_ENV] = self._previous
        shutil.rmtree(self.directory, ignore_errors=True)

    def _relay(self) -> None:
        while not self._stop.wait(self._interval):
            self.poll()

    def poll(self) -> None:
        """Sum the workers' reports into the progress (stages announced in the order first seen)."""
        totals, stages = [0, 0, 0], []
        try:
            names = sorted(n for n in os.listdir(self.directory) if n.endswith(".json"))
        except OSError:
            return
        for name in names:
            try:
                with open(os.path.join(self.directory, name), encoding="utf-8") as handle:
                    report = json.loads(handle.read(_REPORT_MAX_BYTES))
                counts = [int(report.get(key, 0)) for key in ("bytes", "documents", "tokens")]
                named = [str(stage) for stage in report.get("stages", [])]
            except (OSError, ValueError, TypeError, AttributeError):
                continue  # being replaced, or not a report
            totals = [total + count for total, count in zip(totals, counts)]
            stages += [stage for stage in named if stage not in stages]
        self._progress.set_totals(*totals)
        for stage in stages:
            self._progress.stage(stage)


#: This process's progress (a worker process configures its own when its first stage starts).
PROGRESS = Progress()
