"""Runner tuning (pipelines.runner_tuning, applied by pipelines.tuned_run): what each runner
gets, the graph differing only where the tuning says, values handed over by reference across
Beam's in-process shuffles, and the frozen heaps."""

from __future__ import annotations

import os

import apache_beam as beam
import numpy as np
import pytest
from apache_beam.options.pipeline_options import PipelineOptions
from apache_beam.testing.util import assert_that, equal_to

from pipelines import reference_handoff, runner_tuning
from pipelines.parallelism import RunnerSetup
from pipelines.runner_tuning import PLAIN, RunnerTuning, choose_tuning, estimated_groups, tuning_for
from pipelines.tuned_run import TunedRun
from transforms.handoff import let_go

PATHS = ["--input", "in.txt", "--output", "out", "--tokenizer", "tok.json"]
BASE = [*PATHS, "--objective", "ul2", "--inputs-length", "128"]

# --- the choice --------------------------------------------------------------------------------


def _setup(runner, multi_processing=False, **more):
    return RunnerSetup(runner, multi_processing, 2, (), **more)


def test_only_beams_fnapirunner_gets_more_than_the_plain_graph():
    in_process = choose_tuning(_setup("FnApiRunner"))
    assert in_process == RunnerTuning(build_apart=True, by_reference=True, freeze_run=True)
    assert choose_tuning(_setup("FnApiRunner", replays_bundles=True)) == RunnerTuning(
        build_apart=True, by_reference=True, keep_references=True, freeze_run=True)
    workers = choose_tuning(_setup("FnApiRunner", multi_processing=True), encoder_threads=3)
    assert workers == RunnerTuning(encoder_threads=3, build_apart=True, through_files=True, freeze_workers=True)
    # a dry run in one process is never run: nothing to hand over or freeze
    assert choose_tuning(_setup("FnApiRunner"), dry_run=True) == PLAIN
    for runner in ("BundleBasedDirectRunner", "PrismRunner", "FlinkRunner", "SparkRunner", "DataflowRunner"):
        assert choose_tuning(_setup(runner), encoder_threads=2, build_stage="fused") == RunnerTuning(
            encoder_threads=2), runner


def test_build_stage_auto_separates_the_objective_only_where_that_buys_parallelism():
    def stage(runner, objective, groups, multi_processing=False):
        return choose_tuning(_setup(runner, multi_processing), objective=objective, groups=groups).build_stage

    assert stage("FnApiRunner", "bart", 1) == "fused"
    assert stage("FnApiRunner", "bart", 1, multi_processing=True) == "fused"  # measured: no gain
    assert stage("BundleBasedDirectRunner", "bart", 1) == "fused"
    assert stage("DataflowRunner", "bart", 10) == "separate"  # fewer groups than workers
    assert stage("DataflowRunner", "bart", 5000) == "fused"  # groups enough for every worker
    assert stage("DataflowRunner", "clm", 10) == "fused"  # a copy is not worth a shuffle
    assert choose_tuning(_setup("FnApiRunner"), build_stage="separate", objective="clm", groups=1).build_stage == (
        "separate")
    # 10 GB of text, about 2.5 G tokens, in groups of 2**27; gzip counted as 4 times its size
    assert estimated_groups([("a.jsonl", 10 * 10**9)], 2**27, None) == 19
    assert estimated_groups([("a.jsonl.gz", 10**9)], 2**27, None) == 8
    assert estimated_groups([("a.jsonl", 10**12)], 2**27, 64) == 64


