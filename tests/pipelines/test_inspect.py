"""``lmshards inspect | show | validate | report`` on real datasets of every objective.

Datasets are built once per module from one file of the sample corpus with short lengths.
Numbers printed by the commands are checked against the manifest and against counts this
file computes on its own, straight from the Arrow shards with pyarrow (no lmshards
reader). ``validate`` must catch planted faults; the report must be self-contained HTML
whose plots hold the right numbers, and (where Chromium is installed) render visibly in
headless Chromium through ``scripts/render_report.sh``.
"""

from __future__ import annotations

import html
import html.parser
import json
import os
import pty
import re
import shlex
import shutil
import subprocess
import sys
from collections import Counter
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest
from lmshards_testing import ROOT, TOKENIZER, materialize, write_arrow, write_tar

from pipelines.cli import main as cli

SPECS = {
    "clm": ["--objective", "clm", "--seq-len", "48"],
    "prefix_lm": ["--objective", "prefix_lm", "--seq-len", "48"],
    "mlm": ["--objective", "mlm", "--seq-len", "48"],
    "span_corruption": ["--objective", "span_corruption", "--inputs-length", "48"],
    "bart": ["--objective", "bart", "--seq-len", "48"],
    "ul2": ["--objective", "ul2", "--inputs-length", "48"],
    "ul2_decoder": ["--objective", "ul2", "--inputs-length", "48", "--layout", "decoder"],
}
PAD, EOS, MASK = 0, 1, 4
#: A second input for the ``*_corpus`` datasets: text beyond ASCII (byte-level pieces of one
#: character), and records the reader must reject, one per reason.
EXTRA_RECORDS = [
    {"text": "Ünïcödé: naïve café, 東京タワー and emoji 😀🎉 — “quotes”. Second sentence here! Third one? "
             "Yes. " * 6, "source": "unicode"},
    "{\"text\": broken json",
    {"body": "no text field"},
    {"text": ""},
    {"text": 5},
    {"text": "Ελληνικά κείμενα. Русский текст тоже здесь. العربية أيضا. 한국어 문장도. " * 8, "source": "unicode"},
]
#: The datasets are made from faq.jsonl's first records (every check here is per example; more
#: examples only cost time).
FAQ_RECORDS = 60
REJECTED = {"malformed_json": 2, "missing_text_field": 3, "empty_text": 4, "text_not_string": 5}  # reason: line


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    """``dataset(name)``: the path of a dataset built once per module; ``NAME_corpus`` is ``NAME``
    made from faq.jsonl plus :data:`EXTRA_RECORDS`."""
    built: dict[str, str] = {}
    faq_part = tmp_path_factory.mktemp("faq") / "faq.jsonl"
    with open(ROOT / "data" / "sample" / "faq.jsonl", encoding="utf-8") as handle:
        faq_part.write_text("".join(handle.readlines()[:FAQ_RECORDS]), encoding="utf-8")
    extra = tmp_path_factory.mktemp("extra") / "extra.jsonl"
    extra.write_text("".join((r if isinstance(r, str) else json.dumps(r, ensure_ascii=False)) + "\n"
                             for r in EXTRA_RECORDS), encoding="utf-8")

    def get(name: str) -> str:
        if name not in built:
            out = tmp_path_factory.mktemp(name) / "data"
            base, corpus = name.removesuffix("_corpus"), name.endswith("_corpus")
            inputs = ["--input", str(faq_part)] + (["--input", str(extra)] * corpus)
            materialize(out, *inputs, "--tokenizer", TOKENIZER, "--formats", "arrow,webdataset",
                        "--validation-fraction", "0.1", "--num-shards", "3", *SPECS[base])
            built[name] = str(out)
        return built[name]

    return get


def run(capsys, *argv: str) -> tuple[int, str, str]:
    code = cli(list(argv))
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def manifest_of(path) -> dict:
    with open(os.path.join(path, "manifest.json"), encoding="utf-8") as handle:
        return json.load(handle)


def arrow_rows(path, split: str, shard: int | None = None) -> list[dict]:
    rows = []
    for info in manifest_of(path)["splits"][split]["shards"]:
        if shard is None or info["index"] == shard:
            with pa.memory_map(os.path.join(path, info["files"]["arrow"]["path"])) as source:
                rows += pa.ipc.open_stream(source).read_all().to_pylist()
    return rows


def sentinel_ids(path) -> dict[int, int]:
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(os.path.join(path, "tokenizer.json"))
    return {tokenizer.token_to_id(f"<extra_id_{k}>"): k for k in range(128)}


def strip_pad(values: list[int]) -> list[int]:
    end = len(values)
    while end and values[end - 1] == PAD:
        end -= 1
    return values[:end]


def seq2seq_parts(row: dict, name: str) -> tuple[list[int], list[int]]:
    if name == "ul2_decoder":
        length = sum(row["doc_lengths"])
        (cut,) = row["prefix_lengths"]  # one segment: the inputs
        return row["input_ids"][:cut], row["input_ids"][cut:length]
    return strip_pad(row["inputs"]), strip_pad(row["targets"])


