"""Integrity of the reader: bounded memory per record, archives verified before their records
count, nothing that vanishes without a rejection, and line ends.

Memory is measured as the peak RSS of a child process (its ``VmHWM``), never as time.
"""

from __future__ import annotations

import collections
import gzip
import io
import json
import os
import random
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import zstandard
from hypothesis import given, settings
from hypothesis import strategies as st
from lmshards_testing import ROOT
from lmshards_testing import read_file_records as _read
from lmshards_testing import record_texts as _texts
from lmshards_testing import rejection_reasons as _reasons
from lmshards_testing import write_file as _write

from transforms.reading.archives import ZstdFrames, verify_archive
from transforms.reading.inputs import InputChangedError, InputFile, list_inputs
from transforms.reading.line_reader import RecordBuffer, cut_point, iter_lines
from transforms.reading.read import UNVERIFIED_PREFIX, _ReadFile, file_format
from transforms.reading.record_policy import RecordPolicy

# --- line ends and bounded lines -------------------------------------------------------------


def test_cr_lf_and_lone_cr_are_all_line_ends(tmp_path):
    jsonl = _write(tmp_path / "a.jsonl", b'{"text": "one"}\r{"text": "two"}\r\n{"text": "three"}\n')
    assert _texts(_read(jsonl)) == [(1, "one"), (2, "two"), (3, "three")]
    txt = _write(tmp_path / "a.txt", b"first\rsecond\r\rthird\r")
    assert _texts(_read(txt)) == [(1, "first"), (2, "second"), (4, "third")]
    para = _write(tmp_path / "b.txt", b"p1 a\rp1 b\r\rp2\r\n\r\np3")
    assert _texts(_read(para, text_mode="paragraph")) == [(1, "p1 a\rp1 b"), (4, "p2"), (6, "p3")]


@settings(max_examples=60, deadline=None)
@given(data=st.binary(max_size=300).map(lambda b: b.replace(b"x", b"\r").replace(b"y", b"\n")),
       block=st.integers(1, 17))
def test_iter_lines_pieces_concatenate_to_the_stream_and_end_at_line_ends(data, block):
    items = list(iter_lines(io.BytesIO(data), block_bytes=block))
    assert b"".join(piece for _, piece, _ in items) == data
    lines: dict[int, bytes] = collections.defaultdict(bytes)
    for number, piece, _ in items:
        lines[number] += piece
    assert [lines[n] for n in sorted(lines)] == data.splitlines(keepends=True)
    assert all(len(piece) <= 2 * block + 1 for _, piece, _ in items)
    assert [last for *_, last in items].count(True) == len(lines)


def test_cut_point_prefers_line_breaks_then_spaces_then_a_character_boundary():
    assert cut_point(b"aaaa bbbb\ncccc dddd", 16) == 10
    assert cut_point(b"aaaaaaaaa bbbbbbbbbbbb", 16) == 10
    word = "é" * 20  # two bytes each: a hard cut must not split one
    cut = cut_point(word.encode(), 15)
    assert cut == 14 and word.encode()[:cut].decode() == "é" * 7


def test_record_buffer_holds_at_most_its_limit():
    buffer = RecordBuffer(100, split=True)
    pieces = []
    for _ in range(50):
        pieces += buffer.add(b"word " * 7)
        assert len(buffer._data) <= 100 + 35
    pieces.append(buffer.finish())
    assert all(len(p) <= 100 for p in pieces) and b"".join(pieces) == b"word " * 350
    dropped = RecordBuffer(100, split=False)
    for _ in range(50):
        assert dropped.add(b"x" * 35) == [] and len(dropped._data) <= 100
    assert dropped.finish() is None and dropped.excerpt == b"x" * 35


# --- records longer than --max-record-bytes -------------------------------------------------


LIMIT = 2048


def test_long_text_records_are_split_as_they_are_read(tmp_path):
    long_line = " ".join(f"w{i}" for i in range(3000))  # 16,889 bytes on one line
    path = _write(tmp_path / "a.txt", f"short\n{long_line}\nafter\n".encode())
    counters = collections.Counter()
    items = _read(path, policy=RecordPolicy(max_record_bytes=LIMIT), counters=counters)
    texts = _texts(items)
    assert texts[0] == (1, "short") and texts[-1] == (3, "after")
    pieces = [t for position, t in texts if position == 2]
    assert len(pieces) == 9 and all(len(p.encode()) <= LIMIT for p in pieces)
    assert "".join(pieces) == long_line  # cut after spaces, nothing lost
    assert counters["long_documents_split"] == 1 and counters["split_pieces"] == 9


