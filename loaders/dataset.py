"""``ShardedDataset``: a torch ``IterableDataset`` over one split of an lmshards dataset.

It yields examples (dicts of numpy arrays, ints and strings, read-only views into the
memory-mapped Arrow shards) in the epoch's global order (:mod:`loaders.streaming.order`), split
over ranks and DataLoader workers and resumable mid-epoch (:mod:`loaders.streaming.state`),
optionally turning token chunks into examples of another objective on the fly
(:mod:`loaders.dynamic`). Arrow and WebDataset shards of the same dataset give the same
stream. Feed it to :func:`loaders.streaming.dataloader.make_dataloader` for batches of tensors.

When the DataLoader's collator reads whole columns (every collator of :mod:`loaders.collation.collate`
does), local Arrow batches take a columnar fast path: the order of many batches is located
at once, and each batch is gathered from the memory maps straight into one ``(B, L)``
array per fixed-length column (:class:`~loaders.collation.batch.ExampleBatch`), with no per-example
dict. It yields the same examples in the same order as the per-example path.

WebDataset shards can only be read front to back. A worker that needs a row of a tar
shard reads the shard once, keeps every row it will need from it this epoch (it knows
them: the order is a pure function) and drops each row once used; it holds about
``(block_size + 2 * shard rows) / (ranks * workers)`` rows at a time. Arrow needs none
of this and is the format to train from.

Remote datasets (``gs://``, ``s3://``, ...) are read through a bounded local cache
(:mod:`loaders.access.cache`). Before each batch the reader releases the shards outside the
shuffle blocks it is in (their cached files may then be evicted) and, after it, asks a
background thread to download the next ``prefetch_shards`` shards of the epoch order
(then of the next epoch's), so that reading rarely waits for a download. Size the cache
for the shards of two shuffle blocks plus the prefetched ones, or it downloads shards
again (it still never deletes a shard in use).
"""

from __future__ import annotations

import hashlib
import itertools
import json
import os
import re
from collections import OrderedDict
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np

from loaders.access.cache import DEFAULT_CACHE_BYTES, ShardCache
from loaders.access.files import VERIFY_MODES, DatasetLocation
from loaders.access.shards import ShardSet
from loaders.dynamic import DynamicObjective, resolve_objective, special_ids_from_tokenizer
from loaders.errors import UnsupportedSchemaError
from loaders.streaming.order import EpochOrder
from loaders.streaming.state import RankSchedule
from loaders.streaming.stream import ResumableStream
from schemas.examples import example_schema
from transforms.objectives.common import SpecialIds

__all__ = ["ShardedDataset"]


