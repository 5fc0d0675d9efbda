"""The local cache of remote dataset files: size-bounded, shared by processes, prefetched.

Layout: ``<cache_dir>/<dataset tag>/<path in the dataset>`` (the tag is 16 hex digits
derived from the dataset's URL, see :class:`~loaders.access.files.DatasetLocation`). One
:class:`ShardCache` manages a whole ``cache_dir``: the size bound covers every dataset
cached there, and only files inside tag directories are ever counted or deleted.

- **Downloads** go to ``<file>.partial-<pid>-<thread>``, are checked by the caller's
  ``fetch`` (sha256 while streaming) and renamed into place atomically, so a reader never
  sees half a file. A ``<file>.lock`` (held with ``flock`` during the download, removed
  after) keeps processes from downloading the same file twice; without it (no ``fcntl``)
  they would both download and one rename would win, which is also correct.
- **Leases.** A process that uses a cached file (an Arrow shard it memory-maps, a tar it
  is reading) holds a :class:`Lease`: an open descriptor with a shared ``flock`` on the
  file. Eviction takes an exclusive non-blocking lock first and skips the file when that
  fails, so no process ever deletes a file that any process (DataLoader workers included)
  is using. A lease is taken on the downloaded inode before it is renamed into place, and
  a lease on an existing file is only kept after checking that the path still names the
  locked inode, so eviction and leasing cannot race.
- **Only its own files.** The cache deletes only regular files inside its dataset (tag)
  directories, never a symbolic link or what one points to (paths from a manifest are
  checked before they reach the cache, see :mod:`loaders.access.files`).
- **Bound** (``max_bytes``, None for unbounded): before a download, least recently used
  files (by access time, which leases set explicitly) that are not leased are deleted
  until the new file fits. A file that must be read now is downloaded even when the
  leased files alone fill the bound, so the cache holds at most ``max_bytes`` plus the
  files in use, but never one larger than the whole bound (a :class:`~schemas.errors.ConfigError`
  before anything is evicted). Prefetches never exceed the bound: a prefetch that does not fit without
  evicting a leased or soon-needed file is skipped. Partial downloads of other processes
  count at their current size (a few concurrent downloads can overshoot briefly);
  leftovers of crashed processes are deleted after :data:`STALE_PARTIAL_S` seconds.
- Prefetches come from :class:`~loaders.access.prefetch.Prefetcher`: one background thread per reader
  that downloads the next files.

Without ``fcntl`` (Windows) there are no locks: deleting a file that is in use fails
there and is skipped, which keeps the same guarantee.

This module is over 400 lines on purpose: leases, downloads and eviction are one protocol
(shared and exclusive ``flock`` plus inode checks), and the argument that no process deletes a
file in use or reads half a file holds only across all three, so they are kept together.
"""

from __future__ import annotations

import os
import re
import threading
import time
from collections.abc import Callable, Iterable
from contextlib import contextmanager
from typing import Any, BinaryIO

from schemas.errors import ConfigError

try:
    import fcntl
except ImportError:  # pragma: no cover - Windows
    fcntl = None  # type: ignore[assignment]

__all__ = ["DEFAULT_CACHE_BYTES", "STALE_PARTIAL_S", "Lease", "ShardCache"]

#: Default bound of a cache directory (bytes).
DEFAULT_CACHE_BYTES = 20 << 30
#: Seconds after which an unmodified partial download of another process is deleted.
STALE_PARTIAL_S = 600.0

_PARTIAL = ".partial-"
_LOCK = ".lock"
_TAG_DIR = re.compile(r"^[0-9a-f]{16}$")


def _touch(path: str) -> None:
    """Mark ``path`` as used now (access time; the mtime stays, it keys verified checksums)."""
    try:
        os.utime(path, ns=(time.time_ns(), os.stat(path).st_mtime_ns))
    except OSError:
        pass


