"""Inputs read below the file level: the records (and rejected records, positions included)
of a file read in byte ranges or row groups are those of the file read whole, whatever the
split size."""

from __future__ import annotations

import gzip
import hashlib
import json
from collections import Counter

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import transforms.reading.splits as splits
from transforms.reading.read import _tasks_of, empty_file_rejection, iter_file_records
from transforms.reading.splits import ReadTask, plan_tasks, record_start


def _read_in_tasks(path, split_bytes, **kwargs):
    """The file's records read task by task, each range's positions shifted by the lines
    before it (what FixLinePositions does in the pipeline); and the tasks."""
    tasks = [task for _, task, _ in _tasks_of(path, kwargs.get("text_mode", "line"), split_bytes)]
    items, lines = [], 0
    for task in tasks:
        counters = Counter()
        for item in iter_file_records(path, task=task, counters=counters, **kwargs):
            if task.kind == "range":  # records too, here (the pipeline keeps only their texts)
                if isinstance(item, dict):
                    item = {**item, "position": item["position"] + lines}
                else:
                    item = (item[0], item[1] + lines, item[2])
            items.append(item)
        lines += counters.pop(splits.RANGE_LINES, 0)
    if not items and tasks[0].kind == "range":  # what ReadCorpus adds for a split file with no record
        items.append(empty_file_rejection(path))
    return items, tasks


_LINES = st.lists(st.one_of(
    st.sampled_from(["", " ", "\t ", "\ufeff", "\ufeff  ", "\r", "x", "  y  ", "a b c", "\u3000", "é" * 3]),
    st.text(alphabet=st.characters(blacklist_categories=["Cs"], blacklist_characters="\n"), max_size=40),
), max_size=60)


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(lines=_LINES, split=st.integers(1, 50), mode=st.sampled_from(["line", "paragraph"]),
       trailing=st.booleans())
