"""The encoder backend never changes a dataset: fastokens and tokenizers give the same bytes
for every objective, ``auto`` falls back where fastokens cannot be trusted, and a job runs
where fastokens cannot even be imported."""

from __future__ import annotations

import json

import pytest
from lmshards_testing import ROOT, SAMPLE_GLOB, TOKENIZER, file_digests, materialize, run_with_blocked_imports

from pipelines.materialize import main
from transforms.tokenizing.tokenize import _TokenizeBatch

OBJECTIVE_ARGS = {
    "clm": ["--seq-len", "256"],
    "prefix_lm": ["--seq-len", "256"],
    "mlm": ["--seq-len", "256", "--whole-word-mask", "--frame"],
    "span_corruption": ["--inputs-length", "256"],
    "bart": ["--seq-len", "256"],
    "ul2": ["--inputs-length", "256"],
}
#: bart needs word and sentence starts, the most the encoder path has to give: it runs in the
#: fast selection; the other objectives are end-to-end tests.
SAMPLE_OBJECTIVES = [pytest.param(o, marks=() if o == "bart" else pytest.mark.e2e) for o in OBJECTIVE_ARGS]


def _run(out, objective, inputs, *extra):
    return materialize(out, "--input", inputs, "--tokenizer", TOKENIZER, "--objective", objective,
                       *OBJECTIVE_ARGS[objective], "--formats", "arrow,webdataset", "--validation-fraction", "0.05",
                       "--num-buckets", "8", *extra)


def _assert_same_dataset(tmp_path, objective, inputs):
    fast = _run(tmp_path / "fastokens", objective, inputs, "--encoder", "fastokens")
    reference = _run(tmp_path / "tokenizers", objective, inputs, "--encoder", "tokenizers")
    assert fast.run["encoder"]["backend"] == "fastokens" and fast.run["encoder"]["probe"]["result"] == "passed"
    assert reference.run["encoder"]["backend"] == "tokenizers"
    assert fast.deterministic_view() == reference.deterministic_view()
    digests = file_digests(tmp_path / "fastokens")
    assert digests == file_digests(tmp_path / "tokenizers")
    assert sum(info["examples"] for info in fast.splits.values()) > 0
    assert any(p.endswith(".arrow") for p in digests) and any(p.endswith(".tar") for p in digests)


@pytest.mark.parametrize("objective", SAMPLE_OBJECTIVES)
def test_both_backends_write_the_same_bytes_on_the_sample(tmp_path, objective):
    _assert_same_dataset(tmp_path, objective, SAMPLE_GLOB)


@pytest.fixture(scope="module")
def real_corpus(tmp_path_factory) -> str:
    """About 20 MB of real English (the docstrings of the installed Python modules), as JSONL.gz."""
    from benchmarks.corpus import write_corpus

    out = tmp_path_factory.mktemp("docstrings")
    write_corpus(str(out), megabytes=20, files=4)
    return str(out / "*.jsonl.gz")


@pytest.mark.e2e
@pytest.mark.parametrize("objective", list(OBJECTIVE_ARGS))
def test_both_backends_write_the_same_bytes_on_20_mb_of_real_text(tmp_path, objective, real_corpus):
    _assert_same_dataset(tmp_path, objective, real_corpus)


def _tokenizer_fastokens_misreads(tmp_path) -> str:
    """A tokenizer.json fastokens loads but encodes differently: words split at ``\\s+`` first,
    and U+180E is whitespace to tokenizers' regex engine but not to fastokens' (see
    tests/transforms/test_encoder.py)."""
    config = json.loads((ROOT / "data" / "tokenizer.json").read_text(encoding="utf-8"))
    byte_level = {**config["pre_tokenizer"], "use_regex": False}
    config["pre_tokenizer"] = {"type": "Sequence", "pretokenizers": [
        {"type": "Split", "pattern": {"Regex": "\\s+"}, "behavior": "Removed", "invert": False}, byte_level]}
    path = tmp_path / "split-whitespace.json"
    path.write_text(json.dumps(config), encoding="utf-8")
    return str(path)


def test_auto_falls_back_with_a_warning_when_the_probe_fails(tmp_path, caplog):
    tokenizer = _tokenizer_fastokens_misreads(tmp_path)
    args = ["--input", SAMPLE_GLOB, "--tokenizer", tokenizer, "--seq-len", "256"]
    manifest = materialize(tmp_path / "auto", *args)
    encoder = manifest.run["encoder"]
    assert (encoder["requested"], encoder["backend"], encoder["probe"]["result"]) == ("auto", "tokenizers", "mismatch")
    warnings = [r.getMessage() for r in caplog.records if "encoding with tokenizers" in r.getMessage()]
    assert len(warnings) == 1 and "differently from tokenizers" in warnings[0] and "\\u180e" in warnings[0]
    reference = materialize(tmp_path / "tokenizers", *args, "--encoder", "tokenizers")
    assert file_digests(tmp_path / "auto") == file_digests(tmp_path / "tokenizers")
    assert manifest.deterministic_view() == reference.deterministic_view()


