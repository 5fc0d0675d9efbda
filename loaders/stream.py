"""The resumable, rank- and worker-aware ``IterableDataset`` base of every loader dataset.

A subclass says how long an epoch is and how to read a batch of global stream indices;
this class owns the rest (see :mod:`loaders.state` for the split and the state):
``set_epoch``, ``state_dict``/``load_state_dict``, the rank and DataLoader-worker split,
and counting what was consumed.

Counting: iterated directly (or by a DataLoader with ``num_workers=0``) the dataset counts
the samples it hands out. With worker processes only the main process knows what the
trainer received, so use :func:`loaders.dataloader.make_dataloader`, whose loader counts
the batches it yields and keeps this object's state current.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import numpy as np
import torch
from torch.utils.data import IterableDataset, get_worker_info

from loaders.state import UNEVEN_MODES, LoaderState, RankSchedule

__all__ = ["ResumableStream", "resolve_topology"]


def resolve_topology(rank: int | None, world_size: int | None) -> tuple[int, int]:
    """``(rank, world_size)``: as given, else from torch.distributed, else ``RANK``/``WORLD_SIZE``, else (0, 1)."""
    if rank is None and world_size is None:
        import torch.distributed as dist

        if dist.is_available() and dist.is_initialized():
            return dist.get_rank(), dist.get_world_size()
        if "RANK" in os.environ and "WORLD_SIZE" in os.environ:
            return int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
        return 0, 1
    if rank is None or world_size is None:
        raise ValueError(f"give both rank and world_size or neither (got rank={rank}, world_size={world_size})")
    if world_size < 1 or not 0 <= rank < world_size:
        raise ValueError(f"rank {rank} out of range for world_size {world_size}")
    return rank, world_size


class ResumableStream(IterableDataset):
    """Base class: one global stream per epoch, split over ranks and workers, resumable.

    Args:
        batch_size: per-rank batch size; DataLoader workers split the rank's stream by whole
            batches of this size, so it must equal the DataLoader's batch size.
        seed: seed of the order (and of dynamic noise).
        rank, world_size: this process's place in torch.distributed (None: detected).
        uneven: ``wrap`` (read the first samples again) or ``drop`` (skip the tail) so that
            every rank yields the same number of samples.
        drop_last: drop each rank's last partial batch.
    """

    kind = "stream"

    def __init__(
        self,
        *,
        batch_size: int,
        seed: int,
        rank: int | None,
        world_size: int | None,
        uneven: str,
        drop_last: bool,
    ):
        super().__init__()
        if not isinstance(batch_size, int) or batch_size < 1:
            raise ValueError(f"batch_size must be an int >= 1, got {batch_size!r}")
        if not isinstance(seed, int) or seed < 0:
            raise ValueError(f"seed must be an int >= 0, got {seed!r}")
        if uneven not in UNEVEN_MODES:
            raise ValueError(f"uneven={uneven!r}: expected one of {UNEVEN_MODES}")
        self.batch_size, self.seed, self.uneven, self.drop_last = batch_size, seed, uneven, drop_last
        self.rank, self.world_size = resolve_topology(rank, world_size)
        self._epoch = 0
        self._samples = 0  # global samples of the epoch consumed
        self._counted_by_loader = False
        self._shared: torch.Tensor | None = None  # (epoch, samples) for persistent workers

    # -- what a subclass provides ---------------------------------------------------------
    def epoch_size(self) -> int:
        """``N``: samples in one epoch's order (before ``drop``/``wrap``)."""
        raise NotImplementedError

    def fingerprint(self) -> str:
        """Digest of everything that shapes the order; a state only loads into equal data."""
        raise NotImplementedError

    def read(self, epoch: int, stream_indices: np.ndarray, schedule: RankSchedule, worker: int,
             num_workers: int) -> list[dict[str, Any]]:
        """Examples at global stream indices of ``epoch``, in that order."""
        raise NotImplementedError

    def start_iteration(self) -> None:
        """Called in the reading process before each pass."""

    # -- epochs and state ------------------------------------------------------------------
    @property
    def epoch(self) -> int:
        return self._epoch

    @property
    def samples_consumed(self) -> int:
        """Global samples of the current epoch consumed so far (all ranks)."""
        return self._samples

    def schedule(self) -> RankSchedule:
        """This rank's schedule from the current resume point."""
        return RankSchedule(self.epoch_size(), self.world_size, self.rank, self.batch_size, self._samples,
                            self.uneven, self.drop_last)

    def __len__(self) -> int:
        """Samples this rank still yields in the current epoch."""
        return self.schedule().num_samples

    def set_epoch(self, epoch: int) -> None:
        """Start ``epoch`` from its beginning; a no-op for the current epoch (keeps a resume point)."""
        if not isinstance(epoch, int) or epoch < 0:
            raise ValueError(f"epoch must be an int >= 0, got {epoch!r}")
        if epoch != self._epoch:
            self._epoch, self._samples = epoch, 0

    def state_dict(self) -> dict[str, Any]:
        """``{epoch, samples, ...}``: enough to resume exactly (see :class:`~loaders.state.LoaderState`)."""
        return LoaderState(self._epoch, self._samples, self.seed, self.fingerprint(), self.kind, self.world_size,
                           self.batch_size).to_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Resume from :meth:`state_dict` output, possibly saved with other ranks or workers.

        Raises:
            ValueError: other data, seed or order settings; or consumed samples that are not
                a multiple of the world size (the global batch size changed).
        """
        parsed = LoaderState.from_dict(state)
        if parsed.kind != self.kind:
            raise ValueError(f"loader state was saved by a {parsed.kind}, this is a {self.kind}")
        if parsed.fingerprint != self.fingerprint():
            raise ValueError("loader state was saved for other data or order settings (fingerprint differs)")
        if parsed.seed != self.seed:
            raise ValueError(f"loader state was saved with seed {parsed.seed}, this dataset has seed {self.seed}")
        RankSchedule(self.epoch_size(), self.world_size, self.rank, self.batch_size, parsed.samples, self.uneven,
                     self.drop_last)  # validates samples % world_size
        self._epoch, self._samples = parsed.epoch, parsed.samples

    def _advance(self, rank_samples: int) -> None:
        self._samples += rank_samples * self.world_size

    def _finish_epoch(self) -> None:
        self._epoch, self._samples = self._epoch + 1, 0

    def _resume_point(self) -> tuple[int, int]:
        if self._shared is not None and get_worker_info() is not None:
            epoch, samples = self._shared.tolist()
            return int(epoch), int(samples)
        return self._epoch, self._samples

    def read_batches(self, epoch: int, schedule: RankSchedule, worker: int, num_workers: int, *,
                     columnar: bool = False, allocate: Callable | None = None) -> Iterator[Sequence[dict[str, Any]]]:
        """The batches of one worker, in order (default: :meth:`read` of each).

        ``columnar``: the consumer also takes :class:`~loaders.batch.ExampleBatch` batches,
        which a subclass may then yield instead of lists (same examples, same order).
        ``allocate(shape, dtype)``: memory for a columnar batch's fixed-length columns (see
        :meth:`loaders.shards.SegmentTable.gather`); call it only while reading the batch that
        is yielded next (the memory belongs to the group being read).
        """
        for stream_indices in schedule.iter_worker(worker, num_workers):
            yield self.read(epoch, stream_indices, schedule, worker, num_workers)

    # -- iteration -------------------------------------------------------------------------
    def iter_batches(self, *, columnar: bool = False) -> Iterator[Sequence[dict[str, Any]]]:
        """This rank's (and, inside a DataLoader worker, this worker's) batches, as example lists
        (or, with ``columnar``, possibly as :class:`~loaders.batch.ExampleBatch` objects)."""
        for group in self.iter_batch_groups(columnar=columnar, group=1):
            yield from group

    def iter_batch_groups(self, *, columnar: bool = False, group: int = 1,
                          allocate: Callable | None = None) -> Iterator[list[Sequence[dict[str, Any]]]]:
        """Like :meth:`iter_batches`, in lists of ``group`` consecutive batches of the rank
        (:attr:`RankSchedule.group`: inside a DataLoader worker, this worker's groups).
        ``allocate``: see :meth:`read_batches` (each group is read when it is asked for)."""
        epoch, start = self._resume_point()
        schedule = RankSchedule(self.epoch_size(), self.world_size, self.rank, self.batch_size, start, self.uneven,
                                self.drop_last, group)
        info = get_worker_info()
        worker, num_workers = (info.id, info.num_workers) if info is not None else (0, 1)
        self.start_iteration()
        batches = self.read_batches(epoch, schedule, worker, num_workers, columnar=columnar, allocate=allocate)
        for batch_ids in schedule.worker_groups(worker, num_workers):
            yield [next(batches) for _ in batch_ids]

    def __iter__(self) -> Iterator[dict[str, Any]]:
        if self._counted_by_loader or get_worker_info() is not None:
            for batch in self.iter_batches():
                yield from batch
            return
        remaining = self.schedule().num_samples
        if remaining == 0:
            self._finish_epoch()
        for batch in self.iter_batches():
            for example in batch:
                remaining -= 1
                if remaining:
                    self._advance(1)
                else:  # the epoch is consumed once its last sample is handed out
                    self._finish_epoch()
                yield example
