"""Damaged datasets: every inspection command on every damaged dataset ends in one line naming the
file and the problem (exit 1), never a traceback; a path where nothing exists is a usage error (2).
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import shutil
import tarfile

import numpy as np
import pytest
from lmshards_testing import ROOT, TOKENIZER, materialize

from pipelines.inspect import inspect_main, report_main, show_main, validate_main

FAQ = str(ROOT / "data" / "sample" / "faq.jsonl")
ARROW = "train/arrow/data-00000-of-00002.arrow"
TAR = "train/wds/data-00000-of-00002.tar"


@pytest.fixture(scope="module")
def pristine(tmp_path_factory):
    """One file of the sample (a few hundred examples): the commands that do not fail on a damage
    read the whole dataset, for every case."""
    out = tmp_path_factory.mktemp("damaged") / "ds"
    materialize(out, "--input", FAQ, "--tokenizer", TOKENIZER, "--seq-len", "64", "--num-shards", "2",
                "--num-buckets", "4", "--formats", "arrow,webdataset")
    return out


def _manifest(root):
    return json.loads((root / "manifest.json").read_text())


def _write_manifest(root, data) -> None:
    (root / "manifest.json").write_text(json.dumps(data))


def _edit(edit):
    def apply(root):
        data = _manifest(root)
        edit(data)
        _write_manifest(root, data)
    return apply


def _shard0(data):
    return data["splits"]["train"]["shards"][0]


def _truncate(relative, keep=0.5):
    def apply(root):
        path = root / relative
        os.truncate(path, int(path.stat().st_size * keep))
    return apply


def _flip(relative):
    def apply(root):
        path = root / relative
        data = bytearray(path.read_bytes())
        data[len(data) // 2] ^= 0x55
        path.write_bytes(bytes(data))
    return apply


def _tar_int64(root):
    path = root / TAR
    out = io.BytesIO()
    with tarfile.open(path) as source, tarfile.open(fileobj=out, mode="w", format=tarfile.USTAR_FORMAT) as target:
        for member in source.getmembers():
            payload = source.extractfile(member).read()
            if member.name.endswith(".input_ids.npy"):
                buffer = io.BytesIO()
                np.save(buffer, np.load(io.BytesIO(payload)).astype(np.int64))
                payload = buffer.getvalue()
            info = tarfile.TarInfo(member.name)
            info.size = len(payload)
            target.addfile(info, io.BytesIO(payload))
    path.write_bytes(out.getvalue())
    data = _manifest(root)  # re-hashed: only the member's dtype is wrong
    entry = _shard0(data)["files"]["webdataset"]
    entry["bytes"], entry["sha256"] = len(out.getvalue()), hashlib.sha256(out.getvalue()).hexdigest()
    _write_manifest(root, data)


def _rehash(root, relative, fmt, data: bytes) -> None:
    manifest = _manifest(root)
    entry = _shard0(manifest)["files"][fmt]
    assert entry["path"] == relative
    entry["bytes"], entry["sha256"] = len(data), hashlib.sha256(data).hexdigest()
    _write_manifest(root, manifest)


def _arrow_null(root):
    """Row 1's input_ids null (types unchanged), re-hashed: only the data is wrong."""
    import pyarrow as pa

    with pa.memory_map(str(root / ARROW)) as source:
        table = pa.ipc.open_stream(source).read_all()
    values = table.column("input_ids").to_pylist()
    values[1] = None
    field = table.schema.field("input_ids")
    table = table.set_column(table.schema.get_field_index("input_ids"), pa.field("input_ids", field.type),
                             pa.array(values, field.type))
    sink = io.BytesIO()
    with pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table)
    (root / ARROW).write_bytes(sink.getvalue())
    _rehash(root, ARROW, "arrow", sink.getvalue())


def _tar_member_twice(root):
    """The first example's input_ids member written twice (the second a copy of the second example's), re-hashed."""
    path = root / TAR
    out = io.BytesIO()
    with tarfile.open(path) as source, tarfile.open(fileobj=out, mode="w", format=tarfile.USTAR_FORMAT) as target:
        members = [(m.name, source.extractfile(m).read()) for m in source.getmembers()]
        ids = [i for i, (name, _) in enumerate(members) if name.endswith(".input_ids.npy")]
        members.insert(ids[0] + 1, (members[ids[0]][0], members[ids[1]][1]))
        for name, payload in members:
            info = tarfile.TarInfo(name)
            info.size = len(payload)
            target.addfile(info, io.BytesIO(payload))
    path.write_bytes(out.getvalue())
    _rehash(root, TAR, "webdataset", out.getvalue())


def _int64_schema(data):
    for column in data["schema"]["columns"]:
        if column["name"] == "input_ids":
            column["type"] = column["type"].replace("int32", "int64")


