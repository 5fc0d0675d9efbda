"""Runner portability: the same bytes on every Beam runner that runs here, and a run whose
runner or writer loses work fails before it writes a manifest.

The configuration is the one with which Beam's BundleBasedDirectRunner once lost the
re-packed remainder examples (they reached the writers as a side input made by a
multi-output DoFn, which that runner hands over empty at times): 8 buckets, 4 train
shards, a validation split, both formats.
"""

from __future__ import annotations

import os

import pyarrow as pa
import pytest
from lmshards_testing import ROOT, file_digests, materialize

from pipelines.materialize import main
from schemas.manifest import Manifest

FAQ = str(ROOT / "data" / "sample" / "faq.jsonl")
ARGS = ["--input", FAQ, "--objective", "clm", "--seq-len", "512", "--formats", "arrow,webdataset",
        "--validation-fraction", "0.05", "--num-shards", "4", "--num-buckets", "8"]


def _args(tokenizer_path, *extra):
    return [*ARGS, "--tokenizer", tokenizer_path, *extra]


@pytest.fixture(scope="module")
def reference(tmp_path_factory, tokenizer_path):
    out = tmp_path_factory.mktemp("in-process") / "out"
    manifest = materialize(out, *_args(tokenizer_path))
    return out, manifest


def _keys(out, split):
    keys = []
    for name in sorted(os.listdir(out / split / "arrow")):
        if name.endswith(".arrow"):
            with pa.ipc.open_stream(str(out / split / "arrow" / name)) as reader:
                keys.extend(reader.read_all().column("key").to_pylist())
    return keys


def test_reference_run_writes_every_example_it_built(reference):
    out, manifest = reference
    for split in ("train", "validation"):
        built = manifest.stats[split]["objective"]["examples"]
        keys = _keys(out, split)
        assert len(keys) == len(set(keys)) == manifest.splits[split]["examples"] == built
        assert any("-r-c" in key for key in keys), split  # the re-packed remainders are there
    assert (manifest.splits["train"]["examples"], manifest.splits["validation"]["examples"]) == (89, 5)


RUNNER_MODES = {
    "multi_processing": ["--direct_running_mode=multi_processing", "--direct_num_workers=2"],
    "bundle_repeat": ["--direct_runner_bundle_repeat=1"],
    # three runs: which side input that runner loses varied from run to run
    "bundle_based_1": ["--runner", "BundleBasedDirectRunner"],
    "bundle_based_2": ["--runner", "BundleBasedDirectRunner"],
    "bundle_based_3": ["--runner", "BundleBasedDirectRunner"],
}


@pytest.mark.e2e
@pytest.mark.parametrize("mode", sorted(RUNNER_MODES))
def test_every_runner_mode_writes_the_bytes_of_the_in_process_runner(tmp_path, reference, tokenizer_path, mode):
    reference_out, reference_manifest = reference
    out = tmp_path / "out"
    manifest = materialize(out, *_args(tokenizer_path, *RUNNER_MODES[mode]))
    assert file_digests(out) == file_digests(reference_out)
    assert manifest.deterministic_view() == reference_manifest.deterministic_view()
    on_disk = Manifest.loads((out / "manifest.json").read_text())
    assert on_disk.deterministic_view() == reference_manifest.deterministic_view()


def _dropping_arrow_writer(handle, columns):
    """An Arrow shard writer with a fault: it leaves out the last row of every shard it writes."""
    rows = 0
    with pa.ipc.new_stream(handle, columns.schema.schema) as writer:
        batches = list(columns.record_batches())
        if batches:
            batches[-1] = batches[-1].slice(0, batches[-1].num_rows - 1)
        for batch in batches:
            writer.write_batch(batch)
            rows += batch.num_rows
    return rows


def test_a_writer_that_drops_a_row_fails_the_run_without_a_manifest(tmp_path, monkeypatch, capfd, tokenizer_path):
    import transforms.write as write

    monkeypatch.setitem(write.WRITERS, "arrow", _dropping_arrow_writer)
    out = tmp_path / "out"
    args = [part if part != "arrow,webdataset" else "arrow" for part in _args(tokenizer_path)]
    assert main(["--output", str(out), *args]) == 1
    err = capfd.readouterr().err.strip().splitlines()
    assert err[-1] == ("lmshards materialize: error: train: counts do not add up: shard files hold 85 rows, not the "
                       "89 examples built (WriteShards), a runner or writer lost or repeated work; "
                       "no manifest written")
    assert not (out / "manifest.json").exists()


def test_shard_files_that_disagree_on_their_rows_fail_the_run(tmp_path, monkeypatch, capfd, tokenizer_path):
    import transforms.write as write

    monkeypatch.setitem(write.WRITERS, "arrow", _dropping_arrow_writer)
    out = tmp_path / "out"
    assert main(["--output", str(out), *_args(tokenizer_path)]) == 1
    err = capfd.readouterr().err.strip().splitlines()[-1]
    assert err.startswith("lmshards materialize: error: the pipeline failed: ShardRowsError: shard ")
    assert "its files hold different numbers of rows (arrow " in err
    assert not (out / "manifest.json").exists()
