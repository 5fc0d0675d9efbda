"""Runner portability: the same bytes on every Beam runner that runs here, and a run whose
runner or writer loses work fails before it writes a manifest.

Two configurations: the one with which Beam's BundleBasedDirectRunner once lost the
re-packed remainder examples (they reached the writers as a side input made by a
multi-output DoFn, which that runner hands over empty at times): 8 buckets, 4 train
shards, a validation split, both formats; and the default pack groups sized in tokens,
made small (--pack-group-tokens) so that the sample corpus makes many of them, on the same
documents re-split into other files, in another order, some compressed.
"""

from __future__ import annotations

import gzip
import json
import os

import numpy as np
import pyarrow as pa
import pytest
from lmshards_testing import ROOT, file_digests, materialize

from pipelines.materialize import main
from schemas.manifest import Manifest
from transforms.tokenizing.tokenize import assign_split, document_key

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


GROUP_TOKENS = 20000
GROUP_ARGS = ["--objective", "bart", "--seq-len", "256", "--validation-fraction", "0.1",
              "--pack-group-tokens", str(GROUP_TOKENS)]


def _resplit(sample_texts, directory, parts=5):
    """The same documents, a few of them twice, in another order over ``parts`` files, some gzipped."""
    os.makedirs(directory, exist_ok=True)
    texts = list(sample_texts) + list(sample_texts[::50])
    order = np.random.default_rng(11).permutation(len(texts))
    for part in range(parts):
        name = os.path.join(directory, f"part-{part}.jsonl" + (".gz" if part % 2 else ""))
        with (gzip.open if part % 2 else open)(name, "wt", encoding="utf-8") as handle:
            for index in order[part::parts]:
                handle.write(json.dumps({"text": texts[index]}) + "\n")
    return os.path.join(directory, "part-*")


@pytest.fixture(scope="module")
def grouped(tmp_path_factory, sample_texts, tokenizer_path):
    root = tmp_path_factory.mktemp("groups")
    corpus = _resplit(sample_texts, root / "corpus", parts=1)
    out = root / "out"
    manifest = materialize(out, "--input", corpus, "--tokenizer", tokenizer_path, *GROUP_ARGS)
    return corpus, out, manifest


def test_pack_groups_are_planned_in_tokens_and_recorded(grouped, sample_texts):
    _, out, manifest = grouped
    assert manifest.format_version == 3
    assert manifest.config["pack_group_tokens"] == GROUP_TOKENS and manifest.config["num_buckets"] is None
    train = manifest.splits["train"]
    plan = train["pack_groups"]
    # planned over every document read, its copies included
    duplicates = train["duplicates"]
    assert duplicates == len(sample_texts[::50]) - sum(1 for t in sample_texts[::50] if assign_split(
        document_key(t), 0.1) != "train")
    assert plan["tokens"] > train["document_tokens"] and plan["groups"] >= plan["tokens"] // GROUP_TOKENS
    assert plan["largest_group_tokens"] <= GROUP_TOKENS  # no sample document is that long
    groups = {key.split("-")[1] for key in _keys(out, "train") if "-r-" not in key}
    assert groups == {f"g{index:05d}" for index in range(plan["groups"])}


@pytest.mark.e2e
@pytest.mark.parametrize("mode", ["in_process_resplit", "in_process_separate_build", "multi_processing",
                                  "bundle_repeat", "bundle_based"])
def test_token_sized_groups_give_the_same_bytes_on_every_runner_and_input_split(tmp_path, grouped, sample_texts,
                                                                               tokenizer_path, mode):
    corpus, reference_out, reference_manifest = grouped
    # multi_processing builds bart in a stage of its own, as Dataflow does for a small corpus
    beam_args = {"multi_processing": [*RUNNER_MODES["multi_processing"], "--build-stage", "separate"],
                 "bundle_repeat": RUNNER_MODES["bundle_repeat"],
                 "bundle_based": RUNNER_MODES["bundle_based_1"],
                 "in_process_separate_build": ["--build-stage", "separate"]}.get(mode, [])
    if mode == "in_process_resplit":
        corpus = _resplit(sample_texts, tmp_path / "corpus", parts=5)
    out = tmp_path / "out"
    manifest = materialize(out, "--input", corpus, "--tokenizer", tokenizer_path, *GROUP_ARGS, *beam_args)
    assert file_digests(out) == file_digests(reference_out)
    assert manifest.deterministic_view() == reference_manifest.deterministic_view()


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
    import transforms.writing.write as write

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
    import transforms.writing.write as write

    monkeypatch.setitem(write.WRITERS, "arrow", _dropping_arrow_writer)
    out = tmp_path / "out"
    assert main(["--output", str(out), *_args(tokenizer_path)]) == 1
    err = [line for line in capfd.readouterr().err.strip().splitlines() if not line.startswith("lmshards: ")]
    assert len(err) == 1 and err[0].startswith("lmshards materialize: error: shard ")  # one of lmshards' errors
    assert "its files hold different numbers of rows (arrow " in err[0] and "[while running" not in err[0]
    assert not (out / "manifest.json").exists()
