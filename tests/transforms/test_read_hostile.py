"""Hostile input for the readers: policies for invalid UTF-8, NUL bytes, byte-order marks and
long documents, the document splitter, and fuzz tests (random bytes, random JSON values)
checking that no exception escapes :func:`iter_file_records` or the reading DoFn.
"""

from __future__ import annotations

import collections
import gzip
import json
import re
import tempfile
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import zstandard
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from lmshards_testing import read_file_records as _read
from lmshards_testing import record_texts as _texts
from lmshards_testing import rejection_reasons as _reasons
from lmshards_testing import write_file as _write

from transforms.reading.read import EXCERPT_CHARS, _ReadFile, iter_file_records
from transforms.reading.record_policy import RecordPolicy, replace_surrogates, split_text

REASONS = {
    "malformed_json",
    "not_an_object",
    "missing_text_field",
    "text_not_string",
    "invalid_utf8",
    "nul_bytes",
    "empty_text",
    "too_long",
    "unreadable_file",
    "empty_file",
    "unverified_archive",
}


# --- invalid UTF-8 --------------------------------------------------------------------------


def test_invalid_utf8_reject_or_replace_in_text_and_jsonl(tmp_path):
    txt = _write(tmp_path / "a.txt", b"ok\nbad \xff\xfe here\n")
    jsonl = _write(tmp_path / "a.jsonl", b'{"text": "bad \xc3"}\n{"text": "lone \\udc80 escape"}\n{"text": "ok"}\n')
    assert _reasons(_read(txt)) == [(2, "invalid_utf8")]
    assert _reasons(_read(jsonl)) == [(1, "invalid_utf8"), (2, "invalid_utf8")]
    replace = RecordPolicy(invalid_utf8="replace")
    counters = collections.Counter()
    assert _texts(_read(txt, policy=replace, counters=counters)) == [(1, "ok"), (2, "bad \ufffd\ufffd here")]
    assert _texts(_read(jsonl, policy=replace, counters=counters)) == [
        (1, "bad \ufffd"),
        (2, "lone \ufffd escape"),
        (3, "ok"),
    ]
    assert counters["invalid_utf8_replaced"] == 3


def test_replace_surrogates():
    assert replace_surrogates("a\ud800b\udfffc") == "a\ufffdb\ufffdc"
    assert replace_surrogates("plain é") == "plain é"


# --- NUL bytes ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "policy, expected_texts, expected_reasons",
    [
        ("reject", [(1, "fine")], [(2, "nul_bytes"), (3, "nul_bytes"), (4, "nul_bytes")]),
        ("strip", [(1, "fine"), (2, "ab"), (3, "cd")], [(4, "empty_text")]),
        ("keep", [(1, "fine"), (2, "a\x00b"), (3, "c\x00d"), (4, "\x00\x00")], []),
    ],
)
def test_nul_byte_policies_in_text_files(tmp_path, policy, expected_texts, expected_reasons):
    path = _write(tmp_path / "a.txt", b"fine\na\x00b\nc\x00d\n\x00\x00\n")
    items = _read(path, policy=RecordPolicy(nul_bytes=policy))
    assert _texts(items) == expected_texts
    assert _reasons(items) == expected_reasons


@pytest.mark.parametrize(
    "policy, expected_texts, expected_reasons",
    [
        ("reject", [], [(1, "nul_bytes"), (2, "nul_bytes")]),
        ("strip", [(1, "ab"), (2, "cd")], []),
        # Kept NULs: the escape is text, the raw byte makes the line invalid JSON.
        ("keep", [(1, "a\x00b")], [(2, "malformed_json")]),
    ],
)
def test_nul_byte_policies_in_jsonl(tmp_path, policy, expected_texts, expected_reasons):
    path = _write(tmp_path / "a.jsonl", b'{"text": "a\\u0000b"}\n{"text": "c\x00d"}\n')
    items = _read(path, policy=RecordPolicy(nul_bytes=policy))
    assert _texts(items) == expected_texts
    assert _reasons(items) == expected_reasons


