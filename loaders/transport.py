"""Handing collated batches from DataLoader workers to the main process.

torch sends every tensor a worker returns through a new shared-memory segment: the worker
creates and fills it, passes its file descriptor over a socket, and the main process maps
it; that costs the order of a millisecond per tensor, more than gathering the batch. Here
each worker instead keeps a ring of ``slots`` in one shared-memory arena, created once per
pass and sent (the torch way) with the worker's first group of batches. A group's tensors
are copied into the next slot and only a small description (offsets, dtypes, shapes) goes
through the DataLoader's queue.

The main process hands out tensors that are views of the slot, like torch's own transfer
hands out tensors backed by shared memory, and releases the slot (in the arena's header)
once every tensor of the group is gone: a worker never writes a slot that the trainer can
still see. With ``pin_memory`` it copies each batch into pinned memory instead (the copy
torch's pinning thread would make) and releases the slot at once.

A worker never waits: when its next slot is not released yet (the trainer keeps batches,
or the DataLoader prefetches deeper than the ring), when a group does not fit a slot, or
holds tensors that cannot go there (not CPU, not strided, requiring grad), that group
travels the ordinary torch way.
"""

from __future__ import annotations

import itertools
import os
import threading
import weakref
from typing import Any

import numpy as np
import torch

__all__ = ["RingReceiver", "RingSender"]

_ALIGN = 64
_ids = itertools.count()


class _Ref:
    """Where a tensor was in a batch's structure: its index in the batch's tensor list."""

    __slots__ = ("index",)

    def __init__(self, index: int):
        self.index = index

    def __reduce__(self):
        return _Ref, (self.index,)


def _flatten(obj: Any, tensors: list[torch.Tensor]) -> Any:
    """``obj`` with each tensor replaced by a :class:`_Ref` (dicts, lists and tuples walked)."""
    if isinstance(obj, torch.Tensor):
        tensors.append(obj)
        return _Ref(len(tensors) - 1)
    if type(obj) is dict:
        return {key: _flatten(value, tensors) for key, value in obj.items()}
    if type(obj) is list:
        return [_flatten(value, tensors) for value in obj]
    if type(obj) is tuple:
        return tuple(_flatten(value, tensors) for value in obj)
    return obj


def _rebuild(obj: Any, tensors: list[torch.Tensor]) -> Any:
    if isinstance(obj, _Ref):
        return tensors[obj.index]
    if type(obj) is dict:
        return {key: _rebuild(value, tensors) for key, value in obj.items()}
    if type(obj) is list:
        return [_rebuild(value, tensors) for value in obj]
    if type(obj) is tuple:
        return tuple(_rebuild(value, tensors) for value in obj)
    return obj


def _movable(tensor: torch.Tensor) -> bool:
    return tensor.device.type == "cpu" and tensor.layout == torch.strided and not tensor.requires_grad


def _as_bytes(tensor: torch.Tensor) -> Any:
    """A tensor's bytes as a flat numpy uint8 array (a view when contiguous).

    Copies go through numpy: one plain memcpy, where torch's copy of a large tensor may
    start its intra-op thread pool, which on a busy host costs far more than the copy.
    """
    return tensor.contiguous().reshape(-1).view(torch.uint8).numpy()