def independent_counts(path, name: str, split: str) -> dict:
    """Counts computed here from the raw rows, to compare with ``inspect --json``."""
    rows = arrow_rows(path, split)
    sentinels = sentinel_ids(path)
    out: dict = {"examples": len(rows), "lengths": {}, "spans": Counter(), "noise": 0, "span_count": 0}
    if name in ("clm", "prefix_lm", "ul2_decoder"):
        out["lengths"]["input_ids"] = Counter(str(sum(r["doc_lengths"])) for r in rows)
        out["documents"] = Counter(str(len(r["doc_lengths"])) for r in rows)
        if name == "prefix_lm":
            out["prefix_share"] = round(sum(sum(r["prefix_lengths"]) for r in rows) / sum(out_len for out_len in
                                        (sum(r["doc_lengths"]) for r in rows)), 6)
    if name == "mlm":
        selected = [(shown, label) for r in rows for shown, label in zip(r["input_ids"], r["labels"]) if label != -100]
        out["mlm"] = {"selected": len(selected), "masked": sum(shown == MASK for shown, _ in selected),
                      "kept": sum(shown == label for shown, label in selected)}
        out["mlm"]["random"] = out["mlm"]["selected"] - out["mlm"]["masked"] - out["mlm"]["kept"]
        out["lengths"]["input_ids"] = Counter(str(len(strip_pad(r["input_ids"]))) for r in rows)
    if name == "bart":
        out["mask_tokens"] = sum(r["inputs"].count(MASK) for r in rows)
    if name in ("span_corruption", "bart", "ul2", "ul2_decoder"):
        denoisers: dict[str, Counter] = {}
        for row in rows:
            inputs, targets = seq2seq_parts(row, name)
            if name != "ul2_decoder":
                out["lengths"].setdefault("inputs", Counter())[str(len(inputs))] += 1
                out["lengths"].setdefault("targets", Counter())[str(len(targets))] += 1
            if name == "bart":
                continue
            own = denoisers.setdefault(row.get("denoiser", ""), Counter())
            own["examples"] += 1
            starts = [p for p, t in enumerate(targets) if t in sentinels]
            if row.get("denoiser") == "S":
                own["noise"] += len(targets) - 1
                continue
            lengths = [b - a - 1 for a, b in zip(starts, starts[1:] + [len(targets) - 1])]
            own["noise"] += sum(lengths)
            own["spans"] += len(lengths)
            out["spans"].update(str(k) for k in lengths)
        out["denoisers"] = denoisers
        out["noise"] = sum(d["noise"] for d in denoisers.values())
        out["span_count"] = sum(d["spans"] for d in denoisers.values()) + denoisers.get("S", Counter())["examples"]
    return out


@pytest.mark.parametrize("name", list(SPECS))
def test_inspect_numbers_match_the_manifest_and_independent_counts(capsys, dataset, name):
    path = dataset(name)
    manifest = manifest_of(path)
    code, out, _ = run(capsys, "inspect", path, "--json", "--limit", "0")
    assert code == 0
    summary = json.loads(out)
    assert summary["objective"]["name"] == manifest["objective"]["name"]
    for split, info in manifest["splits"].items():
        got, counters = summary["splits"][split], manifest["stats"][split]["objective"]
        measured, mine = got["measured"], independent_counts(path, name, split)
        assert (got["examples"], got["tokens"], got["num_shards"]) == (info["examples"], info["tokens"], 3 if
                                                                      split == "train" else info["num_shards"])
        assert measured["examples"] == mine["examples"] == info["examples"] and not measured["sampled"]
        assert measured["raw_tokens"] == info["tokens"] == counters["chunk_tokens"]
        assert got["shard_tokens"] == [s["tokens"] for s in info["shards"]]
        for column, histogram in mine["lengths"].items():
            assert measured["lengths"][column]["histogram"] == dict(histogram), column
        if name in ("clm", "prefix_lm"):
            assert measured["documents_per_example"]["histogram"] == dict(mine["documents"])
        if name == "prefix_lm":
            assert measured["prefix_share"] == mine["prefix_share"]
        if name == "mlm":
            assert {k: measured["mlm"][k] for k in mine["mlm"]} == mine["mlm"]
            assert (counters["selected"], counters["masked"]) == (mine["mlm"]["selected"], mine["mlm"]["masked"])
        if name == "bart":
            assert measured["bart"]["mask_tokens"] == mine["mask_tokens"] == counters["mask_tokens"]
        if name in ("span_corruption", "ul2", "ul2_decoder"):
            noise = measured["noise"]
            assert noise["noise_tokens"] == mine["noise"] == counters["noise_tokens"]
            assert noise["spans"] == mine["span_count"] == counters["noise_spans"]
            assert noise["span_lengths"] == dict(mine["spans"])
        if name.startswith("ul2"):
            for denoiser, counts in mine["denoisers"].items():
                entry = measured["denoisers"][denoiser]
                assert entry["examples"] == counts["examples"] == counters[f"denoiser/{denoiser}/examples"]
                assert entry["examples_share"] == round(counts["examples"] / mine["examples"], 6)
    code, table, _ = run(capsys, "inspect", path)
    assert code == 0 and f"{manifest['splits']['train']['examples']:,}" in table and "measured on all" in table


def test_inspect_measures_a_uniform_sample_when_limited(capsys, dataset):
    code, out, _ = run(capsys, "inspect", dataset("ul2"), "--json", "--limit", "60", "--split", "train")
    measured = json.loads(out)["splits"]["train"]["measured"]
    assert code == 0 and measured["sampled"] and measured["examples"] == 60
    assert sum(d["examples"] for d in measured["denoisers"].values()) == 60


MARKERS = {
    "clm": ["input_ids: "],
    "prefix_lm": ["[/prefix]"],
    "mlm": ["[MASK:"],
    "span_corruption": ["<extra_id_0>", "restored: ", "[<extra_id_0>:"],
    "bart": ["<mask>", "<s>"],
    "ul2": ["denoiser=", "inputs: ", "targets: "],
    "ul2_decoder": ["denoiser=", "inputs: ", "prefix_length="],
}


@pytest.mark.parametrize("name", list(SPECS))
def test_show_decodes_the_first_examples_with_visible_corruption(capsys, dataset, name):
    path = dataset(name)
    first = arrow_rows(path, "train", 0)[:3]
    code, out, _ = run(capsys, "show", path, "-n", "3")
    assert code == 0 and "\x1b[" not in out  # captured output is not a terminal: plain text
    headers = [line for line in out.splitlines() if line.startswith("── ")]
    assert [h.split()[1] for h in headers] == [row["key"] for row in first]
    assert all("split=train  shard=0" in h for h in headers)
    for marker in MARKERS[name]:
        assert marker in out, marker
    if name.startswith("ul2"):
        assert any(token in out for token in ("[R]", "[S]", "[X]"))


@pytest.mark.parametrize("name, column", [("clm", "input_ids"), ("span_corruption", "inputs")])
def test_show_ids(capsys, dataset, name, column):
    path = dataset(name)
    row = arrow_rows(path, "train", 0)[0]
    code, out, _ = run(capsys, "show", path, "-n", "1", "--ids", "--width", "0")
    id_lines = [line.split("ids: ", 1)[1] for line in out.splitlines() if line.strip().startswith("ids:")]
    assert code == 0 and " ".join(str(t) for t in strip_pad(row[column])) == id_lines[0]


def test_show_refuses_a_negative_count_as_a_usage_error(capsys, dataset):
    code, _, err = run(capsys, "show", dataset("clm"), "-n", "-1")
    assert code == 2 and err.strip().splitlines()[-1] == "lmshards show: error: argument -n: must be >= 0, got -1"


