"""Values handed between the stages of Beam's in-process runner by reference, not as bytes.

Why: FnApiRunner in-process runs every stage in this process, yet moves each element between
stages as encoded bytes: the producing bundle encodes it, the runner decodes it to group it
and encodes it again per group, the consuming bundle decodes it once more. For the token
arrays of a corpus and its example batches, that is much of a run.

How: :func:`shared` turns a value into an instance of a subclass of its own tuple type, which
every transform reads as the tuple it is. Beam's default coder (``FastPrimitivesCoder``)
encodes a type it does not know by pickling it, and pickling such a value stores it in this
process (under the run's scope, :func:`open_scope`) and writes only a token; unpickling the
token gives the very object back, so no bytes are copied on the way. A token read in another
process, or after its run released it, fails with :class:`HandoffError` rather than yield
wrong data. Each value is stored once, under a number of its own, however often Beam encodes
it (Beam also encodes a sample of elements only to estimate their size, and a grouped element
with all its values; those bytes are never read), and stays until the transform that reads it
last lets go of it (:func:`transforms.handoff.let_go`: AssignGroups for Tokenize's batches of
documents, Pack for the blocks of a group, the writers for an example batch); so a run holds
about one copy of the corpus at a time (its documents, then its examples), not both to the
end. What no transform let go of goes when the scope closes (:func:`close_scope`, the end of
the run). Where the runner replays bundles (``--direct_runner_bundle_repeat``, which decodes an
input again after its reader let go of it), a scope opened with ``keep`` holds its values until
it closes. A value read after it was let go of fails with :class:`HandoffError` ("no longer
stored"), never yields another value.

Whether a run hands values over this way is the runner tuning's choice
(:attr:`pipelines.runner_tuning.RunnerTuning.by_reference`). Nothing here imports Beam.
"""

from __future__ import annotations

import itertools
import os
import threading
from typing import Any

from schemas.errors import JobFailedError

__all__ = ["HandoffError", "close_scope", "open_scope", "share_value", "shared"]

_STORE: dict[str, dict[int, Any]] = {}  # scope -> token -> value
_KEEP: set[str] = set()  # scopes whose values stay until release (the runner replays bundles)
_NUMBERS = itertools.count()  # each handed-over value's number in its run's store
_LOCK = threading.Lock()
_COUNTER = itertools.count()
_SHARED_TYPES: dict[type, type] = {}


class HandoffError(JobFailedError):
    """A by-reference value was read where it is not stored (another process, or after release)."""


def open_scope(keep: bool = False) -> str:
    """A new scope of this process for one run's values; with ``keep`` they stay until
    :func:`close_scope`, not only until their last reader lets go of them."""
    scope = f"{os.getpid()}-{next(_COUNTER)}"
    with _LOCK:
        _STORE[scope] = {}
        if keep:
            _KEEP.add(scope)
    return scope


def close_scope(scope: str) -> None:
    """Drop every value of ``scope`` (its run is over: nothing reads them again)."""
    with _LOCK:
        _STORE.pop(scope, None)
        _KEEP.discard(scope)


def _resolve(pid: int, scope: str, token: int) -> Any:
    if pid != os.getpid():
        raise HandoffError(
            f"a value handed over by reference in process {pid} was read in process {os.getpid()}: "
            "by-reference handoff only works with Beam's in-process runner"
        )
    try:
        return _STORE[scope][token]
    except KeyError:
        raise HandoffError(f"by-reference value {token} of run {scope} is no longer stored") from None


def _reduce_by_reference(self):
    token = self.handoff_number
    values = _STORE.get(self.handoff_scope)
    if values is None:
        raise HandoffError(f"by-reference values of run {self.handoff_scope} were released")
    values[token] = self  # the same entry however often it is encoded
    return _resolve, (os.getpid(), self.handoff_scope, token)


def _let_go(self):
    """The run will not read this value again (:func:`transforms.handoff.let_go`)."""
    if self.handoff_scope not in _KEEP:
        values = _STORE.get(self.handoff_scope)
        if values is not None:
            values.pop(self.handoff_number, None)


def _shared_type(cls: type) -> type:
    """The subclass of tuple type ``cls`` (a plain tuple or a NamedTuple) that pickles by reference."""
    shared_type = _SHARED_TYPES.get(cls)
    if shared_type is None:
        # No __slots__: an instance carries its run's scope in its __dict__.
        shared_type = _SHARED_TYPES[cls] = type(f"Shared{cls.__name__.capitalize()}", (cls,),
                                                {"__reduce__": _reduce_by_reference, "let_go_of_handoff": _let_go,
                                                 "__module__": __name__})
    return shared_type


def shared(value: tuple, scope: str) -> tuple:
    """``value`` (a tuple, or a NamedTuple) as an equal tuple of a subclass of its type that
    pickles by reference under ``scope`` (an open scope: :func:`open_scope`)."""
    if not isinstance(value, tuple):
        raise TypeError(f"only tuples are handed over by reference, not {type(value).__name__}")
    handed = tuple.__new__(_shared_type(type(value)), value)
    handed.handoff_scope = scope
    handed.handoff_number = next(_NUMBERS)
    return handed


def share_value(element: tuple, scope: str) -> tuple:
    """``(key, tuple)`` -> ``(key, shared tuple)``: the key stays as it is, for the runner to group by."""
    key, value = element
    return key, shared(value, scope)