class ShardedDataset(ResumableStream):
    """One split of a dataset directory as a resumable, distributed ``IterableDataset``.

    Args:
        path: dataset directory or URL (``gs://``, ``s3://``, ... through fsspec, cached locally).
        split: ``train``, ``validation``, ...
        batch_size: per-rank batch size (DataLoader workers split by whole batches).
        seed: order seed (shard permutation and block shuffle) and dynamic-noise seed.
        shuffle: False reads shards and rows in stored order.
        shuffle_block_size: rows per shuffle block (None: four of the largest shard, >= 65536).
        fmt: ``arrow`` or ``webdataset`` (None: arrow when written).
        rank, world_size: None detects them from torch.distributed (or ``RANK``/``WORLD_SIZE``).
        uneven: ``wrap`` or ``drop``: how every rank gets the same number of samples.
        drop_last: drop each rank's last partial batch.
        verify: shard sha256 check: ``once`` per process, ``always`` (every epoch), ``never``.
        columns: columns to read (None: all).
        objective: dynamic noise: an objective name (registry) or object applied to token chunks.
        objective_params: parameters of a named objective; its length (``seq_len`` or
            ``inputs_length``) defaults to what fits the stored chunks, not to the objective's default.
        special: special ids for the objective (None: from the dataset's tokenizer.json).
        cache_dir: local cache for remote datasets (default ``~/.cache/lmshards``).
        cache_size_bytes: bound of ``cache_dir`` in bytes (None: unbounded); least recently used
            shards no process is reading are evicted.
        prefetch_shards: remote datasets: next shards downloaded in the background (0: none).
        storage_options: ``fsspec`` filesystem options of a remote dataset (credentials, endpoint).

    Raises:
        FileNotFoundError: no manifest (missing or incomplete dataset), or a shard or the
            tokenizer it lists missing.
        ShardIntegrityError: a damaged manifest, a shard whose size is not the manifest's, a
            tokenizer whose sha256 is not (the examples' ids mean what that tokenizer says).
        ValueError: bad arguments, split or format.
        UnsupportedSchemaError: an objective that cannot run on this dataset.
    """

    kind = "ShardedDataset"

    def __init__(
        self,
        path: str,
        split: str = "train",
        *,
        batch_size: int = 1,
        seed: int = 0,
        shuffle: bool = True,
        shuffle_block_size: int | None = None,
        fmt: str | None = None,
        rank: int | None = None,
        world_size: int | None = None,
        uneven: str = "wrap",
        drop_last: bool = False,
        verify: str = "once",
        columns: list[str] | None = None,
        objective: Any = None,
        objective_params: dict[str, Any] | None = None,
        special: SpecialIds | None = None,
        cache_dir: str | None = None,
        cache_size_bytes: int | None = DEFAULT_CACHE_BYTES,
        prefetch_shards: int = 2,
        storage_options: dict[str, Any] | None = None,
    ):
        super().__init__(batch_size=batch_size, seed=seed, rank=rank, world_size=world_size, uneven=uneven,
                         drop_last=drop_last)
        if verify not in VERIFY_MODES:
            raise ValueError(f"verify={verify!r}: expected one of {VERIFY_MODES}")
        self.location = DatasetLocation(path, cache_dir, cache_size_bytes=cache_size_bytes,
                                        storage_options=storage_options)
        self.manifest = self.location.read_manifest()
        self.location.check_tokenizer(self.manifest, verify=verify)
        self.split = split
        self.shards = ShardSet(self.location, self.manifest, split, fmt, verify, prefetch_shards)
        self.shuffle = shuffle
        self.shuffle_block_size = shuffle_block_size
        self.stored_family = self.manifest.schema.get("family")
        unknown = sorted(set(columns or ()) - set(self.shards.columns))
        if unknown:
            raise UnsupportedSchemaError(f"columns {unknown} are not in {path}; it has {sorted(self.shards.columns)}")
        if columns and objective is not None:  # the objective needs the key (noise seed) and the tokens
            columns = list(dict.fromkeys([*columns, *(c for c in ("key", "input_ids", "doc_lengths")
                                                      if c in self.shards.columns)]))
        self.columns = tuple(columns) if columns else None
        self.objective = None
        self._dynamic: DynamicObjective | None = None
        if objective is not None:
            self.objective = resolve_objective(objective, objective_params, self.stored_seq_len)
            if special is None:
                special = special_ids_from_tokenizer(self.location.tokenizer_file(self.manifest, verify=verify),
                                                     self.manifest.tokenizer, self.objective)
            self._dynamic = DynamicObjective(self.objective, special, seed, family=self.stored_family,
                                             seq_len=self.stored_seq_len)
        self._orders: OrderedDict[int, EpochOrder] = OrderedDict()
        self._tar_rows: dict[int, dict[int, list]] = {}
        self._tar_epoch: tuple[int, int] | None = None
        self._tar_done: set[int] = set()
        self._slots: tuple[int, np.ndarray, np.ndarray] | None = None

    def __getstate__(self):
        state = dict(self.__dict__)
        state["_orders"], state["_tar_rows"], state["_tar_epoch"] = OrderedDict(), {}, None  # rebuilt per process
        state["_tar_done"], state["_slots"] = set(), None
        return state

    @property
    def cache(self) -> ShardCache | None:
        """The local cache of a remote dataset (None for a local one); ``cache.stats`` counts its work."""
        return self.location.cache

    # -- description -----------------------------------------------------------------------
    @property
    def stored_seq_len(self) -> int | None:
        """Fixed length of the stored ``input_ids`` (None when variable or absent)."""
        match = re.search(r"\[(\d+)\]$", self.shards.columns.get("input_ids", ""))
        return int(match.group(1)) if match else None

    @property
    def family(self) -> str:
        """Family of the examples this dataset yields (the objective's, in dynamic mode)."""
        return self.objective.family if self.objective is not None else self.stored_family

    @property
    def objective_name(self) -> str | None:
        """Objective of the examples this dataset yields (the dynamic one, else the stored one)."""
        return self.objective.name if self.objective is not None else self.manifest.objective.get("name")

    def example_columns(self) -> tuple[str, ...]:
        """Columns of the examples this dataset yields."""
        if self.objective is None:
            return tuple(self.columns or self.shards.columns)
        return tuple(example_schema(self.objective.family, **self.objective.schema_kwargs()).schema.names)

    @property
    def special_ids(self) -> dict[str, int]:
        """Role -> token id of the dataset's tokenizer (pad, eos, ...)."""
        return dict(self.manifest.tokenizer.get("special_ids", {}))

    def epoch_size(self) -> int:
        return sum(self.shards.rows)

    def shrunk_file_error(self) -> Exception | None:
        return self.shards.shrunk_file_error()

    def fingerprint(self) -> str:
        data = {
            "split": self.split,
            "shards": [s.to_json() for s in self.shards.shards],
            "shuffle": self.shuffle,
            "block": self.order(0).block_size,
            "objective": None if self.objective is None else [self.objective.name, self.objective.params()],
        }
        return hashlib.blake2b(json.dumps(data, sort_keys=True).encode(), digest_size=16).hexdigest()

    def order(self, epoch: int) -> EpochOrder:
        """The global order of ``epoch`` (cached for the last two epochs)."""
        order = self._orders.get(epoch)
        if order is None:
            order = EpochOrder(self.shards.rows, self.seed, epoch, shuffle=self.shuffle,
                               block_size=self.shuffle_block_size)
            self._orders[epoch] = order
            if len(self._orders) > 2:
                self._orders.popitem(last=False)
        return order

    # -- reading ---------------------------------------------------------------------------
    def start_iteration(self) -> None:
        self.shards.start_epoch()
        self._tar_rows, self._tar_epoch, self._tar_done = {}, None, set()

    def _cache_plan(self, epoch: int, order: EpochOrder, positions: np.ndarray):
        """Remote datasets: the shards of the shuffle blocks ``positions`` fall in, and the
        shards the reader needs next (lazily: the rest of this epoch's order, then the next epoch's)."""
        if self._slots is None or self._slots[0] != epoch:
            rows = np.asarray(self.shards.rows, dtype=np.int64)[order.shard_sequence]
            ends = np.cumsum(rows)
            self._slots = (epoch, ends - rows, ends)
        _, starts, ends = self._slots
        block = order.block_size
        low = int(positions.min()) // block * block
        high = (int(positions.max()) // block + 1) * block
        first = int(np.searchsorted(ends, low, side="right"))
        last = int(np.searchsorted(starts, high, side="left"))
        sequence = order.shard_sequence
        current = sequence[first:last].tolist()

        def upcoming():
            done = self._tar_done  # tar shards already read this epoch
            yield from (index for index in sequence[first:].tolist() if index not in done)
            yield from self.order(epoch + 1).shard_sequence.tolist()

        return current, upcoming()

    def read_rows(self, shard_ids: np.ndarray, rows: np.ndarray) -> list[dict[str, Any]]:
        """Stored examples at ``(shard, row)`` pairs (Arrow only), in the given order."""
        opened: dict[int, tuple[Any, list]] = {}
        out = []
        for shard, row in zip(shard_ids.tolist(), rows.tolist(), strict=True):
            found = opened.get(shard)
            if found is None:
                arrow = self.shards.arrow(shard)
                arrow.check_intact()  # a file that shrank under its mapping: an error, not a SIGBUS below
                found = opened[shard] = (arrow, arrow.fields(self.columns))
            out.append(found[0].row(row, found[1]))
        return out

    def transform(self, examples: list[dict[str, Any]], noise_epoch: int | np.ndarray) -> list[dict[str, Any]]:
        """Apply the dynamic objective (if any); ``noise_epoch`` seeds the noise."""
        if self._dynamic is None:
            return examples
        epochs = np.broadcast_to(np.asarray(noise_epoch), (len(examples),)).tolist()
        return [self._dynamic(example, epoch) for example, epoch in zip(examples, epochs, strict=True)]

    def read(self, epoch: int, stream_indices: np.ndarray, schedule: RankSchedule, worker: int,
             num_workers: int) -> list[dict[str, Any]]:
        order = self.order(epoch)
        positions = schedule.positions(stream_indices)
        shard_ids, rows = order.locate(positions)
        plan = self._cache_plan(epoch, order, positions) if self.location.remote and positions.size else None
        if plan is not None:
            self.shards.plan(plan[0])  # release the shards this reader is past
        if self.shards.fmt == "arrow":
            examples = self.read_rows(shard_ids, rows)
        else:
            examples = self._read_tar(epoch, shard_ids, rows, schedule, worker, num_workers)
        if plan is not None:
            self.shards.plan(plan[0], plan[1])  # fetch the next ones while this batch is used
        return self.transform(examples, epoch)

    #: Batches whose order is located at once on the columnar path (amortises the numpy calls).
    CHUNK_BATCHES = 64

    @property
    def columnar(self) -> bool:
        """Whether batches can be gathered by column (:class:`~loaders.collation.batch.ExampleBatch`):
        local Arrow shards without a dynamic objective."""
        return self.shards.fmt == "arrow" and self._dynamic is None and not self.location.remote

    def read_batches(self, epoch: int, schedule: RankSchedule, worker: int, num_workers: int, *,
                     columnar: bool = False) -> Iterator[Sequence[dict[str, Any]]]:
        if not (columnar and self.columnar):
            yield from super().read_batches(epoch, schedule, worker, num_workers)
            return
        # The columnar fast path: the order of CHUNK_BATCHES batches is located with a few
        # vectorised calls, then each batch is gathered column by column from the memory maps.
        order = self.order(epoch)
        columns = self.columns or tuple(self.shards.columns)
        batches = schedule.worker_batches(worker, num_workers)
        while chunk := list(itertools.islice(batches, self.CHUNK_BATCHES)):
            stream_indices, lengths = schedule.batches_stream_indices(chunk)
            shard_ids, rows = order.locate(schedule.positions(stream_indices))
            segments, local = self.shards.segments(shard_ids, rows)
            start = 0
            for length in lengths:
                yield self.shards.gather(segments[start : start + length], local[start : start + length], columns)
                start += length

    def _read_tar(self, epoch, shard_ids, rows, schedule, worker, num_workers) -> list[dict[str, Any]]:
        if self._tar_epoch != (epoch, os.getpid()):
            self._tar_rows, self._tar_epoch, self._tar_done = {}, (epoch, os.getpid()), set()
        out = []
        for shard, row in zip(shard_ids.tolist(), rows.tolist(), strict=True):
            cached = self._tar_rows.get(shard)
            if cached is None:
                cached = self._load_tar_shard(epoch, shard, schedule, worker, num_workers)
                self._tar_rows[shard] = cached
                self._tar_done.add(shard)
            entry = cached[row]  # [example, uses left]
            entry[1] -= 1
            if entry[1] == 0:
                del cached[row]
                if not cached:
                    del self._tar_rows[shard]
            example = entry[0]
            out.append({k: v for k, v in example.items() if k in self.columns} if self.columns else example)
        return out

    def _load_tar_shard(self, epoch, shard, schedule, worker, num_workers) -> dict[int, list]:
        """Read from tar shard ``shard`` every row this worker will use in the rest of the epoch."""
        positions, rows = self.order(epoch).positions_of_shard(shard)
        uses: dict[int, int] = {}
        for lap in range(-(-schedule.total // max(schedule.epoch_size, 1))):  # wrap reads a position twice
            stream = positions + lap * schedule.epoch_size
            for row in rows[schedule.owned_by(stream, worker, num_workers)].tolist():
                uses[row] = uses.get(row, 0) + 1
        examples = self.shards.tar_rows(shard, set(uses))
        return {row: [examples[row], count] for row, count in uses.items()}
