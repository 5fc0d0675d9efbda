"""How a failed materialize pipeline is reported: one line for the failures the job checks itself.

The job's own checks (too many rejected records, counts that do not add up, an empty split,
an input that changed, a lost lock, a file that cannot be written) fail inside a DoFn. The
user gets one line (:func:`job_error`) and exit status 1; any other failure is reported as
``the pipeline failed: <type>: <first line>`` with the runner's error chained, so its
traceback is printed too (:func:`pipelines.materialize.main`).

What Beam lacks, so that this module parses text: the in-process runner re-raises the DoFn's
exception (chained, so :func:`job_error` finds it by type), but the portable runners
(``--direct_running_mode=multi_processing``, Dataflow) report a DoFn's failure as a
``RuntimeError`` whose message holds the worker's traceback as text: the exception's type is
lost at the process boundary, and Beam offers no structured error. So the message is searched
for ``<ClassName>: <the start of its message>``; each check's message starts with a fixed
prefix (the flag it names), which keeps the search from matching anything else, and Beam's
``[while running ...]`` suffix is dropped.

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
from schemas.errors import JobFailedError
from transforms.reading.inputs import InputChangedError
from transforms.writing.accounting import EmptySplitError, RejectedFractionError, UnreconciledCountsError
from transforms.writing.output import LockLostError

__all__ = ["hidden_stderr", "job_error", "quiet_beam"]

#: The job's own checks: ``(error type, the fixed start of its message)``, most specific first.
_CHECKS = (
    (RejectedFractionError, "--max-rejected-fraction "),
    (UnreconciledCountsError, ""),
    (EmptySplitError, "split "),
    (InputChangedError, "--input "),
    (LockLostError, "--output "),
    (OSError, "[Errno "),
)

_BEAM_SUFFIX = re.compile(r"\s*\[while running [^\]]*\]\s*$")


def job_error(exc: BaseException) -> tuple[BaseException, bool]:
    """``(the error a failed pipeline is reported as, whether it chains exc)``: one line, with no
    chained traceback, for the failures the job checks itself."""
    if not isinstance(exc, Exception):
        return exc, False  # KeyboardInterrupt, SystemExit
    for error_type, start in _CHECKS:
        message = _check_message(exc, error_type, start)
        if message is not None:
            if error_type is RejectedFractionError:
                return RejectedFractionError(message), False
            return JobFailedError(message), False
    first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
    return JobFailedError(f"the pipeline failed: {type(exc).__name__}: {first}"), True


def _check_message(exc: BaseException, error_type: type[BaseException], start: str) -> str | None:
    """The one-line message of an ``error_type`` behind a failed pipeline: found by type in the
    exception's chain, else in the text of a portable runner's error (see the module docstring)."""
    seen = exc
    while seen is not None:
        if isinstance(seen, error_type):
            return _BEAM_SUFFIX.sub("", str(seen).splitlines()[0])
        seen = seen.__cause__ or seen.__context__
    found = re.search(rf"{error_type.__name__}: ({re.escape(start)}[^\n]*)", str(exc))
    return _BEAM_SUFFIX.sub("", found.group(1)) if found else None


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


