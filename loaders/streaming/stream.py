"""The resumable, rank- and worker-aware ``IterableDataset`` base of every loader dataset.

A subclass says how long an epoch is and how to read a batch of global stream indices;
this class owns the rest (see :mod:`loaders.streaming.state` for the split and the state):
``set_epoch``, ``state_dict``/``load_state_dict``, the rank and DataLoader-worker split,
and counting what was consumed.

Counting: iterated directly (or by a DataLoader with ``num_workers=0``) the dataset counts
the samples it hands out. With worker processes only the main process knows what the
trainer received, so use :func:`loaders.streaming.dataloader.make_dataloader`, whose loader counts
the batches it yields and keeps this object's state current (exact whatever the workers).

Passes (see :mod:`loaders.streaming.progress`): a fresh ``iter()`` starts the current epoch from its
beginning unless a state was loaded since the last pass (then it resumes there); a pass that
reads the whole epoch moves to the next one, also through a plain torch ``DataLoader`` with
workers (whose last worker to finish advances the shared epoch). Through such a DataLoader
the main process cannot know how much of a pass the trainer consumed, so ``state_dict()``
refuses while a pass is unfinished. Inside a DataLoader worker ``state_dict()`` is that
worker's own progress through its slice, which is what torchdata's ``StatefulDataLoader``
snapshots and restores per worker: it resumes exactly with the same number of workers.
"""

from __future__ import annotations

import itertools
import os
import sys
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np
from torch.utils.data import IterableDataset, get_worker_info

from loaders.streaming.progress import SharedProgress, WorkerPass
from loaders.streaming.state import UNEVEN_MODES, LoaderState, RankSchedule
from schemas.errors import ConfigError

__all__ = ["ResumableStream", "refuse_plain_trainer", "resolve_topology"]


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


def refuse_plain_trainer(dataset: ResumableStream) -> None:
    """Refuse a plain ``transformers.Trainer`` (one not mixing in
    :class:`~loaders.integrations.hf.LMShardsTrainerMixin`) that is asking ``dataset`` for its
    length or its examples.

    That Trainer trains wrongly without a sign: accelerate re-shards the iterable dataset so that
    under DDP every rank trains on rank 0's stream (or on half of its own), and
    ``remove_unused_columns`` strips ``doc_lengths``, so positions never restart and document
    starts are not masked. The calling Trainer is found on the call stack (a frame whose
    ``self`` is one); transformers is not imported.

    Raises:
        ConfigError: a plain Trainer is the caller (a ValueError: ``Trainer`` takes a TypeError from
            ``len()`` for "no length" and would go on).
    """
    frame = sys._getframe(1)
    while frame is not None:
        owner = frame.f_locals.get("self")
        if owner is not None and owner is not dataset and _is_plain_trainer(owner):
            raise ConfigError(
                f"{type(owner).__name__} cannot train from an lmshards dataset correctly (DDP ranks would share "
                "rank 0's stream, remove_unused_columns strips doc_lengths): use "
                "loaders.integrations.hf.LMShardsTrainer (or mix LMShardsTrainerMixin into your Trainer)")
        frame = frame.f_back