def test_long_records_in_paragraph_and_file_modes(tmp_path):
    block = "\n".join(" ".join(f"p{i}w{j}" for j in range(40)) for i in range(30))  # 30 lines, ~8.8 kB
    path = _write(tmp_path / "a.md", f"{block}\n\nsmall paragraph\n".encode())
    items = _read(path, text_mode="paragraph", policy=RecordPolicy(max_record_bytes=LIMIT))
    pieces = [t for position, t in _texts(items) if position == 1]
    assert len(pieces) > 4 and "".join(pieces) == block and all(len(p) <= LIMIT for p in pieces)
    assert all(p.endswith("\n") for p in pieces[:-1])  # cut after a line break when there is one
    assert _texts(items)[-1] == (32, "small paragraph")
    whole = _read(path, text_mode="file", policy=RecordPolicy(max_record_bytes=LIMIT))
    assert "".join(t for _, t in _texts(whole)) == f"{block}\n\nsmall paragraph\n"


def test_long_records_rejected_without_being_held(tmp_path):
    txt = _write(tmp_path / "a.txt", b"before\n" + b"x" * 10_000 + b"\nafter\n")
    items = _read(txt, policy=RecordPolicy(max_record_bytes=LIMIT, long_docs="reject"))
    assert _texts(items) == [(1, "before"), (3, "after")]
    (entry,) = [r for r in items if isinstance(r, dict)]
    assert (entry["position"], entry["reason"]) == (2, "too_long") and "--max-record-bytes" in entry["excerpt"]
    # A JSON line cannot be parsed in pieces: rejected whatever --long-docs says.
    jsonl = _write(tmp_path / "a.jsonl", b'{"text": "ok"}\n' + json.dumps({"text": "y" * 10_000}).encode() + b"\n")
    items = _read(jsonl, policy=RecordPolicy(max_record_bytes=LIMIT, long_docs="split"))
    assert _texts(items) == [(1, "ok")] and _reasons(items) == [(2, "too_long")]


def test_long_parquet_values_are_split_or_rejected(tmp_path):
    path = str(tmp_path / "a.parquet")
    pq.write_table(pa.table({"text": ["short", "z " * 3000]}), path)
    split = _read(path, policy=RecordPolicy(max_record_bytes=LIMIT))
    assert _texts(split)[0] == (0, "short") and "".join(t for p, t in _texts(split) if p == 1) == ("z " * 3000)
    assert _reasons(_read(path, policy=RecordPolicy(max_record_bytes=LIMIT, long_docs="reject"))) == [(1, "too_long")]


# VmHWM, the peak RSS of this process image: getrusage's ru_maxrss would also count the pages of the
# (large) test process the child was forked from, which Linux carries across exec.
_PEAK_RSS = """
import sys
from transforms.reading.read import iter_file_records
counts = {}
for item in iter_file_records(sys.argv[1], text_mode=sys.argv[2]):
    key = item["reason"] if isinstance(item, dict) else "document"
    counts[key] = counts.get(key, 0) + 1
print(counts)
with open("/proc/self/status") as status:
    print(next(int(line.split()[1]) for line in status if line.startswith("VmHWM:")) // 1024)
"""


def _peak_rss_reading(path: str, text_mode: str = "line") -> tuple[str, int]:
    proc = subprocess.run([sys.executable, "-c", _PEAK_RSS, path, text_mode], capture_output=True, text=True,
                          cwd=ROOT, check=True)
    counts, peak = proc.stdout.strip().splitlines()
    return counts, int(peak)


def _gzip_bomb(path: Path, gib: float) -> None:
    """A .gz of NUL bytes, written as concatenated gzip members (valid gzip; nothing large in memory)."""
    member = gzip.compress(b"\0" * (64 << 20), compresslevel=9, mtime=0)
    with open(path, "wb") as handle:
        for _ in range(int(gib * 16)):
            handle.write(member)