def test_repairs_are_counted_once_per_kept_record(tmp_path):
    lines = [
        b'{"text": "raw \x00 and escaped \\u0000 NUL"}',  # two kinds of NUL, one record
        b'{"text": "NUL \x00 and bad \xff byte"}',  # both repairs
        b'{"text": "\x00 \xff but no closing brace"',  # repaired, then malformed: not counted
        b"\x00\xff",  # repaired into "\ufffd": not JSON
    ]
    path = _write(tmp_path / "a.jsonl", b"\n".join(lines))
    counters = collections.Counter()
    items = _read(path, policy=RecordPolicy(invalid_utf8="replace", nul_bytes="strip"), counters=counters)
    assert _texts(items) == [(1, "raw  and escaped  NUL"), (2, "NUL  and bad \ufffd byte")]
    assert _reasons(items) == [(3, "malformed_json"), (4, "malformed_json")]
    assert counters == {"nul_bytes_stripped": 2, "invalid_utf8_replaced": 1}


# --- byte-order marks and blank lines -------------------------------------------------------

BOM = "\ufeff".encode()


def test_bom_mid_file_is_stripped_from_every_record(tmp_path):
    # Two files concatenated with `cat`: the second one's BOM lands mid-file.
    data = BOM + b'{"text": "one"}\n' + BOM + b'{"text": "two"}\n{"text": "\\ufeffthree"}\n'
    jsonl = _write(tmp_path / "a.jsonl", data)
    assert _texts(_read(jsonl)) == [(1, "one"), (2, "two"), (3, "three")]
    txt = _write(tmp_path / "a.txt", BOM + b"first\n" + BOM + b"second\n" + BOM + b"\n" + BOM + b"  third\n")
    assert _read(txt) == [(txt, 1, "first"), (txt, 2, "second"), (txt, 4, "  third")]
    para = _write(tmp_path / "b.txt", b"p1\n" + BOM + b"\n" + BOM + b"p2 a\np2 b\n")
    assert _read(para, text_mode="paragraph") == [(para, 1, "p1"), (para, 3, "p2 a\np2 b")]
    whole = _write(tmp_path / "c.txt", BOM + b"whole file\n")
    assert _read(whole, text_mode="file") == [(whole, 0, "whole file\n")]


def test_only_one_bom_is_removed(tmp_path):
    path = _write(tmp_path / "a.txt", BOM + BOM + b"x\n")
    assert _texts(_read(path)) == [(1, "\ufeffx")]


def test_blank_lines_are_separators_not_records(tmp_path):
    jsonl = _write(tmp_path / "a.jsonl", b'\n\r\n   \t\n{"text": "a"}\n\n' + BOM + b"\n" + b'{"text": "b"}\r\n\n')
    assert _read(jsonl) == [(jsonl, 4, "a"), (jsonl, 7, "b")]
    counters = collections.Counter()
    list(iter_file_records(jsonl, counters=counters))
    assert not counters  # nothing repaired, nothing counted


def test_whitespace_only_text_is_empty_text(tmp_path):
    jsonl = _write(tmp_path / "a.jsonl", b'{"text": ""}\n{"text": " \\n\\t "}\n{"text": "\\u3000\\u2003"}\n')
    assert _reasons(_read(jsonl)) == [(1, "empty_text"), (2, "empty_text"), (3, "empty_text")]


# --- long documents -------------------------------------------------------------------------


def test_long_document_split_or_rejected(tmp_path):
    long_text = " ".join(f"word{i}" for i in range(300))  # 2,189 characters
    lines = [json.dumps({"text": "short"}), json.dumps({"text": long_text})]
    path = _write(tmp_path / "a.jsonl", "\n".join(lines).encode())
    counters = collections.Counter()
    items = _read(path, policy=RecordPolicy(max_doc_chars=500), counters=counters)
    pieces = [text for position, text in _texts(items) if position == 2]
    assert _texts(items)[0] == (1, "short")
    assert len(pieces) == counters["split_pieces"] == 5 and counters["long_documents_split"] == 1
    assert "".join(pieces) == long_text
    assert all(len(p) <= 500 and p.endswith(" ") for p in pieces[:-1])
    rejected = _read(path, policy=RecordPolicy(max_doc_chars=500, long_docs="reject"))
    assert _texts(rejected) == [(1, "short")]
    (entry,) = [r for r in rejected if isinstance(r, dict)]
    assert entry["reason"] == "too_long" and entry["excerpt"] == long_text[:EXCERPT_CHARS]
    assert _read(path, policy=RecordPolicy(max_doc_chars=len(long_text))) == _read(path)


