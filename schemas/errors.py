"""The errors lmshards raises on purpose, in one hierarchy.

Every one carries the exit status the command line gives it (:attr:`LmshardsError.exit_code`),
so the CLI maps errors to exit codes in one place (:func:`exit_code`), and every message is
one line naming the flag, file or value at fault. Errors that also subclass a builtin
(``ValueError``, ``RuntimeError``) do so for callers that caught the builtin before.

A user's bad input (a flag, a ``--config`` file, a tokenizer or corpus file, a loader state)
and a damaged dataset raise these classes; a plain ``ValueError`` is left for a Python caller
that passed a bad argument to one of lmshards' functions, and any other exception (a
``ValueError``, ``TypeError`` or ``KeyError`` of lmshards' own code included) is a bug, which the
CLI prints with its traceback (exit :data:`INTERNAL_ERROR`). I/O errors (``OSError``: a missing
file, a permission) are the user's to fix and stay one line.

- :class:`ConfigError` (exit 2): a configuration or usage error, found before any work.
- :class:`JobFailedError` (exit 1): the job ran and failed (a check of its own results, an
  input that changed, a lost lock); it wrote no manifest.
- :class:`DatasetError` (exit 1): a dataset that cannot be used (damaged, incomplete, a schema
  a reader cannot handle); :class:`ShardIntegrityError` names the file.
"""

from __future__ import annotations

__all__ = ["INTERNAL_ERROR", "ConfigError", "DatasetError", "JobFailedError", "LmshardsError", "ShardIntegrityError",
           "UnsupportedSchemaError", "exit_code"]

#: Exit status of an exception outside this hierarchy and I/O errors: a bug, which the CLI prints
#: with its traceback.
INTERNAL_ERROR = 3


class LmshardsError(Exception):
    """Base of the errors lmshards raises on purpose."""

    exit_code = 1


class ConfigError(LmshardsError, ValueError):
    """A configuration or usage error, found before any work (exit 2)."""

    exit_code = 2


class JobFailedError(LmshardsError, RuntimeError):
    """The job ran and failed; it wrote no manifest (exit 1)."""


class DatasetError(LmshardsError, ValueError):
    """A dataset, or a part of it, that cannot be used (exit 1)."""


class ShardIntegrityError(DatasetError):
    """A shard or manifest does not match what it must be: size, sha256, schema, row count, a path."""


class UnsupportedSchemaError(DatasetError):
    """Examples whose columns a dataset mode or a collator cannot handle."""


def exit_code(error: BaseException) -> int:
    """The exit status of a command that ended in ``error``: the error's own for lmshards'
    errors, 1 for an I/O error (``OSError``), else :data:`INTERNAL_ERROR` (a bug: a plain
    ``ValueError`` too)."""
    if isinstance(error, LmshardsError):
        return error.exit_code
    return 1 if isinstance(error, OSError) else INTERNAL_ERROR
