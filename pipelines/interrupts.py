"""Ctrl-C during a materialize run: one line, exit 130, whichever runner and wherever it lands.

A SIGINT raises ``KeyboardInterrupt`` in the main thread wherever it is, and Beam does not
always let it through as it is: inside a DoFn's ``setup`` or ``process`` the in-process runner
re-raises it as ``RuntimeError: KeyboardInterrupt [while running ...]``, and the runner's own
clean-up may fail on the way out. So :func:`interruptible` records that the run was
interrupted (its SIGINT handler sets :attr:`Interrupt.interrupted`, then raises as Python's
does), and the run reports any failure that follows as the interrupt it is.

With Beam's local worker processes (``--direct_running_mode=multi_processing``) the runner,
once interrupted, waits for its worker processes to end, and a worker that is not interrupted
too (a ``kill -INT`` of lmshards' pid, not a terminal's Ctrl-C of the whole process group)
waits for instructions for ever: the handler also ends this process's SDK worker processes
(SIGTERM; found by their command line among its descendants in ``/proc``). While the run is
interrupted, exceptions of Beam's threads (a worker thread that sees its worker gone) are not
printed.

Only the standard library's public APIs are used (``signal``, ``threading.excepthook``); a
handler is installed only in the main thread, and only where SIGINT has Python's default one.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading

__all__ = ["Interrupt", "interruptible", "quiet_exit_on_interrupt"]

_SDK_WORKER = b"apache_beam.runners.worker.sdk_worker_main"


class Interrupt:
    """Whether the run was interrupted (a SIGINT arrived while it ran)."""

    interrupted = False


def _descendants(pid: int) -> list[int]:
    parents: dict[int, int] = {}
    for name in os.listdir("/proc") if os.path.isdir("/proc") else ():
        if name.isdigit():
            try:
                with open(f"/proc/{name}/stat", "rb") as handle:
                    parents[int(name)] = int(handle.read().rsplit(b")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
    found, frontier = [], [pid]
    while frontier:
        parent = frontier.pop()
        children = [child for child, ppid in parents.items() if ppid == parent]
        found += children
        frontier += children
    return found


def _stop_sdk_workers() -> None:
    """SIGTERM to this process's Beam SDK worker processes (and the shells that started them)."""
    for pid in _descendants(os.getpid()):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as handle:
                command = handle.read()
        except OSError:
            continue
        if _SDK_WORKER in command:
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGTERM)


@contextlib.contextmanager
def interruptible(local_workers: bool):
    """Around a run: a SIGINT marks the :class:`Interrupt` yielded, ends the local SDK worker
    processes (``local_workers``) and raises ``KeyboardInterrupt``; Beam's threads print no
    exception while the run is interrupted."""
    state = Interrupt()
    in_main = threading.current_thread() is threading.main_thread()
    previous = signal.getsignal(signal.SIGINT) if in_main else None
    if previous is not signal.default_int_handler:
        yield state
        return

    def on_sigint(signum, frame):
        state.interrupted = True
        if local_workers:
            threading.Thread(target=_stop_sdk_workers, name="lmshards-stop-workers", daemon=True).start()
        raise KeyboardInterrupt

    hook = threading.excepthook

    def quiet_when_interrupted(args):
        if not state.interrupted:
            hook(args)

    signal.signal(signal.SIGINT, on_sigint)
    threading.excepthook = quiet_when_interrupted
    try:
        yield state
    finally:
        signal.signal(signal.SIGINT, previous)
        # Beam's threads may still see their workers end after the run returned.
        threading.excepthook = quiet_when_interrupted if state.interrupted else hook


def quiet_exit_on_interrupt() -> None:
    """After a command has reported its outcome: a SIGINT while the interpreter winds down (its
    threads joined, its modules torn down) ends the process with status 130 at once, instead of
    a traceback from whatever it was doing."""
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGINT, lambda signum, frame: os._exit(130))