def test_split_prefers_paragraphs_then_lines_then_spaces():
    text = "aaaa bbbb\ncccc dddd\n\neeee ffff gggg"
    assert split_text(text, 24) == ["aaaa bbbb\ncccc dddd\n\n", "eeee ffff gggg"]
    assert split_text("aaaa bbbb cc\ndddd eeee ffff", 20) == ["aaaa bbbb cc\n", "dddd eeee ffff"]
    assert split_text("aaaa bbbb cccc dddd", 12) == ["aaaa bbbb ", "cccc dddd"]
    assert split_text("x" * 25, 10) == ["x" * 10, "x" * 10, "x" * 5]  # no whitespace: hard cuts
    # A boundary in the first half of the window would give a tiny piece: cut hard instead.
    assert split_text("ab " + "x" * 20, 10) == ["ab xxxxxxx", "x" * 10, "xxx"]
    assert split_text("short", 10) == ["short"]


def test_split_drops_whitespace_only_pieces():
    text = "a" + " " * 30 + "b"
    pieces = split_text(text, 8)
    assert pieces == ["a       ", "       b"]  # the pieces in between were only spaces


@settings(max_examples=200, deadline=None)
@given(
    text=st.text(st.sampled_from(list("ab \n\t\u3000é")), max_size=300),
    max_chars=st.integers(1, 40),
)
def test_split_text_properties(text, max_chars):
    pieces = split_text(text, max_chars)
    position = 0
    for piece in pieces:
        assert 0 < len(piece) <= max_chars and piece.strip()
        start = text.index(piece, position)
        assert not text[position:start].strip()  # only whitespace is ever dropped
        position = start + len(piece)
    assert not text[position:].strip()
    assert re.sub(r"\s", "", "".join(pieces)) == re.sub(r"\s", "", text)


def test_split_text_is_linear_on_a_big_document():
    text = ("word " * 50 + "\n") * 40_000  # 10 MB
    pieces = split_text(text, 100_000)
    assert "".join(pieces) == text and max(map(len, pieces)) <= 100_000 and len(pieces) <= 110


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"invalid_utf8": "ignore"}, "--invalid-utf8 ignore"),
        ({"nul_bytes": "drop"}, "--nul-bytes drop"),
        ({"long_docs": "truncate"}, "--long-docs truncate"),
        ({"max_doc_chars": 0}, "--max-doc-chars 0"),
    ],
)
def test_record_policy_validation(kwargs, message):
    with pytest.raises(ValueError, match=message):
        RecordPolicy(**kwargs)
    with pytest.raises(ValueError, match="--max-doc-chars 0"):
        split_text("x", 0)


# --- Parquet --------------------------------------------------------------------------------


def test_parquet_non_string_column_and_string_variants(tmp_path):
    ints = str(tmp_path / "ints.parquet")
    pq.write_table(pa.table({"text": [1, 2]}), ints)
    assert _reasons(_read(ints)) == [(0, "text_not_string"), (1, "text_not_string")]
    large = str(tmp_path / "large.parquet")
    pq.write_table(pa.table({"text": pa.array(["a\x00b", "\ufeffc"], pa.large_string())}), large)
    assert _texts(_read(large, policy=RecordPolicy(nul_bytes="strip"))) == [(0, "ab"), (1, "c")]
    dictionary = str(tmp_path / "dict.parquet")
    pq.write_table(pa.table({"text": pa.array(["x", "y", "x", None]).dictionary_encode()}), dictionary)
    items = _read(dictionary)
    assert _texts(items) == [(0, "x"), (1, "y"), (2, "x")] and _reasons(items) == [(3, "text_not_string")]


# --- fuzz -----------------------------------------------------------------------------------

_FUZZ = settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
_POLICIES = st.builds(
    RecordPolicy,
    invalid_utf8=st.sampled_from(["reject", "replace"]),
    nul_bytes=st.sampled_from(["reject", "strip", "keep"]),
    max_doc_chars=st.one_of(st.none(), st.integers(1, 50)),
    long_docs=st.sampled_from(["split", "reject"]),
)
_NAMES = st.sampled_from(
    ["a.txt", "a.jsonl", "a.parquet", "a.txt.gz", "a.jsonl.gz", "a.jsonl.zst", "a.txt.zst", "a.parquet.gz"]
)
_JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=20) | st.just([]) | st.just({}),
    lambda children: st.lists(children, min_size=1, max_size=4)
    | st.dictionaries(st.sampled_from(["text", "t", "x"]), children, min_size=1, max_size=4),
    max_leaves=12,
)