def _aligned(nbytes: int) -> int:
    return -(-nbytes // _ALIGN) * _ALIGN


def _header_bytes(slots: int) -> int:
    """The arena's header: per slot, one int64: 1 + the number of the last group released from it
    (groups are numbered per worker and pass)."""
    return _aligned(8 * slots)


class RingSender:
    """Worker side: packs groups of collated batches into a ring of shared-memory slots.

    Args:
        worker: this DataLoader worker's id.
        slots: slots in the ring.
    """

    def __init__(self, worker: int, slots: int):
        if slots < 2:
            raise ValueError(f"a ring needs >= 2 slots, got {slots}")
        self.worker, self.slots = worker, slots
        self.arena: torch.Tensor | None = None
        self.arena_id = f"{os.getpid()}-{next(_ids)}"
        self.slot_bytes = 0
        self.sent = 0  # groups sent through the ring
        self._announced = False
        self._last = [-1] * slots  # the group each slot holds (-1: none yet)

    def _free_slot(self) -> int | None:
        """A slot whose group the main process released (round robin from the oldest); None: all in use."""
        for step in range(self.slots):
            slot = (self.sent + step) % self.slots
            group = self._last[slot]
            if group < 0 or int(self._released[slot]) == group + 1:
                return slot
        return None

    def pack(self, batches: list[Any]) -> tuple:
        """A DataLoader item for ``batches``: a ring descriptor, or ``("plain", batches)``."""
        entries, total = [], 0
        for batch in batches:
            tensors: list[torch.Tensor] = []
            structure = _flatten(batch, tensors)
            if not all(_movable(t) for t in tensors):
                return ("plain", batches)
            refs, offset = [], 0
            for tensor in tensors:
                nbytes = tensor.numel() * tensor.element_size()
                refs.append((offset, nbytes, tensor.dtype, tuple(tensor.shape)))
                offset += _aligned(nbytes)
            entries.append((total, offset, structure, refs, tensors))
            total += offset
        if total == 0:
            return ("plain", batches)
        if self.arena is None:
            self.slot_bytes = _aligned(total + total // 4 + (1 << 16))
            try:
                header = _header_bytes(self.slots)
                self.arena = torch.zeros(header + self.slots * self.slot_bytes, dtype=torch.uint8).share_memory_()
                self._bytes = self.arena.numpy()
                self._released = self._bytes[:header].view(np.int64)
            except RuntimeError:  # no room in shared memory: stay with torch's transfer
                self.slot_bytes = -1
        slot = self._free_slot() if self.arena is not None and total <= self.slot_bytes else None
        if slot is None:
            return ("plain", batches)
        base = _header_bytes(self.slots) + slot * self.slot_bytes
        described = []
        for start, _, structure, refs, tensors in entries:
            for (offset, nbytes, _, _), tensor in zip(refs, tensors, strict=True):
                at = base + start + offset
                self._bytes[at : at + nbytes] = _as_bytes(tensor)
            described.append((start, entries_size(refs), structure, refs))
        arena = None if self._announced else self.arena
        self._announced = True
        item = ("ring", self.worker, self.arena_id, arena, self.sent, slot, base, described)
        self._last[slot] = self.sent
        self.sent += 1
        return item


def entries_size(refs: list[tuple]) -> int:
    """Bytes a batch's tensors span in a slot."""
    return refs[-1][0] + refs[-1][1] if refs else 0


class RingReceiver:
    """Main-process side: turns the items of :class:`RingSender` back into batches.

    Args:
        pin_memory: copy batches out into pinned memory (and pin batches sent the torch way);
            otherwise batches are views of the ring, and a slot is released when they are gone.
    """

    def __init__(self, pin_memory: bool = False):
        self.pin_memory = pin_memory
        self._arenas: dict[int, tuple[str, torch.Tensor, np.ndarray]] = {}
        self._lock = threading.Lock()  # the last view of a group may die in any thread
        self._alive: dict[tuple[int, int], int] = {}  # (worker, group) -> batches still referenced
        self.stats = {"ring": 0, "plain": 0}  # groups received each way

    def _release(self, released: np.ndarray, worker: int, group: int, slot: int) -> None:
        with self._lock:
            left = self._alive[worker, group] - 1
            if left:
                self._alive[worker, group] = left
                return
            del self._alive[worker, group]
        released[slot] = group + 1  # the worker may write the slot again

    def unpack(self, item: tuple) -> list[Any]:
        if item[0] == "plain":
            self.stats["plain"] += 1
            batches = item[1]
            if self.pin_memory:
                from torch.utils.data._utils.pin_memory import pin_memory

                batches = pin_memory(batches)
            return batches
        _, worker, arena_id, arena, group, slot, base, described = item
        if arena is not None:
            self._arenas[worker] = (arena_id, arena, arena.numpy())
        known_id, arena, source = self._arenas[worker]
        if known_id != arena_id:
            raise RuntimeError(f"DataLoader worker {worker}: batch from an unknown shared-memory ring")
        released = source[: 8 * (slot + 1)].view(np.int64)
        out = []
        if not self.pin_memory:
            self._alive[worker, group] = len(described)
        for start, nbytes, structure, refs in described:
            region = source[base + start : base + start + nbytes]
            if self.pin_memory:
                own = torch.empty(nbytes, dtype=torch.uint8, pin_memory=True)
                own.numpy()[:] = region
            else:  # a view: the slot is released once the batch's tensors are all gone
                own = torch.from_numpy(region)
                weakref.finalize(region, self._release, released, worker, group, slot)
            tensors = [own[offset : offset + size].view(dtype).view(shape) for offset, size, dtype, shape in refs]
            out.append(_rebuild(structure, tensors))
        if self.pin_memory:
            released[slot] = group + 1
        self.stats["ring"] += 1
        return out