def test_a_quarter_gib_gz_bomb_is_read_in_bounded_memory(tmp_path):
    bomb = tmp_path / "bomb.txt.gz"
    _gzip_bomb(bomb, 0.25)  # 256 MiB of NUL bytes on one line, from 1 MB of gzip
    assert bomb.stat().st_size < 2 << 20
    counts, peak = _peak_rss_reading(str(bomb))
    assert counts == "{'nul_bytes': 4}"  # 4 pieces of 64 MiB (--max-record-bytes), each rejected for its NULs
    assert peak < 600, f"peak RSS {peak} MB"


def test_a_zstd_bomb_never_inflates_more_than_a_few_blocks_at_once(tmp_path):
    compressor = zstandard.ZstdCompressor(level=19)
    with open(tmp_path / "bomb.txt.zst", "wb") as handle, compressor.stream_writer(handle) as writer:
        for _ in range(16):
            writer.write(b"\0" * (16 << 20))
    assert (tmp_path / "bomb.txt.zst").stat().st_size < 1 << 20
    counts, peak = _peak_rss_reading(str(tmp_path / "bomb.txt.zst"))
    assert counts == "{'nul_bytes': 4}"
    assert peak < 600, f"peak RSS {peak} MB"
    with open(tmp_path / "bomb.txt.zst", "rb") as raw:
        frames = ZstdFrames(raw)
        sizes = []
        while chunk := frames.read(8 << 20):  # returns what one decompressor call made, up to 8 MiB
            sizes.append(len(chunk))
    assert sum(sizes) == 256 << 20 and max(sizes) <= 16 * (128 << 10)  # at most 16 blocks of 128 KiB per call


# --- archives verified before their records count --------------------------------------------


def _docs(n: int, seed: int) -> list[str]:
    rng = random.Random(seed)
    return [" ".join(f"{rng.choice('abcdefgh')}{rng.randrange(1000)}" for _ in range(rng.randrange(3, 20)))
            for _ in range(n)]


def _flip(data: bytes, rng: random.Random) -> bytes:
    out = bytearray(data)
    position = rng.randrange(len(out))
    out[position] ^= 1 << rng.randrange(8)
    return bytes(out)


@pytest.mark.parametrize("size", [None, 1 << 40], ids=["verified-first", "verified-beside"])
@pytest.mark.parametrize("suffix", [".gz", ".zst"])
def test_bit_flips_never_put_a_garbled_document_into_the_output(tmp_path, suffix, size):
    docs = _docs(400, 1)
    data = "".join(json.dumps({"text": d}) + "\n" for d in docs).encode()
    if suffix == ".gz":
        compressed = gzip.compress(data, mtime=0)
    else:
        compressed = zstandard.ZstdCompressor(write_checksum=True).compress(data)
    rng = random.Random(7)
    outcomes = collections.Counter()
    for trial in range(50):
        path = _write(tmp_path / f"f{trial}.jsonl{suffix}", _flip(compressed, rng))
        # a listed size above VERIFY_FIRST_BYTES: verified by a thread while it is read
        items = _read(path, size=size)
        texts = [t for _, t in _texts(items)]
        if texts:  # a flip the format does not protect (a gzip header's mtime): the data is intact
            assert texts == docs and not _reasons(items)
            outcomes["intact"] += 1
        else:
            assert [r["reason"] for r in items] == ["unreadable_file"], items
            assert "records before the fault is used" in items[0]["excerpt"]
            outcomes["rejected"] += 1
    assert outcomes["rejected"] >= 40, outcomes


def _large_jsonl(n_docs: int) -> tuple[list[str], bytes]:
    """``n_docs`` documents of about 600 bytes (random hex: gzip halves it), some with an invalid
    UTF-8 byte, as JSONL bytes."""
    rng = random.Random(5)
    docs = [f"doc {i} lorem " + rng.randbytes(300).hex() for i in range(n_docs)]
    lines = [json.dumps({"text": d}).encode() for d in docs]
    for i in range(0, n_docs, 1000):  # raw bytes inside the JSON string: replaced under --invalid-utf8 replace
        lines[i] = lines[i].replace(b"lorem", b"l\xffrem", 1)
    return docs, b"".join(line + b"\n" for line in lines)


