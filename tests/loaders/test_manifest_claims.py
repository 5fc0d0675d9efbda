"""A manifest's numbers are claims: readers check them against the files (and the cache's bound)
before anything is sized or evicted by them; one manifest check serves every reader; a shard
rewritten under a running loader is caught at the next epoch; the tokenizer is checked on open.
"""

from __future__ import annotations

import hashlib
import json
import multiprocessing
import os

import pytest
from conftest import TOKENIZER, batch_keys, write_dataset
from gcs_emulator import start_emulator, upload

from loaders import ShardedDataset, ShardIntegrityError, make_dataloader, open_dataset
from loaders.access.cache import ShardCache
from loaders.inspection.source import open_inspected
from schemas.errors import ConfigError

SHARD = "train/arrow/data-00000-of-00002.arrow"
BUCKET = "lmshards-claims"


def _edit(root, edit) -> None:
    path = os.path.join(root, "manifest.json")
    with open(path) as handle:
        data = json.load(handle)
    edit(data)
    with open(path, "w") as handle:
        json.dump(data, handle)  # (json writes inf as Infinity, as a damaged manifest might hold it)


def _shard0(data):
    return data["splits"]["train"]["shards"][0]


def _claim_rows(rows, size=None):
    def edit(data):
        _shard0(data)["rows"] = rows
        data["splits"]["train"]["examples"] = rows + 4
        if size is not None:
            _shard0(data)["files"]["arrow"]["bytes"] = size
    return edit


def _readers(path):
    return (lambda: ShardedDataset(path), lambda: open_dataset(path), lambda: open_inspected(path))


@pytest.fixture
def dataset(tmp_path):
    return write_dataset(tmp_path / "ds", [5, 4], formats=("arrow",))


@pytest.mark.parametrize("rows", [600_000_000, 10**15])
def test_a_row_count_the_file_cannot_hold_is_refused_before_anything_is_allocated(dataset, rows):
    _edit(dataset, _claim_rows(rows))
    for open_it in _readers(dataset):
        with pytest.raises(ShardIntegrityError, match=r"shards\[0\].rows is .*: more than its 976-byte arrow file"):
            open_it()


def test_rows_and_bytes_claimed_together_are_checked_against_the_file(dataset):
    _edit(dataset, _claim_rows(10**15, size=10**20))
    with pytest.raises(ShardIntegrityError, match=f"shard {SHARD}: 976 bytes on disk, the manifest says {10**20}"):
        ShardedDataset(dataset)


@pytest.mark.parametrize("num_workers", [0, 2])
def test_a_shard_rewritten_in_place_is_an_error_at_the_next_epoch(dataset, num_workers):
    ds = ShardedDataset(dataset, batch_size=3, verify="once")
    loader = make_dataloader(ds, num_workers=num_workers, collate_fn=batch_keys)
    assert sum(len(batch) for batch in loader) == 9
    path = os.path.join(dataset, SHARD)
    stat = os.stat(path)
    with open(path, "r+b") as handle:  # same inode, same size, other bytes (a token of a row)
        handle.seek(-200, os.SEEK_END)
        value = handle.read(1)
        handle.seek(-1, os.SEEK_CUR)
        handle.write(bytes([value[0] ^ 0x01]))
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns + 1_000_000_000))  # a rewrite a clock tick later
    assert os.stat(path).st_ino == stat.st_ino
    before = set(multiprocessing.active_children())
    with pytest.raises(ShardIntegrityError, match=f"shard {SHARD}: sha256"):
        list(loader)
    # the pass's workers have stopped when its error arrives, not when the garbage collector next runs
    assert set(multiprocessing.active_children()) <= before


@pytest.mark.parametrize("case, edit, message", [
    ("no shards", lambda d: d["splits"]["train"].update(shards=[], examples=0), r"splits.train lists no shards"),
    ("a shard listed twice", lambda d: d["splits"]["train"]["shards"].append(_shard0(d)),
     r"shards\[2\] is shard 0 of split 'train', not shard 2"),
    ("a file named twice", lambda d: d["splits"]["train"]["shards"][1]["files"].update(_shard0(d)["files"]),
     r"shards\[1\].files.arrow names train/arrow/data-00000"),
    ("an infinite count", lambda d: d["counts"].update(documents_read=float("inf")), r"the number Infinity"),
    ("a negative infinite count", lambda d: d["counts"].update(rejected=float("-inf")), r"the number -Infinity"),
    ("a count out of range", lambda d: d["counts"].update(rejected="1e999"), None),
    ("seq_len as a string", lambda d: d["objective"]["params"].update(seq_len="512"),
     r"objective.params.seq_len is '512', not a whole number"),
    ("seq_len of 10^12", lambda d: d["objective"]["params"].update(seq_len=10**12),
     r"objective.params.seq_len is 1000000000000, not a whole number of tokens in 1..16,777,216"),
    ("split total not the shards' sum", lambda d: d["splits"]["train"].update(examples=10),
     r"splits.train.examples is 10, not the sum over its shards \(9\)"),
])
def test_every_reader_refuses_an_inconsistent_manifest(dataset, case, edit, message):
    _edit(dataset, edit)
    if case == "a count out of range":  # a literal JSON number beyond a double's range reads as inf
        path = os.path.join(dataset, "manifest.json")
        with open(path) as handle:
            text = handle.read().replace('"1e999"', "1e999")
        with open(path, "w") as handle:
            handle.write(text)
        message = r"the number 1e999 is out of range"
    for open_it in _readers(dataset):
        with pytest.raises(ShardIntegrityError, match=message):
            open_it()


