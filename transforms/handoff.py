"""The last reader of a value lets go of it: :func:`let_go`.

A runner may hand values between stages by reference (:mod:`pipelines.reference_handoff`, on
Beam's in-process runner): the value then stays stored in the process from its first encoding
until the stage that reads it last says it is done. The transforms that are a value's last
reader (AssignGroups for Tokenize's batches of documents, Pack for the blocks of a group, the
writers for an example batch) call :func:`let_go` on it; on any other value, and on every other
runner, it does nothing. Nothing here imports Beam.
"""

from __future__ import annotations

__all__ = ["let_go"]


def let_go(value) -> None:
    """``value`` will not be read again by this run (a no-op unless it was handed over by reference)."""
    release = getattr(value, "let_go_of_handoff", None)
    if release is not None:
        release()