def test_a_large_archive_verified_beside_its_reading_yields_what_verifying_first_does(tmp_path):
    """More than HOLD_BYTES of text: the reading holds its records, waits for the verification,
    then yields them all; the same records and counters as a file verified first."""
    from transforms.reading.file_records import HOLD_BYTES, VERIFY_FIRST_BYTES

    docs, data = _large_jsonl(60_000)
    assert len(data) > HOLD_BYTES
    path = _write(tmp_path / "big.jsonl.gz", gzip.compress(data, compresslevel=1, mtime=0))
    assert os.path.getsize(path) > VERIFY_FIRST_BYTES
    policy = RecordPolicy(invalid_utf8="replace")
    beside, first = collections.Counter(), collections.Counter()
    items = _read(path, policy=policy, counters=beside)
    assert items == _read(path, policy=policy, counters=first, size=0)  # listed as small: verified first
    assert beside == first and beside["invalid_utf8_replaced"] == 60
    texts = [t for _, t in _texts(items)]
    assert len(texts) == 60_000 and texts[1:1000] == docs[1:1000] and "\ufffd" in texts[0]


@pytest.mark.parametrize("damage", ["crc", "truncated"])
def test_a_large_damaged_archive_verified_beside_its_reading_yields_one_rejection(tmp_path, damage):
    """The fault is in the last bytes, found after more than HOLD_BYTES of records were read:
    none of them comes out, and the counters the reading moved are put back."""
    _, data = _large_jsonl(60_000)
    compressed = bytearray(gzip.compress(data, compresslevel=1, mtime=0))
    if damage == "crc":
        compressed[-8] ^= 0x01  # the member's CRC-32
    else:
        compressed = compressed[:-4]  # the length field cut off
    path = _write(tmp_path / "big.jsonl.gz", bytes(compressed))
    counters = collections.Counter({"kept": 1})
    items = _read(path, policy=RecordPolicy(invalid_utf8="replace"), counters=counters)
    assert [r["reason"] for r in items] == ["unreadable_file"], items[:2]
    assert "records before the fault is used" in items[0]["excerpt"]
    assert counters == collections.Counter({"kept": 1})


def test_zstd_frames_without_a_checksum_are_listed_or_rejected(tmp_path):
    docs = _docs(50, 2)
    data = "".join(json.dumps({"text": d}) + "\n" for d in docs).encode()
    path = _write(tmp_path / "a.jsonl.zst", zstandard.ZstdCompressor(write_checksum=False).compress(data))
    counters = collections.Counter()
    assert [t for _, t in _texts(_read(path, counters=counters))] == docs
    assert counters[UNVERIFIED_PREFIX + path] == 1
    (entry,) = _read(path, policy=RecordPolicy(unverified_zstd="reject"))
    assert entry["reason"] == "unverified_archive" and "50 records" in entry["excerpt"]
    checked = _write(tmp_path / "b.jsonl.zst", zstandard.ZstdCompressor(write_checksum=True).compress(data))
    counters = collections.Counter()
    assert len(_read(checked, counters=counters, policy=RecordPolicy(unverified_zstd="reject"))) == 50
    assert not any(k.startswith(UNVERIFIED_PREFIX) for k in counters)


def test_multi_member_gzip_and_multi_frame_zstd_with_skippable_frames(tmp_path):
    parts = [b"one\ntwo\n", b"three\n", b"four\n"]
    gz = _write(tmp_path / "a.txt.gz", b"".join(gzip.compress(p, mtime=0) for p in parts))
    assert [t for _, t in _texts(_read(gz))] == ["one", "two", "three", "four"]
    skippable = (0x184D2A53).to_bytes(4, "little") + (3).to_bytes(4, "little") + b"abc"
    frames = [zstandard.ZstdCompressor(write_checksum=True).compress(p) for p in parts]
    zst = _write(tmp_path / "a.txt.zst", frames[0] + skippable + frames[1] + frames[2])
    assert [t for _, t in _texts(_read(zst))] == ["one", "two", "three", "four"]
    check = verify_archive(zst, "zstd")
    assert check.error is None and check.unverified == 0 and check.data == b"".join(parts)


def test_verification_keeps_small_files_and_rereads_large_ones(tmp_path):
    small = _write(tmp_path / "s.txt.gz", gzip.compress(b"x\n" * 1000))
    assert verify_archive(small, "gzip").data == b"x\n" * 1000
    rng = np.random.default_rng(0)
    big_data = rng.integers(97, 123, size=20 << 20, dtype=np.uint8).tobytes()
    big = _write(tmp_path / "b.txt.gz", gzip.compress(big_data, compresslevel=1))
    check = verify_archive(big, "gzip")
    assert check.error is None and check.data is None and check.size == len(big_data)


