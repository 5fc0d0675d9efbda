"""The work of :class:`transforms.build.BuildExamples` without Beam: chunks -> encoded
:class:`ExampleBatch` pieces and summed counters, in this process or in worker processes.

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
import inspect
import multiprocessing.connection
import multiprocessing.context
import multiprocessing.spawn
import os
import pickle
import threading
from concurrent.futures import Future, ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool

import numpy as np

from schemas.examples import ExampleSchema
from transforms.objectives.common import LazyGenerator, example_rngs
from transforms.objectives.counters import add_counters
from transforms.objectives.layout import row_order_key, shard_hash
from transforms.objectives.packing import Piece
from transforms.shard_format import ExampleColumns, MergedColumns

__all__ = [
    "FORKSERVER",
    "MANY_ROWS",
    "STATS_KEY",
    "TASK_TOKENS",
    "BuildConfig",
    "BuildWorkerError",
    "ChunkBuilder",
    "ExampleBatch",
    "PooledBuilder",
    "build_task",
    "decode_chunks",
    "encode_chunks",
    "example_key",
    "prestart",
    "shutdown_pools",
    "worker_pool",
]

STATS_KEY = "_stats"
#: Chunk tokens times draws per task of a worker: a few hundred chunks, tens of milliseconds
#: of work, so that sending a task and its results costs little beside building it.
TASK_TOKENS = 1 << 18
#: Full chunks a builder gathers before the objective's ``build_block`` builds them at once.
BLOCK_CHUNKS = 256
#: Rows (chunks times draws) per call of an objective's ``build_many``: few enough that the
#: block's arrays stay in the CPU cache (64 rows of 1,024 tokens: 512 KiB as int64). BART
#: took about 125 us per row in blocks of 32 to 96 rows, 205 us in blocks of 256.
MANY_ROWS = 64
#: Tasks in flight per worker process: one running, one waiting, so a worker never idles
#: while the stage feeds it, and a bundle holds only a few tasks' chunks and results.
TASKS_PER_WORKER = 2
#: Modules the forkserver imports once, so that every worker starts with them loaded.
PRELOAD = ("transforms.parallel", "transforms.objectives.registry")
_WORKER_NAME = "lmshards-build-worker"


def example_key(chunk_key: str, draw: int) -> str:
    """Key of draw ``draw`` of a chunk (no dots: it is also the WebDataset ``__key__``)."""
    return f"{chunk_key}-d{draw}"


def _order_of(orders: np.ndarray) -> np.ndarray:
    """Stable ascending order of ``(n, 16)`` uint8 keys compared bytewise."""
    high = orders[:, :8].copy().view(">u8").reshape(-1)
    low = orders[:, 8:].copy().view(">u8").reshape(-1)
    return np.lexsort((low, high))


class ExampleBatch:
    """Rows of one split on their way to the shard writers.

    Attributes:
        orders: ``(n, 16)`` uint8 row-order keys (:func:`transforms.objectives.layout.row_order_key`).
        shard_hashes: ``(n,)`` uint64; a row's shard is ``shard_hashes % num_shards``.
        chunk_tokens: ``(n,)`` int64 source tokens of each row.
        columns: the rows' :class:`~transforms.shard_format.ExampleColumns`.
    """

    __slots__ = ("orders", "shard_hashes", "chunk_tokens", "columns")

    def __init__(self, orders, shard_hashes, chunk_tokens, columns: ExampleColumns):
        self.orders, self.shard_hashes, self.chunk_tokens, self.columns = orders, shard_hashes, chunk_tokens, columns

    @property
    def count(self) -> int:
        return self.columns.count

    @classmethod
    def merge_sorted(cls, parts: list[ExampleBatch], schema: ExampleSchema) -> ExampleBatch:
        """The rows of all ``parts`` in ascending order of their order keys (bytewise, like sorting
        ``bytes``); their token values stay in the parts until written (:class:`MergedColumns`)."""
        if not parts:
            return cls(np.zeros((0, 16), np.uint8), np.zeros(0, np.uint64), np.zeros(0, np.int64),
                       ExampleColumns.from_examples([], schema))
        orders = np.concatenate([p.orders for p in parts])
        order = _order_of(orders)
        part = np.repeat(np.arange(len(parts)), [p.count for p in parts])[order]
        starts = np.zeros(len(parts) + 1, dtype=np.int64)
        np.cumsum([p.count for p in parts], out=starts[1:])
        row = order - starts[part]
        return cls(
            orders[order],
            np.concatenate([p.shard_hashes for p in parts])[order],
            np.concatenate([p.chunk_tokens for p in parts])[order],
            MergedColumns([p.columns for p in parts], part, row, schema),
        )

    def encode(self) -> tuple:
        """Bytes, ints, lists and dicts only: Beam's default coder handles them without pickling."""
        return (self.orders.tobytes(), self.shard_hashes.tobytes(), self.chunk_tokens.tobytes(),
                self.columns.encode())

    @classmethod
    def decode(cls, encoded: tuple, schema: ExampleSchema) -> ExampleBatch:
        orders, hashes, tokens, columns = encoded
        return cls(
            np.frombuffer(orders, dtype=np.uint8).reshape(-1, 16),
            np.frombuffer(hashes, dtype=np.uint64),
            np.frombuffer(tokens, dtype=np.int64),
            ExampleColumns.decode(columns, schema),
        )


