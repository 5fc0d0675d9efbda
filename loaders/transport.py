"""Handing collated batches from DataLoader workers to the main process.

torch sends every tensor a worker returns through a new shared-memory segment: the worker
creates and fills it, passes its file descriptor over a socket, and the main process maps
it; that costs the order of a millisecond per tensor, more than gathering the batch. Here
each worker instead keeps a ring of ``slots`` in one shared-memory arena, created once per
pass and sent (the torch way) with the worker's first group of batches. A group's tensors
are placed in the next slot and only a small description (offsets, dtypes, shapes) goes
through the DataLoader's queue.

A worker may *reserve* the slot of its next group before reading it
(:meth:`RingSender.reserve`): the columnar gathers then write the batch's rows straight into
the slot (:meth:`RingSender.allocate`), and a collated tensor that already lies there (a
column returned as gathered, as :class:`~loaders.collate.StackCollator` does) is not copied
again. Other tensors are copied in behind them, column by column.

The main process hands out tensors that are views of the slot, like torch's own transfer
hands out tensors backed by shared memory: one view of the group's bytes, and per column one
``(batches, ...)`` view split into the batches' tensors. It releases the slot (in the
arena's header) once every tensor of the group is gone: a worker never writes a slot that
the trainer can still see. With ``pin_memory`` it copies the group into pinned memory
instead (the copy torch's pinning thread would make) and releases the slot at once.

A worker never waits: when its next slot is not released yet (the trainer keeps batches,
or the DataLoader prefetches deeper than the ring), when a group does not fit a slot, or
holds tensors that cannot go there (not CPU, not strided, requiring grad), that group
travels the ordinary torch way (tensors that were gathered into the slot are copied out
first).
"""

from __future__ import annotations

import itertools
import math
import os
import weakref
from typing import Any

import numpy as np
import torch

__all__ = ["RingReceiver", "RingSender"]

_ALIGN = 64
_ids = itertools.count()


class _Ref:
    """Where a tensor was in a batch's structure: its index in the group's tensor list."""

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
    if type(obj) is dict:  # (a flat dict of tensors without a call per value)
        return {key: tensors[value.index] if type(value) is _Ref else _rebuild(value, tensors)
                for key, value in obj.items()}
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


def _shared_bytes(nbytes: int) -> torch.Tensor:
    """A zeroed uint8 tensor of ``nbytes`` in shared memory (created there: no copy)."""
    try:
        storage = torch.UntypedStorage._new_shared(nbytes)
        return torch.empty(0, dtype=torch.uint8).set_(storage)
    except (AttributeError, TypeError):  # a torch without the private constructor
        return torch.zeros(nbytes, dtype=torch.uint8).share_memory_()


