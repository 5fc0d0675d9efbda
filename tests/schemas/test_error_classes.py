"""lmshards' one error hierarchy: each error's class decides the CLI's exit status."""

from __future__ import annotations

import pytest

from loaders.errors import ShardIntegrityError as LoaderShardIntegrityError
from schemas.errors import ConfigError, DatasetError, JobFailedError, LmshardsError, ShardIntegrityError, exit_code
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
    assert exit_code(ValueError("--seq-len 0: must be > 0")) == 2
    assert exit_code(OSError("disk full")) == 1
    assert LoaderShardIntegrityError is ShardIntegrityError
