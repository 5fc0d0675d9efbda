"""Local worker processes (``--workers 2``: FnApiRunner multi_processing) keep every example.

Beam's FnApiRunner sends a stage's input to a worker through a data stream whose timed flush
clears what the runner writes while it sends (benchmarks/beam_flush_race.py); before the
example batches crossed through files (pipelines/file_handoff.py), a large Flatten of them lost
whole batches: 25-40 % of the rows past ~200 MB of text. The repro forces the timing it needs
with a thread of the job's process that holds the GIL in long C calls whenever the runner has
such a stream open (a Beam ``PeriodicThread`` is alive), as large protobuf copies of the
runner's other threads do on a loaded machine: the runner's writes then outlast the flush
period. On the code before the fix this failed 5 runs of 5 (93,643, 78,673, 92,973, 90,297 and
96,503 of the 114,515 rows written; the end-to-end check refused each run).
"""

from __future__ import annotations

import json
import threading

import pytest
from lmshards_testing import ROOT, TOKENIZER, file_digests, materialize

COPIES = 40  # distinct copies of the sample corpus (48 MB): enough batches for the flush to cut


@pytest.fixture(scope="module")
def copied_corpus(tmp_path_factory):
    texts = [json.loads(line)["text"] for path in sorted((ROOT / "data" / "sample").glob("*.jsonl"))
             for line in path.read_text(encoding="utf-8").splitlines()]
    path = tmp_path_factory.mktemp("copies") / "copies.jsonl"
    with open(path, "w", encoding="utf-8") as handle:
        for copy in range(COPIES):
            for text in texts:
                handle.write(json.dumps({"text": f"{text}\n\n(copy {copy})"}) + "\n")
    return str(path)


class _GilHolder:
    """Holds the GIL in long C calls while any Beam time-flushed stream of this process is open."""

    def __init__(self):
        from apache_beam.runners.worker.data_plane import PeriodicThread

        self._stop, self._flusher_type = threading.Event(), PeriodicThread
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self):
        while not self._stop.is_set():
            if any(isinstance(t, self._flusher_type) for t in threading.enumerate()):
                sum(range(10**7))  # one C call: no thread switch inside it
            else:
                self._stop.wait(0.001)

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()


ARGS = ["--objective", "bart", "--seq-len", "512", "--draws", "5", "--tokenizer", TOKENIZER,
        "--formats", "arrow"]


@pytest.mark.e2e
def test_local_workers_keep_every_batch_while_the_runner_is_starved(tmp_path, copied_corpus):
    with _GilHolder():
        manifest = materialize(tmp_path / "workers", "--input", copied_corpus, "--workers", "2", *ARGS)
    assert manifest.counts["reconciled"]
    assert manifest.splits["train"]["examples"] == 114_515  # the rows of this corpus (5 draws of 22,903 chunks)
    assert manifest.splits["train"]["examples"] == sum(s["rows"] for s in manifest.splits["train"]["shards"])
    assert not (tmp_path / "workers" / ".tmp").exists()  # the handoff files are gone with the run
    reference = materialize(tmp_path / "in_process", "--input", copied_corpus, *ARGS)
    assert file_digests(tmp_path / "workers") == file_digests(tmp_path / "in_process")
    assert reference.splits["train"]["examples"] == 114_515
