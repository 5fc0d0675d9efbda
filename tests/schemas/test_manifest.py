"""Tests of schemas/manifest.py: shard names, manifest JSON round trip, errors."""

from __future__ import annotations

import json

import pytest

from schemas.manifest import MANIFEST_NAME, MANIFEST_VERSION, Manifest, ShardFile, ShardInfo, shard_name


def _shard(index: int) -> ShardInfo:
    return ShardInfo(
        split="train",
        index=index,
        rows=10 + index,
        tokens=100 * (10 + index),
        files={
            "webdataset": ShardFile(shard_name("train", "webdataset", index, 2), 4096, "b" * 64),
            "arrow": ShardFile(shard_name("train", "arrow", index, 2), 2048, "a" * 64),
        },
    )


def _manifest(**run) -> Manifest:
    return Manifest(
        objective={"name": "clm", "seq_len": 8},
        config={"seed": 0, "packing": "concat", "formats": ["arrow", "webdataset"]},
        tokenizer={"file": "tokenizer.json", "sha256": "c" * 64, "vocab_size": 8000, "special": {"eos": 1}},
        schema={"family": "decoder", "columns": [{"name": "key", "type": "string"}]},
        counts={"read": 12, "written": 10, "rejected": {"malformed_json": 2}},
        splits={"train": {"examples": 21, "shards": [_shard(0).to_json(), _shard(1).to_json()]}},
        stats={"tokens": 2100, "ratio": 0.5},
        run=run or {"created_at": "2025-01-01T00:00:00Z", "argv": ["lmshards", "materialize"]},
    )


def test_constants():
    assert MANIFEST_NAME == "manifest.json"
    assert MANIFEST_VERSION == 3


def test_shard_name():
    assert shard_name("train", "arrow", 3, 16) == "train/arrow/data-00003-of-00016.arrow"
    assert shard_name("validation", "webdataset", 0, 1) == "validation/wds/data-00000-of-00001.tar"
    assert shard_name("train", "arrow", 99999, 100000) == "train/arrow/data-99999-of-100000.arrow"


@pytest.mark.parametrize(
    "args, message",
    [
        (("train", "parquet", 0, 1), "unknown shard format 'parquet'; expected one of ['arrow', 'webdataset']"),
        (("train", "arrow", 16, 16), "shard index 16 out of range for 16 shards"),
        (("train", "arrow", -1, 4), "shard index -1 out of range for 4 shards"),
        (("train", "arrow", 0, 0), "shard index 0 out of range for 0 shards"),
    ],
)
def test_shard_name_errors(args, message):
    with pytest.raises(ValueError) as info:
        shard_name(*args)
    assert str(info.value) == message


def test_shard_info_json_round_trip():
    shard = _shard(1)
    data = shard.to_json()
    assert data == {
        "split": "train",
        "index": 1,
        "rows": 11,
        "tokens": 1100,
        "files": {
            "arrow": {"path": "train/arrow/data-00001-of-00002.arrow", "bytes": 2048, "sha256": "a" * 64},
            "webdataset": {"path": "train/wds/data-00001-of-00002.tar", "bytes": 4096, "sha256": "b" * 64},
        },
    }
    assert list(data["files"]) == ["arrow", "webdataset"]  # sorted by format
    assert ShardInfo.from_json(json.loads(json.dumps(data))) == shard


def test_dumps_is_canonical():
    text = _manifest().dumps()
    assert text.endswith("}\n") and not text.endswith("\n\n")
    data = json.loads(text)
    assert data["format"] == "lmshards"
    assert data["format_version"] == 3
    assert text == json.dumps(data, indent=2, sort_keys=True) + "\n"
    assert list(data) == sorted(data)
    assert text.startswith('{\n  "config": {\n    "formats": [\n      "arrow",')


def test_dumps_loads_round_trip():
    manifest = _manifest()
    text = manifest.dumps()
    loaded = Manifest.loads(text)
    assert loaded == manifest
    assert loaded.dumps() == text
    assert loaded.shards("train") == [_shard(0), _shard(1)]


def test_loads_defaults_for_missing_optional_blocks():
    data = json.loads(_manifest().dumps())
    del data["stats"], data["run"]
    loaded = Manifest.loads(json.dumps(data))
    assert loaded.stats == {} and loaded.run == {}
    assert loaded.format_version == 3


def test_deterministic_view_drops_run_only():
    first = _manifest(created_at="2025-01-01T00:00:00Z", output="/tmp/a")
    second = _manifest(created_at="2025-06-30T12:00:00Z", output="/tmp/b", inputs=["x.jsonl"])
    assert first.dumps() != second.dumps()
    assert first.deterministic_view() == second.deterministic_view()
    view = first.deterministic_view()
    assert "run" not in view
    assert set(view) == {
        "format",
        "format_version",
        "objective",
        "config",
        "tokenizer",
        "schema",
        "counts",
        "splits",
        "stats",
    }
    assert first.run == {"created_at": "2025-01-01T00:00:00Z", "output": "/tmp/a"}  # not mutated
    changed = _manifest(created_at="2025-01-01T00:00:00Z", output="/tmp/a")
    changed.config["seed"] = 1
    assert changed.deterministic_view() != view


def test_shards_unknown_split():
    with pytest.raises(KeyError, match=r"split 'validation' not in dataset; it has \['train'\]"):
        _manifest().shards("validation")


@pytest.mark.parametrize(
    "text, message",
    [
        ("[]", 'not an lmshards manifest (missing "format": "lmshards")'),
        ('{"format": "other", "format_version": 1}', 'not an lmshards manifest (missing "format": "lmshards")'),
        ('{"format_version": 1}', 'not an lmshards manifest (missing "format": "lmshards")'),
        (
            '{"format": "lmshards", "format_version": 4}',
            "unsupported manifest format_version 4; this lmshards reads <= 3",
        ),
        ('{"format": "lmshards"}', "unsupported manifest format_version None; this lmshards reads <= 3"),
        ('{"format": "lmshards", "format_version": "1"}', "unsupported manifest format_version '1'"),
    ],
)
def test_loads_errors(text, message):
    with pytest.raises(ValueError) as info:
        Manifest.loads(text)
    assert str(info.value).startswith(message)


def test_loads_invalid_json_raises_value_error():
    with pytest.raises(ValueError):
        Manifest.loads("{not json")


def test_loads_missing_required_block():
    data = json.loads(_manifest().dumps())
    del data["counts"], data["splits"]
    with pytest.raises(ValueError, match=r"lmshards manifest is missing \['counts', 'splits'\]"):
        Manifest.loads(json.dumps(data))


def test_a_format_1_manifest_still_loads():
    data = json.loads(_manifest().dumps())
    data["format_version"] = 1  # datasets packed in --num-buckets hash buckets
    assert Manifest.loads(json.dumps(data)).format_version == 1
