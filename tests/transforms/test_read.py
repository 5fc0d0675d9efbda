"""Tests of transforms/reading/read.py: formats, compression, rejection reasons, input globs."""

from __future__ import annotations

import gzip
import json
import os
import random
import re
import tempfile
from pathlib import Path

import apache_beam as beam
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import zstandard
from apache_beam.testing import test_pipeline
from apache_beam.testing.util import assert_that, equal_to
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from transforms.reading.read import (
    EXCERPT_CHARS,
    ReadCorpus,
    RecordPolicy,
    expand_inputs,
    file_format,
    iter_file_records,
    rejection,
)


def _write(path: Path, data: bytes) -> str:
    path.write_bytes(data)
    return str(path)


def _records(path: str, **kwargs) -> list:
    return list(iter_file_records(path, **kwargs))


def _reasons(items: list) -> list[tuple[int, str]]:
    return [(r["position"], r["reason"]) for r in items if isinstance(r, dict)]


# --- text files ---------------------------------------------------------------------------


def test_text_line_mode_positions_and_blank_lines(tmp_path):
    path = _write(tmp_path / "a.txt", b"alpha\n\n   \nbeta gamma\r\n  indented  \ndelta")
    assert _records(path) == [
        (path, 1, "alpha"),
        (path, 4, "beta gamma"),
        (path, 5, "  indented  "),
        (path, 6, "delta"),
    ]


def test_text_paragraph_mode(tmp_path):
    data = b"p1 line1\np1 line2\n\n\np2 only\n \t\np3 a\r\np3 b\r\n\n"
    path = _write(tmp_path / "a.md", data)
    assert _records(path, text_mode="paragraph") == [
        (path, 1, "p1 line1\np1 line2"),
        (path, 5, "p2 only"),
        (path, 7, "p3 a\r\np3 b"),
    ]


def test_text_file_mode_keeps_whole_file(tmp_path):
    path = _write(tmp_path / "doc.txt", "first line\n\nsecond ü\n".encode())
    assert _records(path, text_mode="file") == [(path, 0, "first line\n\nsecond ü\n")]


def test_text_file_mode_empty_file_is_rejected(tmp_path):
    path = _write(tmp_path / "empty.txt", b"")
    (entry,) = _records(path, text_mode="file")
    assert (entry["position"], entry["reason"]) == (0, "empty_file")


def test_text_invalid_utf8_rejected_and_reading_goes_on(tmp_path):
    path = _write(tmp_path / "a.txt", b"good\nbad \xff\xfe byte\nalso good\n")
    assert _records(path) == [
        (path, 1, "good"),
        {"source": path, "position": 2, "reason": "invalid_utf8", "excerpt": "bad \\xff\\xfe byte"},
        (path, 3, "also good"),
    ]


def test_text_unicode_whitespace_only_line_is_empty_text(tmp_path):
    # bytes.strip() keeps U+3000 (ideographic space) but str.strip() removes it.
    path = _write(tmp_path / "a.txt", "\u3000\nx\n".encode())
    assert _records(path) == [
        {"source": path, "position": 1, "reason": "empty_text", "excerpt": "\u3000"},
        (path, 2, "x"),
    ]


def test_unknown_text_mode_raises(tmp_path):
    path = _write(tmp_path / "a.txt", b"x\n")
    with pytest.raises(ValueError, match="--text-mode sentence"):
        _records(path, text_mode="sentence")


# --- jsonl --------------------------------------------------------------------------------


def test_jsonl_text_field_and_every_rejection_reason(tmp_path):
    lines = [
        b'{"text": "hello", "id": 1}',
        b"",
        b'{"text": "broken"',
        b"[1, 2]",
        b'{"body": "no text field"}',
        b'{"text": 42}',
        b'{"text": null}',
        b'{"text": "   "}',
        b'{"text": "caf\xc3\xa9 \\u00e9"}',
        b'{"text": "bad \xff"}',
        b'{"text": "lone \\ud800 surrogate"}',
        b'{"text": "last"}',
    ]
    path = _write(tmp_path / "a.jsonl", b"\n".join(lines) + b"\n")
    items = _records(path)
    assert [r for r in items if not isinstance(r, dict)] == [
        (path, 1, "hello"),
        (path, 9, "café é"),
        (path, 12, "last"),
    ]
    assert _reasons(items) == [
        (3, "malformed_json"),
        (4, "not_an_object"),
        (5, "missing_text_field"),
        (6, "text_not_string"),
        (7, "text_not_string"),
        (8, "empty_text"),
        (10, "invalid_utf8"),
        (11, "invalid_utf8"),
    ]
    by_position = {r["position"]: r for r in items if isinstance(r, dict)}
    assert by_position[3] == {
        "source": path,
        "position": 3,
        "reason": "malformed_json",
        "excerpt": '{"text": "broken"\n',
    }
    assert by_position[8]["excerpt"] == "   "
    # Every excerpt is a str that encodes to UTF-8 (rejected/ is written as JSON lines).
    for entry in by_position.values():
        entry["excerpt"].encode("utf-8")
        json.dumps(entry, ensure_ascii=False).encode("utf-8")