def test_show_reads_only_what_it_needs(capsys, dataset, tmp_path):
    source = dataset("clm")
    shards = manifest_of(source)["splits"]["train"]["shards"]
    target = next(r for r in arrow_rows(source, "train", 0) if len(r["doc_lengths"]) > 1)  # a document boundary
    # Only the first train shard is left: -n reads it alone, --key finds the one shard the key hashes to.
    copy = tmp_path / "partial"
    shutil.copytree(source, copy)
    for shard in shards[1:]:
        for info in shard["files"].values():
            os.remove(copy / info["path"])
    code, out, _ = run(capsys, "show", str(copy), "-n", "2")
    assert code == 0 and out.count("── ") == 2
    for fmt in ("arrow", "webdataset"):
        code, out, _ = run(capsys, "show", str(copy), "--key", target["key"], "--format", fmt)
        assert code == 0 and f"── {target['key']}  split=train  shard=0" in out and "[/doc]" in out
    code, out, err = run(capsys, "show", source, "--key", "train-b99999-c000000-d0")
    assert code == 1 and "not found" in err
    code, out, _ = run(capsys, "show", source, "--split", "validation", "-n", "1")
    assert code == 0 and "split=validation" in out


def test_show_wraps_keeps_line_breaks_and_prints_a_legend_first(capsys, dataset):
    """``show`` (piped: 100 columns) wraps each line under its name, breaks where the text has a
    line break (after a ``↵``), and starts with a legend of the markup it uses."""
    from tokenizers import Tokenizer

    path = dataset("span_corruption")
    code, out, _ = run(capsys, "show", path, "-n", "2")
    lines = out.splitlines()
    assert code == 0 and lines[0] == "markup:" and all(len(line) <= 100 for line in lines)
    legend = lines[1:lines.index("")]
    assert [entry.split()[0] for entry in legend] == ["<extra_id_k>", "[<extra_id_k>:span]", "\u21b5", "\\xNN"]
    assert "[MASK:orig]" not in out  # no MLM markup on a span corruption dataset
    first = arrow_rows(path, "train", 0)[0]
    tokenizer = Tokenizer.from_file(os.path.join(path, "tokenizer.json"))
    text = tokenizer.decode(strip_pad(first["inputs"]), skip_special_tokens=False)
    block = lines[lines.index(next(line for line in lines if line.startswith("── "))):]
    inputs = block[1:next(n for n, line in enumerate(block) if line.startswith(" targets: "))]
    assert inputs[0].startswith("  inputs: ") and all(line.startswith(" " * 10) for line in inputs[1:])
    assert sum(line.endswith("\u21b5") for line in inputs) == text.count("\n")  # a break per line break
    joined = "".join(line[10:].removesuffix("\u21b5") for line in inputs)
    assert joined.replace(" ", "") == text.replace("\n", "").replace(" ", "")
    code, unwrapped, _ = run(capsys, "show", path, "-n", "2", "--width", "0", "--no-legend")
    rows = unwrapped.splitlines()
    first_inputs = next(n for n, line in enumerate(rows) if line.startswith("  inputs: "))
    first_targets = next(n for n, line in enumerate(rows) if line.startswith(" targets: "))
    assert code == 0 and unwrapped.startswith("── ")  # no legend
    assert first_targets - first_inputs == text.count("\n") + 1  # --width 0: only the text's own line breaks


def _show_through(path: str, env: dict, *extra: str, tty: bool) -> str:
    """Run ``lmshards show`` in a child process whose stdout is a pseudo-terminal or a pipe."""
    command = [sys.executable, "-m", "pipelines.cli", "show", path, "-n", "1", *extra]
    env = {**os.environ, "PYTHONPATH": str(ROOT), **env}
    if not tty:
        return subprocess.run(command, env=env, cwd=ROOT, capture_output=True, text=True, check=True).stdout
    leader, follower = pty.openpty()
    process = subprocess.Popen(command, env=env, cwd=ROOT, stdout=follower, stderr=subprocess.DEVNULL)
    os.close(follower)
    chunks = []
    while True:
        try:
            chunk = os.read(leader, 65536)
        except OSError:  # the child closed the terminal
            break
        if not chunk:
            break
        chunks.append(chunk)
    os.close(leader)
    assert process.wait(timeout=60) == 0
    return b"".join(chunks).decode("utf-8", "replace")


def test_show_colours_a_terminal_only_and_respects_no_color(dataset):
    path = dataset("mlm")
    clean = {"NO_COLOR": ""}  # set but empty: colour stays on (no-color.org)
    assert "\x1b[1;37;41m[MASK:" in _show_through(path, clean, tty=True)
    assert "\x1b[" not in _show_through(path, {"NO_COLOR": "1"}, tty=True)
    assert "\x1b[" not in _show_through(path, clean, tty=False)
    assert "\x1b[" in _show_through(path, clean, "--color", "always", tty=False)


@pytest.mark.parametrize("name", list(SPECS))
def test_validate_passes_every_example_of_every_objective(capsys, dataset, name):
    path = dataset(name)
    total = sum(info["examples"] for info in manifest_of(path)["splits"].values())
    code, out, _ = run(capsys, "validate", path, "--json")
    report = json.loads(out)
    assert code == 0 and report["ok"] and report["problems"] == [], report["problems"][:5]
    assert report["examples_checked"] == total and report["files_hashed"] == 1 + 2 * 4
    code, out, _ = run(capsys, "validate", path, "--sample", "40")
    assert code == 0 and "validate: OK; checked a sample of" in out


# -- planted faults --------------------------------------------------------------------------------


