"""The shards of one split, opened lazily per process and read in batches (:class:`ShardSet`).

:class:`~loaders.access.arrow_shard.ArrowShard` (memory-mapped Arrow IPC streams, rows by index)
and :func:`~loaders.access.tar_shard.iter_tar_shard` (WebDataset tars, read sequentially) are the
only shard openers: the loader, :func:`loaders.access.reader.open_dataset` and the inspection
commands all read through them, after :meth:`loaders.access.files.DatasetLocation.open_shard` has
found the file and checked its size and sha256 (see :mod:`loaders.access.files`). Each opener
compares what it reads with the manifest (schema, row count, dtypes and shapes) and raises
:class:`~loaders.errors.ShardIntegrityError` naming the shard. A :class:`ShardSet` gathers
whole batches of Arrow rows through a :class:`~loaders.access.segment_table.SegmentTable`.

Remote datasets are read from a bounded local cache (:mod:`loaders.access.cache`): an opened
Arrow shard holds a lease on its cached file until the reader releases it
(:meth:`ShardSet.plan`), and a background thread downloads the next shards.
"""

from __future__ import annotations

import functools
import os
import weakref
from typing import Any

import numpy as np

from loaders.access.arrow_shard import ArrowShard
from loaders.access.cache import Lease
from loaders.access.files import DatasetLocation
from loaders.access.prefetch import Prefetcher
from loaders.access.segment_table import SegmentTable
from loaders.access.tar_shard import read_tar_rows
from loaders.collation.batch import ExampleBatch
from loaders.errors import ShardIntegrityError
from schemas.manifest import Manifest, ShardInfo

__all__ = ["FORMATS", "ShardSet"]

FORMATS = ("arrow", "webdataset")


