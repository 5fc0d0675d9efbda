"""The global sample order of one epoch: a pure function of (shard rows, seed, epoch).

An epoch visits every row of a split exactly once, in this order:

1. **Shard permutation.** The shards are permuted by a generator seeded with
   ``(seed, epoch)``; their rows, concatenated in that order, form the epoch's *virtual
   sequence* ``0 .. N-1``.
2. **Block shuffle.** The virtual sequence is cut into blocks of ``block_size`` rows (the
   last one shorter). Block ``q`` is permuted by a generator seeded with ``(seed, epoch, q)``.
   Blocks are larger than shards (by default at least four of the largest shard), so a
   block mixes rows of several shards, while the writer already shuffled rows inside each
   shard (docs/design.md section 2, step 6).

Position ``p`` of the epoch is ``virtual = q*B + perm_q[p - q*B]`` with ``q = p // B``, then
the shard holding ``virtual``. Nothing of size ``N`` is ever built: an :class:`EpochOrder`
holds the shard permutation (O(shards)) and at most two block permutations (O(block_size)),
so any position can be located without replaying the epoch. This is the shard-permutation
plus block-window shuffle of MosaicML streaming's ``py1b``/``py1s`` family, seeded only by
(seed, epoch) and never by process, worker or time. With ``shuffle=False`` the order is the
stored order: shards by index, rows as written.

This module is pure numpy: no torch, no I/O.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence

import numpy as np

__all__ = ["DEFAULT_MIN_BLOCK", "EpochOrder", "default_block_size", "seeded_rng"]

#: Smallest default shuffle block (rows); a block's permutation costs 8 bytes per row.
DEFAULT_MIN_BLOCK = 1 << 16

_MASK64 = (1 << 64) - 1
# Purpose tags keep the generators of different uses independent under the same seed.
_TAG_SHARDS = 0x5348415244  # "SHARD"
_TAG_BLOCK = 0x424C4F434B  # "BLOCK"


def seeded_rng(seed: int, tag: int, *words: int) -> np.random.Generator:
    """A generator seeded by ``(seed, tag, *words)`` (all taken modulo 2**64)."""
    return np.random.default_rng([seed & _MASK64, tag & _MASK64, *(int(w) & _MASK64 for w in words)])


def default_block_size(shard_rows: Sequence[int]) -> int:
    """Default shuffle block: four of the largest shard, at least :data:`DEFAULT_MIN_BLOCK` rows."""
    largest = max(shard_rows, default=0)
    return max(4 * largest, DEFAULT_MIN_BLOCK)


class EpochOrder:
    """Where each position of one epoch comes from.

    Args:
        shard_rows: rows of each shard, in shard index order.
        seed: shuffle seed (>= 0).
        epoch: epoch number (>= 0).
        shuffle: False keeps the stored order (no shard permutation, no block shuffle).
        block_size: rows per shuffle block; None for :func:`default_block_size`.

    Raises:
        ValueError: negative seed, epoch or rows, or a block size < 1.
    """

    def __init__(
        self,
        shard_rows: Sequence[int],
        seed: int,
        epoch: int,
        *,
        shuffle: bool = True,
        block_size: int | None = None,
    ):
        rows = np.asarray(list(shard_rows), dtype=np.int64)
        if rows.size and rows.min() < 0:
            raise ValueError(f"shard_rows must be >= 0, got {rows.tolist()}")
        if seed < 0:
            raise ValueError(f"seed must be >= 0, got {seed}")
        if epoch < 0:
            raise ValueError(f"epoch must be >= 0, got {epoch}")
        if block_size is None:
            block_size = default_block_size(rows.tolist())
        if block_size < 1:
            raise ValueError(f"shuffle block_size must be >= 1, got {block_size}")
        self.seed, self.epoch, self.shuffle = seed, epoch, shuffle
        self.num_rows = int(rows.sum())
        self.block_size = int(min(block_size, max(self.num_rows, 1)))
        if shuffle:
            self.shard_sequence = seeded_rng(seed, _TAG_SHARDS, epoch).permutation(rows.size)
        else:
            self.shard_sequence = np.arange(rows.size)
        sequence_rows = rows[self.shard_sequence]
        self._ends = np.cumsum(sequence_rows)
        self._starts = self._ends - sequence_rows
        # virtual start of each shard, by shard index
        self._shard_start = np.empty(rows.size, dtype=np.int64)
        self._shard_start[self.shard_sequence] = self._starts
        self._rows = rows
        self._blocks: OrderedDict[int, np.ndarray] = OrderedDict()

    def __len__(self) -> int:
        return self.num_rows

    def _block_permutation(self, block: int) -> np.ndarray:
        perm = self._blocks.get(block)
        if perm is None:
            start = block * self.block_size
            size = min(self.block_size, self.num_rows - start)
            perm = seeded_rng(self.seed, _TAG_BLOCK, self.epoch, block).permutation(size)
            self._blocks[block] = perm
            if len(self._blocks) > 2:  # a consumer walks blocks forwards; two cover a batch on a boundary
                self._blocks.popitem(last=False)
        else:
            self._blocks.move_to_end(block)
        return perm

    def virtual(self, positions: np.ndarray) -> np.ndarray:
        """Virtual-sequence index of each epoch position."""
        p = np.asarray(positions, dtype=np.int64)
        if p.size and (p.min() < 0 or p.max() >= self.num_rows):
            raise ValueError(f"positions must lie in [0, {self.num_rows}), got {p.min()}..{p.max()}")
        if not self.shuffle or p.size == 0:
            return p.copy()
        blocks = p // self.block_size
        first, last = int(blocks.min()), int(blocks.max())
        if first == last:  # the common case: a batch inside one block
            base = first * self.block_size
            return base + self._block_permutation(first)[p - base]
        out = np.empty_like(p)
        for block in np.flatnonzero(np.bincount(blocks - first)).tolist():  # not np.unique: it imports numpy.ma
            here = blocks == block + first
            base = (block + first) * self.block_size
            out[here] = base + self._block_permutation(block + first)[p[here] - base]
        return out

    def locate(self, positions: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """``(shard index, row in shard)`` arrays of epoch positions (vectorised)."""
        v = self.virtual(positions)
        slot = np.searchsorted(self._ends, v, side="right")
        return self.shard_sequence[slot], v - self._starts[slot]

    def positions_of_shard(self, shard: int) -> tuple[np.ndarray, np.ndarray]:
        """Inverse of :meth:`locate` for one shard: ``(positions, rows)``, sorted by position.

        Costs O(block_size) per block the shard overlaps; used by sequential (tar) readers
        that must know in advance which rows of a shard they will need.
        """
        start = int(self._shard_start[shard])
        stop = start + int(self._rows[shard])
        if start == stop:
            empty = np.zeros(0, dtype=np.int64)
            return empty, empty
        if not self.shuffle:
            positions = np.arange(start, stop, dtype=np.int64)
            return positions, positions - start
        found_positions, found_rows = [], []
        for block in range(start // self.block_size, (stop - 1) // self.block_size + 1):
            base = block * self.block_size
            virtual = base + self._block_permutation(block)
            offsets = np.flatnonzero((virtual >= start) & (virtual < stop))
            found_positions.append(base + offsets)
            found_rows.append(virtual[offsets] - start)
        return np.concatenate(found_positions), np.concatenate(found_rows)
