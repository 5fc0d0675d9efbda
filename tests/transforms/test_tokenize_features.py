"""The Tokenize DoFn's per-token features, through both ways of mapping text to tokens."""

from __future__ import annotations

import os
import string
from pathlib import Path

import numpy as np
import pytest
from lmshards_testing import tokenized_documents
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

from transforms.tokenizing.text_rules import sentence_start_chars
from transforms.tokenizing.tokenize import _TokenizeBatch

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


def _documents(tokenizer_path: str, features=("word_starts", "sentence_starts"),
               texts=TEXTS, encoder="tokenizers") -> tuple[_TokenizeBatch, list]:
    fn = _TokenizeBatch(tokenizer_path, set(features), 0.0, 4, 2, 0, encoder=encoder)
    fn.setup()
    fn.start_bundle()
    out = [o for text in texts for o in fn.process(text)] + list(fn.finish_bundle())
    fn.teardown()
    return fn, tokenized_documents(out)


@pytest.mark.parametrize("kind", ["byte-level bpe", "unigram"])
def test_sentence_starts_flag_the_token_holding_each_start(kind, tmp_path):
    path = str(PROJECT_TOKENIZER) if kind == "byte-level bpe" else _unigram(tmp_path / "unigram.json")
    fn, documents = _documents(path)
    # Which mapping ran: byte spans and the text's word rules, or the encoder's offsets and word ids.
    made = fn._token_features
    assert made.ids_suffice == (made.byte_lengths is not None) == (made.words is not None) == (kind == "byte-level bpe")
    tokenizer = Tokenizer.from_file(path)
    tokenizer.encode_special_tokens = True
    by_text = {}
    for text in TEXTS:
        encoding = tokenizer.encode(text, add_special_tokens=False)
        by_text[tuple(encoding.ids)] = (text, encoding)
    assert len(documents) == len(TEXTS)
    for _, document in documents:
        features = document.features
        text, encoding = by_text[tuple(document.ids.tolist())]
        assert np.flatnonzero(features["sentence_starts"]).tolist() == _expected_sentence_flags(encoding, text)
        assert features["word_starts"].tolist() == _expected_word_flags(encoding)


def _expected_sentence_flags(encoding, text) -> list[int]:
    """For each sentence start, the first token whose character span ends after it."""
    return sorted({next(i for i, (_, end) in enumerate(encoding.offsets) if end > char)
                   for char in sentence_start_chars(text).tolist()})


def _expected_word_flags(encoding) -> list[bool]:
    words = np.array([np.nan if w is None else w for w in encoding.word_ids])
    return [True] + (words[1:] != words[:-1]).tolist()


