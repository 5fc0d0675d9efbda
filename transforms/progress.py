"""Progress of a run as its user sees it: input bytes read, documents and tokens, stages.

One :class:`Progress` per process (:data:`PROGRESS`), fed by the stages that run there: the
reader adds the bytes of each read task as it finishes it, Tokenize its documents and
tokens, and a later stage announces itself once when it starts. An in-process runner runs
every stage in the process that planned the run, so its progress covers the whole input: a
bar on a terminal (tqdm: percent of the input bytes, tokens/s, ETA), else a line every
``seconds``. Nothing is shown before ``seconds`` have passed: a short run stays quiet. A
worker process of a multi-process or Dataflow runner reports only its own
share, in lines naming its pid (it does not know the total).

Wall-clock time only decides when something is shown, never what a dataset holds.
"""

from __future__ import annotations

import os
import sys
import threading
import time

__all__ = ["PROGRESS", "Progress"]


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

    def add_bytes(self, count: int) -> None:
        """A read task of ``count`` input bytes is done."""
        with self._lock:
            self.bytes += count
            if self._bar is not None:
                self._bar.update(count)
            self._maybe_print()

    def add(self, documents: int, tokens: int) -> None:
        """Tokenize emitted ``documents`` documents of ``tokens`` tokens."""
        with self._lock:
            self.documents += documents
            self.tokens += tokens
            if self._bar is not None:
                self._bar.set_postfix_str(f"{self.tokens / max(time.monotonic() - self._start, 1e-9):,.0f} tokens/s",
                                          refresh=False)
            self._maybe_print()

    def stage(self, name: str) -> None:
        """A later stage starts in this process (announced once per run)."""
        with self._lock:
            if name in self.stages or not self.seconds:
                return
            self.stages.append(name)
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
        if self._bar is not None or not self.seconds:
            return
        now = time.monotonic()
        if now - self._last >= self.seconds:
            self._last, self._shown = now, True
            print(self._line(), file=self.stream, flush=True)


#: This process's progress (a worker process configures its own when its first stage starts).
PROGRESS = Progress()