EVERY = ("inspect", "show", "show webdataset", "validate", "report")
ARROW_READERS = ("inspect", "show", "validate", "report")
#: case -> (damage, files the error may name, the commands that must fail)
DAMAGE = {
    # the manifest
    "garbage manifest": (lambda root: (root / "manifest.json").write_bytes(b"\xff\xfe\x00garbage"),
                         ["manifest.json"], EVERY),
    "empty manifest": (lambda root: (root / "manifest.json").write_bytes(b""), ["manifest.json"], EVERY),
    "not an lmshards manifest": (lambda root: (root / "manifest.json").write_text("{}"), ["manifest.json"], EVERY),
    "wrong types in the manifest": (_edit(lambda d: _shard0(d).update(rows="many")), ["manifest.json"], EVERY),
    "shard path with ..": (_edit(lambda d: _shard0(d)["files"]["arrow"].update(path="../../../etc/hostname")),
                           ["manifest.json"], EVERY),
    "absolute shard path": (_edit(lambda d: _shard0(d)["files"]["arrow"].update(path="/etc/hostname")),
                            ["manifest.json"], EVERY),
    "unknown objective": (_edit(lambda d: d["objective"].update(name="nonsense")), ["manifest.json"], EVERY),
    "bad seed": (_edit(lambda d: d["config"].update(seed="x")), ["manifest.json"], EVERY),
    "manifest of int64 columns": (_edit(_int64_schema), [ARROW, TAR, "manifest.json"], EVERY),
    # (a tar's rows are counted at its end: `show -n 2` of the tar copy stops before)
    "wrong row count": (_edit(lambda d: (_shard0(d).update(rows=_shard0(d)["rows"] + 1),
                                         d["splits"]["train"].update(examples=d["splits"]["train"]["examples"] + 1))),
                        [ARROW, TAR], ARROW_READERS),
    # one manifest check for every reader and validate: what no writer makes is refused on open
    "a split without shards": (_edit(lambda d: d["splits"]["train"].update(shards=[], examples=0, tokens=0)),
                               ["manifest.json"], EVERY),
    "a shard listed twice": (_edit(lambda d: d["splits"]["train"]["shards"].append(_shard0(d))), ["manifest.json"],
                             EVERY),
    "an infinite count": (_edit(lambda d: d["counts"].update(documents_read=float("inf"))), ["manifest.json"], EVERY),
    "seq_len as a string": (_edit(lambda d: d["objective"]["params"].update(seq_len="512")), ["manifest.json"],
                            EVERY),
    "seq_len of 10^12": (_edit(lambda d: d["objective"]["params"].update(seq_len=10**12)), ["manifest.json"], EVERY),
    "rows the file cannot hold": (_edit(lambda d: (_shard0(d).update(rows=10**15),
                                                   d["splits"]["train"].update(examples=10**15))),
                                  ["manifest.json"], EVERY),
    "flipped tokenizer": (_flip("tokenizer.json"), ["tokenizer.json"], EVERY),
    # the files
    "missing shard": (lambda root: (root / ARROW).unlink(), [ARROW], ARROW_READERS),
    "truncated shard": (_truncate(ARROW), [ARROW], ARROW_READERS),
    "flipped byte": (_flip(ARROW), [ARROW], ARROW_READERS),
    "garbage shard": (lambda root: (root / ARROW).write_bytes(b"\x00" * (root / ARROW).stat().st_size), [ARROW],
                      ARROW_READERS),
    "int64 tar member": (_tar_int64, [TAR], ("show webdataset", "validate")),
    # checks the loader made that the inspection commands did not (one shard opener now)
    "null in an arrow shard": (_arrow_null, [ARROW], ARROW_READERS),
    "tar member twice": (_tar_member_twice, [TAR], ("show webdataset", "validate")),
    "truncated tar": (_truncate(TAR), [TAR], ("show webdataset", "validate")),
    "missing tokenizer": (lambda root: (root / "tokenizer.json").unlink(), ["tokenizer.json"], EVERY),
    "garbage tokenizer": (lambda root: (root / "tokenizer.json").write_bytes(b"{not json"), ["tokenizer.json"],
                          EVERY),
}


def _commands(root, tmp_path):
    yield "inspect", lambda: inspect_main([str(root)])
    yield "show", lambda: show_main([str(root), "-n", "2"])
    yield "show webdataset", lambda: show_main([str(root), "-n", "2", "--format", "webdataset"])
    yield "validate", lambda: validate_main([str(root), "--quiet"])
    yield "report", lambda: report_main([str(root), "-o", str(tmp_path / "report.html")])


@pytest.mark.parametrize("case", sorted(DAMAGE))
def test_every_command_on_a_damaged_dataset_ends_in_one_line(pristine, tmp_path, capsys, case):
    root = tmp_path / "ds"
    shutil.copytree(pristine, root)
    damage, named, failing = DAMAGE[case]
    damage(root)
    for name, command in _commands(root, tmp_path):
        code = command()
        out, err = capsys.readouterr()
        assert "Traceback" not in err
        if name not in failing:
            assert code in (0, 1), (case, name, code)  # it may not read the damaged file at all
            if code == 0:
                continue
        assert code == 1, (case, name, code, err)
        if name == "validate" and not err:
            assert any(n in out for n in named), (case, out)  # the report lists what is wrong, by file
            continue
        lines = err.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith(f"lmshards {name.split()[0]}: error: "), (case, name, err)
        assert any(n in lines[0] for n in named), (case, name, lines[0])


def test_a_path_where_nothing_exists_is_a_usage_error(tmp_path, capsys):
    assert inspect_main([str(tmp_path / "nothing")]) == 2
    assert "no manifest.json" in capsys.readouterr().err
    (tmp_path / "incomplete").mkdir()  # a run killed before its manifest: an incomplete dataset
    assert show_main([str(tmp_path / "incomplete")]) == 1