# --- nothing vanishes ---------------------------------------------------------------------------


@pytest.mark.parametrize("name, data", [
    ("a.txt", b""), ("a.jsonl", b""), ("a.jsonl.gz", b""), ("a.txt.zst", b""), ("a.parquet", b""),
    ("b.jsonl.gz", gzip.compress(b"", mtime=0)), ("b.txt.zst", zstandard.ZstdCompressor().compress(b"")),
    ("c.jsonl", b"\n\n  \r\n"),
])
def test_a_file_without_records_is_one_empty_file_rejection(tmp_path, name, data):
    path = _write(tmp_path / name, data)
    assert _reasons(_read(path)) == [(0, "empty_file")]


def test_big_integers_in_json_metadata_do_not_reject_the_record(tmp_path):
    big = "7" * 5000  # more digits than Python converts by default
    path = _write(tmp_path / "a.jsonl", f'{{"id": {big}, "text": "fine"}}\n{{"text": {big}}}\n'.encode())
    items = _read(path)
    assert _texts(items) == [(1, "fine")] and _reasons(items) == [(2, "text_not_string")]


def test_globs_list_directories_and_broken_links_as_skipped_and_read_backslash_names(tmp_path):
    (tmp_path / "ok.jsonl").write_bytes(b'{"text": "ok"}\n')
    (tmp_path / "back\\slash.jsonl").write_bytes(b'{"text": "with a backslash"}\n')
    (tmp_path / "dir.jsonl").mkdir()
    (tmp_path / "dangling.jsonl").symlink_to(tmp_path / "nowhere")
    (tmp_path / "loop1.jsonl").symlink_to(tmp_path / "loop2.jsonl")
    (tmp_path / "loop2.jsonl").symlink_to(tmp_path / "loop1.jsonl")
    os.mkfifo(tmp_path / "fifo.jsonl")
    listing = list_inputs([str(tmp_path / "*.jsonl")], file_format)
    assert [os.path.basename(f.path) for f in listing.files] == ["back\\slash.jsonl", "ok.jsonl"]
    assert {os.path.basename(s.path): s.reason for s in listing.skipped} == {
        "dir.jsonl": "directory", "dangling.jsonl": "broken symbolic link", "loop1.jsonl": "symbolic link loop",
        "loop2.jsonl": "symbolic link loop", "fifo.jsonl": "not a regular file"}
    assert _texts(_read(listing.files[0].path)) == [(1, "with a backslash")]
    with pytest.raises(ValueError, match=r"dir\.jsonl: matches no file \(skipped: .*dir\.jsonl \(directory\)\)"):
        list_inputs([str(tmp_path / "dir.jsonl")], file_format)


def test_a_file_name_that_is_not_utf8_is_a_configuration_error(tmp_path):
    os.close(os.open(os.fsencode(str(tmp_path)) + b"/bad\xff.jsonl", os.O_CREAT | os.O_WRONLY))
    with pytest.raises(ValueError, match=r"not valid UTF-8; rename it"):
        list_inputs([str(tmp_path / "*.jsonl")], file_format)


def test_the_reader_fails_on_a_file_that_changed_since_it_was_listed(tmp_path):
    path = _write(tmp_path / "a.jsonl", b'{"text": "one"}\n{"text": "two"}\n')
    (listed,) = list_inputs([path]).files
    fn = _ReadFile("line", "text", RecordPolicy())
    fn.setup()
    assert len(list(fn.process(listed))) == 3  # two texts and the file's stats
    Path(path).write_bytes(b'{"text": "one"}\n')  # truncated
    with pytest.raises(InputChangedError, match=r"a\.jsonl: the file changed after the inputs were listed "
                                                r"\(32 -> 16 bytes\)"):
        list(fn.process(listed))
    Path(path).unlink()
    with pytest.raises(InputChangedError, match="the file vanished"):
        list(fn.process(listed))
    stale = InputFile(listed.path, listed.size, listed.mtime - 10)
    Path(path).write_bytes(b'{"text": "one"}\n{"text": "two"}\n')
    with pytest.raises(InputChangedError, match=r"modified"):
        list(fn.process(stale))
