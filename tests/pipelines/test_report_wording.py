"""What the summary, the report and the table say is what the dataset and its tokenizer hold, in
the manifest's spelling: the tokenizer's own sentinels and objective tokens beside those the objective
uses, no "0:" for no added tokens, lengths as numbers, no Python ``None``/``True``; a run that
drops a large share of its tokens says so; a hub name for ``--tokenizer`` says how to get a file.
"""

from __future__ import annotations

import re

import pytest
from lmshards_testing import ROOT, TOKENIZER, materialize

from loaders.inspection.report_sections import _num
from pipelines.cli import main as cli
from pipelines.materialize import main as materialize_main

FAQ = str(ROOT / "data" / "sample" / "faq.jsonl")


@pytest.fixture(scope="module")
def mlm(tmp_path_factory):
    out = tmp_path_factory.mktemp("wording") / "mlm"
    materialize(out, "--input", FAQ, "--tokenizer", TOKENIZER, "--objective", "mlm", "--seq-len", "64")
    return out


def test_the_report_gives_the_tokenizers_sentinels_and_mode_tokens(mlm, tmp_path, capsys):
    page = tmp_path / "r.html"
    assert cli(["report", str(mlm), "-o", str(page), "--limit", "50", "--examples", "1"]) == 0
    text = page.read_text(encoding="utf-8")
    assert "128 in the tokenizer, 0 used by the objective" in text
    assert "[R] [S] [X] [NLU] [S2S] [NLG] in the tokenizer; used by the objective: none" in text
    assert "none (the tokenizer had every token the objective needs)" in text and ">0: <" not in text


def test_diff_gives_the_tokenizers_sentinels_and_mode_tokens_as_the_report_does(mlm, capsys):
    assert cli(["diff", str(mlm), str(mlm)]) == 0
    lines = capsys.readouterr().out.splitlines()
    tokenizer = lines[lines.index("tokenizer") + 1:lines.index("counts")]
    rows = {re.split(r"\s{2,}", line.strip())[0]: re.split(r"\s{2,}", line.strip())[1:] for line in tokenizer}
    assert rows["sentinels in the tokenizer"] == ["128", "128"]
    assert rows["sentinels used by the objective"] == ["0", "0"]
    assert rows["objective tokens in the tokenizer"] == ["[R] [S] [X] [NLU] [S2S] [NLG]"] * 2
    assert rows["objective tokens used by the objective"] == ["none", "none"]
    assert not any("num_sentinels" in line or "{}" in line for line in tokenizer), tokenizer


def test_the_summary_spells_parameters_as_the_manifest_does(mlm, capsys):
    assert cli(["inspect", str(mlm), "--limit", "50"]) == 0
    header = [line for line in capsys.readouterr().out.splitlines() if line.startswith("objective")][0]
    assert "whole_word_mask=false" in header and "max_predictions=null" in header, header
    assert not re.search(r"=(True|False|None)\b", header), header


def test_large_lengths_are_numbers_not_exponents():
    assert _num(48780.5) == "48,780.5" and _num(3.14159) == "3.142" and _num(12) == "12"


def test_a_run_that_drops_many_tokens_warns(tmp_path, capsys):
    assert materialize_main(["--input", FAQ, "--tokenizer", TOKENIZER, "--output", str(tmp_path / "o"),
                             "--seq-len", "4096"]) == 0
    warning = [line for line in capsys.readouterr().out.splitlines() if line.startswith("warning:")]
    assert len(warning) == 1 and re.fullmatch(
        r"warning: train dropped \d+% of its document tokens \([\d,]+ of [\d,]+: the last partial chunk of its "
        r"examples' length\); lower the example length, or --last-chunk pad keeps it as padding", warning[0])


def test_a_hub_name_for_tokenizer_says_how_to_get_a_file(tmp_path, capsys):
    assert materialize_main(["--input", FAQ, "--tokenizer", "gpt2", "--output", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and err.startswith("lmshards materialize: error: --tokenizer gpt2: cannot read")
    assert "names on the Hugging Face hub (gpt2, t5-base) are not fetched" in err
    assert "python -m pipelines.train_tokenizer" in err and "DIR/tokenizer.json" in err


def test_rejected_excerpts_show_invalid_bytes_and_nuls_escaped(tmp_path, capsys):
    """What the report shows of a rejected record says which bytes were wrong: an invalid byte
    is ``\\xff`` (not U+FFFD), a NUL is ``\\x00`` (not a character the browser hides)."""
    bad = tmp_path / "bad.txt"
    bad.write_bytes(b"".join(b"a good line of plain text number %d\n" % i for i in range(40))
                    + b"bad \xff\xfe byte\nnul \x00 here\n")
    out = tmp_path / "o"
    assert materialize_main(["--input", str(bad), "--tokenizer", TOKENIZER, "--output", str(out),
                             "--seq-len", "16"]) == 0
    page = tmp_path / "r.html"
    assert cli(["report", str(out), "-o", str(page), "--limit", "0"]) == 0
    text = page.read_text(encoding="utf-8")
    assert "bad \\xff\\xfe byte" in text and "nul \\x00 here" in text
    assert "\ufffd" not in text and "\x00" not in text
