"""The work of :class:`transforms.build.BuildExamples` without Beam: chunks -> encoded
:class:`~transforms.elements.ShardPiece` elements and summed counters, in this process or in worker processes.

Beam's in-process runner runs the stage that packs chunks and applies the objective on one
thread, so on a machine with cores to spare the objective can run beside it:
:class:`PooledBuilder` gathers chunks into tasks of about :data:`TASK_TOKENS` tokens and
hands them to a pool of worker processes, which build them with the same
:class:`ChunkBuilder` the inline path uses. Nothing written depends on where a chunk was
built: an example's noise, shard and row order come from its key, the writer sorts every
shard's rows, and counters are integers that add up in any order.

The pool (:func:`worker_pool`) is one ``ProcessPoolExecutor`` per size and process, made on
first use (or by :func:`prestart` while the pipeline starts up) and reused by later
pipelines, shut down at exit. Its workers start from a ``forkserver`` that has imported this
module and the objectives (numpy and pyarrow, no Beam): ``fork`` would copy a process with
Beam's and our own threads running. A worker never imports the parent's ``__main__`` (see
:func:`_keep_main_out_of_workers`).

This module imports no Beam, so that workers start quickly and small.
"""

from __future__ import annotations

import atexit
import collections
import hashlib
import multiprocessing.connection
import multiprocessing.context
import multiprocessing.spawn
import os
import pickle
import threading
from concurrent.futures import Future, ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool

import numpy as np

from schemas.errors import JobFailedError
from schemas.examples import ExampleSchema
from transforms.elements import Chunk, ShardPiece
from transforms.objectives.base import Block
from transforms.objectives.counters import add_counters
from transforms.objectives.layout import example_digests
from transforms.objectives.packing import Piece
from transforms.shard_format import ExampleColumns

__all__ = [
    "BLOCK_ROWS",
    "FORKSERVER",
    "TASK_TOKENS",
    "BuildConfig",
    "BuildWorkerError",
    "ChunkBuilder",
    "PooledBuilder",
    "build_task",
    "decode_chunks",
    "encode_chunks",
    "example_key",
    "prestart",
    "shutdown_pools",
    "worker_pool",
]

#: Chunk tokens times draws per task of a worker: a few hundred chunks, tens of milliseconds
#: of work, so that sending a task and its results costs little beside building it.
TASK_TOKENS = 1 << 18
#: Rows (chunks times draws) a builder gathers before the objective builds them in one call:
#: enough that numpy's cost per call is spread thin, few enough that a block's arrays stay small.
BLOCK_ROWS = 512
#: Tasks in flight per worker process: one running, one waiting, so a worker never idles
#: while the stage feeds it, and a bundle holds only a few tasks' chunks and results.
TASKS_PER_WORKER = 2
#: Modules the forkserver imports once, so that every worker starts with them loaded.
PRELOAD = ("transforms.parallel", "transforms.objectives.registry")
_WORKER_NAME = "lmshards-build-worker"


def example_key(chunk_key: str, draw: int) -> str:
    """Key of draw ``draw`` of a chunk (no dots: it is also the WebDataset ``__key__``)."""
    return f"{chunk_key}-d{draw}"


class BuildConfig:
    """What building a chunk's examples takes besides the chunk and its split's shard count.

    Args:
        objective: an :class:`transforms.objectives.base.Objective`.
        special: resolved :class:`transforms.objectives.common.SpecialIds`.
        schema: the :class:`schemas.examples.ExampleSchema` the examples are written with.
        seed: global seed.
        draws: independent noisings per chunk.
        block_rows: rows (chunks times draws) per block the objective builds at once (default
            :data:`BLOCK_ROWS`); each block leaves as one ShardPiece per shard it touches.
    """

    def __init__(self, objective, special, schema: ExampleSchema, seed: int, draws: int, *,
                 block_rows: int | None = None):
        self.objective, self.special, self.schema, self.seed, self.draws = objective, special, schema, seed, draws
        self.block_rows = BLOCK_ROWS if block_rows is None else block_rows
        self._payload: tuple[str, bytes] | None = None

    def __getstate__(self):
        return {**self.__dict__, "_payload": None}

    def payload(self) -> tuple[str, bytes]:
        """``(token, pickled config)``: workers unpickle a config once and keep it by its token."""
        if self._payload is None:
            blob = pickle.dumps(self, protocol=pickle.HIGHEST_PROTOCOL)
            self._payload = (hashlib.blake2b(blob, digest_size=16).hexdigest(), blob)
        return self._payload