def test_text_ranges_hold_the_records_of_the_whole_file(tmp_path, lines, split, mode, trailing):
    path = tmp_path / "corpus.txt"
    data = "\n".join(lines) + ("\n" if trailing else "")
    path.write_bytes(data.encode("utf-8"))
    whole = list(iter_file_records(str(path), text_mode=mode))
    parts, tasks = _read_in_tasks(str(path), split, text_mode=mode)
    assert parts == whole
    assert len(tasks) == max(1, -(-len(data.encode()) // split)) if len(data.encode()) > split else len(tasks) == 1


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(rows=st.lists(st.one_of(st.text(max_size=30).map(lambda t: json.dumps({"text": t})),
                                st.sampled_from(["", "not json", "[1]", '{"x": 1}', '{"text": 5}', "\ufeff{}",
                                                 '{"text": "\\ud800"}', "   "])), max_size=50),
       split=st.integers(1, 80))
def test_jsonl_ranges_hold_the_records_and_rejections_of_the_whole_file(tmp_path, rows, split):
    path = tmp_path / "corpus.jsonl"
    path.write_bytes(("\n".join(rows) + "\n").encode("utf-8"))
    whole = list(iter_file_records(str(path)))
    assert _read_in_tasks(str(path), split)[0] == whole


def test_record_starts_for_lines_and_paragraphs(tmp_path):
    path = tmp_path / "a.txt"
    data = b"one\ntwo two\n\n \nthree\nfour\n\nfive"
    path.write_bytes(data)
    with open(path, "rb") as handle:
        starts = [record_start(handle, x, len(data), "line") for x in range(len(data) + 1)]
        paragraphs = [record_start(handle, x, len(data), "paragraph") for x in range(len(data) + 1)]
    line_starts = [0, 4, 12, 13, 15, 21, 26, 27]
    assert sorted(set(starts)) == line_starts + [len(data)]
    assert all(s == min(b for b in line_starts + [len(data)] if b >= x) for x, s in enumerate(starts))
    paragraph_starts = [0, 15, 27]  # "one", "three", "five"
    assert all(p == min(b for b in paragraph_starts + [len(data)] if b >= x) for x, p in enumerate(paragraphs))


def test_compressed_and_whole_file_text_stay_whole(tmp_path):
    assert plan_tasks("a.jsonl.gz", 10**9, kind="jsonl", compressed=True, text_mode="line",
                      split_bytes=100) == [ReadTask("a.jsonl.gz")]
    assert plan_tasks("a.txt", 10**9, kind="text", compressed=False, text_mode="file",
                      split_bytes=100) == [ReadTask("a.txt")]
    assert plan_tasks("a.txt", 100, kind="text", compressed=False, text_mode="line",
                      split_bytes=100) == [ReadTask("a.txt")]
    assert [(t.start, t.stop, t.index) for t in plan_tasks("a.txt", 250, kind="text", compressed=False,
                                                           text_mode="line", split_bytes=100)] == [
        (0, 100, 0), (100, 200, 1), (200, 250, 2)]
    gz = tmp_path / "big.jsonl.gz"
    gz.write_bytes(gzip.compress(b'{"text": "x"}\n' * 1000))
    assert _tasks_of(str(gz), "line", 10) == [(None, ReadTask(str(gz)), 0)]


def _parquet(path, texts, row_group_size):
    pq.write_table(pa.table({"text": texts, "n": list(range(len(texts)))}), path, row_group_size=row_group_size)


def test_parquet_is_read_by_row_groups_with_file_row_numbers(tmp_path, monkeypatch):
    path = str(tmp_path / "rows.parquet")
    rows = 5000
    # texts that do not compress away, so that the file is much larger than a footer read (64 KiB)
    texts = [hashlib.sha256(str(i).encode()).hexdigest() * (1 + i % 5) if i % 13 else None for i in range(rows)]
    _parquet(path, texts, row_group_size=370)
    whole = list(iter_file_records(path))
    assert [r["position"] for r in whole if isinstance(r, dict)] == [i for i in range(rows) if i % 13 == 0]
    read = []  # bytes read through each task's handle
    open_raw = splits._open_raw

    def counting(name):
        handle = open_raw(name)
        real_read = handle.read

        def read_and_count(*args):
            data = real_read(*args)
            read[-1] += len(data)
            return data

        read.append(0)
        handle.read = read_and_count
        return handle

    parts, tasks = _read_in_tasks(path, 20000)
    assert parts == whole
    assert len(tasks) > 3 and all(t.kind == "row_groups" for t in tasks)
    assert [t.first_row for t in tasks] == [370 * t.start for t in tasks]
    monkeypatch.setattr(splits, "_open_raw", counting)
    size = (tmp_path / "rows.parquet").stat().st_size
    for task in tasks:
        list(iter_file_records(path, task=task))
    assert size > 4 * 2**16 and max(read) < size / 2  # a task reads its row groups and the footer


def test_parquet_without_the_text_column_is_rejected_once(tmp_path):
    path = str(tmp_path / "other.parquet")
    pq.write_table(pa.table({"body": [f"b{i}" for i in range(100)]}), path, row_group_size=10)
    parts, tasks = _read_in_tasks(path, 50, text_field="text")
    assert len(tasks) > 1
    assert parts == list(iter_file_records(path)) and len(parts) == 1 and parts[0]["reason"] == "missing_text_field"


@pytest.mark.parametrize("mode", ["line", "paragraph"])
def test_a_range_that_fails_to_read_still_counts_its_lines(tmp_path, mode):
    path = tmp_path / "a.txt"
    path.write_bytes(b"one\n\ntwo\nthree\n\nfour\n" * 20)
    tasks = [task for _, task, _ in _tasks_of(str(path), mode, 40)]
    total = 0
    for task in tasks:
        counters = Counter()
        list(iter_file_records(str(path), text_mode=mode, task=task, counters=counters))
        total += counters[splits.RANGE_LINES]
    assert total == 6 * 20


def test_a_split_file_of_blank_lines_is_one_empty_file_rejection_as_when_read_whole(tmp_path):
    from lmshards_testing import TOKENIZER, materialize

    corpus = tmp_path / "corpus"
    corpus.mkdir()
    (corpus / "blank.txt").write_bytes(b" \n\n\t\n\r\n" * 400)  # 2,400 bytes: several ranges
    (corpus / "good.txt").write_text("".join(f"document {i} has a few words in it\n" for i in range(40)))
    manifests = [materialize(tmp_path / f"out{mb}", "--input", str(corpus / "*.txt"), "--tokenizer", TOKENIZER,
                             "--seq-len", "16", "--input-split-mb", mb) for mb in ("64", "0.0005")]
    for manifest in manifests:
        assert manifest.counts["rejected_by_reason"] == {"empty_file": 1}
        assert manifest.counts["documents_read"] == 41 and manifest.counts["reconciled"]
    assert manifests[0].deterministic_view() == manifests[1].deterministic_view()  # the split size is no config
    digests = [open(tmp_path / f"out{mb}" / "rejected" / "rejected.jsonl", "rb").read() for mb in ("64", "0.0005")]
    assert digests[0] == digests[1]
