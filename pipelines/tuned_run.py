"""A :class:`~pipelines.runner_tuning.RunnerTuning` applied to one materialize run: :class:`TunedRun`.

:func:`pipelines.materialize.build_pipeline` asks a :class:`TunedRun` where its graph differs
by runner (:meth:`TunedRun.hand_over`, :meth:`TunedRun.before_tokenize`,
:meth:`TunedRun.build_examples`), :func:`pipelines.materialize.run_job` runs the pipeline inside
:meth:`TunedRun.running` and ends with :meth:`TunedRun.release`. What each piece is and why is
:mod:`pipelines.runner_tuning`'s; this module only does what the tuning says, with the handoffs'
machinery of :mod:`pipelines.reference_handoff` and :mod:`pipelines.file_handoff`.
"""

from __future__ import annotations

import contextlib
import gc
import sys
from typing import Any

import apache_beam as beam

from pipelines.file_handoff import FileHandoff, spill_value
from pipelines.reference_handoff import close_scope, open_scope, share_value, shared
from pipelines.runner_tuning import PLAIN, RunnerTuning

__all__ = ["SDK_WORKER_MAIN", "TunedRun", "freeze_worker_heap"]

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
    """A pass-through stage whose workers freeze their heap when they set it up (the worker lives
    as long as the job; what the run makes is collected as usual)."""

    def setup(self):
        freeze_worker_heap()

    def process(self, element):
        yield element


class TunedRun:
    """The tuning of one run, and what it holds while the run lasts: the scope of the values it
    hands over by reference, the directory of those it hands over through files.

    Args:
        tuning: the run's :class:`~pipelines.runner_tuning.RunnerTuning` (default: the plain graph).
        output: the run's output directory (a local one holds the handoff files under ``.tmp/``;
            None: the system's temporary directory).
    """

    def __init__(self, tuning: RunnerTuning = PLAIN, output: str | None = None):
        self.tuning = tuning
        self.files = FileHandoff(output) if tuning.through_files else None
        self.scope = open_scope(keep=tuning.keep_references) if tuning.by_reference else None

    def hand_over(self, elements: beam.PCollection, label: str, *, values_only: bool = False) -> beam.PCollection:
        """``elements`` (tuples; with ``values_only``, ``(key, tuple)`` pairs whose keys the runner
        groups by and must see as they are), handed over by reference where this run does that;
        ``(key, tuple)`` pairs' values through files of the run where it does that."""
        # Output typed Any, as an unannotated Map's is: the functions' ``-> tuple`` would make the
        # elements Tuple[Any, ...], which Beam's type check (--pipeline-type-check, from Beam 2.78)
        # refuses as a GroupByKey input; the coder (FastPrimitivesCoder) is the same for both.
        if self.files is not None and values_only:
            return elements | label >> beam.Map(spill_value, self.files.directory).with_output_types(Any)
        if self.scope is None:
            return elements
        return elements | label >> beam.Map(share_value if values_only else shared, self.scope).with_output_types(Any)

    def before_tokenize(self, texts: beam.PCollection) -> beam.PCollection:
        """The texts Tokenize reads: through the stage that freezes the workers' heap where the
        tuning says so."""
        if not self.tuning.freeze_workers:
            return texts
        return texts | "FreezeWorkerHeap" >> beam.ParDo(_FreezeWorkerHeap())

    def build_examples(self, chunk_outputs: tuple, split_tokens: beam.PCollection, make_build) -> tuple:
        """Apply the objective (``make_build(separate_ok)``: a BuildExamples) to Pack's chunk
        outputs; return ``(example batch PCollections, objective statistics)``.

        Built apart: one BuildExamples per output (``separate_ok`` only for the first, as the
        groups' chunks are the many), each output's batches handed over, their statistics
        flattened. Else one BuildExamples over the outputs' Flatten."""
        if self.tuning.build_apart:
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
        """Around the pipeline's run: where the tuning freezes the run's heap, the objects that
        exist now stay out of the garbage collector's full passes until it ends. A process that
        froze objects itself is left alone (a freeze has no undo of one caller's part)."""
        if not self.tuning.freeze_run or gc.get_freeze_count():
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
            close_scope(self.scope)