class ChunkBuilder:
    """Builds the examples of chunks in blocks, into per-shard batches, summing their counters.

    Chunks wait until their rows (chunks times draws) fill a block of ``block_rows``; the
    objective builds a block in one call (:meth:`~transforms.objectives.base.Objective.build`),
    each row's noise from the digest of its example key, so nothing depends on how chunks
    fall into blocks.

    Attributes:
        stats: split -> summed counters of the examples built so far.
        built: number of examples built so far.
    """

    def __init__(self, config: BuildConfig):
        self._config = config
        self._waiting: list[tuple[Chunk, int]] = []
        self.stats: dict[str, dict[str, int]] = {}
        self.built = 0

    def add(self, chunk: Chunk, shard_count: int) -> list[tuple]:
        """Take ``chunk``; return the ``((split, shard, shard count), encoded ShardPiece)``
        elements of a block it completes."""
        self._waiting.append((chunk, shard_count))
        if len(self._waiting) * self._config.draws >= self._config.block_rows:
            return self._build()
        return []

    def finish(self) -> list[tuple]:
        """The pieces of every chunk still waiting."""
        return self._build() if self._waiting else []

    def _build(self) -> list[tuple]:
        config = self._config
        block, self._waiting = self._waiting, []
        out = []
        for split, count, chunks in _by_split(block):
            rows = [(chunk, draw) for chunk in chunks for draw in range(config.draws)]
            keys = [example_key(chunk.key, draw) for chunk, draw in rows]
            digests = example_digests(config.seed, keys)
            pieces = [chunk.piece for chunk, _ in rows]
            examples = Block.of_rows(pieces, [chunk.plan for chunk, _ in rows], digests.randoms)
            built = config.objective.build(examples, config.special)
            strings = {"key": keys, **built.strings}
            columns = ExampleColumns(config.schema, len(keys), built.arrays, built.scalars, strings)
            counters = dict(built.counters)
            counters["chunk_tokens"] = int(examples.offsets[-1])
            add_counters(self.stats.setdefault(split, {}), counters)
            out.extend(_shard_pieces(split, count, digests, columns, examples.lengths))
        self.built += len(block) * config.draws
        return out


def _shard_pieces(split: str, count: int, digests, columns: ExampleColumns, chunk_tokens: np.ndarray) -> list[tuple]:
    """The rows of a block as one ``((split, shard, count), encoded ShardPiece)`` element per shard."""
    hashes, orders = digests.shard_hashes, np.ascontiguousarray(digests.orders)
    shards = hashes % np.uint64(count)
    present = np.unique(shards).tolist()
    out = []
    for shard in present:
        if len(present) == 1:  # every row: no copy
            batch = ShardPiece(orders, hashes, chunk_tokens, columns)
        else:
            rows = np.flatnonzero(shards == shard)
            batch = ShardPiece(orders[rows], hashes[rows], chunk_tokens[rows], columns.take(rows))
        out.append(((split, shard, count), batch.encode()))
    return out


def _by_split(block: list[tuple[Chunk, int]]) -> list[tuple[str, int, list[Chunk]]]:
    """``(split, shard count, chunks)`` of a block of ``(chunk, shard count)``, by split name."""
    by_split: dict[str, tuple[int, list[Chunk]]] = {}
    for chunk, shard_count in block:
        by_split.setdefault(chunk.split, (shard_count, []))[1].append(chunk)
    return [(split, count, chunks) for split, (count, chunks) in sorted(by_split.items())]


_CONFIGS: collections.OrderedDict[str, BuildConfig] = collections.OrderedDict()
_CONFIGS_KEPT = 8


def encode_chunks(chunks: list[Chunk]) -> tuple:
    """Chunks as a few lists and one array per column:
    pickling a task then costs about a copy of its tokens instead of 15 us per chunk (and
    as much again to unpickle) for its small arrays. :func:`decode_chunks` inverts it."""
    pieces = [chunk.piece for chunk in chunks]
    names = sorted(pieces[0].features) if pieces else []
    if not pieces or any(sorted(piece.features) != names for piece in pieces):
        return ("chunks", chunks)  # no chunk, or chunks with different features: as they are
    return (
        "columns",
        [chunk.split for chunk in chunks], [chunk.key for chunk in chunks], [chunk.plan for chunk in chunks],
        [piece.tokens.shape[0] for piece in pieces], [piece.doc_lengths.shape[0] for piece in pieces],
        np.concatenate([piece.tokens for piece in pieces]).astype(np.int32, copy=False),
        np.concatenate([piece.doc_lengths for piece in pieces]).astype(np.int32, copy=False),
        {name: np.concatenate([piece.features[name] for piece in pieces]).astype(bool, copy=False) for name in names},
    )


