"""Where a stream is in its epochs, shared between the main process and DataLoader workers.

A :class:`~loaders.streaming.stream.ResumableStream` keeps ``(epoch, samples, pending)`` in one small
shared-memory block (:class:`SharedProgress`) so that every process that holds a copy of the
dataset (DataLoader workers get a pickled or forked copy) sees the same progress:

- ``epoch``, ``samples``: the resume point (global samples of the epoch consumed);
- ``pending``: set by ``load_state_dict``; the next pass starts at ``samples``. Without it a
  new pass (a fresh ``iter()``) starts its epoch from the beginning: an evaluation loop that
  stops early scores the same batches every time, as with a map-style DataLoader;
- the current pass of plain DataLoader workers (a torch ``DataLoader`` or torchdata's
  ``StatefulDataLoader`` over the dataset itself, not :func:`~loaders.streaming.dataloader.make_dataloader`):
  its key, epoch, start, worker count and how many workers finished their slice. When the
  last worker finishes, the epoch advances, so the next ``iter()`` reads the next epoch
  without a ``set_epoch`` call, as it does without workers.

Workers of one pass recognise each other by a key derived from the DataLoader's base seed
(``worker_info.seed - worker_info.id``, drawn anew for every iterator), the worker's count of
passes (persistent workers keep their seed) and a generation counter that ``set_epoch`` and
``load_state_dict`` bump. Updates take a lock (a ``spawn``-context lock, which forked,
spawned and forkserver workers can all share).
"""

from __future__ import annotations

import hashlib
import multiprocessing
from dataclasses import dataclass
from multiprocessing import context as mp_context
from typing import Any

import torch

from schemas.errors import ConfigError

__all__ = ["SharedProgress", "WorkerPass"]

EPOCH, SAMPLES, PENDING, GENERATION, KEY, PASS_EPOCH, PASS_START, PASS_WORKERS, PASS_DONE = range(9)
_FIELDS = {"epoch": EPOCH, "samples": SAMPLES, "pending": PENDING, "generation": GENERATION, "key": KEY,
           "pass_epoch": PASS_EPOCH, "pass_start": PASS_START}


@dataclass
class WorkerPass:
    """One DataLoader worker's part of a pass: where the pass starts, and what this worker yielded."""

    key: int
    epoch: int
    start: int
    yielded: int = 0  # examples of this worker's slice handed out since the pass started
    done: bool = False


class SharedProgress:
    """The shared block and its lock (see the module docstring)."""

    def __init__(self) -> None:
        self.values = torch.zeros(9, dtype=torch.int64).share_memory_()
        self.lock = multiprocessing.get_context("spawn").Lock()

    def __getstate__(self) -> dict[str, Any]:
        if mp_context.get_spawning_popen() is not None:  # a worker being started: share
            return {"values": self.values, "lock": self.lock}
        return {"values": self.values.clone(), "lock": None}  # any other pickle: an independent copy

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.values, self.lock = state["values"], state["lock"]
        if self.lock is None:
            self.values = self.values.share_memory_()
            self.lock = multiprocessing.get_context("spawn").Lock()

    def get(self, name: str) -> int:
        return int(self.values[_FIELDS[name]])

    def add(self, name: str, value: int) -> None:
        with self.lock:
            self.values[_FIELDS[name]] += int(value)

    def set(self, **fields: int) -> None:
        """Set fields by name (``epoch=3, samples=0``) under the lock."""
        with self.lock:
            for name, value in fields.items():
                self.values[_FIELDS[name]] = int(value)

    def begin_main_pass(self) -> tuple[int, int]:
        """A pass read and counted in this process: ``(epoch, start)``; the epoch restarts unless
        a loaded state is pending."""
        with self.lock:
            v = self.values
            start = int(v[SAMPLES]) if v[PENDING] else 0
            v[SAMPLES], v[PENDING] = start, 0
            v[PASS_EPOCH], v[PASS_START] = v[EPOCH], start
            return int(v[EPOCH]), start

    def join_worker_pass(self, base_seed: int, worker_passes: int, num_workers: int,
                         restore: tuple[int, int, int] | None) -> WorkerPass:
        """Join (or open) the current pass of plain DataLoader workers.

        ``restore``: ``(epoch, start, yielded)`` of this worker's loaded state (StatefulDataLoader).
        """
        with self.lock:
            v = self.values
            digest = hashlib.blake2b(f"{base_seed}:{worker_passes}:{int(v[GENERATION])}".encode(), digest_size=7)
            key = int.from_bytes(digest.digest(), "little") | 1  # never 0 (0: no pass)
            if v[KEY] != key:  # the first worker of a new pass decides where it starts
                if restore is not None:
                    epoch, start = restore[0], restore[1]
                else:
                    epoch, start = int(v[EPOCH]), int(v[SAMPLES]) if v[PENDING] else 0
                v[KEY], v[PASS_EPOCH], v[PASS_START] = key, epoch, start
                v[PASS_WORKERS], v[PASS_DONE] = num_workers, 0
                v[EPOCH], v[SAMPLES], v[PENDING] = epoch, start, 0
            epoch, start = int(v[PASS_EPOCH]), int(v[PASS_START])
        if restore is not None and (restore[0], restore[1]) != (epoch, start):
            raise ConfigError(
                f"DataLoader workers were restored from states of different passes ({restore[:2]} and "
                f"{(epoch, start)}); load one checkpoint's state into all of them"
            )
        return WorkerPass(key, epoch, start, yielded=restore[2] if restore is not None else 0)

    def finish_worker_pass(self, worker_pass: WorkerPass) -> None:
        """A worker read its whole slice; the last one of the pass advances the epoch."""
        if worker_pass.done:
            return
        worker_pass.done = True
        with self.lock:
            v = self.values
            if v[KEY] != worker_pass.key:  # set_epoch or load_state_dict since: not this pass's to end
                return
            v[PASS_DONE] += 1
            if v[PASS_DONE] >= v[PASS_WORKERS]:
                v[EPOCH], v[SAMPLES], v[PENDING] = worker_pass.epoch + 1, 0, 0

    def worker_pass_unfinished(self) -> bool:
        """Whether plain DataLoader workers started a pass that not all of them finished."""
        v = self.values
        return bool(v[KEY]) and int(v[PASS_DONE]) < int(v[PASS_WORKERS])