def test_encoder_threads_share_the_cores_among_multi_processing_workers(capsys):
    from pipelines.options import parse_args

    def threads(argv):
        return tuning_for(parse_args(argv), []).encoder_threads

    cores = len(os.sched_getaffinity(0))
    assert threads(BASE) is None  # in-process: the tokenizer's default
    multi = [*BASE, "--direct_running_mode=multi_processing"]
    assert threads([*multi, "--direct_num_workers=2"]) == max(1, cores // 2)
    assert threads([*multi, f"--direct_num_workers={2 * cores}"]) == 1
    assert threads([*multi, "--direct_num_workers=2", "--encoder-threads", "3"]) == 3
    # Dataflow runs one SDK process per core, unless told to run one.
    assert threads([*BASE, "--runner", "DataflowRunner"]) == 1
    assert threads([*BASE, "--runner", "DataflowRunner", "--experiments=no_use_multiple_sdk_containers"]) is None
    for bad in ("0", "many"):
        with pytest.raises(SystemExit):
            parse_args([*BASE, "--encoder-threads", bad])
        assert f"--encoder-threads {bad}: expected auto or a number of threads >= 1" in capsys.readouterr().err


def test_flink_and_sparks_sdk_workers_share_the_cores_among_their_encoders(monkeypatch):
    monkeypatch.setattr(runner_tuning, "usable_cores", lambda: 8)  # our own helper, not Beam's
    for beam_args, threads in ((["--runner=FlinkRunner", "--parallelism=2", "--sdk_worker_parallelism=2"], 4),
                               (["--runner=SparkRunner", "--spark_master_url=local[4]"], 2),
                               (["--runner=FlinkRunner"], 1), (["--runner=SparkRunner"], 1)):
        assert choose_tuning(RunnerSetup.from_beam_args(beam_args)).encoder_threads == threads, beam_args
    assert choose_tuning(RunnerSetup.from_beam_args(["--runner=PrismRunner"])).encoder_threads is None  # one worker


# --- the graph -----------------------------------------------------------------------------------


def _labels(tuning: RunnerTuning) -> set[str]:
    """The transform labels of materialize's graph on the sample corpus under ``tuning``."""
    from lmshards_testing import SAMPLE_GLOB, TOKENIZER

    from pipelines.materialize import build_pipeline
    from pipelines.options import parse_args
    from pipelines.plan import plan_run

    plan = plan_run(parse_args(["--input", SAMPLE_GLOB, "--tokenizer", TOKENIZER, "--output", "/nonexistent-out",
                                "--objective", "bart", "--seq-len", "64"]))
    pipeline = beam.Pipeline(options=PipelineOptions(["--runner=FnApiRunner"]))
    tuned = TunedRun(tuning)
    build_pipeline(pipeline, plan, tuned=tuned)
    labels = set()

    class Visitor(beam.pipeline.PipelineVisitor):
        def enter_composite_transform(self, node):
            labels.add(node.full_label)

        def visit_transform(self, node):
            labels.add(node.full_label)

    pipeline.visit(Visitor())
    tuned.release()
    return labels


def test_the_graph_differs_by_runner_only_where_the_tuning_says():
    """Dataflow and other runners: one BuildExamples over the chunk outputs' Flatten, nothing
    handed over, no worker freeze. FnApiRunner: the objective on each chunk output apart (no
    chunk materialized between stages), the documents and each output's example batches handed
    over, by reference in-process, through files with local workers (whose heaps are frozen)."""
    plain = _labels(choose_tuning(_setup("DataflowRunner")))
    assert {"AllChunks", "BuildExamples"} <= plain
    assert not {label for label in plain if label.startswith(("HandOver", "BuildRepacked", "FreezeWorkerHeap"))}
    in_process = _labels(choose_tuning(_setup("FnApiRunner")))
    assert {"BuildExamples", "BuildRepackedExamples", "HandOverDocuments", "HandOverExamples",
            "HandOverRepackedExamples"} <= in_process
    assert not {label for label in in_process if label.startswith(("HandOverChunks", "AllChunks", "FreezeWorkerHeap"))}
    workers = _labels(choose_tuning(_setup("FnApiRunner", multi_processing=True)))
    assert {"BuildExamples", "BuildRepackedExamples", "FreezeWorkerHeap", "HandOverDocuments", "HandOverExamples",
            "HandOverRepackedExamples"} <= workers
    assert not {label for label in workers if label.startswith(("HandOverChunks", "AllChunks"))}


def test_other_runners_get_the_values_as_they_are():
    tuned = TunedRun(PLAIN)
    assert tuned.scope is None and tuned.files is None
    with beam.Pipeline(options=PipelineOptions(["--runner=FnApiRunner"])) as pipeline:
        elements = pipeline | beam.Create([(1, (b"a",))])
        assert tuned.hand_over(elements, "HandOver", values_only=True) is elements
    tuned.release()


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


@pytest.mark.parametrize("beam_args", [[], ["--direct_runner_bundle_repeat=1"]], ids=["once", "bundle_repeat"])
def test_values_cross_a_real_group_by_key_of_the_in_process_runner_without_a_copy(beam_args):
    """The values a GroupByKey hands on are the very objects handed over (no bytes copied),
    read as plain tuples, also when the runner replays every bundle."""
    tuned = TunedRun(choose_tuning(RunnerSetup.from_beam_args(["--runner=FnApiRunner", *beam_args])))
    assert tuned.tuning.keep_references == bool(beam_args)
    _PRODUCED.clear()

    expected = [(i % 3, i, True, 400_000) for i in range(12)]
    try:
        with beam.Pipeline(options=PipelineOptions(["--runner=FnApiRunner", *beam_args])) as pipeline:
            produced = pipeline | beam.Create(range(12)) | beam.FlatMap(_produce)
            got = (tuned.hand_over(produced, "HandOver", values_only=True) | beam.GroupByKey()
                   | beam.FlatMap(_consume))
            assert_that(got, equal_to(expected))
        if not beam_args:  # every value let go of by its reader (Beam's size samples too): none waits for the end
            assert reference_handoff._STORE[tuned.scope] == {}
    finally:
        tuned.release()
    assert tuned.scope not in reference_handoff._STORE


# --- the frozen heaps ----------------------------------------------------------------------------


def test_only_a_beam_worker_process_freezes_its_heap(monkeypatch):
    """A local SDK worker (a process running ``sdk_worker_main``) freezes its objects once;
    any other process, this test's included, is left alone."""
    import gc
    import importlib.machinery
    import sys
    import types

    from pipelines.tuned_run import SDK_WORKER_MAIN, freeze_worker_heap

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


def test_an_in_process_run_freezes_the_older_objects_while_it_runs_and_then_unfreezes():
    import gc

    assert gc.get_freeze_count() == 0
    tuned = TunedRun(choose_tuning(_setup("FnApiRunner")))
    with tuned.running():
        assert gc.get_freeze_count() > 1000
    assert gc.get_freeze_count() == 0
    workers = TunedRun(choose_tuning(_setup("FnApiRunner", multi_processing=True)))
    with workers.running():
        assert gc.get_freeze_count() == 0  # the job's process of a multi-process run: not measured, left alone
    tuned.release()
    workers.release()