def decode_chunks(encoded: tuple) -> list[Chunk]:
    """The chunks of :func:`encode_chunks` (their arrays are slices of one array per column)."""
    if encoded[0] == "chunks":
        return encoded[1]
    _, splits, keys, plans, lengths, segments, tokens, doc_lengths, features = encoded
    ends = np.cumsum(lengths).tolist()
    segment_ends = np.cumsum(segments).tolist()
    chunks, start, segment_start = [], 0, 0
    for split, key, plan, end, segment_end in zip(splits, keys, plans, ends, segment_ends):
        piece = Piece(tokens[start:end], doc_lengths[segment_start:segment_end],
                      {name: flags[start:end] for name, flags in features.items()})
        chunks.append(Chunk(split, key, plan, piece))
        start, segment_start = end, segment_end
    return chunks


def build_task(token: str, blob: bytes, shard_counts: dict[str, int], encoded: tuple) -> tuple:
    """A worker's task: build the chunks of ``encoded`` (:func:`encode_chunks`) with the config
    pickled in ``blob``.

    Returns ``(pieces, stats, built)``: the encoded batches, split -> summed counters, and
    the number of examples.
    """
    config = _CONFIGS.get(token)
    if config is None:
        config = _CONFIGS[token] = pickle.loads(blob)
        while len(_CONFIGS) > _CONFIGS_KEPT:
            _CONFIGS.popitem(last=False)
    builder = ChunkBuilder(config)
    pieces = []
    for chunk in decode_chunks(encoded):
        pieces.extend(builder.add(chunk, shard_counts[chunk.split]))
    pieces.extend(builder.finish())
    return pieces, builder.stats, builder.built


class BuildWorkerError(JobFailedError):
    """A worker process of the build pool failed or died."""


class PooledBuilder:
    """:class:`ChunkBuilder`'s interface, with the building done by a pool of ``processes`` workers.

    Chunks are sent in tasks of about :data:`TASK_TOKENS` tokens (times draws), at most
    :data:`TASKS_PER_WORKER` per worker in flight; results come back in submission order.
    Chunks left over at :meth:`finish` (all of them, for a bundle smaller than one task) are
    built here, while the workers finish theirs.
    """

    def __init__(self, config: BuildConfig, processes: int):
        self._config, self._processes = config, processes
        self._inline = ChunkBuilder(config)
        self._pending: list[Chunk] = []
        self._pending_tokens = 0
        self._shard_counts: dict[str, int] = {}
        self._in_flight: collections.deque[Future] = collections.deque()
        self._pool: ProcessPoolExecutor | None = None
        self.stats: dict[str, dict[str, int]] = {}
        self.built = 0

    def add(self, chunk: Chunk, shard_count: int) -> list[tuple]:
        self._shard_counts[chunk.split] = shard_count
        self._pending.append(chunk)
        self._pending_tokens += len(chunk.piece) * self._config.draws
        if self._pending_tokens < TASK_TOKENS:
            return []
        out = []
        while len(self._in_flight) >= TASKS_PER_WORKER * self._processes:
            out.extend(self._collect(self._in_flight.popleft()))
        token, blob = self._config.payload()
        try:
            if self._pool is None:
                self._pool = worker_pool(self._processes)
            future = self._pool.submit(build_task, token, blob, dict(self._shard_counts), encode_chunks(self._pending))
        except BrokenProcessPool as exc:
            raise self._died() from exc
        except Exception as exc:
            raise BuildWorkerError(f"BuildExamples: cannot start the build pool (--build-processes "
                                   f"{self._processes}): {type(exc).__name__}: {exc}") from exc
        self._in_flight.append(future)
        self._pending, self._pending_tokens = [], 0
        while self._in_flight and self._in_flight[0].done():
            out.extend(self._collect(self._in_flight.popleft()))
        return out

    def finish(self) -> list[tuple]:
        out = []
        for chunk in self._pending:
            out.extend(self._inline.add(chunk, self._shard_counts[chunk.split]))
        self._pending, self._pending_tokens = [], 0
        out.extend(self._inline.finish())
        self._merge(self._inline.stats, self._inline.built)
        self._inline = ChunkBuilder(self._config)
        while self._in_flight:
            out.extend(self._collect(self._in_flight.popleft()))
        return out

    def _merge(self, stats: dict[str, dict[str, int]], built: int) -> None:
        for split, counters in stats.items():
            add_counters(self.stats.setdefault(split, {}), counters)
        self.built += built

    def _collect(self, future: Future) -> list[tuple]:
        try:
            pieces, stats, built = future.result()
        except BrokenProcessPool as exc:
            raise self._died() from exc
        except Exception as exc:
            raise BuildWorkerError(
                f"BuildExamples: building examples in a worker process (--build-processes {self._processes}) "
                f"failed: {type(exc).__name__}: {exc}"
            ) from exc
        self._merge(stats, built)
        return pieces

    def _died(self) -> BuildWorkerError:
        _discard(self._processes, self._pool)
        return BuildWorkerError(
            f"BuildExamples: a worker process of the build pool (--build-processes {self._processes}) died "
            "(killed, or out of memory?); run with --build-processes 0 to build in the pipeline's own process"
        )


