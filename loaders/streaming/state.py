"""Who reads which sample: the rank/worker split of an epoch and the resumable state.

The split is built so that resuming never depends on the topology (pure Python/numpy,
no torch):

- An epoch is one **global stream** ``g = 0, 1, ..., T-1`` over the epoch order (positions
  ``g mod N``). Every rank yields the same count ``n``: ``N // W`` (``uneven="drop"``, the
  tail of the shuffled order is skipped) or ``ceil(N / W)`` (``"wrap"``, the first positions
  are read again), so ``T = n * W`` and DDP never waits on a rank that ran dry.
- Rank ``r`` of ``W`` reads ``g = start + r + j*W`` for ``j = 0, 1, ...`` (strided).
  Each rank's local batch ``k`` is its samples ``j in [k*b, (k+1)*b)``, so global step ``s``
  consumes exactly ``g in [s*W*b, (s+1)*W*b)`` whatever ``W`` and ``b`` are, as long as
  ``W*b`` (the global batch size) is kept.
- DataLoader worker ``w`` of ``K`` produces the rank's batches ``k = w, w+K, ...``; PyTorch
  collects worker batches round-robin, so the rank's stream does not depend on ``K``. The
  loader of :mod:`loaders.streaming.dataloader` hands batches over in groups of ``G`` consecutive ones
  (``RankSchedule.group``): worker ``w`` then produces groups ``c = w, w+K, ...``, i.e. the
  batches ``c*G .. c*G+G-1``; again the rank's stream depends on neither ``K`` nor ``G``.
- The state is only ``(epoch, samples)``: ``samples`` global samples of the epoch already
  consumed (``= W * samples consumed per rank``). Resuming with another ``W'`` or ``K'``
  restarts the stream at ``g = samples``, which only needs ``samples % W' == 0`` (true
  when the global batch size is kept). Like MosaicML streaming's elastic resumption, and
  unlike replay-based loaders, resuming costs O(1).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from schemas.errors import ConfigError

__all__ = ["STATE_VERSION", "UNEVEN_MODES", "LoaderState", "RankSchedule", "samples_per_rank"]

UNEVEN_MODES = ("drop", "wrap")
STATE_VERSION = 1


def samples_per_rank(epoch_size: int, world_size: int, uneven: str) -> int:
    """Samples every rank yields in a full epoch of ``epoch_size`` samples."""
    if uneven not in UNEVEN_MODES:
        raise ValueError(f"uneven={uneven!r}: expected one of {UNEVEN_MODES}")
    if world_size < 1:
        raise ValueError(f"world_size must be >= 1, got {world_size}")
    if uneven == "drop":
        return epoch_size // world_size
    return -(-epoch_size // world_size)


@dataclass(frozen=True)
class RankSchedule:
    """The batches one rank reads in one epoch, from a resume point on.

    Attributes:
        epoch_size: ``N``, positions in the epoch order.
        world_size: ``W``.
        rank: ``r``.
        batch_size: per-rank batch size ``b``.
        start: global samples of the epoch already consumed (multiple of ``W``).
        uneven: ``drop`` or ``wrap``.
        drop_last: drop the rank's last partial batch.
        group: DataLoader workers take groups of this many consecutive batches (round-robin).
        skip_groups: groups each worker already produced in this pass (a restored worker resumes
            after them).
    """

    epoch_size: int
    world_size: int
    rank: int
    batch_size: int
    start: int = 0
    uneven: str = "wrap"
    drop_last: bool = False
    group: int = 1
    skip_groups: int = 0

    def __post_init__(self):
        if not 0 <= self.rank < self.world_size:
            raise ValueError(f"rank {self.rank} out of range for world_size {self.world_size}")
        if self.batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {self.batch_size}")
        if self.group < 1:
            raise ValueError(f"group must be >= 1, got {self.group}")
        if self.start < 0 or self.start % self.world_size:
            raise ConfigError(
                f"cannot resume at global sample {self.start} with world_size {self.world_size}: it is not a multiple "
                "of the world size; resume with the same global batch size (world_size * batch_size)"
            )

    @property
    def total(self) -> int:
        """``T``: global samples in the epoch (all ranks)."""
        return samples_per_rank(self.epoch_size, self.world_size, self.uneven) * self.world_size

    @property
    def num_samples(self) -> int:
        """Samples this rank still yields in the epoch."""
        remaining = max(self.total - self.start, 0) // self.world_size
        if self.drop_last:
            remaining -= remaining % self.batch_size
        return remaining

    @property
    def num_batches(self) -> int:
        return -(-self.num_samples // self.batch_size)

    def batch_length(self, batch: int) -> int:
        """Samples in the rank's batch ``batch`` (only the last one may be short)."""
        return max(0, min(self.batch_size, self.num_samples - batch * self.batch_size))

    def batch_stream_indices(self, batch: int) -> np.ndarray:
        """Global stream indices ``g`` of the rank's batch ``batch``."""
        first = batch * self.batch_size
        j = np.arange(first, first + self.batch_length(batch), dtype=np.int64)
        return self.start + self.rank + j * self.world_size

    def batches_stream_indices(self, batches: Sequence[int]) -> tuple[np.ndarray, list[int]]:
        """Global stream indices of several of the rank's batches at once, concatenated, and
        each batch's length (the same as :meth:`batch_stream_indices` of each, vectorised)."""
        lengths = [self.batch_length(b) for b in batches]
        first = np.asarray(batches, dtype=np.int64) * self.batch_size
        j = (first[:, None] + np.arange(self.batch_size, dtype=np.int64)[None, :]).reshape(-1)
        if sum(lengths) < j.size:  # a short (last) batch
            keep = np.arange(self.batch_size)[None, :] < np.asarray(lengths, dtype=np.int64)[:, None]
            j = j[keep.reshape(-1)]
        return self.start + self.rank + j * self.world_size, lengths

    def positions(self, stream_indices: np.ndarray) -> np.ndarray:
        """Epoch-order positions of global stream indices (``wrap`` reads the start again)."""
        return np.asarray(stream_indices, dtype=np.int64) % max(self.epoch_size, 1)

    def worker_groups(self, worker: int, num_workers: int) -> Iterator[range]:
        """The groups of the rank's batches that DataLoader worker ``worker`` of ``num_workers``
        produces, in order (each a range of batches; ``group`` 1: one batch each)."""
        if not 0 <= worker < max(num_workers, 1):
            raise ValueError(f"worker {worker} out of range for {num_workers} workers")
        size, total, workers = self.group, self.num_batches, max(num_workers, 1)
        return (range(c * size, min(c * size + size, total))
                for c in range(worker + self.skip_groups * workers, -(-total // size), workers))

    def worker_batches(self, worker: int, num_workers: int) -> Iterator[int]:
        """The rank's batches that DataLoader worker ``worker`` of ``num_workers`` produces, in order."""
        if self.group == 1:
            if not 0 <= worker < max(num_workers, 1):
                raise ValueError(f"worker {worker} out of range for {num_workers} workers")
            workers = max(num_workers, 1)
            return iter(range(worker + self.skip_groups * workers, self.num_batches, workers))
        return (batch for batches in self.worker_groups(worker, num_workers) for batch in batches)

    def iter_worker(self, worker: int, num_workers: int) -> Iterator[np.ndarray]:
        """Global stream indices of each batch of one worker, in order."""
        for batch in self.worker_batches(worker, num_workers):
            yield self.batch_stream_indices(batch)

    def owned_by(self, stream_indices: np.ndarray, worker: int, num_workers: int) -> np.ndarray:
        """Boolean mask: which global stream indices this rank's worker will read."""
        g = np.asarray(stream_indices, dtype=np.int64)
        offset = g - self.start - self.rank
        j = offset // self.world_size
        mine = (offset >= 0) & (offset % self.world_size == 0) & (j < self.num_samples)
        group = j // self.batch_size // self.group
        workers = max(num_workers, 1)
        return mine & (group % workers == worker) & (group >= self.skip_groups * workers)


@dataclass(frozen=True)
class LoaderState:
    """Resumable state of a loader (what ``state_dict()`` returns, as a dict).

    Attributes:
        epoch: current epoch.
        samples: global samples of the epoch consumed (all ranks together).
        seed: shuffle seed.
        fingerprint: digest of the data (shards and sources); loading into other data fails.
        kind: class of the dataset that wrote it.
        world_size: world size when saved (informational).
        batch_size: per-rank batch size when saved (informational).
        version: format version.
    """

    epoch: int
    samples: int
    seed: int
    fingerprint: str
    kind: str
    world_size: int
    batch_size: int
    version: int = STATE_VERSION

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> LoaderState:
        """Parse a state dict.

        Raises:
            ConfigError: missing fields or an unknown version (a ``ValueError``).
        """
        if not isinstance(data, dict):
            raise ConfigError(f"state must be a dict, got {type(data).__name__}")
        version = data.get("version")
        if version != STATE_VERSION:
            raise ConfigError(f"unsupported loader state version {version!r}; expected {STATE_VERSION}")
        missing = sorted(set(cls.__dataclass_fields__) - set(data))
        if missing:
            raise ConfigError(f"loader state is missing {missing}")
        return cls(**{name: data[name] for name in cls.__dataclass_fields__})