def rewrite_shard(root, split: str, index: int, mutate, *, formats=("arrow", "webdataset"), rehash: bool = True):
    """Rewrite one shard with the project's writers after ``mutate(examples)``, as a buggy writer would;
    ``rehash`` records the new sha256 and size in the manifest (else the manifest keeps the old ones)."""
    import hashlib

    from loaders.access.reader import read_arrow_shard, read_tar_shard
    from loaders.inspection.source import objective_from_manifest
    from schemas.examples import example_schema

    manifest = manifest_of(root)
    objective = objective_from_manifest(manifest["objective"])
    schema = example_schema(objective.family, **objective.schema_kwargs())
    shard = manifest["splits"][split]["shards"][index]
    for fmt in formats:
        path = os.path.join(root, shard["files"][fmt]["path"])
        read, write = (read_arrow_shard, write_arrow) if fmt == "arrow" else (read_tar_shard, write_tar)
        examples = [{k: np.array(v) if isinstance(v, np.ndarray) else v for k, v in e.items()} for e in read(path)]
        mutate(examples)
        with open(path, "wb") as handle:
            write(handle, examples, schema)
        if rehash:
            with open(path, "rb") as handle:
                data = handle.read()
            shard["files"][fmt].update(sha256=hashlib.sha256(data).hexdigest(), bytes=len(data))
    with open(os.path.join(root, "manifest.json"), "w", encoding="utf-8") as handle:
        json.dump(manifest, handle, indent=2, sort_keys=True)


def copy_of(dataset, name: str, tmp_path) -> str:
    copy = tmp_path / name
    shutil.copytree(dataset(name), copy)
    return str(copy)


def problems(capsys, path) -> tuple[int, list[dict], str]:
    code, out, _ = run(capsys, "validate", path, "--json")
    report = json.loads(out)
    code_text, text, _ = run(capsys, "validate", path)
    assert code_text == code
    return code, report["problems"], text


def first_with_spans(examples, column: str, sentinels: dict[int, int], at_least: int) -> dict:
    return next(e for e in examples if sum(int(t) in sentinels for t in e[column]) >= at_least)


@pytest.mark.parametrize("rehash", [False, True])
def test_validate_catches_a_flipped_target_token_in_one_copy(capsys, dataset, tmp_path, rehash):
    """A target token changed in the Arrow copy only: a checksum mismatch (unless the manifest was re-hashed
    too) and, either way, an Arrow row that no longer equals its WebDataset copy."""
    path = copy_of(dataset, "span_corruption", tmp_path)
    flipped = {}

    def flip(examples):
        example = examples[5]
        example["targets"][1] = 777 if example["targets"][1] != 777 else 778  # a noise token, not a sentinel
        flipped["key"] = example["key"]

    rewrite_shard(path, "train", 1, flip, formats=("arrow",), rehash=rehash)
    code, found, text = problems(capsys, path)
    arrow = manifest_of(path)["splits"]["train"]["shards"][1]["files"]["arrow"]["path"]
    checks = Counter(p["check"] for p in found)
    assert code == 1 and checks["cross-format"] == 1 and checks["checksum"] == (0 if rehash else 1), found
    assert "[cross-format] train/wds/data-00001-of-00003.tar row 5: webdataset copy differs in ['targets']" in text
    if not rehash:
        assert f"[checksum] {arrow}: sha256" in text


@pytest.mark.parametrize("name", ["clm", "mlm", "bart", "span_corruption", "ul2"])
def test_validate_catches_a_flipped_target_token_in_every_copy(capsys, dataset, tmp_path, name):
    """A target token flipped consistently (both formats, manifest re-hashed): the objective's invariants
    or its replay find it."""
    path = copy_of(dataset, name, tmp_path)
    sentinels = sentinel_ids(path)
    state = {}

    def flip(examples):
        if name == "clm":  # the EOS that ends a packed document (clm's targets are its input_ids)
            example = next(e for e in examples if len(e["doc_lengths"]) > 1)
            example["input_ids"][int(example["doc_lengths"][0]) - 1] = 1000
        elif name == "mlm":  # the label of a kept position (the model sees the original, must predict it)
            example = next(e for e in examples if ((e["labels"] == e["input_ids"]) & (e["labels"] >= 0)).any())
            position = int(np.flatnonzero((example["labels"] == example["input_ids"]) & (example["labels"] >= 0))[0])
            example["labels"][position] = 1000 if example["labels"][position] != 1000 else 1001
        elif name == "bart":  # a target token (the original text) flipped to <mask>
            example = examples[3]
            example["targets"][5] = MASK
        elif name == "span_corruption":  # the targets' closing EOS flipped to a text token
            example = examples[3]
            example["targets"][len(strip_pad(list(example["targets"]))) - 1] = 1000
        else:  # a span target token flipped to a sentinel of another span
            example = first_with_spans([e for e in examples if e["denoiser"] != "S"], "targets", sentinels, 2)
            starts = [p for p, t in enumerate(example["targets"]) if int(t) in sentinels]
            example["targets"][starts[1] - 1] = next(t for t, k in sentinels.items() if k == len(starts) + 3)
        state["key"] = example["key"]

    rewrite_shard(path, "train", 0, flip)
    code, found, text = problems(capsys, path)
    assert code == 1 and found and {p["check"] for p in found} <= {"invariant", "stats", "tokens"}, found
    assert any(p["check"] == "invariant" and p["where"].startswith(state["key"]) for p in found)
    assert f"[invariant] {state['key']} (train shard 0 row" in text


@pytest.mark.parametrize("name, column", [("span_corruption", "inputs"), ("ul2_decoder", "input_ids")])
def test_validate_catches_a_wrong_sentinel_order(capsys, dataset, tmp_path, name, column):
    path = copy_of(dataset, name, tmp_path)
    sentinels = sentinel_ids(path)
    zero, one = (next(t for t, k in sentinels.items() if k == i) for i in (0, 1))
    state = {}

    def swap(examples):
        # Swap <extra_id_0> and <extra_id_1> wherever they occur: inputs and targets still pair up, in the wrong order.
        columns = ["inputs", "targets"] if column == "inputs" else ["input_ids"]
        example = first_with_spans(examples, columns[0], sentinels, 2 if column == "inputs" else 4)
        for name_ in columns:
            ids = example[name_]
            first, second = ids == zero, ids == one
            ids[first], ids[second] = one, zero
        state["key"] = example["key"]

    rewrite_shard(path, "train", 2, swap)
    code, found, text = problems(capsys, path)
    assert code == 1 and found and {p["check"] for p in found} == {"invariant"}, found
    assert all(p["where"].startswith(state["key"]) for p in found)
    assert "sentinels out of order (<extra_id_1>, <extra_id_0>" in found[0]["message"]


