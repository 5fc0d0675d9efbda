"""One large file read in byte ranges (and Parquet in row groups) makes the dataset of the same
documents read whole or spread over many files, rejected records included."""

from __future__ import annotations

import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from lmshards_testing import file_digests, materialize

ARGS = ["--objective", "clm", "--seq-len", "128", "--validation-fraction", "0.1", "--formats", "arrow,webdataset",
        "--pack-group-tokens", "40000"]
BAD = ['{"text": 17}', "not json", "", "   ", '{"body": "no text field"}', '{"text": "   "}']


def _lines(sample_texts):
    """The sample documents as JSON lines, with a bad or blank line after every fifth."""
    lines = []
    for index, text in enumerate(sample_texts):
        lines.append(json.dumps({"text": text}))
        if index % 5 == 0:
            lines.append(BAD[(index // 5) % len(BAD)])
    return lines


def _shard_digests(out):
    return {path: digest for path, digest in file_digests(out).items() if not path.startswith("rejected")}


@pytest.fixture(scope="module")
def big_file(tmp_path_factory, sample_texts, tokenizer_path):
    root = tmp_path_factory.mktemp("big")
    path = root / "corpus.jsonl"
    path.write_text("\n".join(_lines(sample_texts)) + "\n", encoding="utf-8")
    manifest = materialize(root / "whole", "--input", str(path), "--tokenizer", tokenizer_path, *ARGS)
    return path, root / "whole", manifest


@pytest.mark.e2e
@pytest.mark.parametrize("split_mb, beam_args", [(0.02, []), (0.003, []),
                                                 (0.02, ["--direct_running_mode=multi_processing",
                                                         "--direct_num_workers=2"])])
def test_a_large_file_in_byte_ranges_gives_the_bytes_of_the_whole_file(tmp_path, big_file, tokenizer_path, split_mb,
                                                                       beam_args):
    path, whole, reference = big_file
    assert path.stat().st_size > 30 * split_mb * 2**20  # many ranges
    out = tmp_path / "out"
    manifest = materialize(out, "--input", str(path), "--tokenizer", tokenizer_path, *ARGS,
                           "--input-split-mb", str(split_mb), *beam_args)
    assert file_digests(out) == file_digests(whole)  # rejected records too: sources, line numbers, order
    assert manifest.deterministic_view() == reference.deterministic_view()
    rejected = [json.loads(line) for line in (out / "rejected" / "rejected.jsonl").read_text().splitlines()]
    lines = path.read_text(encoding="utf-8").split("\n")
    assert {record["reason"] for record in rejected} == {"text_not_string", "malformed_json", "missing_text_field",
                                                        "empty_text"}
    for record in rejected:  # a line number is the line's, counted from 1 in the whole file
        line = lines[record["position"] - 1]
        if record["reason"] == "empty_text":
            assert json.loads(line)["text"] == record["excerpt"]
        else:
            assert record["excerpt"].rstrip("\n") == line[:200]


@pytest.mark.e2e
def test_a_large_file_in_byte_ranges_gives_the_shards_of_the_same_documents_in_many_files(tmp_path, big_file,
                                                                                        tokenizer_path):
    path, whole, _ = big_file
    lines = path.read_text(encoding="utf-8").split("\n")
    parts = tmp_path / "parts"
    parts.mkdir()
    for part in range(7):
        (parts / f"part-{part}.jsonl").write_text("\n".join(lines[part::7]) + "\n", encoding="utf-8")
    many = materialize(tmp_path / "many", "--input", str(parts / "*.jsonl"), "--tokenizer", tokenizer_path, *ARGS)
    split = materialize(tmp_path / "split", "--input", str(path), "--tokenizer", tokenizer_path, *ARGS,
                        "--input-split-mb", "0.01")
    assert _shard_digests(tmp_path / "split") == _shard_digests(tmp_path / "many") == _shard_digests(whole)
    assert split.splits == many.splits
    assert split.counts["rejected"] == many.counts["rejected"] > 0


@pytest.mark.e2e
def test_paragraphs_of_a_large_text_file_in_byte_ranges(tmp_path, sample_texts, tokenizer_path):
    path = tmp_path / "book.txt"
    paragraphs = ["\n".join(line for line in t.splitlines() if line.strip()) for t in sample_texts[:300]]
    path.write_text("\n\n\n".join(paragraphs) + "\n \n\x00bad\n", encoding="utf-8")
    args = ["--input", str(path), "--tokenizer", tokenizer_path, "--text-mode", "paragraph", *ARGS]
    whole = materialize(tmp_path / "whole", *args)
    split = materialize(tmp_path / "split", *args, "--input-split-mb", "0.005")
    assert file_digests(tmp_path / "split") == file_digests(tmp_path / "whole")
    assert split.deterministic_view() == whole.deterministic_view()
    assert whole.counts["documents_written"] + whole.counts["duplicates"] == 300 and whole.counts["rejected"] == 1


@pytest.mark.e2e
def test_parquet_in_row_groups_gives_the_bytes_of_the_whole_file(tmp_path, sample_texts, tokenizer_path):
    path = tmp_path / "corpus.parquet"
    texts = [t if i % 9 else None for i, t in enumerate(sample_texts)]
    pq.write_table(pa.table({"text": texts}), path, row_group_size=25)
    args = ["--input", str(path), "--tokenizer", tokenizer_path, *ARGS]
    whole = materialize(tmp_path / "whole", *args, "--input-split-mb", "1000")
    split = materialize(tmp_path / "split", *args, "--input-split-mb", "0.01")
    assert file_digests(tmp_path / "split") == file_digests(tmp_path / "whole")
    assert split.deterministic_view() == whole.deterministic_view()
    assert whole.counts["rejected"] == len(texts[::9])
