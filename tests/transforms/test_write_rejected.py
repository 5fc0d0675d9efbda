"""Rejected records: several files when there are many, each sorted, the same on every runner."""

from __future__ import annotations

import hashlib
import json
import os

import apache_beam as beam
import pytest
from apache_beam.options.pipeline_options import PipelineOptions
from lmshards_testing import file_digests, materialize

from transforms.writing.write import WriteRejected, rejected_file_name


def _records(count):
    return [{"source": f"gs://b/part-{i % 3}.jsonl", "position": 1 + i // 3, "reason": "malformed_json",
             "excerpt": f"{{bad {i}"} for i in range(count)]


def _canonical(rows):
    return sorted(json.dumps(r, sort_keys=True) for r in rows)


def _write(out, records, runner, per_file):
    os.makedirs(out / "rejected")
    os.makedirs(out / ".tmp")
    with beam.Pipeline(options=PipelineOptions([f"--runner={runner}"])) as pipeline:
        files, _ = pipeline | beam.Create(records) | WriteRejected(str(out), per_file)
        _ = files | beam.Map(lambda f: None)
    return {path: digest for path, digest in file_digests(out).items() if path.startswith("rejected")}


def test_file_names():
    assert rejected_file_name(0, 1) == "rejected/rejected.jsonl"
    assert rejected_file_name(3, 12) == "rejected/rejected-00003-of-00012.jsonl"


@pytest.mark.parametrize("count, files", [(0, 0), (10, 1), (11, 2), (95, 10)])
def test_records_are_spread_over_ceil_count_per_file_files_each_sorted(tmp_path, count, files):
    records = _records(count)
    digests = _write(tmp_path / "in-process", records, "FnApiRunner", per_file=10)
    assert len(digests) == files
    written = []
    for path in sorted(digests):
        with open(tmp_path / "in-process" / path, encoding="utf-8") as handle:
            rows = [json.loads(line) for line in handle]
        keys = [(r["source"], r["position"], r["reason"], r["excerpt"]) for r in rows]
        assert keys == sorted(keys)
        assert files == 1 or len(rows) < 20  # spread by a digest of the record: none holds them all
        written.extend(rows)
    assert _canonical(written) == _canonical(records)
    if count:
        # the same files, byte for byte, on Beam's other local runner
        assert _write(tmp_path / "bundle-based", records, "BundleBasedDirectRunner", per_file=10) == digests


def test_a_run_with_many_rejected_records_writes_and_lists_every_file(tmp_path, tokenizer_path, sample_texts):
    corpus = tmp_path / "corpus.jsonl"
    lines = []
    for i, text in enumerate(sample_texts[:30]):
        lines.append(json.dumps({"text": text}))
        lines.append('{"text": ' + str(i) + "}")  # text_not_string
    corpus.write_text("\n".join(lines) + "\n")
    manifest = materialize(tmp_path / "out", "--input", str(corpus), "--tokenizer", tokenizer_path,
                           "--objective", "clm", "--seq-len", "64", "--rejected-per-file", "4")
    listed = manifest.counts["rejected_files"]
    # 30 records over ceil(30 / 4) = 8 files by a digest of each record: a file no record hashes to
    # is not written (no record, no file)
    paths = [f["path"] for f in listed]
    assert 1 < len(paths) == len(set(paths)) and set(paths) <= {rejected_file_name(i, 8) for i in range(8)}
    assert sum(f["records"] for f in listed) == manifest.counts["rejected"] == 30
    for entry in listed:
        data = (tmp_path / "out" / entry["path"]).read_bytes()
        assert hashlib.sha256(data).hexdigest() == entry["sha256"] and len(data) == entry["bytes"]
        assert data.count(b"\n") == entry["records"]
