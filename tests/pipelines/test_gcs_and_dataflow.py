"""gs:// end to end against a real local GCS server, and a Dataflow job built with --dry_run."""

from __future__ import annotations

import glob
import hashlib
import json
import os
import socket

import pytest
from gcs_emulator import download_tree, start_emulator, upload
from lmshards_testing import ROOT, file_digests, materialize

BUCKET = "lmshards-test"


@pytest.fixture(scope="module")
def gcs(sample_glob, tokenizer_path):
    emulator = start_emulator(BUCKET)
    for path in sorted(glob.glob(sample_glob)):
        upload(path, f"gs://{BUCKET}/corpus/{os.path.basename(path)}")
    upload(tokenizer_path, f"gs://{BUCKET}/tokenizer.json")
    yield emulator
    emulator.stop()
    os.environ.pop("STORAGE_EMULATOR_HOST", None)


ARGS = ["--objective", "clm", "--seq-len", "128", "--num-buckets", "8", "--validation-fraction", "0.1",
        "--num-shards", "2", "--formats", "arrow,webdataset"]


def test_gs_inputs_tokenizer_and_output_give_the_bytes_of_a_local_run(gcs, tmp_path, sample_glob, tokenizer_path):
    remote = materialize(f"gs://{BUCKET}/out/clm", "--input", f"gs://{BUCKET}/corpus/*.jsonl",
                         "--tokenizer", f"gs://{BUCKET}/tokenizer.json", *ARGS)
    local = materialize(tmp_path / "local", "--input", sample_glob, "--tokenizer", tokenizer_path, *ARGS)
    assert remote.deterministic_view() == local.deterministic_view()
    objects = download_tree(f"gs://{BUCKET}/out/clm")
    remote_digests = {p: hashlib.sha256(b).hexdigest() for p, b in objects.items() if p != "manifest.json"}
    assert remote_digests == file_digests(tmp_path / "local")
    assert not any(p.startswith(".tmp") for p in objects)
    assert remote.run["input_files"][0]["path"].startswith(f"gs://{BUCKET}/corpus/")


def test_dataflow_job_builds_with_dry_run(gcs, tmp_path):
    """Translation and pickling for Dataflow must work: a change that breaks them fails here."""
    from pipelines.materialize import run_job

    out = f"gs://{BUCKET}/out/dataflow"
    manifest, result = run_job([
        "--input", f"gs://{BUCKET}/corpus/*.jsonl", "--tokenizer", f"gs://{BUCKET}/tokenizer.json",
        "--output", out, *ARGS, "--runner", "DataflowRunner", "--dry_run=True", "--no_auth",
        "--project", "lmshards-test", "--region", "us-central1", "--temp_location", f"gs://{BUCKET}/tmp",
        "--setup_file", str(ROOT / "setup.py"),
    ])
    assert manifest is None
    transforms = result.job.proto_pipeline.components.transforms.values()
    labels = {t.unique_name.split("/")[0] for t in transforms}
    assert {"ReadCorpus", "Tokenize", "Pack", "BuildExamples", "WriteShards", "WriteManifest"} <= labels
    # Every user DoFn was pickled into the job (payloads hold cloudpickle bytes).
    pardos = [t for t in transforms if t.spec.urn == "beam:transform:pardo:v1"]
    assert len(pardos) >= 10
    # A dry run validates the output location but writes nothing there.
    assert download_tree(out) == {}


# --- the output on an object store: --overwrite, .tmp, debris, the lock ---------------------------


def _gs_run(out: str, *extra: str):
    return materialize(out, "--input", f"gs://{BUCKET}/corpus/*.jsonl", "--tokenizer", f"gs://{BUCKET}/tokenizer.json",
                       "--objective", "clm", "--seq-len", "128", "--num-buckets", "4", "--formats", "arrow,webdataset",
                       *extra)


def _put(url: str, data: bytes) -> None:
    from apache_beam.io.filesystems import FileSystems

    with FileSystems.create(url) as handle:
        handle.write(data)


@pytest.mark.e2e
def test_gs_overwrite_replaces_every_old_object_and_cleans_tmp(gcs):
    out = f"gs://{BUCKET}/out/overwrite"
    _gs_run(out, "--num-shards", "4")
    four = download_tree(out)
    assert sum(p.startswith("train/arrow/data-") for p in four) == 4
    _put(f"{out}/.tmp/0123-train-arrow-data-00001-of-00004.arrow", b"a partial shard of a killed run")
    with pytest.raises(ValueError, match="directory is not empty"):
        _gs_run(out, "--num-shards", "2")
    manifest = _gs_run(out, "--num-shards", "2", "--overwrite")
    objects = download_tree(out)
    listed = {f["path"] for s in manifest.splits.values() for shard in s["shards"] for f in shard["files"].values()}
    shards = {p for p in objects if p.startswith(("train/", "validation/")) and "/data-" in p}
    assert shards == listed and all("-of-00002." in p for p in shards)  # no old 4-shard file is left
    assert not any(p.startswith(".tmp/") for p in objects) and ".lmshards.lock" not in objects


@pytest.mark.e2e
def test_gs_killed_run_debris_is_replaced_by_the_bytes_of_a_clean_run(gcs):
    clean = f"gs://{BUCKET}/out/clean"
    _gs_run(clean, "--num-shards", "2")
    reference = {p: hashlib.sha256(b).hexdigest() for p, b in download_tree(clean).items() if p != "manifest.json"}
    debris = f"gs://{BUCKET}/out/debris"
    # What a killed run leaves: some shards under final names, temporary files, its (stale) lock.
    for path, data in download_tree(clean).items():
        if path.startswith("train/arrow/") or path == "tokenizer.json":
            _put(f"{debris}/{path}", data)
    _put(f"{debris}/.tmp/feed-train-wds-data-00000-of-00002.tar", b"half a tar")
    _put(f"{debris}/.lmshards.lock", json.dumps({"run_id": "dead", "host": socket.gethostname(), "pid": 2 ** 22 + 7,
                                                  "started": "2020-01-01T00:00:00+00:00"}).encode())
    _gs_run(debris, "--num-shards", "2", "--overwrite")
    got = {p: hashlib.sha256(b).hexdigest() for p, b in download_tree(debris).items() if p != "manifest.json"}
    assert got == reference


def test_gs_lock_refuses_a_second_run_and_foreign_objects_are_refused(gcs):
    out = f"gs://{BUCKET}/out/locked"
    _put(f"{out}/.lmshards.lock", json.dumps({"run_id": "r", "host": "another-host", "pid": 1,
                                               "started": "2020-01-01T00:00:00+00:00"}).encode())
    from transforms.writing.output import OutputLockedError

    with pytest.raises(OutputLockedError, match="another run is writing there"):
        _gs_run(out, "--overwrite")
    foreign = f"gs://{BUCKET}/out/foreign"
    _put(f"{foreign}/notes/mine.txt", b"not lmshards")
    with pytest.raises(ValueError, match="notes/mine.txt is not part of one"):
        _gs_run(foreign, "--overwrite")
    assert download_tree(foreign) == {"notes/mine.txt": b"not lmshards"}
