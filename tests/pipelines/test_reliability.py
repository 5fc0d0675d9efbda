"""Reliability of ``lmshards materialize`` (docs/design.md section 7, pipeline side).

- A corpus mixing good documents with every kind of bad record (including a BOM mid-file,
  blank lines, a 10 MB document and a truncated .gz): the run completes, every good
  document is in the output (checked token by token), every bad record is in
  ``rejected/`` with its reason, and the counts reconcile in the manifest and the summary.
- ``--max-rejected-fraction``: the job fails with one line and writes no manifest.
- Configuration errors: one line naming the flag and value, exit status 2, nothing written.
- Crash safety: SIGKILL at several points leaves no manifest and no incomplete file under a
  final name; re-running with ``--overwrite`` gives the bytes of an uninterrupted run.
"""

from __future__ import annotations

import collections
import glob
import gzip
import json
import os
import re
import signal
import subprocess
import sys
import tarfile
import time
import zlib
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.ipc as ipc
import pyarrow.parquet as pq
import pytest
from lmshards_testing import ROOT, TOKENIZER, file_digests, materialize

from pipelines import reference_handoff
from pipelines.materialize import main
from schemas.manifest import Manifest
from transforms.reading.record_policy import split_text

BIG_DOC_CHARS = 10_000_000
MAX_DOC_CHARS = 200_000
SEQ_LEN = 512
BOM = "\ufeff".encode()


# --- the hostile corpus ---------------------------------------------------------------------


def _sample_texts() -> list[str]:
    texts = []
    for path in sorted(glob.glob(str(ROOT / "data" / "sample" / "*.jsonl"))):
        with open(path, encoding="utf-8") as handle:
            texts.extend(json.loads(line)["text"] for line in handle if line.strip())
    return list(dict.fromkeys(texts))  # distinct, in file order


def _jline(text) -> bytes:
    return json.dumps({"text": text, "id": 1}).encode()


class _Entry:
    """One input line and what each run must make of it.

    ``strict`` / ``lenient``: the document text, ``"!reason"`` for a rejection, or None for
    a blank line (not a record). ``strict`` is the default policy; ``lenient`` is
    ``--invalid-utf8 replace --nul-bytes strip``.
    """

    def __init__(self, raw: bytes, strict, lenient="same"):
        self.raw, self.strict = raw, strict
        self.lenient = strict if lenient == "same" else lenient


