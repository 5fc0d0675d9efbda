"""Hand freed heap memory back to the system between the phases of a run: :func:`return_freed_memory`.

A run frees one form of the corpus while it makes the next: Pack lets go of the documents'
token buffers (a few KB each, in key order, so the holes they leave are scattered) as it cuts
chunks, the builders let go of chunks as they build blocks of examples of a few MB. glibc's
malloc keeps what is freed in its heap for later allocations of a size that fits; blocks of a
few MB do not fit between holes of a few KB, so without help the process's resident memory grows
by one copy of the corpus per phase though only one copy is alive. ``malloc_trim`` (glibc's
public API) returns the free pages inside the heap to the system.

A trim walks the heap, which costs up to about a second per GB of holes, so callers ask for one
where a phase has freed memory (after each block of examples, when the writers start) and it
runs only as often as keeps trims under :data:`MAX_SHARE` of the process's time. Elsewhere than glibc
(macOS, musl) it does nothing. The bytes a run writes do not depend on it.
"""

from __future__ import annotations

import ctypes
import threading
import time

__all__ = ["MAX_SHARE", "return_freed_memory"]

#: The most of a process's time trims may take: after a trim of t seconds, the next waits 1/MAX_SHARE * t.
MAX_SHARE = 0.05

_LOCK = threading.Lock()
_state = {"next": 0.0}


def _trim_function():
    try:
        function = ctypes.CDLL(None).malloc_trim
    except (OSError, AttributeError):  # not glibc
        return None
    function.argtypes, function.restype = [ctypes.c_size_t], ctypes.c_int
    return function


_TRIM = _trim_function()


def return_freed_memory() -> bool:
    """Return the heap's free pages to the system, unless a trim ran too recently; whether it ran."""
    if _TRIM is None:
        return False
    with _LOCK:
        now = time.monotonic()
        if now < _state["next"]:
            return False
        _TRIM(0)
        took = time.monotonic() - now
        _state["next"] = time.monotonic() + took / MAX_SHARE
        return True
