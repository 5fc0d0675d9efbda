"""Runner tuning (pipelines.runner_tuning): values handed over by reference across Beam's
in-process shuffles, read by the transforms as the tuples they are."""

from __future__ import annotations

import pickle
import subprocess
import sys
from typing import NamedTuple

import apache_beam as beam
import numpy as np
import pytest
from apache_beam.options.pipeline_options import PipelineOptions
from apache_beam.testing.util import assert_that, equal_to
from lmshards_testing import ROOT

from pipelines import runner_tuning
from pipelines.runner_tuning import HandoffError, RunnerTuning, shared
from transforms.handoff import let_go

#: index -> the bytes object made, for the GroupByKey test (this process runs every stage; a
#: module global read by module-level functions, which Beam pickles by reference).
_PRODUCED: dict[int, bytes] = {}


def _produce(index):
    ids = _PRODUCED.setdefault(index, np.full(100_000, index, dtype=np.int32).tobytes())
    yield index % 3, (index, ids)


def _consume(element):
    key, values = element
    for value in values:
        index, ids = value  # a plain tuple to the consumer
        let_go(value)
        yield key, index, ids is _PRODUCED[index], len(ids)


class _Named(NamedTuple):
    key: bytes
    ids: bytes


def test_pickling_stores_the_value_once_and_writes_only_a_token_until_its_reader_lets_go():
    tuning = RunnerTuning(in_one_process=True)
    ids = np.arange(1_000_000, dtype=np.int32).tobytes()
    try:
        value = shared((b"key", ids), tuning.scope)
        assert value == (b"key", ids) and isinstance(value, tuple)
        blob = pickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL)
        assert len(blob) < 200  # a token, not 4 MB
        assert pickle.dumps(value) and len(runner_tuning._STORE[tuning.scope]) == 1  # encoded again: one entry
        back = pickle.loads(blob)
        assert back is value  # the same object: no copy
        assert pickle.loads(blob) is value  # read again before its reader let go
        assert pickle.loads(pickle.dumps(back)) is value  # re-encoded, as a pass-through stage does
        let_go(back)
        assert runner_tuning._STORE[tuning.scope] == {}  # the run no longer holds it
        with pytest.raises(HandoffError, match="no longer stored"):
            pickle.loads(blob)  # read after: an error, never another value
        let_go(back)  # twice: nothing more happens
        let_go((b"a", b"plain tuple"))  # not handed over: nothing happens
    finally:
        tuning.release()


def test_a_runner_that_replays_bundles_keeps_the_values_until_the_run_ends():
    tuning = RunnerTuning(in_one_process=True, replays=True)
    try:
        value = shared((b"key", b"ids"), tuning.scope)
        blob = pickle.dumps(value)
        let_go(pickle.loads(blob))
        assert pickle.loads(blob) is value  # read again (a replayed bundle)
    finally:
        tuning.release()
    assert tuning.scope not in runner_tuning._KEEP
    with pytest.raises(HandoffError, match="no longer stored"):
        pickle.loads(blob)


def test_a_named_tuple_stays_one_with_its_fields():
    tuning = RunnerTuning(in_one_process=True)
    try:
        value = shared(_Named(b"k", b"ids"), tuning.scope)
        assert isinstance(value, _Named) and value.key == b"k" and value.ids == b"ids" and value == (b"k", b"ids")
        assert pickle.loads(pickle.dumps(value)) is value
    finally:
        tuning.release()
    with pytest.raises(TypeError, match="only tuples"):
        shared([b"k"], tuning.scope)


def test_release_drops_the_values_of_its_run_only():
    first, second = RunnerTuning(in_one_process=True), RunnerTuning(in_one_process=True)
    blob_first = pickle.dumps(shared((b"first",), first.scope))
    blob_second = pickle.dumps(shared((b"second",), second.scope))
    first.release()
    assert first.scope not in runner_tuning._STORE
    with pytest.raises(HandoffError, match="no longer stored"):
        pickle.loads(blob_first)
    assert pickle.loads(blob_second) == (b"second",)
    second.release()
    with pytest.raises(HandoffError, match="no longer stored"):
        pickle.loads(blob_second)


def test_other_runners_get_the_values_as_they_are():
    tuning = RunnerTuning(in_one_process=False)
    assert tuning.scope is None
    with beam.Pipeline(options=PipelineOptions(["--runner=FnApiRunner"])) as pipeline:
        elements = pipeline | beam.Create([(1, (b"a",))])
        assert tuning.hand_over(elements, "HandOver", values_only=True) is elements
    tuning.release()


def test_a_token_read_in_another_process_fails_clearly():
    tuning = RunnerTuning(in_one_process=True)
    try:
        blob = pickle.dumps(shared((b"payload",), tuning.scope))
        done = subprocess.run([sys.executable, "-c", "import pickle, sys; pickle.loads(sys.stdin.buffer.read())"],
                              input=blob, capture_output=True, cwd=ROOT)
        assert done.returncode != 0
        assert "HandoffError" in done.stderr.decode()
        assert "only works with Beam's in-process runner" in done.stderr.decode()
    finally:
        tuning.release()