def _is_plain_trainer(owner: Any) -> bool:
    """A ``transformers.Trainer`` without :class:`~loaders.integrations.hf.LMShardsTrainerMixin`, told
    by its classes' names: neither transformers nor the integration is imported."""
    classes = [(cls.__module__, cls.__name__) for cls in type(owner).__mro__]
    if ("loaders.integrations.hf", "LMShardsTrainerMixin") in classes:
        return False
    return any(name == "Trainer" and module.startswith("transformers") for module, name in classes)


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
        self._progress = SharedProgress()  # epoch, samples consumed, pending resume, workers' pass
        self._counted_by_loader = False  # make_dataloader's loader counts what the trainer received
        self._worker_pass: WorkerPass | None = None  # inside a plain DataLoader worker: its current pass
        self._worker_restore: tuple[int, int, int] | None = None  # a worker state loaded for the next pass
        self._worker_passes = 0

    # -- what a subclass provides ---------------------------------------------------------
    def epoch_size(self) -> int:
        """``N``: samples in one epoch's order (before ``drop``/``wrap``)."""
        raise NotImplementedError

    def fingerprint(self) -> str:
        """Digest of everything that shapes the order; a state only loads into equal data."""
        raise NotImplementedError

    def shrunk_file_error(self) -> Exception | None:
        """An error naming a file of this stream that shrank on disk (see
        :meth:`loaders.access.shards.ShardSet.shrunk_file_error`); None here: no files."""
        return None

    def read(self, epoch: int, stream_indices: np.ndarray, schedule: RankSchedule, worker: int,
             num_workers: int) -> list[dict[str, Any]]:
        """Examples at global stream indices of ``epoch``, in that order."""
        raise NotImplementedError

    def start_iteration(self) -> None:
        """Called in the reading process before each pass."""

    # -- epochs and state ------------------------------------------------------------------
    @property
    def epoch(self) -> int:
        return self._progress.get("epoch")

    @property
    def samples_consumed(self) -> int:
        """Global samples of the current epoch consumed so far (all ranks)."""
        return self._progress.get("samples")

    def _next_start(self) -> int:
        """Where the next pass starts: a loaded state's point, else the epoch's beginning."""
        return self._progress.get("samples") if self._progress.get("pending") else 0

    def schedule(self, start: int | None = None) -> RankSchedule:
        """This rank's schedule from ``start`` (default: where the next pass starts)."""
        start = self._next_start() if start is None else start
        return RankSchedule(self.epoch_size(), self.world_size, self.rank, self.batch_size, start, self.uneven,
                            self.drop_last)

    def __len__(self) -> int:
        """Samples this rank yields in its next pass (the rest of the epoch after a loaded state).

        Raises:
            ConfigError: called by a plain ``transformers.Trainer`` (see
                :func:`refuse_plain_trainer`).
        """
        refuse_plain_trainer(self)
        return self.schedule().num_samples

    def set_epoch(self, epoch: int) -> None:
        """Start ``epoch`` from its beginning; a no-op for the current epoch (keeps a loaded resume point)."""
        if not isinstance(epoch, int) or epoch < 0:
            raise ValueError(f"epoch must be an int >= 0, got {epoch!r}")
        if epoch != self.epoch:
            self._progress.set(epoch=epoch, samples=0, pending=0, key=0,
                               generation=self._progress.get("generation") + 1)

    def state_dict(self) -> dict[str, Any]:
        """``{epoch, samples, ...}``: enough to resume exactly (see :class:`~loaders.streaming.state.LoaderState`).

        Inside a DataLoader worker: that worker's progress (``worker`` entry), for torchdata's
        ``StatefulDataLoader``, which saves and restores one state per worker.

        Raises:
            ValueError: in the main process of a plain DataLoader with workers whose pass is not
                finished (what the trainer consumed is only known to the loader: use ``make_dataloader``).
        """
        info = get_worker_info()
        if info is not None and not self._counted_by_loader:
            worker_pass = self._worker_pass or self._join_worker_pass(info)
            state = self._state(worker_pass.epoch, worker_pass.start)
            state["worker"] = {"id": info.id, "num_workers": info.num_workers, "examples": worker_pass.yielded}
            return state
        if not self._counted_by_loader and self._progress.worker_pass_unfinished():
            raise ValueError(
                f"{self.kind}.state_dict(): a DataLoader's worker processes are reading this dataset and only the "
                "loader knows which of their batches the trainer consumed; build the loader with "
                "loaders.make_dataloader (exact with any number of workers) and save loader.state_dict(), "
                "or use num_workers=0"
            )
        return self._state(self.epoch, self.samples_consumed)

    def _state(self, epoch: int, samples: int) -> dict[str, Any]:
        return LoaderState(epoch, samples, self.seed, self.fingerprint(), self.kind, self.world_size,
                           self.batch_size).to_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Resume from :meth:`state_dict` output, possibly saved with other ranks or workers.

        The next pass starts at the saved point (later ones at their epoch's beginning).

        Raises:
            ConfigError: other data, seed or order settings; or consumed samples that are not
                a multiple of the world size (the global batch size changed); a worker's state
                loaded into a worker of another place or worker count.
        """
        parsed = LoaderState.from_dict(state)
        if parsed.kind != self.kind:
            raise ConfigError(f"loader state was saved by a {parsed.kind}, this is a {self.kind}")
        if parsed.fingerprint != self.fingerprint():
            raise ConfigError("loader state was saved for other data or order settings (fingerprint differs)")
        if parsed.seed != self.seed:
            raise ConfigError(f"loader state was saved with seed {parsed.seed}, this dataset has seed {self.seed}")
        RankSchedule(self.epoch_size(), self.world_size, self.rank, self.batch_size, parsed.samples, self.uneven,
                     self.drop_last)  # validates samples % world_size
        worker = state.get("worker")
        info = get_worker_info()
        if worker is not None:
            if info is None or (worker.get("id"), worker.get("num_workers")) != (info.id, info.num_workers):
                where = "the main process" if info is None else f"worker {info.id} of {info.num_workers}"
                raise ConfigError(
                    f"this state is DataLoader worker {worker.get('id')}'s of {worker.get('num_workers')}, "
                    f"loaded into {where}; resume a StatefulDataLoader with the same num_workers, or use "
                    "loaders.make_dataloader, whose state resumes with any number of workers"
                )
            self._worker_restore = (parsed.epoch, parsed.samples, int(worker["examples"]))
            self._worker_pass = None
            return
        self._progress.set(epoch=parsed.epoch, samples=parsed.samples, pending=1, key=0,
                           generation=self._progress.get("generation") + 1)

    def _advance(self, rank_samples: int) -> None:
        self._progress.add("samples", rank_samples * self.world_size)

    def _finish_epoch(self) -> None:
        self._progress.set(epoch=self.epoch + 1, samples=0, pending=0)

    def _begin_pass(self) -> tuple[int, int]:
        """Start a pass counted in this process (direct iteration, or make_dataloader's loader, whose
        workers read its start from the shared block): ``(epoch, start)``."""
        return self._progress.begin_main_pass()

    def _join_worker_pass(self, info: Any) -> WorkerPass:
        self._worker_passes += 1
        restore, self._worker_restore = self._worker_restore, None
        worker_pass = self._progress.join_worker_pass(info.seed - info.id, self._worker_passes, info.num_workers,
                                                      restore)
        self._worker_pass = worker_pass
        if restore is not None:
            # A worker restored after its whole slice is done now: a StatefulDataLoader saved at the end
            # of an epoch never runs its restored workers, and the next pass must be the next epoch.
            schedule = self.schedule(worker_pass.start)
            total = sum(schedule.batch_length(b) for b in schedule.worker_batches(info.id, info.num_workers))
            if worker_pass.yielded >= total:
                self._progress.finish_worker_pass(worker_pass)
        return worker_pass

    def _resume_point(self) -> tuple[int, int, int]:
        """``(epoch, start, examples of this worker's slice already consumed)`` of the pass being read."""
        info = get_worker_info()
        if self._counted_by_loader:  # make_dataloader's loader wrote the pass's start
            return self._progress.get("pass_epoch"), self._progress.get("pass_start"), 0
        if info is not None:
            worker_pass = self._worker_pass or self._join_worker_pass(info)
            return worker_pass.epoch, worker_pass.start, worker_pass.yielded
        return self.epoch, self.samples_consumed, 0

    def read_batches(self, epoch: int, schedule: RankSchedule, worker: int, num_workers: int, *,
                     columnar: bool = False) -> Iterator[Sequence[dict[str, Any]]]:
        """The batches of one worker, in order (default: :meth:`read` of each).

        ``columnar``: the consumer also takes :class:`~loaders.collation.batch.ExampleBatch` batches,
        which a subclass may then yield instead of lists (same examples, same order).
        """
        for stream_indices in schedule.iter_worker(worker, num_workers):
            yield self.read(epoch, stream_indices, schedule, worker, num_workers)

    # -- iteration -------------------------------------------------------------------------
    def iter_batches(self, *, columnar: bool = False) -> Iterator[Sequence[dict[str, Any]]]:
        """This rank's (and, inside a DataLoader worker, this worker's) batches, as example lists
        (or, with ``columnar``, possibly as :class:`~loaders.collation.batch.ExampleBatch` objects)."""
        for group in self.iter_batch_groups(columnar=columnar, group=1):
            yield from group

    def iter_batch_groups(self, *, columnar: bool = False, group: int = 1) -> Iterator[list[Sequence[dict[str, Any]]]]:
        """Like :meth:`iter_batches`, in lists of ``group`` consecutive batches of the rank
        (:attr:`RankSchedule.group`: inside a DataLoader worker, this worker's groups)."""
        epoch, start, consumed = self._resume_point()
        info = get_worker_info()
        worker, num_workers = (info.id, info.num_workers) if info is not None else (0, 1)
        skip_groups, skip_examples = divmod(consumed, self.batch_size * group)
        schedule = RankSchedule(self.epoch_size(), self.world_size, self.rank, self.batch_size, start, self.uneven,
                                self.drop_last, group, skip_groups)
        self.start_iteration()
        batches = self.read_batches(epoch, schedule, worker, num_workers, columnar=columnar)
        for batch_ids in schedule.worker_groups(worker, num_workers):
            out = [next(batches) for _ in batch_ids]
            if skip_examples:  # a restored worker resumes inside its group (StatefulDataLoader)
                out = [list(itertools.chain.from_iterable(out))[skip_examples:]]
                skip_examples = 0
            yield out

    def __iter__(self) -> Iterator[dict[str, Any]]:
        if self._counted_by_loader:  # make_dataloader's loader counts what it hands out
            return self._iter_uncounted()
        refuse_plain_trainer(self)
        if get_worker_info() is not None:
            self._worker_pass = None  # a new pass begins with this iterator (joined on first use)
            return self._iter_worker()
        return self._iter_counted()

    def _iter_uncounted(self) -> Iterator[dict[str, Any]]:
        for batch in self.iter_batches():
            yield from batch

    def _iter_worker(self) -> Iterator[dict[str, Any]]:
        """A plain DataLoader worker's slice of the pass; the last worker to finish ends the epoch."""
        info = get_worker_info()
        worker_pass = self._worker_pass or self._join_worker_pass(info)
        for batch in self.iter_batches():
            for example in batch:
                worker_pass.yielded += 1
                yield example
        self._progress.finish_worker_pass(worker_pass)

    def _iter_counted(self) -> Iterator[dict[str, Any]]:
        _, start = self._begin_pass()
        remaining = self.schedule(start).num_samples
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