def _check_items(items: list, path: str, policy: RecordPolicy) -> None:
    """What every consumer of the reader relies on, whatever the input bytes."""
    for item in items:
        if isinstance(item, dict):
            assert set(item) == {"source", "position", "reason", "excerpt"}
            assert item["reason"] in REASONS and item["source"] == path
            assert isinstance(item["excerpt"], str) and len(item["excerpt"]) <= EXCERPT_CHARS
            json.dumps(item, ensure_ascii=False).encode("utf-8")  # rejected/ is JSON lines
        else:
            source, position, text = item
            assert source == path and isinstance(position, int) and position >= 0
            assert isinstance(text, str) and text.strip()
            text.encode("utf-8")  # no lone surrogates reach the tokenizer
            if policy.nul_bytes != "keep":
                assert "\x00" not in text
            if policy.max_doc_chars is not None:
                assert len(text) <= policy.max_doc_chars


def _compress(name: str, data: bytes, cut: float | None) -> bytes:
    if name.endswith(".gz"):
        data = gzip.compress(data, mtime=0)
    elif name.endswith(".zst"):
        data = zstandard.ZstdCompressor().compress(data)
    if cut is not None:
        data = data[: int(len(data) * cut)]
    return data


@_FUZZ
@given(
    data=st.binary(max_size=400),
    name=_NAMES,
    compress=st.booleans(),
    cut=st.one_of(st.none(), st.floats(0, 1)),
    text_mode=st.sampled_from(["line", "paragraph", "file"]),
    policy=_POLICIES,
)
def test_fuzz_random_bytes_never_raise(data, name, compress, cut, text_mode, policy):
    payload = _compress(name, data, cut) if compress else data
    with tempfile.TemporaryDirectory() as tmp:
        path = _write(Path(tmp) / name, payload)
        items = list(iter_file_records(path, text_mode=text_mode, policy=policy))
        _check_items(items, path, policy)
        # The worker's DoFn around the reader: no exception escapes it either.
        fn = _ReadFile(text_mode, "text", policy)
        fn.setup()
        outputs = list(fn.process(path))
    assert len(outputs) == len(items) + 1  # one output per item, then the file's counters


@_FUZZ
@given(
    values=st.lists(_JSON, max_size=8),
    noise=st.lists(st.sampled_from([b"", b"\x00", b"\xff", BOM, b"\n", b"{", b"\\ud800", b'"']), max_size=8),
    name=st.sampled_from(["a.jsonl", "a.jsonl.gz", "a.json.zst"]),
    cut=st.one_of(st.none(), st.floats(0.5, 1)),
    policy=_POLICIES,
)
def test_fuzz_random_json_values_never_raise(values, noise, name, cut, policy):
    lines = [json.dumps(v, ensure_ascii=bool(i % 2)).encode() for i, v in enumerate(values)]
    for i, extra in enumerate(noise):  # sprinkle hostile bytes into some lines
        if lines:
            k = i % len(lines)
            lines[k] = lines[k][: len(lines[k]) // 2] + extra + lines[k][len(lines[k]) // 2 :]
    payload = _compress(name, b"\n".join(lines), cut)
    with tempfile.TemporaryDirectory() as tmp:
        path = _write(Path(tmp) / name, payload)
        counters = collections.Counter()
        items = list(iter_file_records(path, policy=policy, counters=counters))
    _check_items(items, path, policy)
    # Without noise or truncation, exactly the objects with a usable text come through.
    if not noise and cut is None and policy.max_doc_chars is None and policy.nul_bytes == "keep":
        expected = [
            v["text"].removeprefix("\ufeff")
            for v in values
            if isinstance(v, dict) and isinstance(v.get("text"), str) and v["text"].removeprefix("\ufeff").strip()
        ]
        assert [t for _, t in _texts(items)] == expected


@_FUZZ
@given(values=st.lists(st.one_of(st.none(), st.text(max_size=30)), max_size=10), policy=_POLICIES)
def test_fuzz_parquet_rows(values, policy):
    with tempfile.TemporaryDirectory() as tmp:
        path = str(Path(tmp) / "a.parquet")
        pq.write_table(pa.table({"text": pa.array(values, pa.string())}), path)
        items = _read(path, policy=policy)
    _check_items(items, path, policy)
    if not values:
        assert _reasons(items) == [(0, "empty_file")]
        return
    positions = sorted({r[1] if isinstance(r, tuple) else r["position"] for r in items})
    assert positions == list(range(len(values)))  # every row accounted for
