"""Documents and example batches handed between local worker processes through files (pipelines.file_handoff),
and the Beam race they keep clear of (benchmarks/beam_flush_race.py)."""

from __future__ import annotations

import os
import pickle
import subprocess
import sys

import numpy as np
import pytest
from lmshards_testing import ROOT

from pipelines.file_handoff import FileHandoff, FileHandoffError, SpilledValue, spill_value, spilled


def test_a_block_of_documents_reads_as_the_tuple_it_is_through_its_place(tmp_path):
    """AssignGroups and Pack read a block as a tuple (``tuple(value)``): a spilled block loads,
    once, as the tuple it is; Python's protocol lookups never load it."""
    from transforms.elements import DocumentBatch

    handoff = FileHandoff(str(tmp_path))
    batch = DocumentBatch(np.full((2, 16), 7, np.uint8), np.array([3, 9], np.uint64), np.array([0, 400, 1000]),
                          np.arange(1000, dtype=np.int32))
    try:
        key, handed = spill_value((("train", 3), batch.encode()), handoff.directory)
        assert key == ("train", 3) and tuple(handed) == batch.encode()  # before it crosses: the tuple itself
        back = pickle.loads(pickle.dumps(handed))
        assert isinstance(back, SpilledValue)
        assert getattr(back, "__getnewargs_ex__", None) is None and back._value is None  # not loaded
        again = DocumentBatch.decode(tuple(back))
        assert again.document(1).ids.tolist() == list(range(400, 1000)) and again.buckets.tolist() == [3, 9]
        assert back.load() is back.load()  # read once
        with pytest.raises(AttributeError):
            getattr(back, "no_such_field")  # noqa: B009 - the attribute lookup is the test
    finally:
        handoff.release()


def test_pickling_writes_the_value_once_and_keeps_only_its_place(tmp_path):
    handoff = FileHandoff(str(tmp_path))
    ids = np.arange(500_000, dtype=np.int32).tobytes()
    value = (b"orders", ids, {"input_ids": ids[:40]})
    try:
        blob = pickle.dumps(spilled(value, handoff.directory), protocol=pickle.HIGHEST_PROTOCOL)
        assert len(blob) < 300  # a place, not 2 MB
        assert handoff.directory.startswith(str(tmp_path / ".tmp" / "handoff-"))
        files = os.listdir(handoff.directory)
        assert files == [f"{os.getpid()}.bin"]
        assert os.path.getsize(os.path.join(handoff.directory, files[0])) > len(ids)
        back = pickle.loads(blob)
        assert isinstance(back, SpilledValue)
        orders, got_ids, columns = back  # read as the tuple it stands for, as ShardPiece.decode reads it
        assert (orders, got_ids, columns) == value
        again = pickle.dumps(back)  # the runner's grouping re-encodes it: the place only, nothing written
        size = os.path.getsize(os.path.join(handoff.directory, files[0]))
        assert tuple(pickle.loads(again)) == value and len(again) < 300
        assert os.path.getsize(os.path.join(handoff.directory, files[0])) == size
        second = pickle.loads(pickle.dumps(spilled((b"second",), handoff.directory)))
        assert tuple(second) == (b"second",) and second.offset == size  # appended after the first
    finally:
        handoff.release()
    assert not os.path.exists(handoff.directory)


def test_keys_stay_as_they_are_and_only_tuples_are_spilled(tmp_path):
    handoff = FileHandoff(str(tmp_path))
    key, value = spill_value((("train", 3, 8), (b"a", b"b")), handoff.directory)
    assert key == ("train", 3, 8) and type(key) is tuple
    assert value == (b"a", b"b") and type(value) is not tuple
    with pytest.raises(TypeError, match="only tuples"):
        spilled([b"a"], handoff.directory)
    handoff.release()


def test_a_remote_output_hands_over_under_the_temporary_directory():
    handoff = FileHandoff("gs://bucket/out")
    assert os.path.basename(handoff.directory).startswith("lmshards-handoff-")
    assert not handoff.directory.startswith("gs:")
    handoff.release()


def test_a_value_cut_short_or_gone_fails_in_one_line(tmp_path):
    handoff = FileHandoff(str(tmp_path))
    blob = pickle.dumps(spilled((b"x" * 10_000,), handoff.directory))
    path = os.path.join(handoff.directory, f"{os.getpid()}.bin")
    handoff.release()
    with pytest.raises(FileHandoffError, match="cannot be read"):
        tuple(pickle.loads(blob))
    os.makedirs(os.path.dirname(path))
    with open(path, "wb") as handle:
        handle.write(b"\0" * 100)
    with pytest.raises(FileHandoffError, match="cut short: 100 of"):
        tuple(pickle.loads(blob))


def test_another_process_reads_what_this_one_wrote(tmp_path):
    """Workers are processes: the one that builds a batch writes it, another one reads it."""
    handoff = FileHandoff(str(tmp_path))
    try:
        blob = pickle.dumps(spilled((b"payload", 7), handoff.directory))
        code = "import pickle, sys; print(tuple(pickle.loads(sys.stdin.buffer.read())))"
        done = subprocess.run([sys.executable, "-c", code], input=blob, capture_output=True, cwd=ROOT)
        assert done.returncode == 0, done.stderr.decode()
        assert done.stdout.decode().strip() == "(b'payload', 7)"
    finally:
        handoff.release()


@pytest.mark.skipif(not hasattr(os, "fork"), reason="fork is POSIX's")
def test_a_forked_worker_writes_its_own_file_not_its_parents(tmp_path):
    """A process forked after its parent wrote (its open file inherited) appends to a file of its
    own pid: the parent's values stay as they were written."""
    handoff = FileHandoff(str(tmp_path))
    try:
        first = pickle.loads(pickle.dumps(spilled((b"parent", 1), handoff.directory)))
        read, write = os.pipe()
        child = os.fork()
        if child == 0:  # the child: write one value, send its place, leave without cleanup
            os.close(read)
            os.write(write, pickle.dumps(spilled((b"child!", 2), handoff.directory)))
            os._exit(0)
        os.close(write)
        with os.fdopen(read, "rb") as pipe:
            blob = pipe.read()
        assert os.waitpid(child, 0)[1] == 0
        second = pickle.loads(blob)
        assert second.path == os.path.join(handoff.directory, f"{child}.bin") != first.path
        later = pickle.loads(pickle.dumps(spilled((b"parent", 3), handoff.directory)))
        assert (tuple(first), tuple(second), tuple(later)) == ((b"parent", 1), (b"child!", 2), (b"parent", 3))
        assert later.path == first.path and later.offset == first.offset + first.length
    finally:
        handoff.release()


def test_beams_timed_stream_flush_drops_what_is_written_while_it_sends():
    """The Beam race (apache_beam.runners.worker.data_plane, 2.77): a time-flushed stream clears
    its buffer after handing it to a send that takes a while, so bytes written meanwhile are
    never sent. When this starts failing, Beam has fixed it, and pipelines/file_handoff.py may
    no longer be needed with local workers (measure before removing it)."""
    from benchmarks.beam_flush_race import stream_loss

    written, sent = stream_loss(writes=50)
    assert written == 50_000
    assert sent < written // 2
