"""Large values across a shuffle of Beam's in-process runner: by reference, not by copy.

Beam's in-process runner (``FnApiRunner``, ``in_memory``) runs every stage in this process,
yet moves each element between stages as encoded bytes: the producing bundle encodes it,
the runner decodes it to group it, encodes it again per group, and the consuming bundle
decodes it once more, with several copies of the bytes on the way. For the token arrays of
a corpus that is most of a stage's time after the tokenizer (measured: a plain
``GroupByKey`` of 60 MB of bytes costs 0.4 s more than one of 60 bytes).

:class:`ByReference` wraps a value so that pickling it (Beam's coder falls back to pickle
for types it does not know) stores the value in this process's :data:`_STORE` and writes
only a token; unpickling looks the value up, without a copy. It is only correct where the
producer and consumer run in one process: the pipeline wraps values only for the
in-process runner (:func:`pipelines.options.RunnerSetup.in_one_process`), and a token read
in another process, or one no longer stored, fails with :class:`HandoffError` rather than
yield wrong data.

Stored values stay until :func:`release` is called with the run's scope (the pipeline does
so when it ends): Beam may decode an element more than once (``--direct_runner_bundle_repeat``
replays bundles), so a value cannot be dropped on its first read. They are the values the
runner would otherwise hold as bytes, so this adds no copies, only keeps them until the run
ends.
"""

from __future__ import annotations

import itertools
import os
import threading
from typing import Any

from schemas.errors import JobFailedError

__all__ = ["ByReference", "HandoffError", "release", "scope", "unwrap", "wrap"]

_STORE: dict[tuple[str, int], Any] = {}
_LOCK = threading.Lock()
_COUNTER = itertools.count()


class HandoffError(JobFailedError):
    """A by-reference value was read where it is not stored (another process, or after release)."""


class ByReference:
    """A value that crosses Beam's in-process shuffles by reference (see module docstring).

    Args:
        value: any object; it must not be changed once wrapped.
        scope: the run it belongs to (:func:`scope`); :func:`release` of it drops the value.
    """

    __slots__ = ("value", "scope")

    def __init__(self, value: Any, scope: str):
        self.value = value
        self.scope = scope

    def __reduce__(self):
        token = next(_COUNTER)
        with _LOCK:
            _STORE[self.scope, token] = self.value
        return _resolve, (os.getpid(), self.scope, token)


def _resolve(pid: int, scope: str, token: int) -> ByReference:
    if pid != os.getpid():
        raise HandoffError(
            f"a value handed over by reference in process {pid} was read in process {os.getpid()}: "
            "by-reference handoff only works with Beam's in-process runner"
        )
    try:
        value = _STORE[scope, token]
    except KeyError:
        raise HandoffError(f"by-reference value {token} of run {scope} is no longer stored") from None
    return ByReference(value, scope)


def wrap(value: Any, scope: str | None) -> Any:
    """``value`` as a :class:`ByReference` of ``scope``, or as it is when ``scope`` is None."""
    return value if scope is None else ByReference(value, scope)


def unwrap(value: Any) -> Any:
    """The value inside a :class:`ByReference`, or ``value`` itself."""
    return value.value if type(value) is ByReference else value


def scope() -> str:
    """A new scope name for one run's values."""
    return f"{os.getpid()}-{next(_COUNTER)}"


def release(name: str) -> None:
    """Drop every value stored under scope ``name``."""
    with _LOCK:
        for key in [k for k in _STORE if k[0] == name]:
            del _STORE[key]