def test_validate_catches_a_shard_with_a_bad_checksum(capsys, dataset, tmp_path):
    path = copy_of(dataset, "bart", tmp_path)
    tar = manifest_of(path)["splits"]["validation"]["shards"][0]["files"]["webdataset"]["path"]
    with open(os.path.join(path, tar), "r+b") as handle:  # one bit of the tar's end-of-archive zeros
        handle.seek(-10, os.SEEK_END)
        handle.write(b"\x01")
    code, found, text = problems(capsys, path)
    assert code == 1 and [(p["check"], p["where"]) for p in found] == [("checksum", tar)]
    assert "does not match the manifest's" in text and "validate: FAILED: 1 problem(s) checksum 1" in text


def test_validate_checks_only_the_files_of_a_dataset_of_another_format(capsys, dataset, tmp_path):
    """Format 1 placed, ordered and noised examples by other rules: its files are hashed, its
    examples not checked, and the report says why."""
    path = copy_of(dataset, "span_corruption", tmp_path)
    manifest = manifest_of(path)
    manifest["format_version"] = 1
    with open(os.path.join(path, "manifest.json"), "w", encoding="utf-8") as handle:
        json.dump(manifest, handle)
    code, found, text = problems(capsys, path)
    assert code == 1 and [(p["check"], p["where"]) for p in found] == [("manifest", "format_version")]
    assert "format 1, written by another lmshards" in found[0]["message"]
    shards = sum(len(shard["files"]) for split in manifest["splits"].values() for shard in split["shards"])
    assert f"hashed {shards + 1} files" in text and "checked 0 examples" in text  # the tokenizer too


def test_validate_catches_a_missing_shard(capsys, dataset, tmp_path):
    path = copy_of(dataset, "prefix_lm", tmp_path)
    files = manifest_of(path)["splits"]["train"]["shards"][1]["files"]
    os.remove(os.path.join(path, files["arrow"]["path"]))
    code, found, _ = problems(capsys, path)
    assert code == 1 and [(p["check"], p["where"]) for p in found] == [("missing", files["arrow"]["path"])]
    os.remove(os.path.join(path, files["webdataset"]["path"]))
    code, found, text = problems(capsys, path)
    assert code == 1 and sorted(p["check"] for p in found) == ["missing", "missing"]
    assert f"[missing] {files['webdataset']['path']}: listed in the manifest but not found" in text


# -- report ----------------------------------------------------------------------------------------


class Page(html.parser.HTMLParser):
    """Tags, external references, chart titles and the plotted values of a report."""

    def __init__(self, text: str):
        super().__init__()
        self.tags: Counter = Counter()
        self.external: list[str] = []
        self.charts: dict[str, list[tuple[str, str, float]]] = {}
        self._title = False
        self._chart = ""
        self.feed(text)

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        self.tags[tag] += 1
        for name, value in attrs.items():
            if name != "xmlns" and value and ("://" in value or value.startswith("//")):
                self.external.append(f"{tag} {name}={value}")
        self._title = tag == "text" and attrs.get("class") == "chart-title"
        if tag in ("rect", "circle") and "data-series" in attrs:
            self.charts[self._chart].append((attrs["data-series"], attrs["data-label"], float(attrs["data-value"])))

    def handle_data(self, data):
        if self._title:
            self._chart, self._title = data, False
            self.charts[data] = []


def report_page(capsys, path, tmp_path) -> Page:
    output = tmp_path / "report.html"
    code, out, _ = run(capsys, "report", path, "-o", str(output), "--limit", "0")
    assert code == 0 and str(output) in out
    return Page(output.read_text(encoding="utf-8"))


def values(page: Page, chart: str, series: str) -> dict[str, float]:
    return {label: value for s, label, value in page.charts[chart] if s == series}


CHARTS = {
    "clm": ["train: documents per example", "train: document segment lengths"],
    "prefix_lm": ["train: prefix length / document segment length"],
    "mlm": ["train: MLM replacement split"],
    "span_corruption": ["train: noise span lengths"],
    "bart": ["train: BART span lengths (words), manifest vs Poisson(3.5)"],
    "ul2": ["train: UL2 denoiser mix", "train: span lengths of X(mu=3,r=0.5)"],
    "ul2_decoder": ["train: UL2 denoiser mix", "train: span lengths of R(mu=3,r=0.15)"],
}
SECTIONS = ["summary", "run", "config", "corpus", "rejected", "plots", "shards", "examples"]


def log2_shares(manifest: dict, split: str) -> dict[str, float]:
    """The manifest's document length histogram as shares, keyed like the report's bins."""
    histogram = manifest["stats"][split]["document_lengths"]["log2_histogram"]
    total = sum(histogram.values())
    out = {}
    for key, count in histogram.items():
        high = int(key[1:])
        low = high // 2
        out["0" if high == 1 else str(low) if low == high - 1 else f"{low:,}-{high - 1:,}"] = round(count / total, 6)
    return out