class ShardSet:
    """The shards of one split of a dataset in one format, opened lazily per process.

    Args:
        location: the dataset (see :class:`~loaders.access.files.DatasetLocation`).
        manifest: its manifest.
        split: split name.
        fmt: ``arrow`` or ``webdataset``; None picks arrow when it was written.
        verify: ``once``, ``always`` or ``never`` (see :mod:`loaders.access.files`).
        prefetch_shards: remote datasets: how many of the next shards to download ahead.

    Raises:
        ValueError: unknown split or format, or a format the dataset was not written in.
    """

    def __init__(self, location: DatasetLocation, manifest: Manifest, split: str, fmt: str | None, verify: str,
                 prefetch_shards: int = 2):
        formats = list(manifest.config.get("formats", []))
        fmt = fmt or ("arrow" if "arrow" in formats else (formats[0] if formats else "arrow"))
        if fmt not in FORMATS:
            raise ValueError(f"fmt={fmt!r}: expected one of {FORMATS}")
        if fmt not in formats:
            raise ValueError(f"fmt={fmt!r}: {location.path} was written as {formats}")
        if split not in manifest.splits:
            raise ValueError(f"split {split!r} is not in {location.path}; it has {sorted(manifest.splits)}")
        if not isinstance(prefetch_shards, int) or prefetch_shards < 0:
            raise ValueError(f"prefetch_shards must be an int >= 0, got {prefetch_shards!r}")
        self.location, self.fmt, self.verify = location, fmt, verify
        self.prefetch_shards = prefetch_shards
        self.shards: list[ShardInfo] = manifest.shards(split)
        # The epoch order is sized by the rows, the cache's room by the bytes: both believed only
        # once the files back them (see loaders.access.files).
        location.check_claims([shard.files[fmt] for shard in self.shards if fmt in shard.files])
        self.columns = {c["name"]: c["type"] for c in manifest.schema.get("columns", [])}
        self._row_counts = np.asarray(self.rows, dtype=np.int64)
        self._reset()

    def _reset(self) -> None:
        self._open: dict[int, ArrowShard] = {}
        self._opened_as: dict[int, tuple[str, tuple[int, int, int, int]]] = {}  # index -> (path, file identity)
        self._protect: frozenset[str] = frozenset()
        self._prefetcher: Prefetcher | None = None
        self._released = False  # since the last prefetch request: room may have been freed
        self._pid = os.getpid()
        self._table: SegmentTable | None = None

    def __getstate__(self):
        state = dict(self.__dict__)
        for name in ("_open", "_opened_as", "_protect", "_prefetcher", "_released", "_pid", "_table"):
            state.pop(name)  # memory maps, leases and threads are per process
        return state

    def __setstate__(self, state):
        self.__dict__.update(state)
        self._reset()

    def _check_process(self) -> None:
        if os.getpid() != self._pid:  # forked worker: do not share the parent's maps, leases or thread
            self._reset()

    @property
    def rows(self) -> list[int]:
        return [s.rows for s in self.shards]

    def shrunk_file_error(self) -> ShardIntegrityError | None:
        """The error naming the first of this split's files (in this format) that is now shorter
        on disk than the manifest says, None if none is: asked after a DataLoader worker died
        (a memory-mapped file that shrank under it ends it with SIGBUS, which it cannot report)."""
        for shard in self.shards:
            file = shard.files.get(self.fmt)
            if file is None:
                continue
            try:
                size = os.stat(self.location.on_disk(file.path)).st_size
            except (OSError, ShardIntegrityError):
                continue  # a remote file not in the cache, or gone: nothing mapped shrank here
            if size < file.bytes:
                return ShardIntegrityError(f"shard {file.path}: truncated while it was being read ({size:,} of "
                                           f"{file.bytes:,} bytes left); a DataLoader worker reading it died")
        return None

    def _file(self, index: int):
        return self.shards[index].files[self.fmt]

    def open_file(self, index: int) -> tuple[Lease, str]:
        """``(lease on the local file, relative name)`` of shard ``index``, fetched and verified
        (:meth:`~loaders.access.files.DatasetLocation.open_shard`)."""
        file = self._file(index)
        return self.location.open_shard(file, verify=self.verify, protect=self._protect), file.path

    def local_path(self, index: int) -> tuple[str, str]:
        """``(local path, relative name)`` of shard ``index``, fetched and verified (not leased)."""
        lease, name = self.open_file(index)
        lease.close()
        return lease.path, name

    def arrow(self, index: int) -> ArrowShard:
        """The opened Arrow shard ``index`` (verified on first open in this process)."""
        self._check_process()
        shard = self._open.get(index)
        if shard is None:
            lease, name = self.open_file(index)
            try:
                shard = ArrowShard(lease.path, name=name, columns=self.columns, rows=self.shards[index].rows,
                                   size=self._file(index).bytes)
            except BaseException:
                lease.close()
                raise
            shard.lease = lease if self.location.remote else None
            self._open[index] = shard
            self._opened_as[index] = (lease.path, _identity(os.fstat(shard._fd)))
        return shard

    def start_epoch(self) -> None:
        """Forget opened shards when ``verify="always"``, so that each epoch checks them again;
        with ``once``, forget those whose file changed since it was opened (another inode, size or
        mtime: rewritten in place or replaced), so that the next epoch checks the new bytes and
        never serves them unchecked through the old mapping."""
        if self.verify == "always":
            self.release(list(self._open))
        elif self.verify == "once":
            self.release([index for index in self._open if self._changed(index)])

    def _changed(self, index: int) -> bool:
        path, identity = self._opened_as[index]
        try:
            return _identity(os.stat(path)) != identity
        except OSError:
            return True

    def release(self, indices) -> None:
        """Close opened shards: their cached files may be evicted (rows already read stay valid)."""
        for index in indices:
            shard = self._open.pop(index, None)
            self._opened_as.pop(index, None)
            if shard is not None:
                shard.close()
                self._released = True
                self._table = None  # holds the released shards' maps

    def segments(self, shard_ids: np.ndarray, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """``(segment, row in segment)`` of ``(shard, row)`` pairs for :meth:`gather` (Arrow).

        Opens (and verifies) the shards among ``shard_ids`` that are not open yet.
        """
        self._check_process()
        table = self._table
        if table is None:
            table = self._table = SegmentTable(len(self.shards))
        if shard_ids.size:
            # (np.unique imports numpy.ma on first use: a tenth of a second before the first batch)
            for index in np.flatnonzero(np.bincount(shard_ids, minlength=len(self.shards))).tolist():
                if not table.registered(index):
                    table.register(index, self.arrow(index))
                else:
                    self._open[index].check_intact()
            if rows.min() < 0 or (rows >= self._row_counts[shard_ids]).any():
                raise IndexError(f"rows out of range of their shards: {rows.tolist()}")
        return table.locate(shard_ids, rows)

    def gather(self, segments: np.ndarray, rows: np.ndarray, columns: tuple[str, ...]) -> ExampleBatch:
        """The examples at ``(segment, row)`` pairs from :meth:`segments` (see :meth:`SegmentTable.gather`)."""
        assert self._table is not None, "call segments() first"
        for shard in self._open.values():  # a file that shrank under its mapping: an error, not a SIGBUS
            if os.lseek(shard._fd, 0, os.SEEK_END) < shard._size:
                shard.check_intact()
        return self._table.gather(segments, rows, columns)

    def tar_rows(self, index: int, wanted: set[int] | None) -> dict[int, dict[str, Any]]:
        """Rows of tar shard ``index`` (see :func:`read_tar_rows`)."""
        self._check_process()
        lease, name = self.open_file(index)
        with lease:
            return read_tar_rows(lease.path, name=name, columns=self.columns, rows=self.shards[index].rows,
                                 wanted=wanted)

    # -- remote datasets: what to keep, what to fetch ahead --------------------------------
    def plan(self, current, upcoming=None) -> None:
        """Tell a remote shard set where the reader is (a no-op for local datasets).

        Args:
            current: shards the reader may read from soon (the shuffle blocks it is in); opened
                shards not among them are released, so the cache may evict their files.
            upcoming: shards in the order the reader will need them (an iterable, read lazily);
                the first ``prefetch_shards`` that are not open are downloaded in the
                background. None: only release.
        """
        if not self.location.remote:
            return
        self._check_process()
        current = set(current)
        self.release([index for index in self._open if index not in current])
        if upcoming is None:
            return
        window: list[int] = []
        if self.prefetch_shards:
            for index in upcoming:
                if index in self._open or index in window or not self.shards[index].rows:
                    continue
                window.append(index)
                if len(window) == self.prefetch_shards:
                    break
        self._protect = frozenset(self.location.cache_path(self._file(i).path) for i in (*current, *window))
        if self._prefetcher is None:
            if not window:
                return
            self._prefetcher = Prefetcher(functools.partial(_prefetch_one, weakref.ref(self)))
        self._prefetcher.want(window, self._protect, retry=self._released)
        self._released = False

    def wait_prefetch(self, timeout: float | None = None) -> bool:
        """Wait for the background downloads asked for so far; False on timeout."""
        return self._prefetcher is None or self._prefetcher.wait(timeout)


def _identity(stat: os.stat_result) -> tuple[int, int, int, int]:
    """What tells a file's version apart: device, inode, size, mtime (the key of a verified checksum)."""
    return stat.st_dev, stat.st_ino, stat.st_size, stat.st_mtime_ns


def _prefetch_one(shards: weakref.ref[ShardSet], index: int, protect: frozenset[str]) -> bool:
    """Prefetch job of a shard set (held weakly: the thread does not keep a dropped reader's leases)."""
    owner = shards()
    if owner is None:
        return False
    file = owner._file(index)
    return owner.location.prefetch_file(file.path, sha256=file.sha256, size=file.bytes, protect=protect)
