"""The terminal of the command line, with no Beam import (the CLI uses it before Beam is imported).

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

__all__ = ["hidden_stderr"]


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

