"""gs:// end to end against a real local GCS server, and a Dataflow job built with --dry_run."""

from __future__ import annotations

import glob
import hashlib
import os

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