@pytest.mark.parametrize("name", list(SPECS))
def test_report_is_self_contained_and_plots_the_data(capsys, dataset, tmp_path, name):
    path = dataset(name)
    manifest = manifest_of(path)
    page = report_page(capsys, path, tmp_path)
    text = (tmp_path / "report.html").read_text(encoding="utf-8")
    assert not page.external and not page.tags["script"] and not page.tags["link"] and not page.tags["img"]
    assert page.tags["svg"] == len(page.charts) >= 4
    assert all(f'<section id="{section}">' in text for section in SECTIONS)
    for chart in ["tokens per shard", "document lengths", *CHARTS[name]]:
        assert chart in page.charts and page.charts[chart], chart
    # tokens per shard: every shard of every split, in order, one series (colour) per split
    plotted = page.charts["tokens per shard"]
    assert [v for _, _, v in plotted] == [s["tokens"] for split in manifest["splits"].values() for s in split["shards"]]
    assert [series for series, _, _ in plotted] == [split for split, info in manifest["splits"].items()
                                                    for _ in info["shards"]]
    for split in manifest["splits"]:  # document lengths: each split's log2 histogram as shares
        assert {k: v for k, v in values(page, "document lengths", split).items() if v} == log2_shares(manifest, split)
    for info in manifest["splits"].values():  # the shard table lists every file with its size and sha256
        for shard in info["shards"]:
            for file in shard["files"].values():
                assert file["sha256"] in text and f"{file['bytes']:,}" in text
    assert html.escape(shlex.join(manifest["run"]["argv"])) in text
    assert all(html.escape(f["path"]) in text for f in manifest["run"]["input_files"])
    assert "No record was rejected." in text  # faq.jsonl is clean (rejected samples: tests below)
    mine = independent_counts(path, name, "train")
    column = next(iter(mine["lengths"]))
    if len(mine["lengths"][column]) == 1:  # packed: one length only, a sentence instead of a one-bar plot
        (length, count), = mine["lengths"][column].items()
        assert f"train: {column} length" not in page.charts
        assert f"train: {column} length: all {count:,} examples are {length}" in text
    else:
        plotted = values(page, f"train: {column} length", "examples")
        assert sum(plotted.values()) == mine["examples"]
        if all("-" not in label for label in plotted):
            assert {k: int(v) for k, v in plotted.items() if v} == dict(mine["lengths"][column])
    if name == "span_corruption":
        measured = values(page, "train: noise span lengths", "measured")
        assert {k: int(v) for k, v in measured.items() if v} == dict(mine["spans"])
        expected = values(page, "train: noise span lengths", "expected (configured)")
        assert sum(expected.values()) == pytest.approx(mine["span_count"], rel=1e-6)
    if name.startswith("ul2"):
        shares = values(page, "train: UL2 denoiser mix", "examples share")
        assert shares == {d: round(c["examples"] / mine["examples"], 6) for d, c in mine["denoisers"].items()}
        # the first examples shown: one of every denoiser, in mixture order
        shown = [h.split("denoiser=")[1].split()[0] for h in re.findall(r'<div class="header">([^<]*)</div>', text)]
        mixture = [d["name"] for d in manifest["objective"]["params"]["mixture"]]
        assert shown[: len(mixture)] == mixture
    if name == "mlm":
        split = values(page, "train: MLM replacement split", "measured")
        assert split["masked"] == round(mine["mlm"]["masked"] / mine["mlm"]["selected"], 6)
    if name == "bart":  # masks show what they hide; sentences are numbered as in the original
        assert '<span class="seg mask">[MASK:' in text and '<span class="seg sentence">[#1]</span>' in text
        assert "order=#" in text
    assert page.tags["div"] and "class=\"example\"" in text and "\ufffd" not in text
    assert '<span class="nl">\u21b5</span>\n' in text  # the text's line breaks are real ones


def test_report_shows_rejected_samples_input_shares_and_the_run(capsys, dataset, tmp_path):
    path = dataset("clm_corpus")
    manifest = manifest_of(path)
    page = report_page(capsys, path, tmp_path)
    text = (tmp_path / "report.html").read_text(encoding="utf-8")
    rejected = text[text.index('<section id="rejected">'):text.index('<section id="plots">')]
    for reason, line in REJECTED.items():  # each reason with its count and a sample naming file and line
        row = rejected[rejected.index(f"<td>{reason}</td>"):]
        row = row[: row.index("</tr>")]
        assert "<td>1</td>" in row and f"extra.jsonl:{line}</span>" in row, row
    assert "{&quot;body&quot;: &quot;no text field&quot;}" in rejected and "(empty)" in rejected
    files = manifest["run"]["input_files"]
    total = sum(f["bytes"] for f in files)
    for f in files:
        assert f"{100 * f['bytes'] / total:.1f}%" in text and f"{f['bytes']:,}" in text
    assert f"Input files (2 files, {total:,} bytes)" in text
    assert manifest["run"]["encoder"]["backend"] in text and "seq_len" in text
    assert "Sources" not in text and "document lengths by source" not in page.charts  # no sources block


def test_report_never_reads_a_rejected_file_outside_rejected(capsys, dataset, tmp_path):
    path = copy_of(dataset, "clm_corpus", tmp_path)
    secret = tmp_path / "secret.jsonl"
    secret.write_text(json.dumps({"reason": "leak", "source": "secret", "position": 1, "excerpt": "TOP SECRET"})
                      + "\n", encoding="utf-8")
    manifest = manifest_of(path)
    for unsafe in ("../secret.jsonl", str(secret)):
        manifest["counts"]["rejected_files"] = [{"path": unsafe}]
        with open(os.path.join(path, "manifest.json"), "w", encoding="utf-8") as handle:
            json.dump(manifest, handle)
        # A path that leaves the dataset makes the manifest untrusted: refused in one line, nothing read.
        code, out, err = run(capsys, "report", path, "-o", str(tmp_path / "report.html"), "--limit", "0")
        assert code == 1 and len(err.strip().splitlines()) == 1 and "manifest.json" in err
        assert not (tmp_path / "report.html").exists() and "TOP SECRET" not in out + err
    # A relative path inside the dataset but outside rejected/ is not read either.
    shutil.copy(secret, os.path.join(path, "train", "secret.jsonl"))
    manifest["counts"]["rejected_files"] = [{"path": "train/secret.jsonl"}]
    with open(os.path.join(path, "manifest.json"), "w", encoding="utf-8") as handle:
        json.dump(manifest, handle)
    report_page(capsys, path, tmp_path)
    text = (tmp_path / "report.html").read_text(encoding="utf-8")
    assert "TOP SECRET" not in text and "not a file of rejected/, not read" in text


def test_report_shows_per_source_statistics_when_the_manifest_has_them(capsys, dataset, tmp_path):
    """``stats[split]["sources"]`` (what ``materialize --source-field`` is to record) is shown as a
    table and a chart of each source's document lengths."""
    path = copy_of(dataset, "clm", tmp_path)
    manifest = manifest_of(path)
    manifest["stats"]["train"]["sources"] = {
        "faq": {"documents": 30, "tokens": 9000, "log2_histogram": {"<128": 10, "<512": 20}},
        "wiki": {"documents": 10, "tokens": 6000, "document_lengths": {"log2_histogram": {"<1024": 10}}},
    }
    with open(os.path.join(path, "manifest.json"), "w", encoding="utf-8") as handle:
        json.dump(manifest, handle)
    page = report_page(capsys, path, tmp_path)
    text = (tmp_path / "report.html").read_text(encoding="utf-8")
    assert '<h3 id="sources">Sources</h3>' in text
    assert "<td>faq</td><td>30</td>" in text and "<td>wiki</td><td>10</td>" in text and "75.0%" in text
    chart = "train: document lengths by source"
    assert values(page, chart, "faq (30 documents)") == {"64-127": 10.0, "128-255": 0.0, "256-511": 20.0,
                                                         "512-1,023": 0.0}
    assert values(page, chart, "wiki (10 documents)")["512-1,023"] == 10.0


