"""Values handed over by reference (pipelines.reference_handoff): stored once in this process,
read back as the very objects, let go of by their last reader, and never read as another value."""

from __future__ import annotations

import pickle
import subprocess
import sys
from typing import NamedTuple

import numpy as np
import pytest
from lmshards_testing import ROOT

from pipelines import reference_handoff
from pipelines.reference_handoff import HandoffError, close_scope, open_scope, shared
from transforms.handoff import let_go


class _Named(NamedTuple):
    key: bytes
    ids: bytes


def test_pickling_stores_the_value_once_and_writes_only_a_token_until_its_reader_lets_go():
    scope = open_scope()
    ids = np.arange(1_000_000, dtype=np.int32).tobytes()
    try:
        value = shared((b"key", ids), scope)
        assert value == (b"key", ids) and isinstance(value, tuple)
        blob = pickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL)
        assert len(blob) < 200  # a token, not 4 MB
        assert pickle.dumps(value) and len(reference_handoff._STORE[scope]) == 1  # encoded again: one entry
        back = pickle.loads(blob)
        assert back is value  # the same object: no copy
        assert pickle.loads(blob) is value  # read again before its reader let go
        assert pickle.loads(pickle.dumps(back)) is value  # re-encoded, as a pass-through stage does
        let_go(back)
        assert reference_handoff._STORE[scope] == {}  # the run no longer holds it
        with pytest.raises(HandoffError, match="no longer stored"):
            pickle.loads(blob)  # read after: an error, never another value
        let_go(back)  # twice: nothing more happens
        let_go((b"a", b"plain tuple"))  # not handed over: nothing happens
    finally:
        close_scope(scope)


def test_a_scope_that_keeps_its_values_holds_them_until_it_closes():
    scope = open_scope(keep=True)  # the runner replays bundles
    try:
        value = shared((b"key", b"ids"), scope)
        blob = pickle.dumps(value)
        let_go(pickle.loads(blob))
        assert pickle.loads(blob) is value  # read again (a replayed bundle)
    finally:
        close_scope(scope)
    assert scope not in reference_handoff._KEEP
    with pytest.raises(HandoffError, match="no longer stored"):
        pickle.loads(blob)


def test_a_named_tuple_stays_one_with_its_fields():
    scope = open_scope()
    try:
        value = shared(_Named(b"k", b"ids"), scope)
        assert isinstance(value, _Named) and value.key == b"k" and value.ids == b"ids" and value == (b"k", b"ids")
        assert pickle.loads(pickle.dumps(value)) is value
    finally:
        close_scope(scope)
    with pytest.raises(TypeError, match="only tuples"):
        shared([b"k"], scope)


def test_closing_a_scope_drops_the_values_of_its_run_only():
    first, second = open_scope(), open_scope()
    blob_first = pickle.dumps(shared((b"first",), first))
    blob_second = pickle.dumps(shared((b"second",), second))
    close_scope(first)
    assert first not in reference_handoff._STORE
    with pytest.raises(HandoffError, match="no longer stored"):
        pickle.loads(blob_first)
    assert pickle.loads(blob_second) == (b"second",)
    close_scope(second)
    with pytest.raises(HandoffError, match="no longer stored"):
        pickle.loads(blob_second)


def test_a_token_read_in_another_process_fails_clearly():
    scope = open_scope()
    try:
        blob = pickle.dumps(shared((b"payload",), scope))
        done = subprocess.run([sys.executable, "-c", "import pickle, sys; pickle.loads(sys.stdin.buffer.read())"],
                              input=blob, capture_output=True, cwd=ROOT)
        assert done.returncode != 0
        assert "HandoffError" in done.stderr.decode()
        assert "only works with Beam's in-process runner" in done.stderr.decode()
    finally:
        close_scope(scope)
