"""Clear errors: missing dataset, checksum/size/schema/row mismatches naming the shard, bad options."""

from __future__ import annotations

import json
import os
import shutil

import pytest
from conftest import write_dataset

from loaders import ShardedDataset, ShardIntegrityError
from loaders.access.files import VERIFY_MODES

SHARD = "train/arrow/data-00000-of-00002.arrow"
TAR = "train/wds/data-00001-of-00002.tar"


@pytest.fixture
def dataset(tmp_path):
    return write_dataset(tmp_path / "ds", [5, 4])


def flip_byte(path, offset=-100):
    with open(path, "r+b") as handle:
        handle.seek(offset, os.SEEK_END)
        value = handle.read(1)
        handle.seek(-1, os.SEEK_CUR)
        handle.write(bytes([value[0] ^ 0xFF]))


def edit_manifest(path, edit):
    manifest_path = os.path.join(path, "manifest.json")
    with open(manifest_path) as handle:
        data = json.load(handle)
    edit(data)
    with open(manifest_path, "w") as handle:
        json.dump(data, handle)


def read_all(path, **kw):
    return [e["key"] for e in ShardedDataset(path, **kw)]


def test_missing_or_incomplete_dataset(tmp_path, dataset):
    with pytest.raises(FileNotFoundError, match="no manifest.json; the dataset is missing or incomplete"):
        ShardedDataset(str(tmp_path / "nowhere"))
    os.remove(os.path.join(dataset, "manifest.json"))  # a run killed before its last step
    with pytest.raises(FileNotFoundError, match="incomplete"):
        ShardedDataset(dataset)


def test_missing_shard_is_named(dataset):
    os.remove(os.path.join(dataset, SHARD))
    with pytest.raises(FileNotFoundError, match=SHARD):
        read_all(dataset)


@pytest.mark.parametrize("fmt, shard", [("arrow", SHARD), ("webdataset", TAR)])
def test_checksum_mismatch_names_the_shard(dataset, fmt, shard):
    flip_byte(os.path.join(dataset, shard))
    with pytest.raises(ShardIntegrityError, match=f"shard {shard}: sha256 .* does not match"):
        read_all(dataset, fmt=fmt, verify="once")


def test_verify_modes(dataset, tmp_path):
    assert VERIFY_MODES == ("once", "always", "never")
    with pytest.raises(ValueError, match="verify"):
        ShardedDataset(dataset, verify="sometimes")
    copy = shutil.copytree(dataset, tmp_path / "copy")
    ds = ShardedDataset(str(copy), verify="always")
    assert len(list(ds)) == 9
    flip_byte(os.path.join(copy, SHARD), offset=-20)  # the end-of-stream marker: still a readable stream
    with pytest.raises(ShardIntegrityError, match=SHARD):  # "always" checks again next epoch
        list(ds)
    assert len(read_all(str(copy), verify="never")) == 9  # "never" trusts the bytes (sizes still checked)


def test_size_mismatch_is_caught_even_without_hashing(dataset):
    with open(os.path.join(dataset, SHARD), "ab") as handle:
        handle.write(b"junk")
    with pytest.raises(ShardIntegrityError, match=f"shard {SHARD}: .* bytes on disk, the manifest says"):
        read_all(dataset, verify="never")


def test_schema_mismatch_names_the_shard(dataset):
    def edit(data):
        data["schema"]["columns"][1]["type"] = "fixed_size_list<item: int32>[16]"

    edit_manifest(dataset, edit)
    with pytest.raises(ShardIntegrityError, match=f"shard {SHARD}: schema .* does not match the manifest"):
        read_all(dataset)


def test_webdataset_fields_must_match_the_schema(dataset):
    def edit(data):
        data["schema"]["columns"].append({"name": "prefix_length", "type": "int32"})

    edit_manifest(dataset, edit)
    with pytest.raises(ShardIntegrityError, match="shard train/wds/.*fields"):
        read_all(dataset, fmt="webdataset")


def test_row_count_mismatch_names_the_shard(dataset):
    def edit(data):
        data["splits"]["train"]["shards"][0]["rows"] = 6
        data["splits"]["train"]["examples"] += 1  # a consistent manifest, whose shard lies

    edit_manifest(dataset, edit)
    with pytest.raises(ShardIntegrityError, match=f"shard {SHARD}: 5 rows, the manifest says 6"):
        read_all(dataset)


def test_bad_options(dataset):
    with pytest.raises(ValueError, match="split 'test'"):
        ShardedDataset(dataset, "test")
    with pytest.raises(ValueError, match="fmt='parquet'"):
        ShardedDataset(dataset, fmt="parquet")
    arrow_only = write_dataset(os.path.join(dataset, "..", "arrow_only"), [2], formats=("arrow",))
    with pytest.raises(ValueError, match="was written as"):
        ShardedDataset(arrow_only, fmt="webdataset")
    with pytest.raises(ValueError, match="uneven"):
        ShardedDataset(dataset, uneven="pad")
    with pytest.raises(ValueError, match="batch_size"):
        ShardedDataset(dataset, batch_size=0)
    with pytest.raises(ValueError, match="rank 2 out of range"):
        ShardedDataset(dataset, rank=2, world_size=2)
    with pytest.raises(ValueError, match="columns"):
        ShardedDataset(dataset, columns=["pixels"])


def test_truncated_shard_is_named(dataset):
    path = os.path.join(dataset, SHARD)
    with open(path, "r+b") as handle:
        handle.truncate(os.path.getsize(path) - 300)
    with pytest.raises(ShardIntegrityError, match=f"shard {SHARD}: .* bytes on disk, the manifest says"):
        read_all(dataset, verify="never")


def _rewrite_tar(dataset, rename):
    """Rewrite TAR with member names changed by ``rename`` and fix the manifest's size and sha256."""
    import hashlib
    import io
    import tarfile

    path = os.path.join(dataset, TAR)
    out = io.BytesIO()
    with tarfile.open(path) as source, tarfile.open(fileobj=out, mode="w", format=tarfile.USTAR_FORMAT) as target:
        for member in source.getmembers():
            payload = source.extractfile(member).read()
            member.name = rename(member.name)
            member.size = len(payload)
            target.addfile(member, io.BytesIO(payload))
    data = out.getvalue()
    with open(path, "wb") as handle:
        handle.write(data)

    def edit(manifest):
        for shard in manifest["splits"]["train"]["shards"]:
            entry = shard["files"]["webdataset"]
            if entry["path"] == TAR:
                entry["bytes"], entry["sha256"] = len(data), hashlib.sha256(data).hexdigest()

    edit_manifest(dataset, edit)


def test_unsafe_tar_member_names_are_rejected(dataset):
    _rewrite_tar(dataset, lambda name: "../" + name)
    with pytest.raises(ShardIntegrityError, match=f"shard {TAR}: unsafe member name"):
        read_all(dataset, fmt="webdataset")


def test_pickled_tar_members_are_never_loaded(dataset):
    _rewrite_tar(dataset, lambda name: name.replace(".doc_lengths.npy", ".doc_lengths.pyd"))
    with pytest.raises(ShardIntegrityError, match=r"unsupported type \.pyd"):
        read_all(dataset, fmt="webdataset")