def test_per_source_lengths_share_one_scale_and_name_their_counts(capsys, dataset, tmp_path):
    """A source of one document is no full-height bar beside one of thousands: the sources'
    bars are documents on one scale, and each legend entry says how many documents it has."""
    path = copy_of(dataset, "clm", tmp_path)
    manifest = manifest_of(path)
    manifest["stats"]["train"]["sources"] = {
        "web": {"documents": 5000, "tokens": 900000, "log2_histogram": {"<128": 1000, "<256": 4000}},
        "tiny": {"documents": 1, "tokens": 100, "log2_histogram": {"<128": 1}},
    }
    with open(os.path.join(path, "manifest.json"), "w", encoding="utf-8") as handle:
        json.dump(manifest, handle)
    page = report_page(capsys, path, tmp_path)
    chart = "train: document lengths by source"
    assert {s for s, _, _ in page.charts[chart]} == {"web (5,000 documents)", "tiny (1 document)"}
    assert values(page, chart, "tiny (1 document)") == {"64-127": 1.0, "128-255": 0.0}
    assert values(page, chart, "web (5,000 documents)") == {"64-127": 1000.0, "128-255": 4000.0}


def test_examples_decode_whole_characters(dataset):
    """Byte-level pieces of one character never show as U+FFFD: on every example of clm, bart and
    ul2 made from non-ASCII text, the runs of a line are decoded together; a character the sequence
    holds only part of (cut by a sentinel or a mask) shows its bytes as \\xNN."""
    from tokenizers import Tokenizer

    from loaders.inspection.anatomy import take_apart
    from loaders.inspection.decode import RunDecoder
    from loaders.inspection.render import render_example, to_text
    from loaders.inspection.source import open_inspected

    seen_whole = False
    for name in ("clm_corpus", "bart_corpus", "ul2_corpus"):
        ds = open_inspected(dataset(name))
        tokenizer = Tokenizer.from_file(os.path.join(ds.path, "tokenizer.json"))
        decoder, view = RunDecoder(ds.tokenizer), ds.view
        for split in ds.splits:
            for located in ds.iter_split(split):
                shown = to_text(render_example(located, take_apart(located.example, view), view, seed=ds.seed,
                                               decoder=decoder), decoder)
                assert "\ufffd" not in shown, shown
                if name == "clm_corpus":
                    ids = [int(t) for t in located.example["input_ids"]]
                    whole = tokenizer.decode(ids, skip_special_tokens=True)
                    if "東京タワー" in whole and "\ufffd" not in whole:
                        assert "東京タワー" in shown
                        seen_whole = True
    assert seen_whole


