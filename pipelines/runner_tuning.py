"""Runner tuning: the one place where the materialize job differs by runner.

:func:`pipelines.materialize.build_pipeline` asks :class:`RunnerTuning` what to do; no
transform takes an argument for a runner, and nothing here patches a library. What is in
this module was measured to pay at least 5 % of a whole run on the benchmark corpus, as the
median of at least five interleaved pairs of runs with and without it, every pair gaining, on
the runner it is active for (``benchmarks/bench_tuning.py``; the figures are in
``benchmarks/README.md``, "Runner tuning, measured"). Dataflow and every other
runner get the plain graph: nothing here is active there.

**By-reference handoff (FnApiRunner in-process only).** That runner runs every stage in
this process, yet moves each element between stages as encoded bytes: the producing bundle
encodes it, the runner decodes it to group it and encodes it again per group, the consuming
bundle decodes it once more. For the token arrays of a corpus, its chunks and its example
batches, that is much of a run. :meth:`RunnerTuning.hand_over` turns each value into an
instance of a subclass of its own tuple type (:func:`shared`), which every transform reads
as the tuple it is. Beam's default coder (``FastPrimitivesCoder``) encodes a type it does
not know by pickling it, and pickling such a value stores it in this process (under the
run's scope) and writes only a token; unpickling the token gives the very object back, so
no bytes are copied on the way. A token read in another process, or after its run released
it, fails with :class:`HandoffError` rather than yield wrong data. Each value is stored once,
under a number of its own, however often Beam encodes it (Beam also encodes a sample of
elements only to estimate their size, a grouped element with all its values, and those bytes
are never read), and stays until the transform that reads it last lets go of it
(:func:`transforms.handoff.let_go`: Pack for a document, the builders for a chunk, the writers
for an example batch, dedup for a copy it drops); so a run holds about one copy of the corpus
at a time (its documents, then its chunks, then its examples), not all three to the end. What
no transform let go of goes at :meth:`RunnerTuning.release`, the end of the run. Where the
runner replays bundles (``--direct_runner_bundle_repeat``, which decodes an input again after
its reader let go of it), values stay until that release. A value read after it was let go of
fails with :class:`HandoffError` ("no longer stored"), never yields another value.

**The frozen heap of the run (FnApiRunner in-process only).** That runner holds its stages'
data in this process, so full garbage collections come during the run, and each walked every
object of the process, Beam's modules and the pipeline graph included. :meth:`RunnerTuning.running`
freezes the objects that exist when the pipeline starts (:func:`gc.freeze`, CPython's public
API) and unfreezes them when it ends; what the run makes is collected as usual. A process that
froze objects itself is left alone (a freeze has no undo of one caller's part).

**The objective applied to each chunk output apart (FnApiRunner, in-process or with local
workers).** Pack has two chunk outputs (the groups' chunks, and the re-packed remainders).
FnApiRunner materializes a ``Flatten``: every chunk would be encoded into a buffer and decoded
out of it, which between worker processes is slow; in-process, where the handoff makes it
cheap, the buffer holds every chunk of the corpus (int32 tokens: 1.3 bytes per byte of text)
until the whole Pack stage has run, beside the documents not yet packed. Applying
BuildExamples to each output keeps each in the fused stage that made it, so a chunk lives only
until its block is built; the two example streams meet in the writers' shuffle, which exists
anyway. On a runner that fuses a Flatten (Dataflow), the plain graph is the same work.

**Documents and example batches through files (FnApiRunner with local workers only).** Beam's
FnApiRunner can drop parts of a large stage input it sends to an SDK worker process (a race in
its timed data-stream flush, :mod:`pipelines.file_handoff`); the documents before AssignGroups
(materialized while the plan is made), a pack group, and the writers' Flatten of example
batches are such inputs. With local workers every document and every batch is written once to
a file of the run by the worker that made it, and only its place crosses the runner
(:meth:`RunnerTuning.hand_over`, :meth:`RunnerTuning.build_examples`).
Applying the objective to each chunk output apart (above) also keeps the chunks, which are as
large, out of a Flatten.

**Frozen heap of local SDK workers (FnApiRunner multi-processing only).** A worker process
of ``--direct_running_mode=multi_processing`` holds Beam's modules and its machinery, hundreds
of thousands of objects that every full garbage collection walks. A pass-through stage before
Tokenize freezes them (:func:`gc.freeze`, CPython's public API) once, when the worker starts
its first bundle of it; what the run makes is collected as usual. The worker lives as long as
the job. Not on Dataflow, where it was not measured.
"""