def _record_tokenizer(root) -> None:
    digest = hashlib.sha256(open(os.path.join(root, "tokenizer.json"), "rb").read()).hexdigest()
    _edit(root, lambda data: data["tokenizer"].update(sha256=digest))


@pytest.mark.parametrize("damage", ["flipped", "garbage", "missing"])
def test_every_reader_checks_the_tokenizer_on_open(tmp_path, damage):
    root = write_dataset(tmp_path / "ds", [5, 4], formats=("arrow",), tokenizer=TOKENIZER)
    _record_tokenizer(root)
    assert len(list(ShardedDataset(root))) == 9 and len(list(open_dataset(root).iter_examples())) == 9
    path = os.path.join(root, "tokenizer.json")
    if damage == "missing":
        os.remove(path)
    else:
        data = bytearray(open(path, "rb").read())
        if damage == "flipped":
            data[len(data) // 2] ^= 0x20
        else:
            data[:] = b"{garbage"
        with open(path, "wb") as handle:
            handle.write(data)
    expected = FileNotFoundError if damage == "missing" else ShardIntegrityError
    for open_it in (lambda: list(ShardedDataset(root)), lambda: list(open_dataset(root).iter_examples())):
        with pytest.raises(expected, match="tokenizer"):
            open_it()
    if damage != "missing":  # verify="never" trusts the bytes (it only finds the file)
        assert len(list(ShardedDataset(root, verify="never"))) == 9


# -- the cache's bound ------------------------------------------------------------------------

@pytest.fixture(scope="module")
def gcs():
    emulator = start_emulator(BUCKET)
    yield emulator
    emulator.stop()
    os.environ.pop("STORAGE_EMULATOR_HOST", None)


def _serve(root: str, url: str) -> None:
    for directory, _, names in os.walk(root):
        for name in names:
            path = os.path.join(directory, name)
            upload(path, f"{url}/{os.path.relpath(path, root)}")


def _cached(cache) -> list[str]:
    return sorted(name for _, _, names in os.walk(cache) for name in names if name.endswith(".arrow"))


def test_a_remote_shard_claimed_larger_than_the_cache_evicts_nothing(gcs, tmp_path):
    cache, bound = str(tmp_path / "cache"), 1 << 20
    other = write_dataset(tmp_path / "other", [5, 4], formats=("arrow",))
    _serve(other, f"gs://{BUCKET}/other")
    assert len(list(ShardedDataset(f"gs://{BUCKET}/other", cache_dir=cache, cache_size_bytes=bound))) == 9
    before = _cached(cache)
    assert len(before) == 2
    liar = write_dataset(tmp_path / "liar", [5, 4], formats=("arrow",))
    _edit(liar, lambda data: _shard0(data)["files"]["arrow"].update(bytes=10**13))
    url = f"gs://{BUCKET}/liar"
    _serve(liar, url)
    with pytest.raises(ConfigError, match=r"more than the whole cache \(cache_size_bytes=1,048,576\)"):
        ShardedDataset(url, cache_dir=cache, cache_size_bytes=bound)
    with pytest.raises(ConfigError, match="more than the whole cache"):
        list(open_dataset(url, cache_dir=cache, cache_size_bytes=bound).iter_examples())
    with pytest.raises(ShardIntegrityError, match=f"shard {SHARD}: 976 bytes at {url}, the manifest says {10**13}"):
        ShardedDataset(url, cache_dir=cache, cache_size_bytes=None)  # unbounded: the listing gives it away
    assert _cached(cache) == before


def test_the_cache_refuses_a_file_larger_than_its_bound_before_evicting(tmp_path):
    tag = tmp_path / "0123456789abcdef"
    tag.mkdir()
    kept = tag / "kept.arrow"
    kept.write_bytes(b"k" * 50)
    cache = ShardCache(str(tmp_path), max_bytes=100)
    with pytest.raises(ConfigError, match="nothing was evicted for it"):
        cache.acquire(str(tag / "huge.arrow"), lambda sink: sink.write(b"h" * 200), size=200)
    assert not cache.prefetch(str(tag / "huge.arrow"), lambda sink: sink.write(b"h" * 200), size=200)
    assert kept.read_bytes() == b"k" * 50 and not (tag / "huge.arrow").exists()