def test_jsonl_dotted_text_field(tmp_path):
    lines = [
        {"meta": {"body": "nested text"}},
        {"meta": {"other": 1}},
        {"meta": "not a dict"},
        {"meta.body": "a flat key is not a path"},
    ]
    path = _write(tmp_path / "a.json", "\n".join(json.dumps(x) for x in lines).encode())
    items = _records(path, text_field="meta.body")
    assert items[0] == (path, 1, "nested text")
    assert _reasons(items) == [(2, "missing_text_field"), (3, "missing_text_field"), (4, "missing_text_field")]


def test_jsonl_utf8_bom_on_first_line_is_accepted(tmp_path):
    path = _write(tmp_path / "a.ndjson", b'\xef\xbb\xbf{"text": "bom"}\n{"text": "two"}\n')
    assert _records(path) == [(path, 1, "bom"), (path, 2, "two")]


def test_excerpt_is_truncated(tmp_path):
    long_line = "{" + "x" * 1000
    path = _write(tmp_path / "a.jsonl", long_line.encode() + b"\n")
    (entry,) = _records(path)
    assert entry["reason"] == "malformed_json"
    assert entry["excerpt"] == long_line[:EXCERPT_CHARS]
    assert len(entry["excerpt"]) == EXCERPT_CHARS == 200


def test_rejection_excerpt_types():
    assert rejection("s", 3, "r", b"\xffab") == {"source": "s", "position": 3, "reason": "r", "excerpt": "\\xffab"}
    assert rejection("s", 0, "r", None)["excerpt"] == "None"
    assert rejection("s", 0, "r", 12)["excerpt"] == "12"


# --- parquet ------------------------------------------------------------------------------


def test_parquet_rows_nulls_and_empty(tmp_path):
    table = pa.table({"text": ["one", None, "", "four"], "id": [1, 2, 3, 4]})
    path = str(tmp_path / "a.parquet")
    pq.write_table(table, path)
    items = _records(path)
    assert [r for r in items if not isinstance(r, dict)] == [(path, 0, "one"), (path, 3, "four")]
    assert _reasons(items) == [(1, "text_not_string"), (2, "empty_text")]
    assert items[1]["excerpt"] == "None"


def test_parquet_missing_column(tmp_path):
    path = str(tmp_path / "a.parquet")
    pq.write_table(pa.table({"body": ["x"]}), path)
    assert _records(path) == [
        {"source": path, "position": 0, "reason": "missing_text_field", "excerpt": "columns: ['body']"}
    ]
    assert _records(path, text_field="body") == [(path, 0, "x")]


def test_parquet_gz_and_zst(tmp_path):
    plain = tmp_path / "a.parquet"
    pq.write_table(pa.table({"text": ["alpha", "beta"]}), str(plain))
    data = plain.read_bytes()
    gz = _write(tmp_path / "b.parquet.gz", gzip.compress(data))
    zst = _write(tmp_path / "c.parquet.zst", zstandard.ZstdCompressor().compress(data))
    assert _records(gz) == [(gz, 0, "alpha"), (gz, 1, "beta")]
    assert _records(zst) == [(zst, 0, "alpha"), (zst, 1, "beta")]


def test_corrupt_parquet_is_unreadable(tmp_path):
    path = _write(tmp_path / "a.parquet", b"PAR1 not really parquet")
    (entry,) = _records(path)
    assert entry["reason"] == "unreadable_file"
    assert entry["position"] == 0


# --- compression --------------------------------------------------------------------------