#: Whether this platform has the forkserver start method (every POSIX system; not Windows).
FORKSERVER = "forkserver" in multiprocessing.get_all_start_methods()

if FORKSERVER:

    class _WorkerProcess(multiprocessing.context.ForkServerProcess):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            self.name = self.name.replace(type(self).__name__, _WORKER_NAME, 1)

    class _WorkerContext(multiprocessing.context.ForkServerContext):
        Process = _WorkerProcess


def _keep_main_out_of_workers() -> None:
    """Start our workers without importing the parent's ``__main__``.

    multiprocessing re-imports the parent's main module in every child it spawns, so that
    objects defined there unpickle; ours are never defined there. A script without an
    ``if __name__ == "__main__"`` guard would run again in each worker, and
    ``python -m pipelines.materialize`` would load Beam into each. So the preparation data
    of processes named as ours (and only those) leaves the main module out.
    """
    original = multiprocessing.spawn.get_preparation_data
    if getattr(original, "_lmshards_keeps_main_out", False):
        return

    def get_preparation_data(name):
        data = original(name)
        if str(name).startswith(_WORKER_NAME):
            data.pop("init_main_from_name", None)
            data.pop("init_main_from_path", None)
        return data

    get_preparation_data._lmshards_keeps_main_out = True
    multiprocessing.spawn.get_preparation_data = get_preparation_data


def _exit_with_parent() -> None:
    """Worker initializer: end the worker when the process that made the pool is gone (say,
    killed), instead of waiting for tasks forever."""
    parent = multiprocessing.parent_process()
    if parent is not None:
        threading.Thread(target=_wait_then_exit, args=(parent.sentinel,), name="lmshards-parent-watch",
                         daemon=True).start()


def _wait_then_exit(sentinel) -> None:
    multiprocessing.connection.wait([sentinel])
    os._exit(1)


_POOLS: dict[int, ProcessPoolExecutor] = {}
_POOLS_LOCK = threading.Lock()


def worker_pool(processes: int) -> ProcessPoolExecutor:
    """This process's pool of ``processes`` build workers (made on first use; workers start on demand)."""
    with _POOLS_LOCK:
        pool = _POOLS.get(processes)
        if pool is None:
            if not FORKSERVER:
                raise ValueError(f"--build-processes {processes}: this platform has no forkserver start method; "
                                 "use --build-processes 0")
            if not _POOLS:
                atexit.register(shutdown_pools)
            _keep_main_out_of_workers()
            context = _WorkerContext()
            context.set_forkserver_preload(list(PRELOAD))
            pool = _POOLS[processes] = ProcessPoolExecutor(processes, mp_context=context,
                                                           initializer=_exit_with_parent)
        return pool


def _discard(processes: int, pool: ProcessPoolExecutor) -> None:
    """Forget a broken pool, so that the next pipeline starts a new one."""
    with _POOLS_LOCK:
        if _POOLS.get(processes) is pool:
            del _POOLS[processes]
    pool.shutdown(wait=False, cancel_futures=True)


def shutdown_pools() -> None:
    """Stop every build pool of this process (registered to run at exit)."""
    with _POOLS_LOCK:
        pools = list(_POOLS.values())
        _POOLS.clear()
    for pool in pools:
        pool.shutdown(wait=True, cancel_futures=True)


def _ready() -> None:
    """A no-op task: submitting one per worker starts the workers."""


def _warm_up(processes: int) -> None:
    try:
        pool = worker_pool(processes)
        for _ in range(processes):
            pool.submit(_ready)
    except Exception:  # the stage makes its own pool and reports what fails there
        pass


def prestart(processes: int) -> None:
    """Start the pool of ``processes`` workers in a background thread (nothing for 0).

    The first second of a run is Beam's single-threaded start-up, so the workers' start costs
    almost nothing then.
    """
    if processes > 0:
        threading.Thread(target=_warm_up, args=(processes,), name="lmshards-build-prestart", daemon=True).start()