@pytest.mark.parametrize("beam_args", [[], ["--direct_runner_bundle_repeat=1"]], ids=["once", "bundle_repeat"])
def test_values_cross_a_real_group_by_key_of_the_in_process_runner_without_a_copy(beam_args):
    """The values a GroupByKey hands on are the very objects handed over (no bytes copied),
    read as plain tuples, also when the runner replays every bundle."""
    tuning = RunnerTuning(in_one_process=True, replays=bool(beam_args))
    produced_ids = _PRODUCED
    produced_ids.clear()

    expected = [(i % 3, i, True, 400_000) for i in range(12)]
    try:
        with beam.Pipeline(options=PipelineOptions(["--runner=FnApiRunner", *beam_args])) as pipeline:
            produced = pipeline | beam.Create(range(12)) | beam.FlatMap(_produce)
            got = (tuning.hand_over(produced, "HandOver", values_only=True) | beam.GroupByKey()
                   | beam.FlatMap(_consume))
            assert_that(got, equal_to(expected))
        if not beam_args:  # every value let go of by its reader (Beam's size samples too): none waits for the end
            assert runner_tuning._STORE[tuning.scope] == {}
    finally:
        tuning.release()
    assert tuning.scope not in runner_tuning._STORE


def test_only_a_beam_worker_process_freezes_its_heap(monkeypatch):
    """A local SDK worker (a process running ``sdk_worker_main``) freezes its objects once;
    any other process, this test's included, is left alone."""
    import gc
    import importlib.machinery
    import types

    from pipelines.runner_tuning import SDK_WORKER_MAIN, freeze_worker_heap

    assert gc.get_freeze_count() == 0
    assert not freeze_worker_heap()
    assert gc.get_freeze_count() == 0
    worker_main = types.ModuleType("__main__")
    worker_main.__spec__ = importlib.machinery.ModuleSpec(SDK_WORKER_MAIN, None)
    monkeypatch.setitem(sys.modules, "__main__", worker_main)
    try:
        assert freeze_worker_heap()
        frozen = gc.get_freeze_count()
        assert frozen > 1000
        assert not freeze_worker_heap()  # frozen already: nothing more
        assert gc.get_freeze_count() == frozen
    finally:
        gc.unfreeze()


def _labels(tuning: RunnerTuning) -> set[str]:
    """The transform labels of materialize's graph on the sample corpus under ``tuning``."""
    from lmshards_testing import SAMPLE_GLOB, TOKENIZER

    from pipelines.materialize import build_pipeline
    from pipelines.options import parse_args
    from pipelines.plan import plan_run

    plan = plan_run(parse_args(["--input", SAMPLE_GLOB, "--tokenizer", TOKENIZER, "--output", "/nonexistent-out",
                                "--objective", "bart", "--seq-len", "64"]))
    pipeline = beam.Pipeline(options=PipelineOptions(["--runner=FnApiRunner"]))
    build_pipeline(pipeline, plan, tuning=tuning)
    labels = set()

    class Visitor(beam.pipeline.PipelineVisitor):
        def enter_composite_transform(self, node):
            labels.add(node.full_label)

        def visit_transform(self, node):
            labels.add(node.full_label)

    pipeline.visit(Visitor())
    tuning.release()
    return labels


def test_the_graph_differs_by_runner_only_where_the_tuning_says():
    """Dataflow and other runners: one BuildExamples over the chunk outputs' Flatten, nothing
    handed over, no worker freeze. FnApiRunner: the objective on each chunk output apart (no
    chunk materialized between stages), the documents and each output's example batches handed
    over, by reference in-process, through files with local workers (whose heaps are frozen)."""
    plain = _labels(RunnerTuning(in_one_process=False))
    assert {"AllChunks", "BuildExamples"} <= plain
    assert not {label for label in plain if label.startswith(("HandOver", "BuildRepacked", "FreezeWorkerHeap"))}
    in_process = _labels(RunnerTuning(in_one_process=True))
    assert {"BuildExamples", "BuildRepackedExamples", "HandOverDocuments", "HandOverExamples",
            "HandOverRepackedExamples"} <= in_process
    assert not {label for label in in_process if label.startswith(("HandOverChunks", "AllChunks", "FreezeWorkerHeap"))}
    workers = _labels(RunnerTuning(in_one_process=False, local_workers=True))
    assert {"BuildExamples", "BuildRepackedExamples", "FreezeWorkerHeap", "HandOverDocuments", "HandOverExamples",
            "HandOverRepackedExamples"} <= workers
    assert not {label for label in workers if label.startswith(("HandOverChunks", "AllChunks"))}


def test_an_in_process_run_freezes_the_older_objects_while_it_runs_and_then_unfreezes():
    import gc

    assert gc.get_freeze_count() == 0
    tuning = RunnerTuning(in_one_process=True)
    with tuning.running():
        assert gc.get_freeze_count() > 1000
    assert gc.get_freeze_count() == 0
    with RunnerTuning(in_one_process=False, local_workers=True).running():
        assert gc.get_freeze_count() == 0  # the job's process of a multi-process run: not measured, left alone
    tuning.release()