JSONL = b'{"text": "one"}\n{"text": "two"}\n{"nope": 1}\n{"text": "four"}\n'


@pytest.mark.parametrize(
    "name, compress",
    [
        ("a.jsonl.gz", gzip.compress),
        ("a.jsonl.GZ", gzip.compress),
        ("a.jsonl.gzip", gzip.compress),
        ("a.jsonl.zst", lambda d: zstandard.ZstdCompressor().compress(d)),
        ("a.jsonl.zstd", lambda d: zstandard.ZstdCompressor().compress(d)),
    ],
)
def test_compressed_jsonl_reads_like_plain(tmp_path, name, compress):
    plain = _write(tmp_path / "plain.jsonl", JSONL)
    path = _write(tmp_path / name, compress(JSONL))

    def strip_source(items):
        return [r[1:] if isinstance(r, tuple) else (r["position"], r["reason"]) for r in items]

    assert (
        strip_source(_records(path))
        == strip_source(_records(plain))
        == [
            (1, "one"),
            (2, "two"),
            (3, "missing_text_field"),
            (4, "four"),
        ]
    )


def test_zst_multiple_frames_are_one_stream(tmp_path):
    compressor = zstandard.ZstdCompressor()
    data = compressor.compress(b"one\ntw") + compressor.compress(b"o\nthree\n")
    path = _write(tmp_path / "a.txt.zst", data)
    assert _records(path) == [(path, 1, "one"), (path, 2, "two"), (path, 3, "three")]


def _random_lines(count: int) -> bytes:
    rng = random.Random(0)
    return "".join(f"line {i} {rng.random()}\n" for i in range(count)).encode()


