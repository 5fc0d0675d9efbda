"""The Tokenize DoFn's per-token features, through both ways of mapping text to tokens."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

from transforms.text_rules import sentence_start_chars
from transforms.tokenize import _TokenizeBatch

PROJECT_TOKENIZER = Path(__file__).resolve().parents[2] / "data" / "tokenizer.json"
TEXTS = [
    "Hello world. This is it. \u00c9lan vital!\n\nnew para here. Done.",
    "  Leading space. \u250c\u2500 box. \u4f60\u597d. Next one? Yes",
    "one sentence only",
]


def _unigram(path: Path) -> str:
    tokenizer = Tokenizer(models.Unigram())
    tokenizer.pre_tokenizer = pre_tokenizers.Metaspace()
    tokenizer.decoder = decoders.Metaspace()
    trainer = trainers.UnigramTrainer(vocab_size=120, special_tokens=["<pad>", "</s>", "<unk>"], unk_token="<unk>",
                                      show_progress=False)
    tokenizer.train_from_iterator(TEXTS * 20, trainer=trainer)
    tokenizer.save(str(path))
    return str(path)


def _documents(tokenizer_path: str) -> tuple[_TokenizeBatch, list]:
    fn = _TokenizeBatch(tokenizer_path, {"word_starts", "sentence_starts"}, 0.0, 4, 2, 0)
    fn.setup()
    fn.start_bundle()
    out = [o for text in TEXTS for o in fn.process(text)] + list(fn.finish_bundle())
    fn.teardown()
    return fn, [getattr(o, "value", o) for o in out]


@pytest.mark.parametrize("kind", ["byte-level bpe", "unigram"])
def test_sentence_starts_flag_the_token_holding_each_start(kind, tmp_path):
    path = str(PROJECT_TOKENIZER) if kind == "byte-level bpe" else _unigram(tmp_path / "unigram.json")
    fn, documents = _documents(path)
    assert (fn._byte_lengths is not None) == (kind == "byte-level bpe")  # which mapping ran
    tokenizer = Tokenizer.from_file(path)
    tokenizer.encode_special_tokens = True
    by_text = {}
    for text in TEXTS:
        encoding = tokenizer.encode(text, add_special_tokens=False)
        by_text[tuple(encoding.ids)] = (text, encoding)
    assert len(documents) == len(TEXTS)
    for _, (_, ids, features) in documents:
        text, encoding = by_text[tuple(np.frombuffer(ids, np.int32).tolist())]
        flagged = np.flatnonzero(features["sentence_starts"]).tolist()
        # Expected: for each sentence start, the first token whose character span ends after it.
        expected = sorted({next(i for i, (_, end) in enumerate(encoding.offsets) if end > char)
                           for char in sentence_start_chars(text).tolist()})
        assert flagged == expected
        words = np.array([np.nan if w is None else w for w in encoding.word_ids])
        assert features["word_starts"].tolist() == [True] + (words[1:] != words[:-1]).tolist()


def test_encoder_threads_are_set_for_the_worker_unless_the_user_set_them(monkeypatch):
    monkeypatch.delenv("RAYON_NUM_THREADS", raising=False)
    fn = _TokenizeBatch(str(PROJECT_TOKENIZER), frozenset(), 0.0, 4, 2, 0, encoder_threads=1)
    fn.setup()
    fn.teardown()
    assert os.environ["RAYON_NUM_THREADS"] == "1"
    monkeypatch.setenv("RAYON_NUM_THREADS", "7")
    fn.setup()
    fn.teardown()
    assert os.environ["RAYON_NUM_THREADS"] == "7"
    monkeypatch.delenv("RAYON_NUM_THREADS")
    default = _TokenizeBatch(str(PROJECT_TOKENIZER), frozenset(), 0.0, 4, 2, 0)
    default.setup()
    default.teardown()
    assert "RAYON_NUM_THREADS" not in os.environ


def test_word_start_flags_with_and_without_tokens_outside_words():
    from transforms.tokenize import word_start_flags

    assert word_start_flags([0, 0, 1, 1, 1, 2]).tolist() == [True, False, True, False, False, True]
    # Tokens of no word (special tokens) each start their own.
    assert word_start_flags([None, 0, 0, None, None, 1]).tolist() == [True, True, False, True, True, True]
    assert word_start_flags([]).tolist() == []
