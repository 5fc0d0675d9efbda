"""How a failed materialize pipeline is reported: one line for lmshards' own errors, a traceback for a bug.

The job's own checks (too many rejected records, counts that do not add up, an empty split,
an input that changed, a lost lock, a file that cannot be written) and every other error of
lmshards' hierarchy (:mod:`schemas.errors`) fail inside a DoFn. The user gets one line
(:func:`job_error`), with the exit status of the error's class; an I/O error (``OSError``) is
one line too, exit status 1. Any other exception is a bug: it is raised as it is, and the CLI
prints its traceback (exit status 3, :func:`pipelines.terminal.report_failure`).

What Beam lacks, so that this module parses text: the in-process runner re-raises the DoFn's
exception as a copy of its class with the step named (``... [while running 'Step']``), and
where that copy cannot be made, as a ``RuntimeError`` whose message is ``<ClassName>:
<message>``; the portable runners (``--direct_running_mode=multi_processing``, Dataflow) report
a DoFn's failure as a ``RuntimeError`` whose message holds the worker's traceback as text: the
exception's type is lost at the process boundary, and Beam offers no structured error. So the
last line of that text that starts ``<ClassName>: `` names the error that ended the work (the
lines of a traceback's frames are indented, and each error's message is one line); its class is
looked up among lmshards' errors by name, and Beam's ``[while running ...]`` suffix is dropped.
An error of the hierarchy found only in the context of another exception (a bug raised while
one was handled) does not count: the bug is what stopped the run.

While the pipeline runs, Beam logs every failed bundle with its traceback (several loggers, one
per runner layer) before it raises. :func:`quiet_beam` keeps those logs out through logger
levels only (Beam's public logging configuration): ``apache_beam`` and the job service's relay
of its workers' logs are raised to CRITICAL for the run, unless ``--verbose``. Nothing is
lost: the error that stops the run is what main prints, with its traceback when it is not one
of the job's own checks.

What logger levels cannot reach: Beam's SDK worker prints each failed bundle's traceback to its
process's stderr (``print(..., file=sys.stderr)``, before it reports the failure), and a worker
process of ``--direct_running_mode=multi_processing`` shares lmshards' stderr; a Rust panic of a
tokenizer is printed by Rust's panic hook straight to file descriptor 2. So the CLI runs a job
under :func:`hidden_stderr`: file descriptor 2, which the worker processes inherit and native code
writes to, is a log file of the run while ``sys.stderr`` (everything lmshards and Python print:
progress, warnings, errors) keeps the terminal. The log is removed when the job ends; a process
that dies of a signal leaves it in the temporary directory (``lmshards-stderr-*.log``), with what
the interpreter printed as it died. ``--verbose`` keeps everything on the terminal.
"""

from __future__ import annotations

import contextlib
import logging
import re

from pipelines.beam_logging import WORKER_RELAY_LOGGER
from pipelines.terminal import hidden_stderr
from schemas.errors import JobFailedError, LmshardsError

# Imported for the classes they define: the errors workers raise, found by name in a portable
# runner's text (:func:`_own_classes`).
from transforms.reading.inputs import InputChangedError  # noqa: F401
from transforms.writing.accounting import EmptySplitError, RejectedFractionError  # noqa: F401
from transforms.writing.output import LockLostError  # noqa: F401
from transforms.writing.write import ShardRowsError  # noqa: F401

__all__ = ["hidden_stderr", "job_error", "quiet_beam"]

_BEAM_SUFFIX = re.compile(r"\s*\[while running [^\]]*\]\s*$")
#: A line of a traceback's text that names an exception: ``package.module.ClassName: message``.
_ERROR_LINE = re.compile(r"^(?:[A-Za-z_]\w*\.)*([A-Za-z_]\w*): (.*)$", re.MULTILINE)


def job_error(exc: BaseException) -> tuple[BaseException, bool]:
    """``(the error a failed pipeline is reported as, whether it is not one of lmshards' errors)``:
    lmshards' own error (its class kept) or an I/O error (a :class:`JobFailedError`) in one line,
    its message without Beam's step suffix; any other exception (a bug) as it is, or, where a
    portable runner gave only its text, as a ``RuntimeError`` naming its type and message."""
    if not isinstance(exc, Exception):
        return exc, False  # KeyboardInterrupt, SystemExit
    seen: BaseException | None = exc
    while seen is not None:  # Beam's errors name the DoFn's as their cause, or hold its text
        if isinstance(seen, LmshardsError):
            return type(seen)(_one_line(str(seen))), False
        if isinstance(seen, OSError):
            return JobFailedError(_one_line(str(seen))), False
        named = _ERROR_LINE.findall(str(seen))
        if named:
            name, message = named[-1]
            own = _own_classes().get(name)
            if own is not None:
                return own(_one_line(message)), False
            if name in _io_error_names():
                return JobFailedError(_one_line(message)), False
            if "\n" in str(seen).strip():  # a worker's traceback as text: name the bug's type and message
                return RuntimeError(f"{name}: {_one_line(message)}"), True
            return exc, True
        seen = seen.__cause__
    return exc, True


def _one_line(message: str) -> str:
    lines = message.strip().splitlines()
    return _BEAM_SUFFIX.sub("", lines[0]) if lines else ""


def _subclasses(cls: type) -> dict[str, type]:
    found = {}
    for sub in cls.__subclasses__():
        found[sub.__name__] = sub
        found.update(_subclasses(sub))
    return found


def _own_classes() -> dict[str, type[LmshardsError]]:
    """lmshards' error classes defined so far, by name (the base class included)."""
    return {"LmshardsError": LmshardsError, **_subclasses(LmshardsError)}


def _io_error_names() -> set[str]:
    return {"OSError", "IOError", *_subclasses(OSError)}


@contextlib.contextmanager
def quiet_beam(verbose: bool):
    """While the pipeline runs, Beam's own error logs stay unseen unless ``verbose``: the error
    that ends the run is reported once, by main."""
    if verbose:
        yield
        return
    loggers = [logging.getLogger(name) for name in ("apache_beam", WORKER_RELAY_LOGGER)]
    levels = [logger.level for logger in loggers]
    for logger in loggers:
        logger.setLevel(logging.CRITICAL)
    try:
        yield
    finally:
        for logger, level in zip(loggers, levels):
            logger.setLevel(level)


