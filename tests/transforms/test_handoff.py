"""By-reference handoff of large values across Beam's in-process shuffles (transforms.handoff)."""

from __future__ import annotations

import pickle
import subprocess
import sys

import apache_beam as beam
import numpy as np
import pytest
from apache_beam.options.pipeline_options import PipelineOptions
from apache_beam.testing.util import assert_that, equal_to
from lmshards_testing import ROOT

from transforms import handoff
from transforms.handoff import ByReference, HandoffError, release, scope, unwrap


def test_pickling_stores_the_value_and_writes_only_a_token():
    run = scope()
    value = np.arange(1_000_000, dtype=np.int32).tobytes()
    try:
        blob = pickle.dumps(ByReference(value, run), protocol=pickle.HIGHEST_PROTOCOL)
        assert len(blob) < 200  # a token, not 4 MB
        back = pickle.loads(blob)
        assert type(back) is ByReference and back.scope == run
        assert back.value is value  # the same object: no copy
        assert pickle.loads(blob).value is value  # read again (a replayed bundle)
        again = pickle.loads(pickle.dumps(back))  # re-encoded, as the runner's grouping does
        assert again.value is value
    finally:
        release(run)


def test_unwrap_takes_the_value_out_and_leaves_anything_else_alone():
    run = scope()
    assert unwrap(ByReference((b"k", b"ids"), run)) == (b"k", b"ids")
    assert unwrap((b"k", b"ids")) == (b"k", b"ids")
    assert unwrap(None) is None


def test_release_drops_the_values_of_its_scope_only():
    first, second = scope(), scope()
    blob_first = pickle.dumps(ByReference(b"first", first))
    blob_second = pickle.dumps(ByReference(b"second", second))
    release(first)
    assert not [key for key in handoff._STORE if key[0] == first]
    with pytest.raises(HandoffError, match="no longer stored"):
        pickle.loads(blob_first)
    assert pickle.loads(blob_second).value == b"second"
    release(second)
    with pytest.raises(HandoffError, match="no longer stored"):
        pickle.loads(blob_second)


def test_a_token_read_in_another_process_fails_clearly():
    run = scope()
    try:
        blob = pickle.dumps(ByReference(b"payload", run))
        done = subprocess.run([sys.executable, "-c", "import pickle, sys; pickle.loads(sys.stdin.buffer.read())"],
                              input=blob, capture_output=True, cwd=ROOT)
        assert done.returncode != 0
        assert "HandoffError" in done.stderr.decode()
        assert "only works with Beam's in-process runner" in done.stderr.decode()
    finally:
        release(run)


@pytest.mark.parametrize("beam_args", [[], ["--direct_runner_bundle_repeat=1"]], ids=["once", "bundle_repeat"])
def test_values_cross_a_real_group_by_key_of_the_in_process_runner_without_a_copy(beam_args):
    """The values a GroupByKey hands on are the very objects the producer stored (no bytes
    copied), also when the runner replays every bundle."""
    run = scope()

    def produce(index):
        yield index % 3, ByReference((index, np.full(100_000, index, dtype=np.int32).tobytes()), run)

    def consume(element):
        key, values = element
        stored = [value for (name, _), value in list(handoff._STORE.items()) if name == run]
        for value in values:
            pair = unwrap(value)
            yield key, pair[0], any(pair is s for s in stored), len(pair[1])

    expected = [(i % 3, i, True, 400_000) for i in range(12)]
    try:
        with beam.Pipeline(options=PipelineOptions(["--runner=FnApiRunner", *beam_args])) as pipeline:
            got = pipeline | beam.Create(range(12)) | beam.FlatMap(produce) | beam.GroupByKey() | beam.FlatMap(consume)
            assert_that(got, equal_to(expected))
    finally:
        release(run)
    assert not [key for key in handoff._STORE if key[0] == run]