class BuildConfig:
    """What building a chunk's examples takes besides the chunk and its split's shard count.

    Args:
        objective: object implementing :class:`transforms.objectives.base.Objective`.
        special: resolved :class:`transforms.objectives.common.SpecialIds`.
        schema: the :class:`schemas.examples.ExampleSchema` the examples are written with.
        seed: global seed.
        draws: independent noisings per chunk.
        batch_rows: rows per ExampleBatch a builder emits (per shard; the last ones of a bundle
            or task are shorter).
        max_buffered_rows: rows a builder holds at most, over all shards, before it emits them.
    """

    def __init__(self, objective, special, schema: ExampleSchema, seed: int, draws: int, *, batch_rows: int,
                 max_buffered_rows: int):
        self.objective, self.special, self.schema, self.seed, self.draws = objective, special, schema, seed, draws
        self.batch_rows, self.max_buffered_rows = batch_rows, max_buffered_rows
        self.stats_takes_special = len(inspect.signature(objective.stats).parameters) >= 2
        fixed = {c: schema.fixed_length(c) for c in schema.token_columns}
        self.fixed = {c: n for c, n in fixed.items() if n is not None}
        #: chunks of this many tokens (and no features) are built in blocks by the objective's
        #: ``build_block`` (one draw; columns: token arrays and the key); None: one at a time
        self.block_length: int | None = None
        if (hasattr(objective, "build_block") and draws == 1 and not schema.scalar_columns
                and tuple(schema.string_columns) == ("key",) and len(self.fixed) == 1):
            self.block_length = next(iter(self.fixed.values()))
        #: whether chunks are built in blocks by the objective's ``build_many`` (every draw; each
        #: example from its own generator): all of them, or those its ``builds_many`` accepts
        self.many = hasattr(objective, "build_many") and schema.string_columns[:1] == ("key",)
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
    """Builds the examples of chunks into per-shard batches, summing their counters.

    Attributes:
        stats: split -> summed counters of the examples built so far.
        built: number of examples built so far.
    """

    def __init__(self, config: BuildConfig):
        self._config = config
        self._rows: dict[tuple, list] = {}  # (split, shard, count) -> [(example, chunk tokens, shard hash)]
        self._buffered = 0
        self._block: list[tuple] = []  # (chunk, shard count) waiting for the objective's build_block
        self._many: list[tuple] = []  # (chunk, shard count) waiting for the objective's build_many
        self._accepts = getattr(config.objective, "builds_many", None)  # None: every chunk
        self.stats: dict[str, dict[str, int]] = {}
        self.built = 0

    def add(self, chunk: tuple, shard_count: int) -> list[tuple]:
        """Build ``chunk`` = ``(split, chunk_key, plan, Piece)`` ``draws`` times; return the
        ``((split, shard, shard count), encoded ExampleBatch)`` pieces that are complete."""
        config = self._config
        split, chunk_key, plan, piece = chunk
        if config.block_length is not None and len(piece.tokens) == config.block_length and not piece.features:
            self._block.append((chunk, shard_count))
            return self._build_block() if len(self._block) >= BLOCK_CHUNKS else []
        if config.many and (self._accepts is None or self._accepts(piece, plan)):
            self._many.append((chunk, shard_count))
            return self._build_many() if len(self._many) * config.draws >= MANY_ROWS else []
        features = dict(piece.features)
        features["doc_lengths"] = piece.doc_lengths
        stats = self.stats.setdefault(split, {})
        full = []
        for draw in range(config.draws):
            key = example_key(chunk_key, draw)
            example = config.objective.build(piece.tokens, LazyGenerator(config.seed, key), plan, config.special,
                                             features)
            example["key"] = key
            add_counters(stats, self._finish(example, len(piece.tokens)))
            hashed = shard_hash(config.seed, key)
            shard = (split, hashed % shard_count, shard_count)
            rows = self._rows.setdefault(shard, [])
            rows.append((example, len(piece.tokens), hashed))
            if len(rows) == config.batch_rows:
                full.append(shard)
        self.built += config.draws
        self._buffered += config.draws
        if self._buffered >= config.max_buffered_rows:  # many shards: bound memory, flush them all
            full = sorted(self._rows)
        out = []
        for shard in full:
            self._buffered -= len(self._rows[shard])
            out.append(self._batch(shard))
        return out

    def finish(self) -> list[tuple]:
        """The pieces of every row still held (those of a waiting block first), in shard order."""
        out = self._build_block() if self._block else []
        if self._many:
            out.extend(self._build_many())
        out.extend(self._batch(shard) for shard in sorted(self._rows))
        self._buffered = 0
        return out

    def _build_block(self) -> list[tuple]:
        """The waiting full chunks through the objective's ``build_block``: the same rows and
        counters as :meth:`add` makes one by one (keys, shards and row order from each
        example's key), as one piece per split and shard."""
        config = self._config
        block, self._block = self._block, []
        out = []
        for split, count, chunks in _by_split(block):
            keys = [example_key(chunk[1], 0) for chunk in chunks]
            tokens = np.stack([chunk[3].tokens for chunk in chunks])
            arrays, counters = config.objective.build_block(tokens, [chunk[3].doc_lengths for chunk in chunks])
            columns = ExampleColumns(config.schema, len(keys), arrays, {}, {"key": keys})
            chunk_tokens = np.full(len(keys), tokens.shape[1], dtype=np.int64)
            out.extend(self._block_pieces(split, count, keys, columns, chunk_tokens, counters))
        self.built += len(block)
        return out

    def _build_many(self) -> list[tuple]:
        """The waiting chunks, every draw, through the objective's ``build_many``: the same rows
        and counters as :meth:`add` makes one by one (each example from the generator of its
        key), as one piece per split and shard."""
        config = self._config
        block, self._many = self._many, []
        out = []
        for split, count, chunks in _by_split(block):
            rows = [(chunk, draw) for chunk in chunks for draw in range(config.draws)]
            keys = [example_key(chunk[1], draw) for chunk, draw in rows]
            pieces = [chunk[3] for chunk, _ in rows]
            generators = example_rngs(config.seed, keys)  # these objectives draw for every example: seed together
            arrays, scalars, strings, counters = config.objective.build_many(
                pieces, [chunk[2] for chunk, _ in rows], generators, config.special)
            columns = ExampleColumns(config.schema, len(keys), arrays, scalars, {"key": keys, **strings})
            chunk_tokens = np.fromiter((len(piece.tokens) for piece in pieces), dtype=np.int64, count=len(pieces))
            out.extend(self._block_pieces(split, count, keys, columns, chunk_tokens, counters))
        self.built += len(block) * config.draws
        return out

    def _block_pieces(self, split: str, count: int, keys: list[str], columns: ExampleColumns,
                      chunk_tokens: np.ndarray, counters: dict[str, int]) -> list[tuple]:
        """The rows of a block (``keys``, ``columns``, source tokens per row, summed
        ``counters``) as one piece per shard of the split's ``count``; the counters go to the
        split's stats."""
        config = self._config
        counters["chunk_tokens"] = counters.get("chunk_tokens", 0) + int(chunk_tokens.sum())
        add_counters(self.stats.setdefault(split, {}), counters)
        seed = config.seed
        hashes = np.fromiter((shard_hash(seed, key) for key in keys), dtype=np.uint64, count=len(keys))
        orders = np.frombuffer(b"".join(row_order_key(seed, key) for key in keys), dtype=np.uint8)
        orders = orders.reshape(-1, 16)
        shards = hashes % np.uint64(count)
        present = np.unique(shards).tolist()
        out = []
        for shard in present:
            if len(present) == 1:  # every row: no copy
                batch = ExampleBatch(orders, hashes, chunk_tokens, columns)
            else:
                rows = np.flatnonzero(shards == shard)
                batch = ExampleBatch(orders[rows], hashes[rows], chunk_tokens[rows], columns.take(rows))
            out.append(((split, shard, count), batch.encode()))
        return out

    def _finish(self, example: dict, chunk_tokens: int) -> dict[str, int]:
        """The example's counters; pads short rows of fixed-length columns in place."""
        config = self._config
        if config.stats_takes_special:
            counters = config.objective.stats(example, config.special)
        else:
            counters = config.objective.stats(example)
        example.pop(STATS_KEY, None)
        padding = 0
        for column, length in config.fixed.items():
            values = example[column]
            if len(values) < length:
                padded = np.full(length, config.special.pad, dtype=np.int32)
                padded[: len(values)] = values
                example[column] = padded
                padding += length - len(values)
        counters = dict(counters)
        counters["chunk_tokens"] = counters.get("chunk_tokens", 0) + chunk_tokens
        if padding:
            counters["padding_tokens"] = counters.get("padding_tokens", 0) + padding
        return counters

    def _batch(self, shard: tuple) -> tuple:
        rows = self._rows.pop(shard)
        seed = self._config.seed
        orders = np.frombuffer(b"".join(row_order_key(seed, ex["key"]) for ex, _, _ in rows), dtype=np.uint8)
        hashes = np.fromiter((h for _, _, h in rows), dtype=np.uint64, count=len(rows))
        tokens = np.fromiter((t for _, t, _ in rows), dtype=np.int64, count=len(rows))
        columns = ExampleColumns.from_examples([example for example, _, _ in rows], self._config.schema)
        return shard, ExampleBatch(orders.reshape(-1, 16), hashes, tokens, columns).encode()