def test_encoder_fastokens_with_a_failed_probe_is_a_configuration_error(tmp_path, capsys):
    tokenizer = _tokenizer_fastokens_misreads(tmp_path)
    code = main(["--input", SAMPLE_GLOB, "--tokenizer", tokenizer, "--output", str(tmp_path / "out"),
                 "--encoder", "fastokens"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1
    assert err[0].startswith("lmshards materialize: error: --encoder fastokens: fastokens encodes the probe text ")
    assert not (tmp_path / "out").exists()


def test_a_wordpiece_tokenizer_falls_back_and_says_why(tmp_path, capsys):
    from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, trainers

    tokenizer = Tokenizer(models.WordPiece(unk_token="[UNK]"))
    tokenizer.normalizer = normalizers.BertNormalizer()
    tokenizer.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    trainer = trainers.WordPieceTrainer(vocab_size=600, special_tokens=["[UNK]", "[PAD]", "[CLS]", "[SEP]", "[MASK]"],
                                        show_progress=False)
    texts = [json.loads(line)["text"] for line in (ROOT / "data" / "sample" / "faq.jsonl").open(encoding="utf-8")]
    tokenizer.train_from_iterator(texts, trainer=trainer)
    path = tmp_path / "wordpiece.json"
    tokenizer.save(str(path))
    code = main(["--input", SAMPLE_GLOB, "--tokenizer", str(path), "--output", str(tmp_path / "out"),
                 "--objective", "mlm", "--seq-len", "128", "--whole-word-mask"])
    out = capsys.readouterr().out
    assert code == 0
    assert "encoder: tokenizers " in out and "(this tokenizer's word or sentence starts need" in out
    manifest = json.loads((tmp_path / "out" / "manifest.json").read_text())
    assert manifest["run"]["encoder"]["backend"] == "tokenizers"
    # Without word starts, the job needs only ids: fastokens still cannot load a WordPiece.
    code = main(["--input", SAMPLE_GLOB, "--tokenizer", str(path), "--output", str(tmp_path / "clm"),
                 "--seq-len", "128"])
    assert code == 0 and "(fastokens cannot load this tokenizer (" in capsys.readouterr().out


def test_a_worker_that_cannot_load_the_planned_backend_fails_loudly(tmp_path):
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    tokenizer = Tokenizer(models.WordPiece(unk_token="[UNK]"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer.train_from_iterator(["some words here"] * 5, trainer=trainers.WordPieceTrainer(
        vocab_size=60, special_tokens=["[UNK]"], show_progress=False))
    path = tmp_path / "wordpiece.json"
    tokenizer.save(str(path))
    fn = _TokenizeBatch(str(path), frozenset(), 0.0, 4, 2, 0, encoder="fastokens")
    with pytest.raises(RuntimeError, match=r"planned to encode with fastokens, which cannot be used in this worker "
                                           r".*fastokens cannot load this tokenizer.*--encoder tokenizers"):
        fn.setup()


_RUN_MAIN = """
from pipelines.materialize import main
sys.exit(main(sys.argv[2:]))
"""


@pytest.mark.e2e
def test_a_job_runs_where_fastokens_cannot_be_imported(tmp_path):
    args = ["--input", SAMPLE_GLOB, "--tokenizer", TOKENIZER, "--seq-len", "256"]
    done = run_with_blocked_imports(_RUN_MAIN, "fastokens", *args, "--output", str(tmp_path / "auto"))
    assert done.returncode == 0, done.stderr
    assert "encoding with tokenizers: fastokens is not importable" in done.stderr
    assert "encoder: tokenizers " in done.stdout
    manifest = json.loads((tmp_path / "auto" / "manifest.json").read_text())
    assert manifest["run"]["encoder"]["backend"] == "tokenizers"
    refused = run_with_blocked_imports(_RUN_MAIN, "fastokens", *args, "--output", str(tmp_path / "fast"),
                                       "--encoder", "fastokens")
    assert refused.returncode == 2
    assert refused.stderr.strip().splitlines()[-1].startswith(
        "lmshards materialize: error: --encoder fastokens: fastokens is not importable")
    reference = materialize(tmp_path / "reference", *args)  # fastokens importable here
    assert reference.run["encoder"]["backend"] == "fastokens"
    assert file_digests(tmp_path / "auto") == file_digests(tmp_path / "reference")


def test_a_tokenizer_with_bpe_dropout_is_refused_since_its_encodings_are_random(tmp_path, capsys):
    config = json.loads((ROOT / "data" / "tokenizer.json").read_text(encoding="utf-8"))
    config["model"]["dropout"] = 0.1
    path = tmp_path / "dropout.json"
    path.write_text(json.dumps(config), encoding="utf-8")
    code = main(["--input", SAMPLE_GLOB, "--tokenizer", str(path), "--output", str(tmp_path / "out")])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and err == [f"lmshards materialize: error: --tokenizer {path}: BPE dropout (model.dropout 0.1) "
                                 "makes every encoding random, so the dataset could not be reproduced; remove it "
                                 "from the tokenizer.json"]


def test_the_probe_sample_stays_small_whatever_the_records(tmp_path):
    """The first record of the first file can be a 64 MiB piece of one long line: the corpus
    sample the probe encodes (whole, with both encoders) is cut to SAMPLE_CHARS characters."""
    from pipelines.options import parse_args
    from pipelines.plan import SAMPLE_CHARS, sample_records

    line = tmp_path / "line.txt"
    line.write_text("word " * (SAMPLE_CHARS // 2) + "\n" + "a second document\n", encoding="utf-8")
    options = parse_args(["--input", str(line), "--tokenizer", TOKENIZER, "--output", str(tmp_path / "o")])
    texts, rejected = sample_records(options, [(str(line), line.stat().st_size)])
    assert rejected == [] and len(texts) == 1 and texts[0].startswith("word word")
    assert SAMPLE_CHARS - 5 <= len(texts[0]) <= SAMPLE_CHARS and texts[0].endswith("word")