class RingSender:
    """Worker side: packs groups of collated batches into a ring of shared-memory slots.

    Per group: :meth:`reserve` (optional), read the group (its gathers may :meth:`allocate`
    in the reserved slot), collate, :meth:`pack`.

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
        self._slot: int | None = None  # the reserved slot
        self._used = 0  # bytes allocated in it
        self._demand = 0  # bytes asked of allocate() since the reservation

    def _free_slot(self) -> int | None:
        """A slot whose group the main process released (round robin from the oldest); None: all in use."""
        for step in range(self.slots):
            slot = (self.sent + step) % self.slots
            group = self._last[slot]
            if group < 0 or int(self._released[slot]) == group + 1:
                return slot
        return None

    def _base(self, slot: int) -> int:
        return _header_bytes(self.slots) + slot * self.slot_bytes

    def reserve(self) -> None:
        """Start a group: take a free slot (if any) for :meth:`allocate` until the next :meth:`pack`."""
        self._slot = self._free_slot() if self.arena is not None else None
        self._used = self._demand = 0

    def allocate(self, shape: tuple[int, ...], dtype: Any) -> np.ndarray | None:
        """An uninitialised C-contiguous array in the reserved slot; None: no slot or no room there.

        Only the group being read may use it: its slot is sent with the group.
        """
        dtype = np.dtype(dtype)
        nbytes = math.prod(shape) * dtype.itemsize
        self._demand += _aligned(nbytes)
        if self._slot is None or self._used + nbytes > self.slot_bytes or dtype.hasobject:
            return None
        at = self._base(self._slot) + self._used
        self._used += _aligned(nbytes)
        return self._bytes[at : at + nbytes].view(dtype).reshape(shape)

    def _plain(self, batches: list[Any], resident: tuple[int, int] | None) -> tuple:
        """``("plain", batches)``, with copies of the tensors that lie in the slot ``[start, end)``."""
        if resident is None or resident[0] == resident[1]:
            return ("plain", batches)
        start, end = resident

        def own(tensor: torch.Tensor) -> torch.Tensor:
            ptr = tensor.data_ptr()
            return tensor.clone() if start <= ptr < end else tensor

        out = []
        for batch in batches:
            tensors: list[torch.Tensor] = []
            structure = _flatten(batch, tensors)
            out.append(_rebuild(structure, [own(t) for t in tensors]))
        return ("plain", out)

    def pack(self, batches: list[Any]) -> tuple:
        """A DataLoader item for ``batches``: a ring descriptor, or ``("plain", batches)``."""
        slot, used, demand = self._slot, self._used, self._demand
        self._slot, self._used, self._demand = None, 0, 0  # the reservation ends here
        resident = None  # the addresses allocated in the reserved slot
        if slot is not None:
            start = self.arena.data_ptr() + self._base(slot)
            resident = (start, start + used)
        tensors: list[torch.Tensor] = []
        structures, counts = [], []
        for batch in batches:
            before = len(tensors)
            structures.append(_flatten(batch, tensors))
            counts.append(len(tensors) - before)
        if not tensors or not all(_movable(t) for t in tensors):
            return self._plain(batches, resident)
        # Each tensor's place: where it lies (gathered into the slot), else copied in behind
        # the allocations, column by column (position in its batch, then batch).
        places: list[int | None] = [None] * len(tensors)
        nbytes = [t.numel() * t.element_size() for t in tensors]
        if resident is not None:
            for index, tensor in enumerate(tensors):
                ptr = tensor.data_ptr()
                if (resident[0] <= ptr and ptr + nbytes[index] <= resident[1] and tensor.is_contiguous()
                        and (ptr - resident[0]) % tensor.element_size() == 0):
                    places[index] = ptr - resident[0]
        copies = []
        first = 0
        for count in counts:
            copies += [(position, first + position) for position in range(count)]
            first += count
        copies = [index for _, index in sorted(copies) if places[index] is None]
        if self.arena is None and self.slot_bytes >= 0:
            total = demand + sum(_aligned(nbytes[i]) for i in copies)
            self.slot_bytes = _aligned(total + total // 4 + (1 << 16))
            try:
                header = _header_bytes(self.slots)
                self.arena = _shared_bytes(header + self.slots * self.slot_bytes)
                self._bytes = self.arena.numpy()
                self._released = self._bytes[:header].view(np.int64)
            except RuntimeError:  # no room in shared memory: stay with torch's transfer
                self.arena, self.slot_bytes = None, -1
        if slot is None and self.arena is not None:
            slot = self._free_slot()
        if slot is None:
            return self._plain(batches, resident)
        offset = used
        for index in copies:
            places[index] = offset
            offset += _aligned(nbytes[index])
        if offset > self.slot_bytes:
            return self._plain(batches, resident)
        base = self._base(slot)
        for index in copies:
            at = base + places[index]
            self._bytes[at : at + nbytes[index]] = _as_bytes(tensors[index])
        arena = None if self._announced else self.arena
        self._announced = True
        item = ("ring", self.worker, self.arena_id, arena, self.sent, slot, base, offset, structures,
                _blocks(places, tensors, nbytes))
        self._last[slot] = self.sent
        self.sent += 1
        return item


def _blocks(places: list[int], tensors: list[torch.Tensor], nbytes: list[int]) -> list[tuple]:
    """How the main process cuts a group's tensors out of its slot, with few calls: tensors of one
    dtype and shape that follow each other in the slot (a column of the group's batches) form one
    block, one ``(count, *shape)`` view there.

    Returns ``(offset, dtype, shape, count, tensor indices)`` per block.
    """
    order = sorted(range(len(tensors)), key=places.__getitem__)
    blocks: list[tuple] = []
    last = None  # (dtype, shape, end offset) of the current block
    for index in order:
        tensor, place = tensors[index], places[index]
        key = (tensor.dtype, tuple(tensor.shape))
        if last is not None and nbytes[index] and last[0] == key and last[1] == place:
            blocks[-1][4].append(index)
        else:
            blocks.append((place, key[0], key[1], None, [index]))
        last = (key, place + nbytes[index])
    return [(place, dtype, shape, len(indices), indices) for place, dtype, shape, _, indices in blocks]


def _views(own: torch.Tensor, blocks: list[tuple], count: int) -> list[torch.Tensor]:
    """The ``count`` tensors of :func:`_blocks` cut from ``own`` (the slot's bytes, a multiple of 64)."""
    out: list[Any] = [None] * count
    typed: dict[torch.dtype, torch.Tensor] = {}
    for offset, dtype, shape, n, indices in blocks:
        base = typed.get(dtype)
        if base is None:
            base = typed[dtype] = own.view(dtype)
        size = base.element_size()
        strides = _contiguous_strides(shape)
        if n == 1:
            out[indices[0]] = base.as_strided(shape, strides, offset // size)
        else:
            block = base.as_strided((n, *shape), (math.prod(shape), *strides), offset // size)
            for index, view in zip(indices, block.unbind(0), strict=True):
                out[index] = view
    return out


def _contiguous_strides(shape: tuple[int, ...]) -> tuple[int, ...]:
    strides, step = [], 1
    for size in reversed(shape):
        strides.append(step)
        step *= max(size, 1)
    return tuple(reversed(strides))


class RingReceiver:
    """Main-process side: turns the items of :class:`RingSender` back into batches.

    Args:
        pin_memory: copy groups out into pinned memory (and pin batches sent the torch way);
            otherwise batches are views of the ring, and a slot is released when they are gone.
    """

    def __init__(self, pin_memory: bool = False):
        self.pin_memory = pin_memory
        self._arenas: dict[int, tuple[str, torch.Tensor, np.ndarray]] = {}
        self.stats = {"ring": 0, "plain": 0}  # groups received each way

    @staticmethod
    def _release(released: np.ndarray, slot: int, group: int) -> None:
        released[slot] = group + 1  # the worker may write the slot again

    def unpack(self, item: tuple) -> list[Any]:
        if item[0] == "plain":
            self.stats["plain"] += 1
            batches = item[1]
            if self.pin_memory:
                from torch.utils.data._utils.pin_memory import pin_memory

                batches = pin_memory(batches)
            return batches
        _, worker, arena_id, arena, group, slot, base, nbytes, structures, blocks = item
        if arena is not None:
            self._arenas[worker] = (arena_id, arena, arena.numpy())
        known_id, arena, source = self._arenas[worker]
        if known_id != arena_id:
            raise RuntimeError(f"DataLoader worker {worker}: batch from an unknown shared-memory ring")
        released = source[: 8 * (slot + 1)].view(np.int64)
        region = source[base : base + nbytes]
        if self.pin_memory:
            own = torch.empty(nbytes, dtype=torch.uint8, pin_memory=True)
            own.numpy()[:] = region
            released[slot] = group + 1
        else:  # views: the slot is released once every tensor of the group is gone
            own = torch.from_numpy(region)
            weakref.finalize(region, self._release, released, slot, group)
        del region
        tensors = _views(own, blocks, sum(block[3] for block in blocks))
        self.stats["ring"] += 1
        return [_rebuild(structure, tensors) for structure in structures]
