"""A text the encoder cannot encode is a rejected record, not the end of the run, under both
backends: a Split pre-tokenizer regex that backtracks past its engine's limit on one text
(``(a+)+$`` on thirty ``a`` and a ``!``: a Rust panic in tokenizers' Oniguruma, a ValueError in
fastokens' PCRE2). The tokenizer is the bundled one with that Split put before its ByteLevel
pre-tokenizer."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from lmshards_testing import ROOT, SAMPLE_GLOB, TOKENIZER, file_digests, tokenized_documents

from transforms.tokenizing.tokenize import _TokenizeBatch

PATHOLOGICAL = "a" * 30 + "!"


@pytest.fixture(scope="module")
def backtracking_tokenizer(tmp_path_factory) -> str:
    data = json.loads(open(TOKENIZER, encoding="utf-8").read())
    split = {"type": "Split", "pattern": {"Regex": "(a+)+$"}, "behavior": "Isolated", "invert": False}
    data["pre_tokenizer"] = {"type": "Sequence", "pretokenizers": [split, data["pre_tokenizer"]]}
    path = tmp_path_factory.mktemp("tokenizer") / "tokenizer.json"
    path.write_text(json.dumps(data), encoding="utf-8")
    return str(path)


def _texts() -> list[str]:
    from pathlib import Path

    lines = Path(SAMPLE_GLOB).with_name("howto.jsonl").read_text(encoding="utf-8").splitlines()[:40]
    texts = [json.loads(line)["text"] for line in lines]
    return texts[:20] + [PATHOLOGICAL] + texts[20:]


def _tokenized(tokenizer: str, encoder: str) -> tuple[list, list]:
    fn = _TokenizeBatch(tokenizer, set(), 0.0, 4, 8, 0, encoder=encoder)
    fn.setup()
    fn.start_bundle()
    out = [o for text in _texts() for o in fn.process(text)] + list(fn.finish_bundle())
    fn.teardown()
    items = []
    for o in out:  # a TaggedOutput, a WindowedValue (finish_bundle) or a value, as Beam gets them
        value = getattr(o, "value", o)
        items.append((getattr(o, "tag", None), getattr(value, "value", value) if hasattr(value, "windows") else value))
    documents = sorted((document.key, document.ids.tobytes()) for _, document in tokenized_documents(out))
    rejected = [value for tag, value in items if tag == "rejected"]
    return documents, rejected


def test_the_document_is_rejected_with_the_same_reason_under_both_encoders(backtracking_tokenizer):
    """The DoFn forced onto each backend (a run's parity probe refuses fastokens for this
    tokenizer, whose Split it does not match on other texts: the run test below compares bytes)."""
    by_backend = {backend: _tokenized(backtracking_tokenizer, backend) for backend in ("fastokens", "tokenizers")}
    assert by_backend["fastokens"][1] == by_backend["tokenizers"][1]
    assert {key for key, _ in by_backend["fastokens"][0]} == {key for key, _ in by_backend["tokenizers"][0]}
    documents, rejected = by_backend["tokenizers"]
    assert len(documents) == len(_texts()) - 1
    assert rejected == [{"source": "<tokenizer>", "position": 0, "reason": "encoder_error", "excerpt": PATHOLOGICAL,
                         "detail": "Onig: Regex search error: retry-limit-in-match over"}]


@pytest.mark.e2e
def test_the_run_goes_on_and_reports_the_rejection_in_one_place(backtracking_tokenizer, tmp_path):
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text("".join(json.dumps({"text": t}) + "\n" for t in _texts()), encoding="utf-8")
    digests = {}
    for encoder in ("auto", "tokenizers"):
        out = tmp_path / encoder
        done = subprocess.run([sys.executable, "-m", "pipelines.materialize", "--input", str(corpus), "--output",
                               str(out), "--tokenizer", backtracking_tokenizer, "--seq-len", "64", "--encoder",
                               encoder, "--runner=FnApiRunner"], capture_output=True, text=True, cwd=ROOT)
        assert done.returncode == 0, done.stderr
        assert "panicked" not in done.stderr and "Traceback" not in done.stderr, done.stderr
        manifest = json.loads((out / "manifest.json").read_text())
        assert manifest["counts"]["rejected_by_reason"] == {"encoder_error": 1} and manifest["counts"]["reconciled"]
        rejected = [json.loads(line) for line in (out / "rejected" / "rejected.jsonl").read_text().splitlines()]
        assert [(r["reason"], r["excerpt"]) for r in rejected] == [("encoder_error", PATHOLOGICAL)]
        digests[encoder] = file_digests(out)
    assert digests["auto"] == digests["tokenizers"]