from __future__ import annotations

import contextlib
import gc
import itertools
import os
import sys
import threading
from typing import Any

import apache_beam as beam

from pipelines.file_handoff import FileHandoff, spill_value
from schemas.errors import JobFailedError

__all__ = ["SDK_WORKER_MAIN", "HandoffError", "RunnerTuning", "freeze_worker_heap", "shared"]

_STORE: dict[str, dict[int, Any]] = {}  # scope -> token -> value
_KEEP: set[str] = set()  # scopes whose values stay until release (the runner replays bundles)
_NUMBERS = itertools.count()  # each handed-over value's number in its run's store
_LOCK = threading.Lock()
_COUNTER = itertools.count()
_SHARED_TYPES: dict[type, type] = {}


class HandoffError(JobFailedError):
    """A by-reference value was read where it is not stored (another process, or after release)."""


def _resolve(pid: int, scope: str, token: int) -> Any:
    if pid != os.getpid():
        raise HandoffError(
            f"a value handed over by reference in process {pid} was read in process {os.getpid()}: "
            "by-reference handoff only works with Beam's in-process runner"
        )
    try:
        return _STORE[scope][token]
    except KeyError:
        raise HandoffError(f"by-reference value {token} of run {scope} is no longer stored") from None


def _reduce_by_reference(self):
    token = self.handoff_number
    values = _STORE.get(self.handoff_scope)
    if values is None:
        raise HandoffError(f"by-reference values of run {self.handoff_scope} were released")
    values[token] = self  # the same entry however often it is encoded
    return _resolve, (os.getpid(), self.handoff_scope, token)


def _let_go(self):
    """The run will not read this value again (:func:`transforms.handoff.let_go`)."""
    if self.handoff_scope not in _KEEP:
        values = _STORE.get(self.handoff_scope)
        if values is not None:
            values.pop(self.handoff_number, None)


def _shared_type(cls: type) -> type:
    """The subclass of tuple type ``cls`` (a plain tuple or a NamedTuple) that pickles by reference."""
    shared_type = _SHARED_TYPES.get(cls)
    if shared_type is None:
        # No __slots__: an instance carries its run's scope in its __dict__.
        shared_type = _SHARED_TYPES[cls] = type(f"Shared{cls.__name__.capitalize()}", (cls,),
                                                {"__reduce__": _reduce_by_reference, "let_go_of_handoff": _let_go,
                                                 "__module__": __name__})
    return shared_type


def shared(value: tuple, scope: str) -> tuple:
    """``value`` (a tuple, or a NamedTuple) as an equal tuple of a subclass of its type that
    pickles by reference under ``scope`` (an open :class:`RunnerTuning` scope)."""
    if not isinstance(value, tuple):
        raise TypeError(f"only tuples are handed over by reference, not {type(value).__name__}")
    handed = tuple.__new__(_shared_type(type(value)), value)
    handed.handoff_scope = scope
    handed.handoff_number = next(_NUMBERS)
    return handed


def _share_value(element: tuple, scope: str) -> tuple:
    key, value = element
    return key, shared(value, scope)


#: The module a Beam SDK worker process runs as ``__main__``.
SDK_WORKER_MAIN = "apache_beam.runners.worker.sdk_worker_main"


def freeze_worker_heap() -> bool:
    """In a Beam SDK worker process, freeze its objects as they are now, once; return whether it
    froze them. Any other process (the one that runs the job, a test's) is left alone."""
    spec = getattr(sys.modules.get("__main__"), "__spec__", None)
    if getattr(spec, "name", None) != SDK_WORKER_MAIN or gc.get_freeze_count():
        return False
    gc.freeze()
    return True


class _FreezeWorkerHeap(beam.DoFn):
    def setup(self):
        freeze_worker_heap()

    def process(self, element):
        yield element