class Lease:
    """A cached file in use by this process: no process evicts it until :meth:`close`.

    ``path`` is the file; a lease of a local (uncached) dataset file holds nothing.
    """

    def __init__(self, path: str, cache: ShardCache | None = None, fd: int | None = None, size: int = 0):
        self.path = path
        self._cache, self._fd, self._size = cache, fd, size
        self._pid = os.getpid()
        if cache is not None:
            cache._register(path, size)

    def close(self) -> None:
        """Release the file (it becomes the most recently used one)."""
        cache, fd = self._cache, self._fd
        self._cache = self._fd = None
        if cache is None:
            return
        if os.getpid() == self._pid:
            _touch(self.path)
            cache._unregister(self.path)
        if fd is not None:
            try:
                os.close(fd)  # drops the shared lock once no copy of the descriptor is left
            except OSError:
                pass

    def __enter__(self) -> Lease:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:  # noqa: BLE001 - interpreter shutdown
            pass


class ShardCache:
    """Size-bounded LRU cache directory shared by the processes that read from it.

    Args:
        root: the cache directory (datasets live in 16-hex-digit tag directories under it).
        max_bytes: bound on the bytes of cached files (None: unbounded).

    ``stats`` counts, in this process: ``hits`` (files found cached), ``downloads``,
    ``prefetched`` (downloads made by a prefetcher), ``prefetch_skipped`` (prefetches
    that did not fit), ``evictions`` and ``evicted_bytes``, ``peak_bytes`` (largest
    cache size seen after a download) and ``peak_excess`` (largest excess over
    ``max_bytes`` beyond the files this process had leased; 0 when the bound held).
    """

    def __init__(self, root: str, max_bytes: int | None = DEFAULT_CACHE_BYTES):
        if max_bytes is not None and (not isinstance(max_bytes, int) or max_bytes < 0):
            raise ValueError(f"cache_size_bytes must be an int >= 0 or None, got {max_bytes!r}")
        self.root = os.path.abspath(root)
        self.max_bytes = max_bytes
        self.stats = dict.fromkeys(("hits", "downloads", "prefetched", "prefetch_skipped", "evictions",
                                    "evicted_bytes", "peak_bytes", "peak_excess"), 0)
        self._reset()

    def _reset(self) -> None:
        self._pid = os.getpid()
        self._lock = threading.RLock()  # reentrant: a lease may be closed by the garbage collector
        self._room_lock = threading.Lock()
        self._leased: dict[str, list[int]] = {}  # path -> [count, size]
        self._reserved: dict[str, int] = {}  # downloads of this process in progress -> expected size

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        for name in ("_lock", "_room_lock", "_leased", "_reserved", "_pid"):
            state.pop(name)
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._reset()

    def _check_process(self) -> None:
        if os.getpid() != self._pid:  # forked: the parent's leases and reservations are its own
            self._reset()

    # -- leases ----------------------------------------------------------------------------
    def _register(self, path: str, size: int) -> None:
        self._check_process()
        with self._lock:
            entry = self._leased.setdefault(path, [0, size])
            entry[0] += 1

    def _unregister(self, path: str) -> None:
        with self._lock:
            entry = self._leased.get(path)
            if entry is not None:
                entry[0] -= 1
                if entry[0] <= 0:
                    del self._leased[path]

    def leased_bytes(self) -> int:
        """Bytes of the files this process holds leases on."""
        with self._lock:
            return sum(size for _, size in self._leased.values())

    def _try_lease(self, path: str) -> Lease | None:
        """A lease on ``path`` if it is cached (None if absent or just evicted)."""
        try:
            fd = os.open(path, os.O_RDONLY)
        except FileNotFoundError:
            return None
        try:
            if fcntl is not None:
                fcntl.flock(fd, fcntl.LOCK_SH)  # waits only for an evictor's instant
            held = os.fstat(fd)
            current = os.stat(path)
            if (held.st_ino, held.st_dev) != (current.st_ino, current.st_dev):
                raise FileNotFoundError(path)  # evicted (or replaced) before the lock was taken
        except FileNotFoundError:
            os.close(fd)
            return None
        except BaseException:
            os.close(fd)
            raise
        _touch(path)
        return Lease(path, self, fd, held.st_size)

    def acquire(self, path: str, fetch: Callable[[BinaryIO], None], *, size: int | None = None,
                protect: Iterable[str] = ()) -> Lease:
        """Lease ``path``, downloading it first when it is not cached.

        Args:
            path: the file's place in the cache.
            fetch: writes the file's verified bytes to a binary sink (raises on a mismatch).
            size: expected bytes (to make room beforehand).
            protect: cached files needed soon, evicted only if nothing else makes room.
        """
        self._check_process()
        for _ in range(5):
            lease = self._try_lease(path)
            if lease is not None:
                self.stats["hits"] += 1
                return lease
            lease = self._download(path, fetch, size, protect, prefetch=False)
            if lease is not None:
                return lease
        raise OSError(f"{path}: evicted by other processes as soon as it was cached; raise cache_size_bytes")

    def prefetch(self, path: str, fetch: Callable[[BinaryIO], None], *, size: int | None = None,
                 protect: Iterable[str] = ()) -> bool:
        """Download ``path`` unless cached, if it fits the bound; True when it is cached now."""
        self._check_process()
        if os.path.exists(path):
            _touch(path)
            return True
        lease = self._download(path, fetch, size, protect, prefetch=True)
        if lease is None:
            return False
        lease.close()
        return True

    def discard(self, path: str, *, damaged: bool = False) -> None:
        """Delete a cached file unless it is in use; a ``damaged`` one (a checksum that no longer
        matches) goes even then: on POSIX, processes that mapped it keep their mapping, and the
        next download puts a good copy in its place."""
        if not self._owns(path):
            return  # never delete what the cache did not make (a symbolic link, a path outside it)
        if damaged and fcntl is not None:
            try:
                os.unlink(path)
            except FileNotFoundError:
                pass
            return
        self._evict(path)

    def _owns(self, path: str) -> bool:
        """Whether ``path`` is a regular file (not a link) in a dataset directory of this cache."""
        relative = os.path.relpath(os.path.abspath(path), self.root)
        if relative.startswith(("..", os.sep)) or not _TAG_DIR.match(relative.split(os.sep, 1)[0]):
            return False
        real = os.path.realpath(os.path.dirname(os.path.abspath(path)))
        if not real.startswith(os.path.realpath(self.root) + os.sep):
            return False
        try:
            return not os.path.islink(path)
        except OSError:
            return False

    # -- downloading -----------------------------------------------------------------------
    @contextmanager
    def _download_lock(self, path: str):
        if fcntl is None:  # pragma: no cover - Windows
            yield
            return
        lock_path = path + _LOCK
        while True:
            fd = os.open(lock_path, os.O_RDWR | os.O_CREAT, 0o644)
            fcntl.flock(fd, fcntl.LOCK_EX)
            try:
                held, current = os.fstat(fd), os.stat(lock_path)
                if (held.st_ino, held.st_dev) == (current.st_ino, current.st_dev):
                    break
            except FileNotFoundError:
                pass
            os.close(fd)  # the previous holder removed this lock file: take the new one
        try:
            yield
        finally:
            try:
                os.unlink(lock_path)
            except FileNotFoundError:
                pass
            os.close(fd)

    def _download(self, path: str, fetch: Callable[[BinaryIO], None], size: int | None,
                  protect: Iterable[str], *, prefetch: bool) -> Lease | None:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with self._download_lock(path):
            lease = self._try_lease(path)  # another process or thread may have fetched it meanwhile
            if lease is not None:
                if not prefetch:
                    self.stats["hits"] += 1
                return lease
            if self.max_bytes is not None and (size or 0) > self.max_bytes:
                if prefetch:
                    self.stats["prefetch_skipped"] += 1
                    return None
                # Making room for it would evict every other file, of every dataset cached here, first.
                raise ConfigError(f"{path}: {size:,} bytes, more than the whole cache ({self.max_bytes:,} bytes, "
                                  "cache_size_bytes); nothing was evicted for it; raise cache_size_bytes")
            if not self._make_room(path, size or 0, protect, strict=prefetch):
                self.stats["prefetch_skipped"] += 1
                return None
            partial = f"{path}{_PARTIAL}{os.getpid()}-{threading.get_ident()}"
            fd = os.open(partial, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
            try:
                if fcntl is not None:
                    fcntl.flock(fd, fcntl.LOCK_SH)  # the lease moves with the inode on rename
                with os.fdopen(os.dup(fd), "wb") as sink:
                    fetch(sink)
                os.replace(partial, path)
            except BaseException:
                os.close(fd)
                try:
                    os.remove(partial)
                except FileNotFoundError:
                    pass
                raise
            finally:
                with self._lock:
                    self._reserved.pop(path, None)
            lease = Lease(path, self, fd, os.fstat(fd).st_size)
        self.stats["downloads"] += 1
        if prefetch:
            self.stats["prefetched"] += 1
        if self.max_bytes is not None:
            used = self._scan()[1]
            self.stats["peak_bytes"] = max(self.stats["peak_bytes"], used)
            excess = used - self.max_bytes - self.leased_bytes()
            self.stats["peak_excess"] = max(self.stats["peak_excess"], excess)
        return lease

    # -- the bound -------------------------------------------------------------------------
    def _scan(self) -> tuple[list[tuple[int, int, str]], int]:
        """``(files as (access time, size, path), bytes in use)`` of every dataset cached here."""
        files: list[tuple[int, int, str]] = []
        used = 0
        own = f"{_PARTIAL}{os.getpid()}-"
        now = time.time()
        try:
            tags = [e for e in os.scandir(self.root) if e.is_dir(follow_symlinks=False) and _TAG_DIR.match(e.name)]
        except FileNotFoundError:
            tags = []
        stack = [e.path for e in tags]
        while stack:
            try:
                entries = list(os.scandir(stack.pop()))
            except FileNotFoundError:
                continue
            for entry in entries:
                try:
                    if entry.is_dir(follow_symlinks=False):
                        stack.append(entry.path)
                        continue
                    if not entry.is_file(follow_symlinks=False) or entry.name.endswith(_LOCK):
                        continue
                    stat = entry.stat(follow_symlinks=False)
                except FileNotFoundError:
                    continue
                if _PARTIAL in entry.name:
                    if own in entry.name:
                        continue  # counted by its reservation
                    if now - stat.st_mtime > STALE_PARTIAL_S:
                        try:
                            os.remove(entry.path)  # left by a process that died mid-download
                        except OSError:
                            pass
                        continue
                    used += stat.st_size
                    continue
                files.append((stat.st_atime_ns, stat.st_size, entry.path))
                used += stat.st_size
        with self._lock:
            used += sum(self._reserved.values())
        return files, used

    def _make_room(self, path: str, need: int, protect: Iterable[str], *, strict: bool) -> bool:
        """Evict LRU files until ``need`` more bytes fit; reserve them. False if ``strict`` and they do not."""
        if self.max_bytes is None:
            return True
        with self._room_lock:  # one evictor per process: reservations stay consistent
            return self._make_room_locked(path, need, protect, strict=strict)

    def _make_room_locked(self, path: str, need: int, protect: Iterable[str], *, strict: bool) -> bool:
        files, used = self._scan()
        if used + need > self.max_bytes:
            soon = set(protect)
            with self._lock:
                leased = set(self._leased)
            files.sort()
            candidates = [f for f in files if f[2] not in soon and f[2] not in leased and f[2] != path]
            if not strict:
                candidates += [f for f in files if f[2] in soon and f[2] not in leased and f[2] != path]
            for _, size, victim in candidates:
                if used + need <= self.max_bytes:
                    break
                if self._evict(victim):
                    used -= size
                    self.stats["evictions"] += 1
                    self.stats["evicted_bytes"] += size
        if strict and used + need > self.max_bytes:
            return False
        with self._lock:
            self._reserved[path] = need
        return True

    def _evict(self, path: str) -> bool:
        """Delete ``path`` unless some process holds a lease on it; True if it is gone."""
        if fcntl is None:  # pragma: no cover - Windows refuses to delete a mapped file
            try:
                os.remove(path)
            except FileNotFoundError:
                return True
            except OSError:
                return False
            return True
        try:
            fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))
        except FileNotFoundError:
            return True
        except OSError:
            return False  # a symbolic link: not the cache's to delete
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                return False  # leased by some process
            try:
                current = os.stat(path)
            except FileNotFoundError:
                return True
            held = os.fstat(fd)
            if (held.st_ino, held.st_dev) != (current.st_ino, current.st_dev):
                return False  # replaced by a fresh download meanwhile
            os.unlink(path)
            return True
        finally:
            os.close(fd)

    def size(self) -> int:
        """Bytes cached now (all datasets in this cache directory, partial downloads included)."""
        return self._scan()[1]
