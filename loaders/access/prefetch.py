"""Downloading a reader's next files in the background (:class:`Prefetcher`).

One thread per reader: :class:`~loaders.access.shards.ShardSet` asks for the shards it will need
next, and the job it gives the prefetcher downloads each into the local cache
(:meth:`loaders.access.cache.ShardCache.prefetch`, which never exceeds the cache's bound).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable
from typing import Any

__all__ = ["Prefetcher"]

log = logging.getLogger(__name__)


class Prefetcher:
    """Downloads a reader's next files in one background thread.

    ``job(item, protect)`` downloads one item; :meth:`want` replaces the list of items
    (nearest first). Failures are logged and dropped: the reader downloads the file again
    when it needs it and gets the error then. The thread ends after a few idle seconds
    and starts again on the next :meth:`want`.
    """

    IDLE_EXIT_S = 5.0

    def __init__(self, job: Callable[[Any, frozenset[str]], Any]):
        self._job = job
        self._cond = threading.Condition()
        self._pending: list[Any] = []
        self._last: tuple[Any, ...] = ()
        self._protect: frozenset[str] = frozenset()
        self._busy = False
        self._thread: threading.Thread | None = None
        self.errors = 0

    def want(self, items: Iterable[Any], protect: Iterable[str] = (), *, retry: bool = False) -> None:
        """Download ``items`` (in order) unless cached; forget items asked for before.

        The same items asked for again are only tried again with ``retry`` (say, once room
        was freed for a prefetch that did not fit).
        """
        items = tuple(items)
        with self._cond:
            if items == self._last and not retry:
                return
            self._last, self._pending, self._protect = items, list(items), frozenset(protect)
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._run, name="lmshards-prefetch", daemon=True)
                self._thread.start()
            self._cond.notify_all()

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._pending:
                    self._busy = False
                    self._cond.notify_all()
                    if not self._cond.wait(self.IDLE_EXIT_S) and not self._pending:
                        self._thread = None
                        return
                item, protect = self._pending.pop(0), self._protect
                self._busy = True
            try:
                self._job(item, protect)
            except Exception as exc:  # noqa: BLE001 - the reader gets the error when it needs the file
                self.errors += 1
                log.debug("prefetch of %s failed: %s", item, exc)

    def wait(self, timeout: float | None = None) -> bool:
        """Wait until nothing is being downloaded or pending; False on timeout."""
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._cond:
            while self._pending or self._busy:
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    return False
                self._cond.wait(left)
        return True
