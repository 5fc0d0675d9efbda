"""The terminal of the command line, with no Beam import (the CLI uses it before Beam is imported).

:func:`report_failure`: how every command ends in an error, in one place. lmshards' own errors
(:mod:`schemas.errors`: bad input, a damaged dataset, a job that failed) and I/O errors are one
line with the exit status of their class; any other exception is a bug, printed with its
traceback, exit status 3 (:data:`schemas.errors.INTERNAL_ERROR`).

:func:`hidden_stderr`: while a run goes, file descriptor 2 (which worker processes inherit and
native code writes to) goes to a log of the run, and Python's ``sys.stderr`` keeps the
terminal, so that what a worker prints before it dies never buries lmshards' one-line error
(``--verbose`` leaves it as it is).
"""

from __future__ import annotations

import contextlib
import io
import os
import sys
import tempfile
import traceback

from schemas.errors import INTERNAL_ERROR, exit_code
from schemas.names import shown_name

__all__ = ["hidden_stderr", "report_failure"]


def report_failure(command: str, error: BaseException, line: str | None = None, *,
                   bug: str = "a bug in lmshards, not bad input") -> int:
    """Say on ``sys.stderr`` why ``lmshards <command>`` ended in ``error``; return its exit status
    (:func:`schemas.errors.exit_code`).

    - lmshards' errors and I/O errors (``OSError``: a missing file, a permission): one line,
      ``lmshards <command>: error: <line>`` (``line``: the error's message, names in it escaped),
      no traceback;
    - any other exception is a bug, in lmshards or in code it runs (an objective's hook): a line
      ``lmshards <command>: internal error: <type>: <first line of its message> (<bug>); traceback:``,
      then its traceback (its causes included), exit status :data:`~schemas.errors.INTERNAL_ERROR`.
    """
    code = exit_code(error)
    if code != INTERNAL_ERROR:
        print(f"lmshards {command}: error: {shown_name(error) if line is None else line}", file=sys.stderr)
        return code
    text = str(error).strip()
    first = f": {shown_name(text.splitlines()[0])}" if text else ""
    print(f"lmshards {command}: internal error: {type(error).__name__}{first} ({bug}); traceback:", file=sys.stderr)
    traceback.print_exception(error, file=sys.stderr)
    return code


@contextlib.contextmanager
def hidden_stderr(verbose: bool):
    """File descriptor 2 to a log of the run while ``sys.stderr`` stays the terminal (see the
    module docstring); nothing changes when ``verbose``, or where ``sys.stderr`` is not file
    descriptor 2 (a test's capture, an embedding application's stream)."""
    try:
        is_fd2 = sys.stderr is not None and sys.stderr.fileno() == 2
    except (AttributeError, OSError, ValueError, io.UnsupportedOperation):
        is_fd2 = False
    if verbose or not is_fd2:
        yield
        return
    original = sys.stderr
    original.flush()
    log_fd, log_path = tempfile.mkstemp(prefix="lmshards-stderr-", suffix=".log")
    terminal = os.dup(2)
    os.dup2(log_fd, 2)
    os.close(log_fd)
    sys.stderr = io.TextIOWrapper(io.FileIO(terminal, "w", closefd=False), encoding=original.encoding,
                                  errors=original.errors, line_buffering=True, write_through=True)
    try:
        yield
    finally:
        sys.stderr.flush()
        sys.stderr = original
        os.dup2(terminal, 2)
        os.close(terminal)
        with contextlib.suppress(OSError):
            os.unlink(log_path)