def _layout_probe():
    """scripts/check_report_layout.py as a module (the scripts folder is no package)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("check_report_layout", ROOT / "scripts" / "check_report_layout.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _pixels(image: np.ndarray, rgb: tuple[int, int, int]) -> int:
    return int((np.abs(image - np.array(rgb)).sum(axis=2) < 30).sum())


BROWSER_CHARTS = {
    "clm_corpus": ["document lengths", "train: documents per example", "train: document segment lengths",
                   "tokens per shard"],
    "bart_corpus": ["document lengths", "train: inputs length", "train: BART span lengths (words), manifest vs "
                    "Poisson(3.5)", "tokens per shard"],
    "ul2_corpus": ["document lengths", "train: UL2 denoiser mix", "train: span lengths of R(mu=3,r=0.15)",
                   "tokens per shard"],
}


@pytest.mark.e2e
def test_report_renders_in_headless_chromium(capsys, dataset, tmp_path):
    """clm, bart and ul2 reports laid out by Chromium 1400 px wide: every section and chart is
    there, nothing overflows its box, no chart text overlaps another, and the screenshots show
    the plot colours (measured bars, expected curves, the validation split). With
    ``LMSHARDS_REPORT_SCREENSHOTS=DIR`` the screenshots are kept in DIR."""
    probe = _layout_probe()
    if probe.find_browser() is None:
        pytest.skip("no Chromium installed (apt-get install -y chromium); the structural report tests still run")
    from PIL import Image

    keep = os.environ.get("LMSHARDS_REPORT_SCREENSHOTS")
    for name, charts in BROWSER_CHARTS.items():
        path = dataset(name)
        output = tmp_path / f"{name}.html"
        assert run(capsys, "report", path, "-o", str(output))[0] == 0
        found = probe.measure(str(output), 1400)
        assert probe.problems(found) == [], name
        assert found["sections"] == SECTIONS and set(charts) <= set(found["charts"]), found["charts"]
        headers = found["examples"]
        if name == "ul2_corpus":
            mixture = [d["name"] for d in manifest_of(path)["objective"]["params"]["mixture"]]
            assert [h.split("denoiser=")[1].split()[0] for h in headers[: len(mixture)]] == mixture
        if name == "bart_corpus":
            assert all("sentences=" in h or "noise=not recovered" in h for h in headers)
        height = min(found["page"]["scrollHeight"], 16_000)
        png = tmp_path / f"{name}.png"
        result = subprocess.run(["bash", str(ROOT / "scripts" / "render_report.sh"), str(output), str(png),
                                 f"1400,{height}"], capture_output=True, text=True, timeout=180)
        assert result.returncode == 0, result.stderr
        image = np.asarray(Image.open(png).convert("RGB")).astype(int)
        assert image.shape[:2] == (height, 1400)

        assert _pixels(image, (0x44, 0x72, 0xC4)) > 20_000, name  # measured bars
        assert _pixels(image, (0x76, 0xB0, 0x41)) > 1_000, name  # the validation split's bars (documents, shards)
        if name != "clm_corpus":
            assert _pixels(image, (0xE4, 0x57, 0x2E)) > 500, name  # expected curves and configured weights
        if keep:
            os.makedirs(keep, exist_ok=True)
            shutil.copy(png, os.path.join(keep, png.name))


@pytest.mark.e2e
def test_charts_with_large_numbers_and_long_labels_do_not_overlap(tmp_path):
    """The geometry of :func:`bar_chart` at its extremes, laid out by Chromium: ticks in the
    billions beside the y label, long category labels, a legend of many series."""
    probe = _layout_probe()
    if probe.find_browser() is None:
        pytest.skip("no Chromium installed (apt-get install -y chromium)")
    from loaders.inspection.svg import Series, bar_chart

    labels = [f"validation/{i:05d}" for i in range(40)]
    charts = [
        bar_chart("tokens per shard", labels, [Series("train", [9.87e9 - i for i in range(40)], "#4472c4")],
                  x_label="split/shard", y_label="tokens"),
        bar_chart("many series", ["a", "b"], [Series(f"series number {k} with a long name", [k + 1.0, None], "#000")
                                              for k in range(9)], x_label="x", y_label="y", width=460),
        bar_chart("shares", [f"{2 ** k:,}-{2 ** (k + 1) - 1:,}" for k in range(20)],
                  [Series("train", [0.05] * 20, "#4472c4"), Series("validation", [0.049] * 20, "#76b041")],
                  x_label="document length (tokens)", y_label="share of documents", width=1000),
    ]
    page = tmp_path / "charts.html"
    page.write_text("<!DOCTYPE html><html><body>" + "".join(charts) + "</body></html>", encoding="utf-8")
    found = probe.measure(str(page), 1400)
    assert found["chart_text"] == [] and len(found["charts"]) == 3


def test_diff_puts_two_summaries_side_by_side_and_marks_the_differences(capsys, dataset, tmp_path):
    clm, prefix = dataset("clm"), dataset("prefix_lm")
    # the same dataset written again by another run: only the run's facts differ
    again = copy_of(dataset, "clm", tmp_path)
    manifest = manifest_of(again)
    manifest["run"]["created_at"] = "2030-01-01T00:00:00+00:00"
    with open(os.path.join(again, "manifest.json"), "w", encoding="utf-8") as handle:
        json.dump(manifest, handle)
    code, out, _ = run(capsys, "diff", clm, again, "--exit-code")
    assert code == 0 and out.endswith("0 difference(s) in config, objective, tokenizer, counts and splits; "
                                      "1 in the run's facts\n")
    changed = [line for line in out.splitlines() if line.startswith("! ")]
    assert len(changed) == 1 and changed[0].split()[1] == "created_at"
    # another objective on the same corpus
    code, out, _ = run(capsys, "diff", clm, prefix, "--exit-code")
    assert code == 1 and f"A: {clm}" in out and f"B: {prefix}" in out
    lines = out.splitlines()
    assert lines[lines.index("objective") + 1].split() == ["!", "name", "clm", "prefix_lm"]
    train = lines[lines.index("split train") + 1:]
    marks = {line[2:].split()[0]: line[:1] for line in train if line[:1] in "!-+ " and len(line) > 2}
    assert marks["documents"] == " " and marks["tokens"] == " "  # the same corpus, the same documents and tokens
    assert marks["objective.prefix_share"] == "+"  # a statistic of B's objective only
    code, out, _ = run(capsys, "diff", clm, prefix, "--only-differences")
    body = out.splitlines()[4:-2]
    assert code == 0 and all(line[:2] in ("! ", "- ", "+ ") or not line.startswith(" ") for line in body)
    code, out, _ = run(capsys, "diff", clm, prefix, "--json")
    rows = json.loads(out)["rows"]
    seed = next(r for r in rows if r["section"] == "config" and r["key"] == "seed")
    assert seed == {"section": "config", "key": "seed", "a": 0, "b": 0, "status": "same"}
    a = manifest_of(clm)
    shards = next(r for r in rows if r["section"] == "split train" and r["key"] == "bytes.arrow")
    assert shards["a"] == sum(s["files"]["arrow"]["bytes"] for s in a["splits"]["train"]["shards"])
    code, _, err = run(capsys, "diff", clm, str(tmp_path / "nowhere"))
    assert code == 2 and err.startswith("lmshards diff: error: B: ") and err.count("\n") == 1


def test_diff_keys_a_ul2_mixture_by_denoiser(capsys, dataset, tmp_path):
    path = copy_of(dataset, "ul2", tmp_path)
    manifest = manifest_of(path)
    manifest["objective"]["params"]["mixture"][1]["weight"] = 0.9
    with open(os.path.join(path, "manifest.json"), "w", encoding="utf-8") as handle:
        json.dump(manifest, handle)
    code, out, _ = run(capsys, "diff", dataset("ul2"), path, "-d")
    name = manifest["objective"]["params"]["mixture"][1]["name"]
    changed = [line.split() for line in out.splitlines() if line.startswith("! ")]
    assert code == 0 and [f"params.mixture[{name}].weight"] == [c[1] for c in changed if "mixture" in c[1]]


def test_validate_reports_a_truncated_shard_and_goes_on(capsys, dataset, tmp_path):
    path = copy_of(dataset, "ul2", tmp_path)
    shards = manifest_of(path)["splits"]["train"]["shards"]
    arrow = os.path.join(path, shards[0]["files"]["arrow"]["path"])
    with open(arrow, "r+b") as handle:
        handle.truncate(os.path.getsize(arrow) // 2)
    code, found, _ = problems(capsys, path)
    by_file = Counter((p["check"], p["where"]) for p in found)
    name = shards[0]["files"]["arrow"]["path"]
    assert code == 1 and {("size", name), ("checksum", name), ("read", name)} <= set(by_file), found
    assert {p["check"] for p in found} <= {"size", "checksum", "read"}  # the other shards are still sound


def test_inspect_prints_the_mlm_replacement_split_in_the_order_it_names(capsys, dataset):
    """``mask/random/kept`` is followed by those three shares in that order, measured and as the
    manifest counted them (its dicts come back from JSON with sorted keys: keep, mask, random)."""
    code, out, _ = run(capsys, "inspect", dataset("mlm"))
    assert code == 0
    manifest = json.loads((Path(dataset("mlm")) / "manifest.json").read_text())
    exact = manifest["stats"]["train"]["objective_summary"]["replacement"]
    line = next(line for line in out.splitlines() if "manifest (exact) mask/random/kept" in line)
    shares = [float(v) for v in line.split("mask/random/kept")[1].split("/")]
    assert shares == pytest.approx([exact["mask"], exact["random"], exact["keep"]], abs=1e-4)
    assert shares[0] > 0.7 and shares[1] < 0.2 and shares[2] < 0.2  # 80/10/10, mask first
    measured = next(line for line in out.splitlines() if line.strip().startswith("replacement mask/random/kept"))
    first = float(measured.split("mask/random/kept")[1].split("/")[0])
    assert first > 0.7
