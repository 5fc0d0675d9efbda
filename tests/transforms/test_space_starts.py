"""BART's words are fairseq's: a token whose text begins with a space (or a special token).

fairseq decides per dictionary id with GPT-2's ``is_beginning_of_word``:
``decode(token).startswith(" ")``. The oracle here does exactly that through the tokenizer's
own decoder, id by id, and the Tokenize features must agree with it on real text.
"""

from __future__ import annotations

import glob
import json

import numpy as np
from lmshards_testing import ROOT, SAMPLE_GLOB, tokenized_documents
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

from transforms.tokenizing.tokenize import TokenFeatures, _TokenizeBatch
from transforms.tokenizing.word_starts import space_start_flags

PROJECT_TOKENIZER = str(ROOT / "data" / "tokenizer.json")
REPRO = "The cat sat.\nIt was (very) happy, wasn't it?"


def _tokenizer(path: str = PROJECT_TOKENIZER) -> Tokenizer:
    tokenizer = Tokenizer.from_file(path)
    tokenizer.encode_special_tokens = True  # as the pipeline encodes
    return tokenizer


def _fairseq_word_starts(tokenizer: Tokenizer, ids: np.ndarray) -> np.ndarray:
    """fairseq's ``get_whole_word_mask`` for GPT-2: special ids start words, others when their
    decoded text starts with a space."""
    special = {index for index, added in tokenizer.get_added_tokens_decoder().items() if added.special}
    table = {}
    for index in set(ids.tolist()):
        table[index] = index in special or tokenizer.decode([index], skip_special_tokens=False).startswith(" ")
    return np.array([table[index] for index in ids.tolist()], dtype=bool)


def test_the_repro_has_seven_word_starts_as_fairseq_gives():
    tokenizer = _tokenizer()
    features = TokenFeatures(tokenizer, {"space_starts", "word_starts"})
    assert features.ids_suffice  # a byte-level BPE: a table per id, no offsets needed
    ids = np.asarray(tokenizer.encode(REPRO, add_special_tokens=False).ids)
    made = features.of(REPRO, ids)
    pieces = [tokenizer.id_to_token(i) for i in ids]
    starts = [piece for piece, flag in zip(pieces, made["space_starts"]) if flag]
    assert starts == ["\u0120cat", "\u0120s", "\u0120was", "\u0120(", "\u0120happ", "\u0120was", "\u0120it"]
    assert made["space_starts"].tolist() == _fairseq_word_starts(tokenizer, ids).tolist()
    # The pre-tokenizer (whole-word MLM) splits off ".", "\n", "It", ")", ",", "'t" and "?" too.
    assert int(made["word_starts"].sum()) == 16 and len(ids) == 19


def test_every_id_of_the_project_vocabulary_follows_the_decoded_text():
    tokenizer = _tokenizer()
    features = TokenFeatures(tokenizer, {"space_starts"})
    ids = np.arange(tokenizer.get_vocab_size(with_added_tokens=True))
    assert features.spaces.tolist() == _fairseq_word_starts(tokenizer, ids).tolist()
    assert 0.2 < features.spaces.mean() < 0.8  # both kinds of pieces are common in a BPE vocabulary


def test_words_per_token_on_real_text_are_fairseqs_not_the_pre_tokenizers():
    tokenizer = _tokenizer()
    features = TokenFeatures(tokenizer, {"space_starts", "word_starts"})
    texts = [json.loads(line)["text"] for path in sorted(glob.glob(SAMPLE_GLOB)) for line in open(path)]
    tokens = spaces = words = 0
    for text, encoding in zip(texts, tokenizer.encode_batch(texts, add_special_tokens=False)):
        ids = np.asarray(encoding.ids)
        if not ids.size:
            continue
        made = features.of(text, ids)
        assert made["space_starts"].tolist() == _fairseq_word_starts(tokenizer, ids).tolist()
        tokens += ids.size
        spaces += int(made["space_starts"].sum())
        words += int(made["word_starts"].sum())
    assert tokens > 250_000
    # The sample (technical documentation) has 0.51 fairseq words per token and 0.92
    # pre-tokenizer words: BART's Poisson(3.5) spans in words are 1.8 times as long in tokens.
    assert 0.48 < spaces / tokens < 0.55 and 0.88 < words / tokens < 0.96, (spaces / tokens, words / tokens)


def _unigram(path) -> str:
    tokenizer = Tokenizer(models.Unigram())
    tokenizer.pre_tokenizer = pre_tokenizers.Metaspace()
    tokenizer.decoder = decoders.Metaspace()
    texts = ["The cat sat. It was very happy, was it not? Yes it was."] * 50
    trainer = trainers.UnigramTrainer(vocab_size=60, special_tokens=["<pad>", "</s>", "<unk>"], unk_token="<unk>",
                                      show_progress=False)
    tokenizer.train_from_iterator(texts, trainer=trainer)
    tokenizer.save(str(path))
    return str(path)


def test_other_tokenizers_read_spaces_from_the_text(tmp_path):
    """A token right after a space in the text starts a word; the text's first token does not."""
    path = _unigram(tmp_path / "unigram.json")
    fn = _TokenizeBatch(path, {"space_starts"}, 0.0, 4, 2, 0)
    fn.setup()
    fn.start_bundle()
    out = [o for o in fn.process("The cat sat. It was") if o] + list(fn.finish_bundle())
    fn.teardown()
    assert not fn._token_features.ids_suffice  # offsets from the full encodings
    [(_, document)] = tokenized_documents(out)
    ids, made = document.ids, document.features
    tokenizer = _tokenizer(path)
    encoding = tokenizer.encode("The cat sat. It was", add_special_tokens=False)
    assert ids.tolist() == encoding.ids
    # one start per word after a space, at the first token covering the space or the word
    pieces = [piece for piece, flag in zip(encoding.tokens, made["space_starts"]) if flag]
    assert len(pieces) == 4 and all(piece.startswith("\u2581") for piece in pieces), encoding.tokens
    # spaces dropped (WordPiece-like), kept in the piece (BPE), or a piece of their own
    assert space_start_flags("a b", [(0, 1), (2, 3)]).tolist() == [False, True]
    assert space_start_flags("a  bc", [(0, 1), (1, 4), (4, 5)]).tolist() == [False, True, False]
    assert space_start_flags("a b", [(0, 1), (1, 2), (2, 3)]).tolist() == [False, True, False]
    assert space_start_flags(" a", [(0, 2)]).tolist() == [True]
    assert space_start_flags("ab", [(0, 1), (1, 2)], special=[0, 1]).tolist() == [False, True]