class RunnerTuning:
    """What :func:`~pipelines.materialize.build_pipeline` does for the runner of a run.

    Args:
        in_one_process: the runner runs every stage in this process (FnApiRunner in_memory:
            :attr:`pipelines.options.MaterializeOptions.in_one_process`); only then are values
            handed over by reference.
        local_workers: FnApiRunner with ``--direct_running_mode=multi_processing``: its worker
            processes freeze their heap, and example batches pass between them through files.
        output: the run's output directory (a local one holds the handoff files under ``.tmp/``).
        replays: the runner decodes bundles' inputs more than once (``--direct_runner_bundle_repeat``):
            values handed over by reference then stay until :meth:`release`, not until read.
    """

    def __init__(self, in_one_process: bool, local_workers: bool = False, output: str | None = None,
                 replays: bool = False):
        self.build_apart = local_workers or in_one_process
        self.freeze_workers = local_workers
        self.freeze_run = in_one_process
        self.files = FileHandoff(output) if local_workers else None
        self.scope: str | None = None
        if in_one_process:
            self.scope = f"{os.getpid()}-{next(_COUNTER)}"
            with _LOCK:
                _STORE[self.scope] = {}
                if replays:
                    _KEEP.add(self.scope)

    def hand_over(self, elements: beam.PCollection, label: str, *, values_only: bool = False) -> beam.PCollection:
        """``elements`` (tuples; with ``values_only``, ``(key, tuple)`` pairs whose keys the runner
        groups by and must see as they are), handed over by reference where this run does that;
        with local workers, ``(key, tuple)`` pairs' values through files of the run."""
        # Output typed Any, as an unannotated Map's is: the functions' ``-> tuple`` would make the
        # elements Tuple[Any, ...], which Beam's type check (--pipeline-type-check, from Beam 2.78)
        # refuses as a GroupByKey input; the coder (FastPrimitivesCoder) is the same for both.
        if self.files is not None and values_only:  # local workers: through files of the run
            return elements | label >> beam.Map(spill_value, self.files.directory).with_output_types(Any)
        if self.scope is None:
            return elements
        return elements | label >> beam.Map(_share_value if values_only else shared, self.scope).with_output_types(Any)

    def before_tokenize(self, texts: beam.PCollection) -> beam.PCollection:
        """The texts Tokenize reads: on local workers through the stage that freezes their heap."""
        if not self.freeze_workers:
            return texts
        return texts | "FreezeWorkerHeap" >> beam.ParDo(_FreezeWorkerHeap())

    def build_examples(self, chunk_outputs: tuple, split_tokens: beam.PCollection, make_build) -> tuple:
        """Apply the objective (``make_build(separate_ok)``: a BuildExamples) to Pack's chunk
        outputs; return ``(example batch PCollections, objective statistics)``.

        FnApiRunner (in-process or local workers): one BuildExamples per output (``separate_ok``
        only for the first, as the groups' chunks are the many), each batch handed over (by
        reference, or through a file), their statistics flattened. Elsewhere: one over the
        outputs' Flatten."""
        if self.build_apart:
            batches, stats = [], []
            for index, (label, chunks) in enumerate(zip(("BuildExamples", "BuildRepackedExamples"), chunk_outputs)):
                built, built_stats = (chunks, split_tokens) | label >> make_build(index == 0)
                batches.append(self.hand_over(built, f"HandOver{label[5:]}", values_only=True))
                stats.append(built_stats)
            return tuple(batches), tuple(stats) | "AllObjectiveStats" >> beam.Flatten()
        all_chunks = tuple(chunk_outputs) | "AllChunks" >> beam.Flatten()
        built, built_stats = (all_chunks, split_tokens) | "BuildExamples" >> make_build(True)
        return (built,), built_stats

    @contextlib.contextmanager
    def running(self):
        """Around the pipeline's run: in-process, the objects that exist now stay out of the
        garbage collector's full passes until it ends."""
        if not self.freeze_run or gc.get_freeze_count():
            yield
            return
        gc.freeze()
        try:
            yield
        finally:
            gc.unfreeze()

    def release(self) -> None:
        """Drop every value this run handed over (the run is over: nothing reads them again)."""
        if self.files is not None:
            self.files.release()
        if self.scope is not None:
            with _LOCK:
                _STORE.pop(self.scope, None)
                _KEEP.discard(self.scope)