def test_truncated_gz_keeps_no_record_and_says_how_many_it_held(tmp_path):
    data = _random_lines(20000)
    compressed = gzip.compress(data)
    path = _write(tmp_path / "a.txt.gz", compressed[: len(compressed) // 2])
    (entry,) = _records(path)  # none of the records before the cut counts: their CRC never verified
    assert (entry["position"], entry["reason"]) == (0, "unreadable_file")
    assert entry["excerpt"].startswith("EOFError")
    held = int(re.search(r"none of the ([\d,]+) records", entry["excerpt"]).group(1).replace(",", ""))
    assert 0 < held < 20000


def test_truncated_zst_is_unreadable_not_silently_short(tmp_path):
    data = _random_lines(20000)
    compressed = zstandard.ZstdCompressor().compress(data)
    path = _write(tmp_path / "a.txt.zst", compressed[: len(compressed) // 2])
    (entry,) = _records(path)
    assert entry["reason"] == "unreadable_file"
    assert entry["excerpt"].startswith("EOFError")


def test_not_gzip_data_is_unreadable(tmp_path):
    path = _write(tmp_path / "a.txt.gz", b"this is not gzip")
    assert _reasons(_records(path)) == [(0, "unreadable_file")]


def test_empty_text_in_file_mode_after_decompression(tmp_path):
    path = _write(tmp_path / "a.txt.gz", gzip.compress(b" \n\t\n"))
    assert _reasons(_records(path, text_mode="file")) == [(0, "empty_text")]


# --- file types and globs -----------------------------------------------------------------


@pytest.mark.parametrize(
    "name, kind",
    [
        ("a.txt", "text"),
        ("A.TXT.GZ", "text"),
        ("a.md.zst", "text"),
        ("a.rst", "text"),
        ("a.text", "text"),
        ("a.jsonl", "jsonl"),
        ("a.json.gz", "jsonl"),
        ("a.ndjson.zstd", "jsonl"),
        ("a.parquet", "parquet"),
        ("dir.v2/a.parquet.gz", "parquet"),
    ],
)
def test_file_format(name, kind):
    assert file_format(name) == kind


@pytest.mark.parametrize("name", ["a.csv", "a.gz", "a.txt.bz2", "jsonl", "a.parquet.tar"])
def test_unknown_suffix_raises(name):
    with pytest.raises(ValueError, match="unknown file type"):
        file_format(name)


def test_iter_file_records_unknown_suffix_raises(tmp_path):
    path = _write(tmp_path / "a.csv", b"x\n")
    with pytest.raises(ValueError, match=r"--input .*a\.csv: unknown file type"):
        _records(path)


def test_expand_inputs_sorted_deduplicated_with_sizes(tmp_path):
    b = _write(tmp_path / "b.txt", b"12345")
    a = _write(tmp_path / "a.jsonl", b"{}")
    c = _write(tmp_path / "c.txt.gz", gzip.compress(b"x"))
    files = expand_inputs([str(tmp_path / "*.txt*"), str(tmp_path / "*"), b])
    assert files == sorted([(a, 2), (b, 5), (c, len(Path(c).read_bytes()))])


def test_expand_inputs_glob_matching_nothing(tmp_path):
    pattern = str(tmp_path / "*.jsonl")
    with pytest.raises(ValueError, match=r"--input .*\*\.jsonl: matches no file"):
        expand_inputs([pattern])


def test_expand_inputs_missing_plain_path(tmp_path):
    with pytest.raises(ValueError, match="matches no file"):
        expand_inputs([str(tmp_path / "missing.txt")])


def test_expand_inputs_unknown_suffix(tmp_path):
    _write(tmp_path / "a.txt", b"x")
    _write(tmp_path / "b.csv", b"x")
    with pytest.raises(ValueError, match=r"b\.csv: unknown file type"):
        expand_inputs([str(tmp_path / "*")])


def test_expand_inputs_needs_a_pattern():
    with pytest.raises(ValueError, match="at least one input glob"):
        expand_inputs([])


# --- properties ---------------------------------------------------------------------------

# Lines without "\n"; a trailing "\r" would be eaten as part of a CRLF ending.
_LINE = st.text(st.characters(blacklist_characters="\n\r", blacklist_categories=("Cs",)), max_size=20)
_WORDS = st.text(st.characters(whitelist_categories=("L", "N", "P")), min_size=1, max_size=8)
_SETTINGS = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@_SETTINGS
@given(lines=st.lists(_LINE, max_size=12), compression=st.sampled_from(["", ".gz", ".zst"]))
def test_line_mode_round_trip(lines, compression):
    data = "".join(line + "\n" for line in lines).encode()
    if compression == ".gz":
        data = gzip.compress(data, mtime=0)
    elif compression == ".zst":
        data = zstandard.ZstdCompressor().compress(data)
    with tempfile.TemporaryDirectory() as tmp:
        path = _write(Path(tmp) / f"a.txt{compression}", data)
        items = _records(path)
    expected = []
    for number, line in enumerate(lines, start=1):
        line = line.removeprefix("\ufeff")  # one byte-order mark per record is dropped
        if not line.encode().strip():
            continue  # blank separator lines are not records
        if "\x00" in line:
            expected.append(("nul_bytes", number))  # the default NUL policy rejects
        elif line.strip():
            expected.append((path, number, line))
        else:
            expected.append(("empty_text", number))
    got = [r if isinstance(r, tuple) else (r["reason"], r["position"]) for r in items]
    assert got == (expected or [("empty_file", 0)])  # a file without a record is one rejection


@_SETTINGS
@given(
    paragraphs=st.lists(st.lists(st.lists(_WORDS, min_size=1, max_size=4), min_size=1, max_size=4), max_size=6),
    gaps=st.lists(st.integers(1, 3), min_size=6, max_size=6),
)
def test_paragraph_mode_round_trip(paragraphs, gaps):
    blocks = ["\n".join(" ".join(words) for words in block) for block in paragraphs]
    text = ""
    starts = []
    line = 1
    for block, gap in zip(blocks, gaps):
        starts.append(line)
        text += block + "\n" * (gap + 1)
        line += block.count("\n") + 1 + gap
    with tempfile.TemporaryDirectory() as tmp:
        path = _write(Path(tmp) / "a.txt", text.encode())
        items = _records(path, text_mode="paragraph")
    if not blocks:
        assert _reasons(items) == [(0, "empty_file")]
        return
    assert items == [(path, start, block) for start, block in zip(starts, blocks)]


@_SETTINGS
@given(texts=st.lists(st.text(st.characters(blacklist_categories=()), max_size=30).filter(str.strip), max_size=10))
def test_jsonl_round_trip_any_text(texts):
    data = "".join(json.dumps({"text": t, "n": i}) + "\n" for i, t in enumerate(texts)).encode()
    with tempfile.TemporaryDirectory() as tmp:
        path = _write(Path(tmp) / "a.jsonl", data)
        items = _records(path, policy=RecordPolicy(nul_bytes="keep"))

    def outcome(t):
        try:
            t.encode("utf-8")
        except UnicodeEncodeError:
            return "invalid_utf8"  # lone surrogates are valid JSON escapes but not text
        t = t.removeprefix("\ufeff")  # a leading byte-order mark is dropped
        return t if t.strip() else "empty_text"

    outcomes = [outcome(t) for t in texts]
    if not texts:
        assert _reasons(items) == [(0, "empty_file")]
        return
    assert [r for r in items if isinstance(r, tuple)] == [
        (path, i + 1, t) for i, t in enumerate(outcomes) if t not in ("invalid_utf8", "empty_text")
    ]
    assert _reasons(items) == [(i + 1, t) for i, t in enumerate(outcomes) if t in ("invalid_utf8", "empty_text")]


# --- ReadCorpus ---------------------------------------------------------------------------


def test_read_corpus_pipeline(tmp_path):
    txt = _write(tmp_path / "a.txt", b"first doc\n\nsecond doc\n")
    jsonl = _write(tmp_path / "b.jsonl.gz", gzip.compress(b'{"text": "third"}\n{"oops": 1}\nnot json\n'))
    with test_pipeline.TestPipeline(runner="FnApiRunner") as p:
        outputs = p | ReadCorpus([txt, jsonl])
        rejected = outputs[ReadCorpus.REJECTED] | beam.Map(lambda r: (r["source"], r["position"], r["reason"]))
        assert_that(outputs.texts, equal_to(["first doc", "second doc", "third"]), label="Texts")
        assert_that(
            rejected,
            equal_to([(jsonl, 2, "missing_text_field"), (jsonl, 3, "malformed_json")]),
            label="Rejected",
        )


def test_read_corpus_paragraph_mode_and_field(tmp_path):
    txt = _write(tmp_path / "a.txt", b"p one\nstill one\n\np two\n")
    jsonl = _write(tmp_path / "b.jsonl", b'{"m": {"t": "nested"}}\n')
    with test_pipeline.TestPipeline(runner="FnApiRunner") as p:
        outputs = p | ReadCorpus([txt], text_mode="paragraph")
        assert_that(outputs.texts, equal_to(["p one\nstill one", "p two"]), label="Paragraphs")
        nested = p | "Nested" >> ReadCorpus([jsonl], text_field="m.t")
        assert_that(nested.texts, equal_to(["nested"]), label="Nested")


def _open_handles(path: str) -> int:
    """File descriptors of this process open on ``path`` (Linux: ``/proc/self/fd``)."""
    target, count = os.path.realpath(path), 0
    for fd in os.listdir("/proc/self/fd"):
        try:
            count += os.readlink(f"/proc/self/fd/{fd}") == target
        except OSError:  # closed meanwhile (the listing's own descriptor)
            pass
    return count


@pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="counts descriptors through /proc/self/fd")
@pytest.mark.parametrize("name, compress", [("a.txt", bytes), ("a.txt.gz", gzip.compress)])
def test_source_file_is_closed(tmp_path, name, compress):
    path = _write(tmp_path / name, compress(b"one\ntwo\nthree\n"))
    assert len(_records(path)) == 3
    assert _open_handles(path) == 0
    records = iter_file_records(path)
    next(records)
    # the file being read; a compressed one was read whole to verify it, closed, and its records
    # come from the verified bytes
    assert _open_handles(path) == (0 if name.endswith(".gz") else 1)
    records.close()  # a consumer that stops early
    assert _open_handles(path) == 0


def test_a_bytes_excerpt_shows_invalid_bytes_whole_and_cuts_no_character():
    """Invalid bytes are ``\\xNN`` (each escape whole at the cut), a valid character cut by the
    excerpt's end is not shown as invalid bytes."""
    assert rejection("s", 0, "r", b"\xff" * 300)["excerpt"] == "\\xff" * 50
    assert rejection("s", 0, "r", b"ab\xff" + b"\x00")["excerpt"] == "ab\\xff\x00"
    text = "東" * 300  # 3 bytes each: 200 characters are 600 bytes, more than EXCERPT_CHARS bytes
    assert rejection("s", 0, "r", text.encode())["excerpt"] == "東" * EXCERPT_CHARS
