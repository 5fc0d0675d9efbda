"""A new user's corpus mistakes, refused alike by ``materialize`` and ``train-tokenizer`` in one line
(exit 2) saying how to proceed: JSONL saved as ``.txt``, ``--text-field`` on text files,
``--text-mode paragraph`` on JSONL, a ``--text-field`` no record has; and train-tokenizer shows
its progress as materialize does.
"""

from __future__ import annotations

import json
import re

import pytest
from lmshards_testing import ROOT, TOKENIZER

from pipelines.materialize import main as materialize
from pipelines.train_tokenizer import main as train_tokenizer

FAQ = str(ROOT / "data" / "sample" / "faq.jsonl")


@pytest.fixture
def jsonl_as_txt(tmp_path):
    path = tmp_path / "corpus.txt"
    path.write_text((ROOT / "data" / "sample" / "faq.jsonl").read_text(encoding="utf-8"), encoding="utf-8")
    return str(path)


@pytest.fixture
def text_file(tmp_path):
    path = tmp_path / "plain.txt"
    lines = [json.loads(line)["text"] for line in (ROOT / "data" / "sample" / "faq.jsonl").open(encoding="utf-8")]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return str(path)


def _commands(tmp_path, inputs, *flags):
    yield "materialize", lambda: materialize(["--input", inputs, "--tokenizer", TOKENIZER, "--output",
                                              str(tmp_path / "out"), *flags])
    yield "train-tokenizer", lambda: train_tokenizer(["--input", inputs, "--output", str(tmp_path / "t.json"),
                                                      "--vocab-size", "600", *flags])


def _refused(tmp_path, capsys, inputs, flags, message):
    for name, command in _commands(tmp_path, inputs, *flags):
        assert command() == 2, name
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and err[0].startswith(f"lmshards {name}: error: ") and message in err[0], (name, err)
    assert not (tmp_path / "out").exists() and not (tmp_path / "t.json").exists()


def test_jsonl_saved_as_txt_is_refused_unless_text_mode_is_given(tmp_path, capsys, jsonl_as_txt):
    _refused(tmp_path, capsys, jsonl_as_txt, [],
             f"--input {jsonl_as_txt}: its first 8 lines are JSON objects: JSONL saved as text? Rename it .jsonl "
             "(its --text-field is then read), or pass --text-mode line to read each line as text")
    assert train_tokenizer(["--input", jsonl_as_txt, "--output", str(tmp_path / "t.json"), "--vocab-size", "600",
                            "--text-mode", "line"]) == 0  # read as text on purpose


def test_text_field_on_text_files_is_refused(tmp_path, capsys, text_file):
    _refused(tmp_path, capsys, text_file, ["--text-field", "body"],
             f"--text-field body: the inputs are text files ({text_file}), which have no fields; drop --text-field")


def test_text_mode_paragraph_on_jsonl_is_refused(tmp_path, capsys):
    _refused(tmp_path, capsys, FAQ, ["--text-mode", "paragraph"],
             f"--text-mode paragraph: cuts text files (.txt/.md/.rst) into documents, and the inputs are jsonl "
             f"({FAQ}), one document per record; drop --text-mode")


def test_a_text_field_no_record_has_is_refused(tmp_path, capsys):
    _refused(tmp_path, capsys, FAQ, ["--text-field", "txet"],
             f"--text-field txet: no record has the field 'txet' (the first 185 of {FAQ}); fields seen: ")


def test_plain_text_still_trains(tmp_path, capsys, text_file):
    assert train_tokenizer(["--input", text_file, "--output", str(tmp_path / "t.json"), "--vocab-size", "600"]) == 0
    assert re.search(r"trained on [0-9,]+ documents$", capsys.readouterr().out.strip())


def test_train_tokenizer_shows_its_progress(tmp_path, capsys):
    # (--progress-seconds 1e-9: a line at every document, whatever the machine's speed)
    assert train_tokenizer(["--input", FAQ, "--output", str(tmp_path / "t.json"), "--vocab-size", "600",
                            "--progress-seconds", "1e-9"]) == 0
    lines = [line for line in capsys.readouterr().err.splitlines() if line.startswith("lmshards train-tokenizer:")]
    assert lines and lines[-1].startswith("lmshards train-tokenizer: reading: 100% of 0.2 MB, 185 documents, ")