def _by_split(block: list[tuple]) -> list[tuple[str, int, list[tuple]]]:
    """``(split, shard count, chunks)`` of a block of ``(chunk, shard count)``, by split name."""
    by_split: dict[str, tuple[int, list[tuple]]] = {}
    for chunk, shard_count in block:
        by_split.setdefault(chunk[0], (shard_count, []))[1].append(chunk)
    return [(split, count, chunks) for split, (count, chunks) in sorted(by_split.items())]


_CONFIGS: collections.OrderedDict[str, BuildConfig] = collections.OrderedDict()
_CONFIGS_KEPT = 8


def encode_chunks(chunks: list[tuple]) -> tuple:
    """``(split, chunk_key, plan, Piece)`` chunks as a few lists and one array per column:
    pickling a task then costs about a copy of its tokens instead of 15 us per chunk (and
    as much again to unpickle) for its small arrays. :func:`decode_chunks` inverts it."""
    pieces = [chunk[3] for chunk in chunks]
    names = sorted(pieces[0].features) if pieces else []
    if not pieces or any(sorted(piece.features) != names for piece in pieces):
        return ("chunks", chunks)  # no chunk, or chunks with different features: as they are
    return (
        "columns",
        [chunk[0] for chunk in chunks], [chunk[1] for chunk in chunks], [chunk[2] for chunk in chunks],
        [piece.tokens.shape[0] for piece in pieces], [piece.doc_lengths.shape[0] for piece in pieces],
        np.concatenate([piece.tokens for piece in pieces]).astype(np.int32, copy=False),
        np.concatenate([piece.doc_lengths for piece in pieces]).astype(np.int32, copy=False),
        {name: np.concatenate([piece.features[name] for piece in pieces]).astype(bool, copy=False) for name in names},
    )


def decode_chunks(encoded: tuple) -> list[tuple]:
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
        chunks.append((split, key, plan, piece))
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
        pieces.extend(builder.add(chunk, shard_counts[chunk[0]]))
    pieces.extend(builder.finish())
    return pieces, builder.stats, builder.built


class BuildWorkerError(RuntimeError):
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
        self._pending: list[tuple] = []
        self._pending_tokens = 0
        self._shard_counts: dict[str, int] = {}
        self._in_flight: collections.deque[Future] = collections.deque()
        self._pool: ProcessPoolExecutor | None = None
        self.stats: dict[str, dict[str, int]] = {}
        self.built = 0

    def add(self, chunk: tuple, shard_count: int) -> list[tuple]:
        self._shard_counts[chunk[0]] = shard_count
        self._pending.append(chunk)
        self._pending_tokens += len(chunk[3]) * self._config.draws
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
            out.extend(self._inline.add(chunk, self._shard_counts[chunk[0]]))
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