@pytest.mark.parametrize("encoder", ["tokenizers", "fastokens"])
@pytest.mark.parametrize("features", [("sentence_starts",), ("word_starts",), ("word_starts", "sentence_starts")])
def test_a_byte_level_bpe_encodes_ids_only_and_falls_back_per_document(features, encoder, tmp_path):
    """A byte-level BPE encodes without offsets and word ids (with either backend), and a
    document whose tokens do not spell its bytes (here: a character the vocabulary lacks,
    encoded as <unk>) is encoded once more, by tokenizers, with them."""
    tokenizer = Tokenizer(models.BPE(unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    trainer = trainers.BpeTrainer(vocab_size=300, special_tokens=["<unk>", "</s>"], show_progress=False)
    ascii_only = [t.encode("ascii", "ignore").decode() for t in TEXTS] + [string.printable]
    tokenizer.train_from_iterator(ascii_only * 20, trainer=trainer)
    path = str(tmp_path / "ascii-bpe.json")
    tokenizer.save(path)
    texts = [*TEXTS, "Caf\u00e9 open. Closed now! Bye", "This is it. Done here."]
    fn, documents = _documents(path, features, texts, encoder)
    assert fn._encoder.name == encoder
    assert fn._token_features.ids_suffice and fn._token_features.byte_lengths is not None
    assert (fn._token_features.words is not None) == ("word_starts" in features)
    tokenizer.encode_special_tokens = True
    assert len(documents) == len(texts)
    unknown = tokenizer.token_to_id("<unk>")
    # fastokens refuses a byte the vocabulary lacks, where tokenizers gives <unk>: the batches
    # holding one are encoded by tokenizers, so the ids are the reference's either way.
    assert (fn.fallback_batches > 0) == (encoder == "fastokens")
    for (_, document), text in zip(documents, texts):
        made = document.features
        encoding = tokenizer.encode(text, add_special_tokens=False)
        assert document.ids.tolist() == encoding.ids
        assert (unknown in encoding.ids) == (not text.isascii())  # the fallback ran for those
        assert set(made) == set(features)
        if "sentence_starts" in features:
            assert np.flatnonzero(made["sentence_starts"]).tolist() == _expected_sentence_flags(encoding, text)
        if "word_starts" in features:
            assert made["word_starts"].tolist() == _expected_word_flags(encoding)
    # The project's tokenizer: fast too, and the same flags as the offsets and word ids give.
    fn, documents = _documents(str(PROJECT_TOKENIZER), features, encoder=encoder)
    assert fn._token_features.ids_suffice
    project = Tokenizer.from_file(str(PROJECT_TOKENIZER))
    project.encode_special_tokens = True
    for (_, document), text in zip(documents, TEXTS):
        made = document.features
        encoding = project.encode(text, add_special_tokens=False)
        if "sentence_starts" in features:
            assert np.flatnonzero(made["sentence_starts"]).tolist() == _expected_sentence_flags(encoding, text)
        if "word_starts" in features:
            assert made["word_starts"].tolist() == _expected_word_flags(encoding)
    # Word starts: fast for the GPT-2 regex byte-level pre-tokenizer only (see the next test).
    assert _documents(str(PROJECT_TOKENIZER), ("word_starts",))[0]._token_features.ids_suffice
    assert not _documents(_unigram(tmp_path / "unigram.json"), ("word_starts",))[0]._token_features.ids_suffice


def test_encoder_threads_are_set_for_the_worker_unless_the_user_set_them(monkeypatch):
    for name in ("RAYON_NUM_THREADS", "FASTOKENS_BPE_THREADS"):
        monkeypatch.delenv(name, raising=False)
    fn = _TokenizeBatch(str(PROJECT_TOKENIZER), frozenset(), 0.0, 4, 2, 0, encoder_threads=1)
    fn.setup()
    fn.teardown()
    assert os.environ["RAYON_NUM_THREADS"] == os.environ["FASTOKENS_BPE_THREADS"] == "1"
    monkeypatch.setenv("RAYON_NUM_THREADS", "7")
    monkeypatch.setenv("FASTOKENS_BPE_THREADS", "5")
    fn.setup()
    fn.teardown()
    assert (os.environ["RAYON_NUM_THREADS"], os.environ["FASTOKENS_BPE_THREADS"]) == ("7", "5")
    monkeypatch.delenv("RAYON_NUM_THREADS")
    monkeypatch.delenv("FASTOKENS_BPE_THREADS")
    default = _TokenizeBatch(str(PROJECT_TOKENIZER), frozenset(), 0.0, 4, 2, 0)
    default.setup()
    default.teardown()
    assert "RAYON_NUM_THREADS" not in os.environ and "FASTOKENS_BPE_THREADS" not in os.environ


def test_word_start_flags_with_and_without_tokens_outside_words():
    from transforms.tokenizing.tokenize import word_start_flags

    assert word_start_flags([0, 0, 1, 1, 1, 2]).tolist() == [True, False, True, False, False, True]
    # Tokens of no word (special tokens) each start their own.
    assert word_start_flags([None, 0, 0, None, None, 1]).tolist() == [True, True, False, True, True, True]
    assert word_start_flags([]).tolist() == []


@pytest.mark.parametrize("count, sizes", [
    (0, []), (1, [1]), (256, [256]), (257, [128, 129]), (713, [356, 178, 179]), (2048, [1024, 512, 256, 256]),
])
def test_a_bundle_ends_in_batches_that_halve(count, sizes):
    from transforms.tokenizing.tokenize import FIRST_BATCH, _tail_batches

    assert FIRST_BATCH == 128
    texts = [f"t{i}" for i in range(count)]
    batches = _tail_batches(texts)
    assert [len(batch) for batch in batches] == sizes
    assert [text for batch in batches for text in batch] == texts
