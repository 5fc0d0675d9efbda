"""Hostile datasets for the readers: a manifest's paths are data (local and emulator-served datasets),
the cache deletes only its own files, every reader checks sha256, schema, rows, dtypes and
shapes, and a shard truncated under a running loader is a Python error naming it.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import re
import shutil
import signal
import tarfile

import numpy as np
import pytest
from conftest import write_dataset
from gcs_emulator import start_emulator, upload

from loaders import ShardedDataset, ShardIntegrityError, open_dataset
from loaders.access.cache import ShardCache
from loaders.access.files import DatasetLocation, check_relative
from loaders.inspection.source import open_inspected

SHARD = "train/arrow/data-00000-of-00002.arrow"
TAR = "train/wds/data-00000-of-00002.tar"
BUCKET = "lmshards-hostile"


def _edit(root, edit) -> None:
    path = os.path.join(root, "manifest.json")
    with open(path) as handle:
        data = json.load(handle)
    edit(data)
    with open(path, "w") as handle:
        json.dump(data, handle)


def _set_path(data: dict, path: str, *, sha256: str | None = None, size: int | None = None) -> None:
    entry = data["splits"]["train"]["shards"][0]["files"]["arrow"]
    entry["path"] = path
    if sha256 is not None:
        entry["sha256"], entry["bytes"] = sha256, size


@pytest.fixture
def dataset(tmp_path):
    return write_dataset(tmp_path / "ds", [5, 4])


@pytest.mark.parametrize("path", ["/etc/hostname", "../../../../etc/hostname", "train/../../outside.arrow",
                                  "train\\arrow\\x.arrow", "gs://bucket/x.arrow", "C:/x.arrow", "./train/x.arrow",
                                  "train//x.arrow", ""])
def test_an_unsafe_shard_path_is_refused_naming_the_manifest(dataset, path):
    _edit(dataset, lambda data: _set_path(data, path))
    where = os.path.join(dataset, "manifest.json")
    for open_it in (lambda: ShardedDataset(dataset), lambda: open_dataset(dataset), lambda: open_inspected(dataset)):
        with pytest.raises(ShardIntegrityError) as caught:
            open_it()
        assert "manifest.json" in str(caught.value) and (where in str(caught.value) or dataset in str(caught.value))


def test_check_relative_accepts_the_writers_names():
    for name in ("train/arrow/data-00000-of-00002.arrow", "tokenizer.json", "rejected/rejected.jsonl"):
        assert check_relative(name, "m") == name


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


def test_an_emulator_served_manifest_cannot_make_the_loader_write_or_delete_a_file(gcs, dataset, tmp_path):
    victim = tmp_path / "victim.txt"
    victim.write_bytes(b"the user's own file")
    payload = b"attacker's bytes"
    target = tmp_path / "created-by-attacker.txt"
    cache = tmp_path / "cache"
    for index, path in enumerate([str(victim), str(target), "../../../victim.txt"]):
        evil = f"gs://{BUCKET}/evil{index}"
        _edit(dataset, lambda data, p=path: _set_path(data, p, sha256=hashlib.sha256(payload).hexdigest(),
                                                       size=len(payload)))
        _serve(dataset, evil)
        with pytest.raises(ShardIntegrityError, match="manifest.json"):
            ShardedDataset(evil, cache_dir=str(cache))
        from pipelines.inspect import inspect_main, show_main, validate_main

        for command in (inspect_main, show_main, validate_main):
            assert command([evil]) == 1
    assert victim.read_bytes() == b"the user's own file" and not target.exists()
    assert not (tmp_path / "victim.txt.partial").exists()


def test_a_symlink_in_the_cache_is_never_written_through(gcs, dataset, tmp_path):
    url = f"gs://{BUCKET}/good"
    _serve(dataset, url)
    cache = tmp_path / "cache"
    location = DatasetLocation(url, str(cache))
    outside = tmp_path / "outside"
    outside.mkdir()
    os.makedirs(location.cache_root)
    os.symlink(outside, os.path.join(location.cache_root, "train"))  # planted: the cache's train/ is elsewhere
    with pytest.raises(ShardIntegrityError, match="resolves outside the cache"):
        list(ShardedDataset(url, cache_dir=str(cache), shuffle=False))
    assert list(outside.iterdir()) == []


def test_the_cache_deletes_only_its_own_regular_files(tmp_path):
    cache = ShardCache(str(tmp_path / "cache"))
    tag = tmp_path / "cache" / "0123456789abcdef"
    tag.mkdir(parents=True)
    victim = tmp_path / "victim.txt"
    victim.write_text("mine")
    link = tag / "link.arrow"
    link.symlink_to(victim)
    cache.discard(str(link), damaged=True)
    cache.discard(str(victim), damaged=True)  # outside the cache
    assert victim.read_text() == "mine" and link.is_symlink()
    assert not cache._evict(str(link)) and victim.exists()
    own = tag / "own.arrow"
    own.write_bytes(b"x")
    cache.discard(str(own), damaged=True)
    assert not own.exists()


# --- every reader checks what it reads ----------------------------------------------------------


def _flip(path: str, offset: int = -100) -> None:
    with open(path, "r+b") as handle:
        handle.seek(offset, os.SEEK_END)
        value = handle.read(1)
        handle.seek(-1, os.SEEK_CUR)
        handle.write(bytes([value[0] ^ 0xFF]))


def test_open_dataset_checks_sha256_sizes_schema_and_rows(dataset):
    keys = [e["key"] for e in open_dataset(dataset).iter_examples()]
    assert len(keys) == 9
    broken = dataset + "-flipped"
    shutil.copytree(dataset, broken)
    _flip(os.path.join(broken, SHARD))
    with pytest.raises(ShardIntegrityError, match=f"shard {SHARD}: sha256"):
        list(open_dataset(broken).iter_examples())
    # verify="never" trusts the bytes (documented): only sizes are compared
    assert len(list(open_dataset(broken, verify="never").iter_examples())) == 9
    _edit(dataset, lambda d: (d["splits"]["train"]["shards"][0].update(rows=6),
                              d["splits"]["train"].update(examples=10)))
    with pytest.raises(ShardIntegrityError, match=f"shard {SHARD}: 5 rows, the manifest says 6"):
        list(open_dataset(dataset).iter_examples())
    _edit(dataset, lambda d: (d["splits"]["train"]["shards"][0].update(rows=5),
                              d["splits"]["train"].update(examples=9)))

    def int64(data):
        for column in data["schema"]["columns"]:
            if column["name"] == "input_ids":
                column["type"] = column["type"].replace("int32", "int64")

    _edit(dataset, int64)
    with pytest.raises(ShardIntegrityError, match=f"shard {SHARD}: schema"):
        list(open_dataset(dataset).iter_examples())
    with pytest.raises(ShardIntegrityError, match="member .* is a int32 array of shape \\(8,\\), the manifest's schema "
                                                  "says int64 array"):
        list(open_dataset(dataset).iter_examples(fmt="webdataset"))


def _rewrite_tar(root: str, relative: str, change) -> None:
    """Rewrite a tar shard through ``change(name, payload) -> [(name, payload), ...]`` and re-hash it."""
    path = os.path.join(root, relative)
    out = io.BytesIO()
    with tarfile.open(path) as source, tarfile.open(fileobj=out, mode="w", format=tarfile.USTAR_FORMAT) as target:
        for member in source.getmembers():
            for name, payload in change(member.name, source.extractfile(member).read()):
                info = tarfile.TarInfo(name)
                info.size = len(payload)
                target.addfile(info, io.BytesIO(payload))
    data = out.getvalue()
    with open(path, "wb") as handle:
        handle.write(data)

    def rehash(manifest):
        for shard in manifest["splits"]["train"]["shards"]:
            entry = shard["files"]["webdataset"]
            if entry["path"] == relative:
                entry["bytes"], entry["sha256"] = len(data), hashlib.sha256(data).hexdigest()

    _edit(root, rehash)


def _npy(array: np.ndarray) -> bytes:
    buffer = io.BytesIO()
    np.save(buffer, array, allow_pickle=False)
    return buffer.getvalue()


def test_webdataset_members_are_checked_for_dtype_and_shape(dataset):
    _rewrite_tar(dataset, TAR, lambda name, payload: [(name, _npy(np.arange(7, dtype=np.int64)))
                                                      if name.endswith(".input_ids.npy") else (name, payload)])
    with pytest.raises(ShardIntegrityError, match=r"input_ids\.npy is a int64 array of shape \(7,\), the manifest's "
                                                  r"schema says int32 array of shape \(8,\)"):
        list(ShardedDataset(dataset, fmt="webdataset", shuffle=False))
    with pytest.raises(ShardIntegrityError, match=r"int64 array of shape \(7,\)"):
        list(open_dataset(dataset).iter_examples(fmt="webdataset"))


def test_an_extra_tar_field_is_refused_by_every_reader(dataset):
    def extra(name, payload):
        out = [(name, payload)]
        if name.endswith(".input_ids.npy"):
            out.append((name.replace(".input_ids.npy", ".pixels.npy"), _npy(np.zeros(3, np.int32))))
        return out

    _rewrite_tar(dataset, TAR, extra)
    with pytest.raises(ShardIntegrityError, match="pixels"):
        list(ShardedDataset(dataset, fmt="webdataset", shuffle=False))
    with pytest.raises(ShardIntegrityError, match="pixels"):
        list(open_dataset(dataset).iter_examples(fmt="webdataset"))


def test_a_shard_truncated_under_a_running_loader_is_a_python_error(tmp_path):
    root = write_dataset(tmp_path / "big", [4000, 10], seq_len=256)
    dataset = ShardedDataset(root, batch_size=8, shuffle=False)
    stream = iter(dataset)
    first = [next(stream) for _ in range(16)]
    assert first[0]["key"] == "s0-r0"
    path = os.path.join(root, SHARD)
    os.truncate(path, os.path.getsize(path) // 3)  # the mapping now reaches past the end of the file
    with pytest.raises(ShardIntegrityError, match=f"shard {SHARD}: truncated while it was being read"):
        for _ in stream:
            pass


def test_a_shard_truncated_under_dataloader_workers_is_a_python_error(tmp_path):
    from loaders.streaming.dataloader import make_dataloader

    root = write_dataset(tmp_path / "big", [6000, 10], seq_len=256)
    loader = make_dataloader(ShardedDataset(root, batch_size=8, shuffle=False), num_workers=2)
    batches = iter(loader)
    next(batches)
    path = os.path.join(root, SHARD)
    os.truncate(path, os.path.getsize(path) // 4)
    # A worker that had the shard open finds it shrunk; one that opens it now finds the wrong size (or, when
    # the truncation falls between its size check and its hashing, the wrong sha256); one that read a
    # page of the map just after its size check passed dies of SIGBUS, and the loader names the shard
    # from the files (the test below): either way a Python error naming the shard.
    with pytest.raises(ShardIntegrityError, match=f"shard {SHARD}: (truncated while it was being read|"
                                                  r"\d+ bytes on disk, the manifest says|sha256 \w+ does not match)"):
        for _ in batches:
            pass


@pytest.mark.parametrize("shrunk", [True, False])
def test_a_dataloader_worker_that_dies_is_explained_by_a_shard_that_shrank(tmp_path, shrunk):
    """A worker that dies (a shard that shrank under its memory map: SIGBUS, which the worker cannot
    report) ends the pass in a ShardIntegrityError naming the shard when a file of the split is now
    shorter than the manifest says, with torch's error as its cause; any other death is torch's error.
    Made deterministic here: the collator, in the worker, truncates the shard and kills its process."""
    from loaders.streaming.dataloader import make_dataloader

    root = write_dataset(tmp_path / "ds", [40, 10], seq_len=16)
    path = os.path.join(root, SHARD)
    size = os.path.getsize(path)

    def die(examples):
        if shrunk:
            os.truncate(path, size // 4)
        os.kill(os.getpid(), signal.SIGKILL)

    loader = make_dataloader(ShardedDataset(root, batch_size=8, shuffle=False), num_workers=2, collate_fn=die)
    if shrunk:
        with pytest.raises(ShardIntegrityError, match=f"^shard {SHARD}: truncated while it was being read "
                                                      f"\\({size // 4:,} of {size:,} bytes left\\); a DataLoader "
                                                      "worker reading it died$") as info:
            list(loader)
        assert isinstance(info.value.__cause__, RuntimeError) and "DataLoader worker" in str(info.value.__cause__)
    else:
        with pytest.raises(RuntimeError, match="DataLoader worker") as info:
            list(loader)
        assert not isinstance(info.value, ShardIntegrityError)


def test_a_shard_that_changed_after_its_size_check_is_named_as_changed(tmp_path):
    """The loader checks a shard's size against the manifest, then opens it: a file truncated in
    between is unreadable as a stream, and the message says why (its size), not only "unreadable"."""
    from loaders.access.arrow_shard import ArrowShard

    root = write_dataset(tmp_path / "big", [600, 10], seq_len=64)
    path = os.path.join(root, SHARD)
    size = os.path.getsize(path)
    os.truncate(path, size // 4)
    message = f"shard {SHARD}: {size // 4} bytes on disk, the manifest says {size}$"
    with pytest.raises(ShardIntegrityError, match=message):
        ArrowShard(path, name=SHARD, columns=None, rows=None, size=size)
    with pytest.raises(ShardIntegrityError, match=f"shard {SHARD}: not a readable Arrow IPC stream"):
        ArrowShard(path, name=SHARD, columns=None, rows=None)


# -- one way in. Every reader (the loader, a mixture, open_dataset, the inspection commands) reads
# the manifest, the shards and the tokenizer through the same doors, so a check one of them made is made by all.
# Each case below was missed (read as data, or a raw library error) by at least one of them before.


def _readers(root: str, fmt: str, verify: str = "once") -> dict:
    """Every way to read a whole split, by name."""
    from loaders import MixtureDataset
    from pipelines.inspect import show_main

    readers = {
        "ShardedDataset": lambda: list(ShardedDataset(root, fmt=fmt, shuffle=False, verify=verify)),
        "open_dataset": lambda: list(open_dataset(root, verify).iter_examples(fmt=fmt)),
        "inspection": lambda: list(open_inspected(root).iter_split("train", fmt)),
    }
    if fmt == "arrow":  # (a mixture reads Arrow shards only)
        readers["MixtureDataset"] = lambda: list(MixtureDataset(
            [ShardedDataset(root, shuffle=False, verify=verify)], [1.0], samples_per_epoch=9))
    readers["show"] = lambda: show_main([root, "-n", "20", "--format", fmt])
    return readers


def _all_refuse(root: str, fmt: str, match: str, verify: str = "once", capsys=None) -> None:
    for name, read in _readers(root, fmt, verify).items():
        if name == "show":
            assert read() == 1, name
            err = capsys.readouterr().err
            assert len(err.strip().splitlines()) == 1 and re.search(match, err), (name, err)
            continue
        with pytest.raises(ShardIntegrityError, match=match):
            read()


def _rewrite_arrow(root: str, relative: str, change) -> None:
    """Rewrite an Arrow shard as ``change(table) -> table`` (same column types) and re-hash it in the manifest."""
    import pyarrow as pa

    path = os.path.join(root, relative)
    with pa.memory_map(path) as source:
        table = pa.ipc.open_stream(source).read_all()
    table = change(table)
    sink = io.BytesIO()
    with pa.ipc.new_stream(sink, table.schema) as writer:
        for batch in table.to_batches():
            writer.write_batch(batch)
    data = sink.getvalue()
    with open(path, "wb") as handle:
        handle.write(data)

    def rehash(manifest):
        for shard in manifest["splits"]["train"]["shards"]:
            entry = shard["files"]["arrow"]
            if entry["path"] == relative:
                entry["bytes"], entry["sha256"] = len(data), hashlib.sha256(data).hexdigest()

    _edit(root, rehash)


def _with_null(name: str):
    """A table whose column ``name`` has row 1 null (the types, as printed, unchanged)."""
    import pyarrow as pa

    def change(table):
        values = table.column(name).to_pylist()
        values[1] = None
        return table.set_column(table.schema.get_field_index(name), pa.field(name, table.schema.field(name).type),
                                pa.array(values, table.schema.field(name).type))

    return change


@pytest.mark.parametrize("column", ["input_ids", "doc_lengths", "key"])
def test_a_null_in_an_arrow_shard_is_refused_by_every_reader(dataset, capsys, column):
    # Nulls are not in the format; a null row's bytes are whatever the writer left there. Before, every reader
    # read them as data (input_ids, doc_lengths) or crashed on a None key.
    _rewrite_arrow(dataset, SHARD, _with_null(column))
    _all_refuse(dataset, "arrow", f"shard {re.escape(SHARD)}: column {column} has nulls", capsys=capsys)


def test_list_offsets_out_of_order_are_refused_by_every_reader(dataset, capsys):
    # pyarrow's stream reader accepts offsets that go backwards (its cheap validation checks the ends only);
    # before, the loader and the readers sliced an empty doc_lengths row out of them.
    import pyarrow as pa

    def backwards(table):
        column = table.column("doc_lengths").combine_chunks()
        offsets = np.asarray(column.offsets).copy()
        offsets[2] = offsets[1] - 1  # row 1 ends before it starts
        broken = pa.ListArray.from_buffers(column.type, len(column), [None, pa.py_buffer(offsets.tobytes())],
                                           children=[column.values])
        return table.set_column(table.schema.get_field_index("doc_lengths"), "doc_lengths", broken)

    _rewrite_arrow(dataset, SHARD, backwards)
    _all_refuse(dataset, "arrow", f"shard {re.escape(SHARD)}: not a readable Arrow IPC stream .*non-monotonic offset",
                capsys=capsys)


def test_a_tar_member_twice_in_one_example_is_refused_by_every_reader(dataset, capsys):
    # Before: open_dataset and the inspection commands kept the second copy, the loader (webdataset) raised a
    # bare ValueError.
    copy = ("s0-r1.input_ids.npy", _npy(np.arange(8, dtype=np.int32)))
    _rewrite_tar(dataset, TAR, lambda name, payload: [(name, payload), copy] if name == copy[0] else [(name, payload)])
    _all_refuse(dataset, "webdataset",
                f"shard {re.escape(TAR)}: example s0-r1 has the member s0-r1.input_ids.npy twice", capsys=capsys)


def test_a_tar_member_without_a_type_is_refused_by_every_reader(dataset, capsys):
    # Before, the loader (webdataset) skipped a member named without a suffix: its bytes silently not read.
    hidden = ("s0-r2", b"hidden")
    _rewrite_tar(dataset, TAR, lambda name, payload: [(name, payload), hidden] if name == "s0-r2.input_ids.npy"
                 else [(name, payload)])
    _all_refuse(dataset, "webdataset", f"shard {re.escape(TAR)}: member s0-r2. has unsupported type", capsys=capsys)


def test_the_loader_checks_the_tokenizer_like_the_inspection_commands(tmp_path):
    # The dynamic objective takes its special ids from the dataset's tokenizer.json; before, the loader used
    # whatever file was there, while the inspection commands refused one that is not the manifest's.
    from conftest import TOKENIZER

    root = write_dataset(tmp_path / "ds", [5, 4], seq_len=32, tokenizer=TOKENIZER)
    with open(os.path.join(root, "tokenizer.json"), "rb") as handle:
        real = handle.read()
    _edit(root, lambda data: data["tokenizer"].update(sha256=hashlib.sha256(real).hexdigest()))
    first = next(iter(ShardedDataset(root, objective="mlm", shuffle=False)))
    assert first["key"] == "s0-r0" and first["input_ids"].shape == (32,)
    with open(os.path.join(root, "tokenizer.json"), "wb") as handle:
        handle.write(real.replace(b'"<mask>"', b'"<MASK>"', 1))  # another tokenizer: no <mask> any more
    match = "tokenizer tokenizer.json: sha256 .* does not match the manifest's"
    with pytest.raises(ShardIntegrityError, match=match):
        ShardedDataset(root, objective="mlm")
    with pytest.raises(ShardIntegrityError, match=match):
        _ = open_inspected(root).tokenizer
    assert ShardedDataset(root, objective="mlm", verify="never").objective.name == "mlm"  # trusted, as documented


def test_open_dataset_reads_a_url_through_the_loaders_cache_and_checks(gcs, dataset, tmp_path):
    # Before, open_dataset refused URLs; it now reads them the way ShardedDataset does.
    local = [e["key"] for e in open_dataset(dataset).iter_examples()]
    url = f"gs://{BUCKET}/reader-url"
    _serve(dataset, url)
    remote = list(open_dataset(url, cache_dir=str(tmp_path / "cache")).iter_examples())
    assert [e["key"] for e in remote] == local
    assert np.array_equal(remote[3]["input_ids"], next(e for e in open_dataset(dataset).iter_examples()
                                                       if e["key"] == remote[3]["key"])["input_ids"])
    broken = dataset + "-flipped"
    shutil.copytree(dataset, broken)
    _flip(os.path.join(broken, SHARD))
    _serve(broken, f"{url}-flipped")
    with pytest.raises(ShardIntegrityError, match=f"shard {re.escape(SHARD)} downloaded from .*: sha256"):
        list(open_dataset(f"{url}-flipped", cache_dir=str(tmp_path / "cache")).iter_examples())


def test_a_download_stops_at_the_manifests_size(gcs, dataset, tmp_path):
    # A served file longer than the manifest says is cut off at the manifest's size plus one byte (before, it
    # was downloaded whole, then its sha256 compared): the manifest bounds what a reader fetches.
    path = os.path.join(dataset, SHARD)
    size = os.path.getsize(path)
    url = f"gs://{BUCKET}/longer"
    _serve(dataset, url)
    grown = tmp_path / "grown.arrow"
    grown.write_bytes(open(path, "rb").read() + b"\0" * (8 << 20))
    upload(str(grown), f"{url}/{SHARD}")
    # The loader compares the listing's sizes with the manifest's before it orders or fetches anything;
    # open_dataset reads shard by shard, and its download stops one byte past the manifest's size.
    listed = f"shard {re.escape(SHARD)}: {size + (8 << 20)} bytes at {url}, the manifest says {size}"
    match = f"{re.escape(SHARD)} downloaded from .*: more than the {size:,} bytes the manifest says"
    for read, message in ((lambda c: list(ShardedDataset(url, cache_dir=c, shuffle=False)), listed),
                          (lambda c: list(open_dataset(url, cache_dir=c).iter_examples()), match)):
        cache = str(tmp_path / f"cache{id(read)}")
        with pytest.raises(ShardIntegrityError, match=message):
            read(cache)
        assert not [n for _, _, names in os.walk(cache) for n in names if n.endswith(".arrow")]
