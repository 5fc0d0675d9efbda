"""Tests of pipelines/train_tokenizer.py on the bundled sample corpus (kept small with --max-documents)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from tokenizers import Tokenizer

from pipelines.train_tokenizer import SPECIAL_TOKENS, _texts, main, train_tokenizer
from transforms.tokenizing.tokenizer_utils import ROLE_CANDIDATES, resolve_special_tokens

ROOT = Path(__file__).resolve().parents[2]
SAMPLE = str(ROOT / "data" / "sample" / "*.jsonl")
MODELS = ("bpe", "unigram", "wordpiece")
SENTENCE = "The quick brown fox jumps over the lazy dog."


@pytest.fixture(scope="module")
def trained(tmp_path_factory) -> dict[str, Path]:
    out = tmp_path_factory.mktemp("tokenizers")
    paths = {}
    for model in MODELS:
        path = out / f"{model}.json"
        argv = [
            "--input",
            SAMPLE,
            "--output",
            str(path),
            "--model",
            model,
            "--vocab-size",
            "600",
            "--num-sentinels",
            "3",
            "--extra-token",
            "[R]",
            "--extra-token",
            "[S]",
            "--no-objective-tokens",
            "--max-documents",
            "60",
        ]
        assert main(argv) == 0
        paths[model] = path
    return paths


def test_special_tokens_order():
    assert SPECIAL_TOKENS == ["<pad>", "</s>", "<s>", "<unk>", "<mask>"]


@pytest.mark.parametrize("model", MODELS)
def test_special_token_ids(trained, model):
    tokenizer = Tokenizer.from_file(str(trained[model]))
    expected = ["<pad>", "</s>", "<s>", "<unk>", "<mask>", "<extra_id_0>", "<extra_id_1>", "<extra_id_2>", "[R]", "[S]"]
    assert [tokenizer.id_to_token(i) for i in range(10)] == expected
    added = json.loads(trained[model].read_text())["added_tokens"]
    assert [(t["id"], t["content"], t["special"]) for t in added] == [(i, t, True) for i, t in enumerate(expected)]
    assert tokenizer.id_to_token(10) not in expected
    resolved = resolve_special_tokens(
        tokenizer, required=frozenset(ROLE_CANDIDATES), num_sentinels=3, mode_tokens=("[R]", "[S]")
    )
    special = resolved.special
    assert (special.pad, special.eos, special.bos, special.unk, special.mask) == (0, 1, 2, 3, 4)
    assert special.sentinels == (5, 6, 7)
    assert special.mode_tokens == {"[R]": 8, "[S]": 9}
    assert special.all_special == frozenset(range(10))
    assert resolved.added == []


@pytest.mark.parametrize(
    "model, model_type, pre_tokenizer",
    [("bpe", "BPE", "ByteLevel"), ("unigram", "Unigram", "Metaspace"), ("wordpiece", "WordPiece", "BertPreTokenizer")],
)
def test_model_layout(trained, model, model_type, pre_tokenizer):
    data = json.loads(trained[model].read_text())
    assert data["model"]["type"] == model_type
    assert data["pre_tokenizer"]["type"] == pre_tokenizer
    vocab_size = Tokenizer.from_file(str(trained[model])).get_vocab_size()
    assert 300 < vocab_size <= 600
    if model == "bpe":
        assert vocab_size == 600


@pytest.mark.parametrize("model", MODELS)
def test_encode_decode_round_trip(trained, model):
    tokenizer = Tokenizer.from_file(str(trained[model]))
    encoding = tokenizer.encode(SENTENCE, add_special_tokens=False)
    assert 3 < len(encoding.ids) < len(SENTENCE)
    assert tokenizer.decode(encoding.ids) == SENTENCE
    # Special tokens are single ids inside text and are skipped when decoding.
    ids = tokenizer.encode("fox <mask> dog", add_special_tokens=False).ids
    assert 4 in ids
    assert tokenizer.decode(ids, skip_special_tokens=True).split() == ["fox", "dog"]


def test_bpe_round_trips_any_bytes(trained):
    tokenizer = Tokenizer.from_file(str(trained["bpe"]))
    text = "  Ünïcödé, 中文 and emoji \U0001f600\ttabs\nnewlines  "
    ids = tokenizer.encode(text, add_special_tokens=False).ids
    assert tokenizer.token_to_id("<unk>") not in ids
    assert tokenizer.decode(ids) == text


def test_bpe_training_is_reproducible(tmp_path):
    texts = list(_texts([str(ROOT / "data" / "sample" / "faq.jsonl")], "line", "text", 40, 10**9))
    first = train_tokenizer(texts, vocab_size=500, num_sentinels=2).to_str()
    second = train_tokenizer(texts, vocab_size=500, num_sentinels=2).to_str()
    assert first == second


def test_texts_respects_limits(tmp_path):
    path = tmp_path / "a.txt"
    path.write_text("one\ntwo\n\nthree\nfour\n")
    jsonl = tmp_path / "b.jsonl"
    jsonl.write_text('{"t": "five"}\n{"x": 1}\n{"t": "six"}\n')
    files = [str(path), str(jsonl)]
    assert list(_texts(files, "line", "t", 100, 10**9)) == ["one", "two", "three", "four", "five", "six"]
    assert list(_texts([str(jsonl)], "line", "t", 100, 10**9)) == ["five", "six"]  # bad record skipped
    assert list(_texts(files, "line", "t", 3, 10**9)) == ["one", "two", "three"]
    assert list(_texts(files, "paragraph", "t", 100, 10**9)) == ["one\ntwo", "three\nfour", "five", "six"]
    # The text that reaches max_chars is the last one.
    assert list(_texts(files, "line", "t", 100, 6)) == ["one", "two"]


def test_vocab_too_small_for_bpe(tmp_path, capsys):
    out = tmp_path / "tok.json"
    argv = [
        "--input",
        SAMPLE,
        "--output",
        str(out),
        "--vocab-size",
        "200",
        "--num-sentinels",
        "3",
        "--max-documents",
        "5",
    ]
    assert main(argv) == 2
    assert capsys.readouterr().err.strip() == (
        "lmshards train-tokenizer: error: --vocab-size 200: must exceed 270 (special tokens + 256 bytes)"
    )
    assert not out.exists()


def test_input_matching_nothing(tmp_path, capsys):
    out = tmp_path / "tok.json"
    assert main(["--input", str(tmp_path / "*.jsonl"), "--output", str(out)]) == 2
    assert "matches no file" in capsys.readouterr().err
    assert not out.exists()


def test_unknown_model():
    with pytest.raises(ValueError, match="--model sentencepiece: choose one of bpe, unigram, wordpiece"):
        train_tokenizer(["x"], model="sentencepiece")


def test_main_reports_what_it_wrote(tmp_path, capsys):
    out = tmp_path / "tok.json"
    argv = [
        "--input",
        SAMPLE,
        "--output",
        str(out),
        "--vocab-size",
        "400",
        "--num-sentinels",
        "1",
        "--max-documents",
        "5",
    ]
    assert main(argv) == 0
    assert capsys.readouterr().out.strip() == (f"wrote {out}: bpe, vocab 400, 12 special tokens (1 sentinel, "
                                               "the objectives' own tokens [R] [S] [X] [NLU] [S2S] [NLG]), trained "
                                               "on 5 documents")
    assert Tokenizer.from_file(str(out)).token_to_id("<extra_id_0>") == 5
    assert Tokenizer.from_file(str(out)).token_to_id("[NLG]") == 11


def test_an_existing_output_is_kept_unless_overwrite(tmp_path, capsys):
    out = tmp_path / "tok.json"
    out.write_text("mine", encoding="utf-8")
    argv = ["--input", SAMPLE, "--output", str(out), "--vocab-size", "400", "--max-documents", "5"]
    assert main(argv) == 2
    assert capsys.readouterr().err.strip() == (f"lmshards train-tokenizer: error: --output {out}: the file exists "
                                               "(pass --overwrite to replace it)")
    assert out.read_text(encoding="utf-8") == "mine"
    assert main([*argv, "--overwrite"]) == 0
    assert Tokenizer.from_file(str(out)).get_vocab_size() == 400


def test_the_defaults_serve_every_built_in_objective_without_adding_tokens(tmp_path):
    """train-tokenizer's defaults, then materialize's plan for each objective and UL2 preset at
    their default lengths: nothing is missing, so no --add-special-tokens is needed."""
    from pipelines.options import parse_args
    from pipelines.plan import plan_run
    from transforms.objectives.registry import OBJECTIVES

    out = tmp_path / "tok.json"
    assert main(["--input", SAMPLE, "--output", str(out), "--vocab-size", "1000", "--max-documents", "50"]) == 0
    # The ids every trained tokenizer has had: the objectives' tokens come from the registry now.
    added = [(t["id"], t["content"]) for t in json.loads(out.read_text())["added_tokens"]]
    assert added == list(enumerate([*SPECIAL_TOKENS, *(f"<extra_id_{k}>" for k in range(128)),
                                    "[R]", "[S]", "[X]", "[NLU]", "[S2S]", "[NLG]"]))
    runs = [[name] for name in OBJECTIVES] + [["ul2", "--ul2-preset", "paper"], ["ul2", "--layout", "decoder"]]
    for objective, *extra in runs:
        plan = plan_run(parse_args(["--input", SAMPLE, "--tokenizer", str(out), "--output", str(tmp_path / "o"),
                                    "--objective", objective, *extra, "--encoder", "tokenizers"]))
        assert plan.resolved.added == [], (objective, extra)
        assert len(plan.resolved.special.sentinels) == plan.objective.max_sentinels() <= 128


def test_the_objectives_own_tokens_come_from_the_registry_and_the_old_flag_still_leaves_them_out(tmp_path, capsys):
    from pipelines.train_tokenizer import build_parser
    from transforms.objectives.registry import tokens_needed

    assert tokens_needed().tokens[:6] == ("[R]", "[S]", "[X]", "[NLU]", "[S2S]", "[NLG]")
    text = " ".join(build_parser().format_help().split())
    assert ("--no-objective-tokens, --no-mode-tokens leave out the registered objectives' own tokens ([R] [S] [X] "
            "[NLU] [S2S] [NLG]") in text
    assert "UL2" not in text
    outputs = {}
    for flag in ("--no-objective-tokens", "--no-mode-tokens"):
        out = tmp_path / f"{flag}.json"
        argv = ["--input", SAMPLE, "--output", str(out), "--vocab-size", "400", "--num-sentinels", "2",
                "--max-documents", "5", flag]
        assert main(argv) == 0
        assert capsys.readouterr().out.strip() == (f"wrote {out}: bpe, vocab 400, 7 special tokens (2 sentinels), "
                                                   "trained on 5 documents")
        outputs[flag] = out.read_text(encoding="utf-8")
        assert Tokenizer.from_file(str(out)).token_to_id("[R]") is None
    assert outputs["--no-objective-tokens"] == outputs["--no-mode-tokens"]
