"""lmshards' one error hierarchy: each error's class decides the CLI's exit status, and the
modules that read what a user gives raise its classes, not plain ``ValueError``s."""

from __future__ import annotations

import ast

import pytest
from lmshards_testing import ROOT

from loaders.errors import ShardIntegrityError as LoaderShardIntegrityError
from schemas.errors import (
    INTERNAL_ERROR,
    ConfigError,
    DatasetError,
    JobFailedError,
    LmshardsError,
    ShardIntegrityError,
    exit_code,
)
from transforms.reading.inputs import InputChangedError
from transforms.tokenizing.encoder import EncoderUnavailable
from transforms.writing.accounting import EmptySplitError, RejectedFractionError, UnreconciledCountsError
from transforms.writing.output import LockLostError, OutputLockedError
from transforms.writing.write import ShardRowsError


@pytest.mark.parametrize(("error", "base", "code"), [
    (RejectedFractionError, JobFailedError, 1),
    (UnreconciledCountsError, JobFailedError, 1),
    (EmptySplitError, JobFailedError, 1),
    (InputChangedError, JobFailedError, 1),
    (LockLostError, JobFailedError, 1),
    (ShardRowsError, JobFailedError, 1),
    (OutputLockedError, ConfigError, 2),
    (ShardIntegrityError, DatasetError, 1),
    (EncoderUnavailable, LmshardsError, 1),
])
def test_every_error_has_its_place_and_exit_status(error, base, code):
    assert issubclass(error, base) and issubclass(error, LmshardsError)
    assert exit_code(error("one line")) == code


def test_job_failures_are_not_configuration_errors():
    """A job that failed is never taken for a bad value (the CLI does not depend on the order of
    its except clauses): no JobFailedError is a ValueError."""
    for error in (RejectedFractionError, EmptySplitError, UnreconciledCountsError, InputChangedError):
        assert not issubclass(error, ValueError)
    assert LoaderShardIntegrityError is ShardIntegrityError


def test_an_exception_outside_the_hierarchy_is_a_bug_and_an_io_error_is_the_user_s():
    """Only lmshards' own errors and I/O errors have a one-line exit status; a plain
    ``ValueError``, ``TypeError`` or ``KeyError`` raised by lmshards' code is a bug (3)."""
    assert INTERNAL_ERROR == 3
    for bug in (ValueError("seq_len must be > 0"), TypeError("unhashable type: 'list'"), KeyError("input_ids"),
                ZeroDivisionError("division by zero"), RuntimeError("the loader ended after 3 of 4 batches")):
        assert exit_code(bug) == INTERNAL_ERROR
    assert exit_code(ConfigError("--seq-len 0: must be > 0")) == 2
    assert exit_code(OSError("disk full")) == exit_code(PermissionError(13, "Permission denied")) == 1
    assert exit_code(FileNotFoundError(2, "No such file or directory")) == 1


#: Modules that read what a user gives: flags, ``--config`` files, tokenizer and corpus files, a
#: dataset's manifest, shards and tokenizer. A bad value there is a configuration error or a
#: damaged dataset (:mod:`schemas.errors`), never a plain ``ValueError`` (which the CLI takes for a
#: bug). Folders end with ``/``.
READS_USER_INPUT = ("pipelines/", "transforms/reading/", "transforms/tokenizing/", "transforms/building/",
                    "schemas/manifest.py", "loaders/access/", "loaders/inspection/")

#: The plain ``ValueError``s left there: each checks an argument a Python caller passes to
#: lmshards' API, which no flag or file sets.
API_ARGUMENT_CHECKS = {
    "schemas/manifest.py": 2,  # shard_name(fmt, index)
    "loaders/access/cache.py": 1,  # ShardCache(max_bytes=)
    "loaders/access/files.py": 2,  # verify_file(mode=), DatasetLocation(cache_size_bytes=)
    "loaders/access/reader.py": 2,  # DatasetReader(verify=), iter_examples(fmt=)
    "loaders/access/shards.py": 4,  # ShardSet(fmt=, split=, prefetch_shards=)
}


def _plain_value_errors(path) -> int:
    """``ValueError(...)`` calls (raised or returned) and bare ``raise ValueError`` in a module."""
    count = 0
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "ValueError":
            count += 1
        elif isinstance(node, ast.Raise) and isinstance(node.exc, ast.Name) and node.exc.id == "ValueError":
            count += 1
    return count


def test_modules_that_read_user_input_raise_the_hierarchy_s_classes():
    """A new plain ``ValueError`` where a user's input is read fails here: raise
    :class:`~schemas.errors.ConfigError` (bad configuration or usage) or
    :class:`~schemas.errors.DatasetError` / :class:`~schemas.errors.ShardIntegrityError` (a
    damaged dataset) instead, both ``ValueError`` subclasses; or, for an argument only a Python
    caller passes, count it in ``API_ARGUMENT_CHECKS`` with the argument it checks."""
    found = {}
    for prefix in READS_USER_INPUT:
        paths = sorted((ROOT / prefix).glob("**/*.py")) if prefix.endswith("/") else [ROOT / prefix]
        assert paths, prefix
        for path in paths:
            if count := _plain_value_errors(path):
                found[path.relative_to(ROOT).as_posix()] = count
    assert found == API_ARGUMENT_CHECKS


def test_the_count_sees_every_form_of_a_plain_value_error(tmp_path):
    module = tmp_path / "m.py"
    module.write_text("def f(x):\n    if x:\n        raise ValueError(f'{x}')\n    if x is None:\n"
                      "        raise ValueError\n    return ValueError('returned, raised by the caller')\n\n\n"
                      "def g():\n    raise ConfigError('fine')\n", encoding="utf-8")
    assert _plain_value_errors(module) == 3