def _hostile_corpus(root: Path) -> dict:
    """Write the corpus under ``root``; return what each run must produce."""
    sample = _sample_texts()
    good = iter(sample)
    root.mkdir(parents=True, exist_ok=True)
    jsonl = [
        _Entry(_jline(next(good)), "good"),
        _Entry(b'{"text": "an unterminated string', "!malformed_json"),
        _Entry(b"[1, 2, 3]", "!not_an_object"),
        _Entry(b'"just a string"', "!not_an_object"),
        _Entry(b'{"body": "no text field"}', "!missing_text_field"),
        _Entry(b'{"text": 42}', "!text_not_string"),
        _Entry(b'{"text": null}', "!text_not_string"),
        _Entry(_jline(next(good)), "good"),
        _Entry(b'{"text": "bad byte \xff in JSON"}', "!invalid_utf8", "bad byte \ufffd in JSON"),
        _Entry(b'{"text": "a lone \\ud800 surrogate"}', "!invalid_utf8", "a lone \ufffd surrogate"),
        _Entry(b'{"text": ""}', "!empty_text"),
        _Entry(b'{"text": " \\t\\n \\u3000 "}', "!empty_text"),
        _Entry(b'{"text": "escaped \\u0000 NUL"}', "!nul_bytes", "escaped  NUL"),
        _Entry(b'{"text": "raw \x00 NUL byte"}', "!nul_bytes", "raw  NUL byte"),
        _Entry(b"", None),
        _Entry(b"   \t", None),
        _Entry(BOM + _jline("a record after a mid-file byte-order mark"), "a record after a mid-file byte-order mark"),
        _Entry(_jline("\ufeffa text value that starts with a BOM"), "a text value that starts with a BOM"),
        _Entry(BOM, None),
        _Entry(b"\r", None),
        _Entry(_jline(sample[0]), "good"),  # an exact duplicate of the first document
    ]
    jsonl += [_Entry(_jline(next(good)), "good") for _ in range(40)]
    text_lines = [
        _Entry(b"a plain text line", "a plain text line"),
        _Entry(b"", None),
        _Entry(b"invalid \xc3\x28 UTF-8 in a text file", "!invalid_utf8", "invalid \ufffd( UTF-8 in a text file"),
        _Entry(b"NUL\x00in a text line", "!nul_bytes", "NULin a text line"),
        _Entry("\u3000\u2003".encode(), "!empty_text"),
        _Entry(BOM + b"text after a byte-order mark", "text after a byte-order mark"),
        _Entry(b"\x00\x00\x00", "!nul_bytes", "!empty_text"),
        _Entry(b"  ", None),
        _Entry(b"the last text line", "the last text line"),
    ]
    files = {"mixed.jsonl": jsonl, "notes.txt": text_lines}
    expected = {"strict": {"docs": [], "rejected": []}, "lenient": {"docs": [], "rejected": []}}
    for name, entries in files.items():
        (root / name).write_bytes(b"\n".join(e.raw for e in entries) + b"\n")
        for number, entry in enumerate(entries, start=1):
            for run in ("strict", "lenient"):
                outcome = getattr(entry, run)
                if outcome == "good":
                    outcome = json.loads(entry.raw)["text"]
                if outcome is None:
                    continue
                if outcome.startswith("!"):
                    expected[run]["rejected"].append((name, number, outcome[1:]))
                else:
                    expected[run]["docs"].append((name, outcome))
    # A 10 MB single document: distinct paragraphs, so its pieces are distinct documents.
    paragraphs, size, k = [], 0, 0
    while size < BIG_DOC_CHARS:
        paragraphs.append(f"[{k}] {sample[k % len(sample)]}")
        size += len(paragraphs[-1]) + 2
        k += 1
    big = "\n\n".join(paragraphs)[:BIG_DOC_CHARS]
    (root / "big.jsonl").write_bytes(_jline(big) + b"\n")
    expected["strict"]["rejected"].append(("big.jsonl", 1, "too_long"))
    expected["lenient"]["docs"].extend(("big.jsonl", piece) for piece in split_text(big, MAX_DOC_CHARS))
    # A .gz cut in the middle: its CRC never verifies, so none of its records counts: one rejection.
    cut_docs = [next(good) for _ in range(60)]
    compressed = gzip.compress(b"".join(_jline(t) + b"\n" for t in cut_docs), mtime=0)
    truncated = compressed[: len(compressed) * 3 // 5]
    (root / "cut.jsonl.gz").write_bytes(truncated)
    whole_lines = zlib.decompressobj(wbits=31).decompress(truncated).count(b"\n")
    assert 0 < whole_lines < len(cut_docs)
    # Parquet rows: a text, a null, a blank.
    pq.write_table(pa.table({"text": [next(good), None, "  "]}), str(root / "rows.parquet"))
    for run in ("strict", "lenient"):
        expected[run]["rejected"].append(("cut.jsonl.gz", 0, "unreadable_file"))
        expected[run]["docs"].append(("rows.parquet", pq.read_table(str(root / "rows.parquet"))["text"][0].as_py()))
        expected[run]["rejected"] += [("rows.parquet", 1, "text_not_string"), ("rows.parquet", 2, "empty_text")]
    expected["big_doc"] = big
    return expected


def _encode(texts: list[str]) -> list[tuple[int, ...]]:
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(TOKENIZER)
    tokenizer.encode_special_tokens = True  # as the pipeline: text that spells "</s>" is text
    return [tuple(e.ids) for e in tokenizer.encode_batch_fast(texts, add_special_tokens=False)]


def _read_arrow(path: str) -> pa.Table:
    with open(path, "rb") as handle:
        return ipc.open_stream(handle).read_all()  # raises on a cut or damaged stream


def _output_documents(out: Path, eos: int) -> collections.Counter:
    """Documents in the output of ``--packing none``: each bucket's pieces in chunk order, cut at EOS."""
    pieces = []
    for path in sorted(glob.glob(str(out / "train" / "arrow" / "*.arrow"))):
        table = _read_arrow(path)
        ids = table.column("input_ids").combine_chunks().flatten().to_numpy().reshape(table.num_rows, SEQ_LEN)
        for key, row, lengths in zip(table.column("key").to_pylist(), ids, table.column("doc_lengths").to_pylist()):
            _, bucket, chunk, _ = key.split("-")
            pieces.append((bucket, int(chunk[1:]), row[: sum(lengths)]))
    documents = collections.Counter()
    for bucket in sorted({b for b, _, _ in pieces}):
        stream = np.concatenate([row for b, _, row in sorted(p for p in pieces if p[0] == bucket)])
        ends = np.flatnonzero(stream == eos)
        assert len(ends) and ends[-1] == len(stream) - 1
        for start, end in zip(np.concatenate([[0], ends[:-1] + 1]), ends):
            documents[tuple(stream[start:end].tolist())] += 1
    return documents


@pytest.fixture(scope="module")
def hostile(tmp_path_factory):
    root = tmp_path_factory.mktemp("hostile")
    return root, _hostile_corpus(root / "corpus")


def _hostile_args(root: Path, out: Path, *extra: str) -> list[str]:
    return ["--input", str(root / "corpus" / "*"), "--tokenizer", TOKENIZER, "--output", str(out),
            "--seq-len", str(SEQ_LEN), "--packing", "none", "--num-buckets", "4", "--num-shards", "2",
            "--max-doc-chars", str(MAX_DOC_CHARS), *extra]


@pytest.mark.parametrize(
    "run, flags",
    [
        ("strict", ["--long-docs", "reject", "--max-rejected-fraction", "0.5"]),
        ("lenient", ["--long-docs", "split", "--invalid-utf8", "replace", "--nul-bytes", "strip"]),
    ],
)
def test_hostile_corpus_every_document_accounted_for(hostile, capsys, run, flags):
    root, expected = hostile
    expect = expected[run]
    out = root / run
    assert main(_hostile_args(root, out, *flags)) == 0
    summary = capsys.readouterr().out
    manifest = Manifest.loads((out / "manifest.json").read_text())

    # Every good (or repaired, or split) document is in the output, token for token.
    docs = [text for _, text in expect["docs"]]
    unique_docs = list(dict.fromkeys(docs))
    assert _output_documents(out, manifest.tokenizer["special_ids"]["eos"]) == collections.Counter(
        _encode(unique_docs)
    )
    # Every bad record is in rejected/ with its source, position and reason.
    with open(out / "rejected" / "rejected.jsonl", encoding="utf-8") as handle:
        rejected = [json.loads(line) for line in handle]
    assert sorted((os.path.basename(r["source"]), r["position"], r["reason"]) for r in rejected) == sorted(
        expect["rejected"]
    )
    # The counts reconcile exactly, in the manifest and in the summary line.
    counts = manifest.counts
    by_reason = collections.Counter(reason for _, _, reason in expect["rejected"])
    assert counts["documents_read"] == len(docs) + len(expect["rejected"])
    assert counts["documents_written"] == len(unique_docs)
    assert counts["duplicates"] == len(docs) - len(unique_docs) == 1
    assert counts["rejected_by_reason"] == dict(sorted(by_reason.items()))
    assert counts["rejected"] == len(expect["rejected"]) == len(rejected)
    assert counts["filtered"] == 0 and counts["reconciled"]
    assert counts["documents_read"] == (
        counts["documents_written"] + counts["duplicates"] + counts["rejected"] + counts["filtered"]
    )
    reasons = ", ".join(f"{reason} {n:,}" for reason, n in sorted(by_reason.items()))
    assert (
        f"documents: read {counts['documents_read']:,} = written {counts['documents_written']:,} + duplicates 1 "
        f"+ rejected {counts['rejected']:,} ({reasons}) + filtered 0"
    ) in summary.splitlines()
    assert manifest.config["max_doc_chars"] == MAX_DOC_CHARS
    if run == "strict":
        assert set(by_reason) == {"malformed_json", "not_an_object", "missing_text_field", "text_not_string",
                                  "invalid_utf8", "empty_text", "nul_bytes", "too_long", "unreadable_file"}
        assert counts["records_read"] == counts["documents_read"]
        assert manifest.config["max_rejected_fraction"] == 0.5
    else:
        pieces = len(split_text(expected["big_doc"], MAX_DOC_CHARS))
        # Repairs count kept records only: the all-NUL line is empty once stripped, so rejected.
        assert counts["repaired"] == {"invalid_utf8_replaced": 3, "nul_bytes_stripped": 3,
                                      "long_documents_split": 1, "split_pieces": pieces}
        assert counts["records_read"] == counts["documents_read"] - pieces + 1
        assert (f"repaired: invalid utf8 replaced 3, nul bytes stripped 3, long documents split 1 "
                f"(into {pieces} documents)") in summary.splitlines()


def test_max_rejected_fraction_fails_the_job_without_a_manifest(hostile, capfd):
    root, expected = hostile
    out = root / "too-many-rejected"
    args = ["--input", str(root / "corpus" / "mixed.jsonl"), "--input", str(root / "corpus" / "notes.txt"),
            "--tokenizer", TOKENIZER, "--output", str(out), "--seq-len", "64", "--max-rejected-fraction", "0.05"]
    files = ("mixed.jsonl", "notes.txt")
    rejected = [r for r in expected["strict"]["rejected"] if r[0] in files]
    read = len(rejected) + sum(1 for name, _ in expected["strict"]["docs"] if name in files)
    assert main(args) == 1
    err = capfd.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    match = re.fullmatch(
        r"lmshards materialize: error: --max-rejected-fraction 0\.05 exceeded: ([\d.]+)% of documents rejected "
        r"\((\d+) of (\d+) read: (.*)\); mostly (\w+): (.*); no manifest written, the rejected records are in (.*)",
        err[0],
    )
    assert match, err[0]
    by_reason = collections.Counter(r[2] for r in rejected)
    top = max(by_reason, key=lambda reason: (by_reason[reason], reason))
    assert (match.group(5), match.group(6)) == (top, "--nul-bytes strip keeps such records")
    assert (int(match.group(2)), int(match.group(3))) == (len(rejected), read)
    assert match.group(1) == f"{100 * len(rejected) / read:.2f}"
    assert "malformed_json 1" in match.group(4)
    assert match.group(7) == str(out / "rejected" / "rejected.jsonl")
    assert not (out / "manifest.json").exists()
    assert (out / "rejected" / "rejected.jsonl").exists()
    assert not reference_handoff._STORE  # a failed run releases what it handed over by reference too


# --- configuration errors -------------------------------------------------------------------


@pytest.fixture(scope="module")
def config_files(tmp_path_factory):
    from tokenizers import Tokenizer, models, pre_tokenizers

    root = tmp_path_factory.mktemp("config")
    no_mask = Tokenizer(models.WordLevel({"</s>": 0, "<unk>": 1, "<pad>": 2, "hello": 3}, unk_token="<unk>"))
    no_mask.pre_tokenizer = pre_tokenizers.Whitespace()
    no_mask.save(str(root / "no_mask.json"))
    (root / "garbage.json").write_text("{not a tokenizer")
    (root / "params.json").write_text(json.dumps({"seq_len": 128, "mask_ratio_typo": 0.5}))
    (root / "data.csv").write_text("text\nhello\n")
    busy = root / "busy"
    busy.mkdir()
    (busy / "keep.txt").write_text("x")
    return root


# (flags to set, text that the one error line must contain); "{root}" is the fixture's folder and a
# flag set to None is left out.
CONFIG_ERRORS = {
    "unknown objective": (["--objective", "nope"], "--objective nope: unknown objective"),
    "unknown option": (["--seq-len-typo", "5"], "unknown option --seq-len-typo"),
    "parameter of another objective": (["--noise-density", "0.2"], "--noise-density is not a parameter of"),
    "bad parameter value": (["--objective", "mlm", "--mlm-probability", "2"], "--mlm-probability 2.0:"),
    "unknown parameter in --config": (["--config", "{root}/params.json"], "--config {root}/params.json:"),
    "missing special token (override)": (["--special-token", "eos=<nope>"], "--special-token eos=<nope>: token not"),
    "missing special token (role)": (["--objective", "mlm", "--tokenizer", "{root}/no_mask.json"],
                                     "--tokenizer {root}/no_mask.json: the tokenizer has no mask token"),
    "too few sentinels": (["--objective", "span_corruption", "--seq-len", None, "--inputs-length", "8192"],
                          "the tokenizer is short of special tokens: 455 sentinels"),
    "seq_len too small": (["--seq-len", "1"], "--seq-len 1:"),
    "inputs_length too small": (["--objective", "span_corruption", "--seq-len", None, "--inputs-length", "2"],
                                "--inputs-length 2:"),
    "tokenizer missing": (["--tokenizer", "{root}/missing.json"], "--tokenizer {root}/missing.json: cannot read"),
    "tokenizer invalid": (["--tokenizer", "{root}/garbage.json"], "--tokenizer {root}/garbage.json: not a valid"),
    "inputs matching nothing": (["--input", "{root}/*.jsonl"], "--input {root}/*.jsonl: matches no file"),
    "input of unknown type": (["--input", "{root}/data.csv"], "--input {root}/data.csv: unknown file type"),
    "non-empty output": (["--output", "{root}/busy"], "--output {root}/busy: directory is not empty"),
    "bad choice": (["--nul-bytes", "drop"], "argument --nul-bytes: invalid choice: 'drop'"),
    "bad fraction": (["--max-rejected-fraction", "1.5"], "--max-rejected-fraction 1.5: must be in [0, 1]"),
    "bad max-doc-chars": (["--max-doc-chars", "0"], "--max-doc-chars 0: must be > 0"),
    "record bound too small": (["--max-record-bytes", "100"], "--max-record-bytes 100: must be at least 1024"),
    "multi-threading runner": (["--direct_running_mode", "multi_threading"],
                               "--direct_running_mode=multi_threading: not supported"),
}


@pytest.mark.parametrize("case", CONFIG_ERRORS)
def test_configuration_errors_fail_before_any_work(config_files, capfd, case):
    extra, message = CONFIG_ERRORS[case]
    root = str(config_files)
    out = config_files / "never"
    args = {"--input": str(ROOT / "data" / "sample" / "*.jsonl"), "--tokenizer": TOKENIZER, "--seq-len": "64",
            "--output": str(out)}
    for flag, value in zip(extra[::2], extra[1::2]):
        args[flag] = value and value.replace("{root}", root)
    busy_before = sorted(os.listdir(config_files / "busy"))
    assert main([part for flag, value in args.items() if value is not None for part in (flag, value)]) == 2
    captured = capfd.readouterr()
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1, captured.err
    assert lines[0].startswith("lmshards materialize: error: ") and message.replace("{root}", root) in lines[0]
    assert captured.out == ""
    assert not out.exists()
    assert sorted(os.listdir(config_files / "busy")) == busy_before


# --- crash safety ---------------------------------------------------------------------------

CRASH_VARIANTS = 1  # the sample corpus, about 1.1 MB of text


def _crash_corpus(root: Path) -> str:
    texts = _sample_texts()
    root.mkdir(parents=True)
    for variant in range(CRASH_VARIANTS):
        for part in range(2):
            name = f"part-{variant}-{part}.jsonl" + ("" if part else ".gz")
            lines = b"".join(_jline(f"[variant {variant}] {t}") + b"\n" for t in texts[part::2])
            (root / name).write_bytes(lines if part else gzip.compress(lines, mtime=0))
    (root / "bad.jsonl").write_bytes(b'{"text": "ok"}\nnot json\n{"t": 1}\n')
    return str(root / "*")


def _crash_args(corpus: str, out: Path) -> list[str]:
    return ["--input", corpus, "--tokenizer", TOKENIZER, "--output", str(out), "--seq-len", "128",
            "--num-shards", "8", "--num-buckets", "8", "--validation-fraction", "0.1", "--formats", "arrow,webdataset"]


def _pipeline_started(out: Path, state: dict, after: float) -> bool:
    if "started" not in state and (out / "tokenizer.json").exists():
        state["started"] = time.monotonic()
    return "started" in state and time.monotonic() - state["started"] >= after


def _listdir(path: Path) -> list[str]:
    try:
        return os.listdir(path)
    except FileNotFoundError:
        return []


#: name -> predicate(out, state, seconds since launch): when to SIGKILL the run.
def _final_shards(out: Path) -> list[str]:
    return _listdir(out / "train" / "wds") + _listdir(out / "train" / "arrow")


KILL_POINTS = {
    "while starting up": lambda out, state, t: t >= 0.5,
    "0.3 s into the pipeline": lambda out, state, t: _pipeline_started(out, state, 0.3),
    # A temporary shard file exists (or, on a fast machine, the first one was already renamed).
    "shard file being written": lambda out, state, t: any("-train-" in name for name in _listdir(out / ".tmp"))
    or bool(_final_shards(out)),
    "first shard renamed into place": lambda out, state, t: bool(_final_shards(out)),
}


def _check_complete(path: Path) -> None:
    """Parse a final-named file to its end (a cut file raises)."""
    if path.suffix == ".arrow":
        _read_arrow(str(path))
    elif path.suffix == ".tar":
        with tarfile.open(path) as tar:
            for member in tar:
                assert tar.extractfile(member).read() is not None
    elif path.suffix in (".json", ".jsonl"):
        text = path.read_text(encoding="utf-8")
        json.loads(text) if path.suffix == ".json" else [json.loads(line) for line in text.splitlines()]


@pytest.mark.e2e
def test_killed_runs_leave_nothing_half_written_and_rerun_gives_the_same_bytes(tmp_path):
    corpus = _crash_corpus(tmp_path / "corpus")
    reference = tmp_path / "reference"
    reference_manifest = materialize(reference, *_crash_args(corpus, reference))
    reference_digests = file_digests(reference)
    killed_mid_run = {}
    for index, (point, should_kill) in enumerate(KILL_POINTS.items()):
        out = tmp_path / f"killed-{index}"
        proc = subprocess.Popen([sys.executable, "-m", "pipelines.materialize", *_crash_args(corpus, out)], cwd=ROOT,
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
        start, state = time.monotonic(), {}
        try:
            while proc.poll() is None and not should_kill(out, state, time.monotonic() - start):
                time.sleep(0.002)
            killed_mid_run[point] = proc.poll() is None
            if killed_mid_run[point]:
                os.killpg(proc.pid, signal.SIGKILL)
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        # Every file under a final name is complete: the bytes of the uninterrupted run. A manifest
        # exists only if the run got to its end before the kill (it is written last): then so does
        # every other file.
        # The lock of a killed run is debris by design (its process is gone: --overwrite removes it).
        digests = {rel: sha for rel, sha in file_digests(out).items()
                   if not rel.startswith(".tmp") and rel != ".lmshards.lock"} if out.exists() else {}
        if (out / "manifest.json").exists():
            assert digests == reference_digests, point
        for rel, sha in digests.items():
            assert reference_digests.get(rel) == sha, (point, rel)
            _check_complete(out / rel)
        if point == "first shard renamed into place":
            assert any(rel.startswith("train/") for rel in digests), digests
            rerun_dir = out
    assert all(killed_mid_run.values()), killed_mid_run
    # Re-running over the debris of a killed run with --overwrite gives the same bytes.
    proc = subprocess.run([sys.executable, "-m", "pipelines.materialize", *_crash_args(corpus, rerun_dir),
                           "--overwrite"], cwd=ROOT, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert file_digests(rerun_dir) == reference_digests
    rerun_manifest = Manifest.loads((rerun_dir / "manifest.json").read_text())
    assert rerun_manifest.deterministic_view() == reference_manifest.deterministic_view()
