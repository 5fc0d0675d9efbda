"""The encoder seam: both backends give the reference ids, and ``auto`` takes fastokens only
where it loads the tokenizer and the parity probe passes."""

from __future__ import annotations

import json
import unicodedata

import numpy as np
import pytest
from lmshards_testing import TOKENIZER
from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, trainers

from transforms.tokenizing import encoder_choice
from transforms.tokenizing.encoder import EncodedBatch, EncoderUnavailable, load_encoder
from transforms.tokenizing.encoder_choice import choose_encoder
from transforms.tokenizing.encoder_probe import first_difference, probe_texts

PROJECT_JSON = open(TOKENIZER, encoding="utf-8").read()


def _ids(encoder, texts) -> list[list[int]]:
    batch = encoder.encode(texts)
    return [batch.ids_of(i).tolist() for i in range(len(texts))]


@pytest.mark.parametrize("backend", ["fastokens", "tokenizers"])
def test_both_backends_give_the_reference_ids_and_keep_special_token_text_as_text(backend):
    encoder = load_encoder(backend, PROJECT_JSON)
    assert encoder.name == backend
    batch = encoder.encode(["The cat sat.", "</s>", "", "a <extra_id_0> b"])
    assert batch.ids.dtype == np.int32 and batch.offsets.dtype == np.int64
    assert batch.offsets.tolist() == [0, 5, 8, 8, 17]
    assert _ids(encoder, ["The cat sat.", "</s>", "a <extra_id_0> b"]) == [
        [629, 5506, 408, 407, 152],
        [6268, 221, 168],  # "</", "s", ">": never the eos id 1
        [203, 700, 3988, 201, 657, 201, 154, 168, 430],  # never the sentinel id 5
    ]


def test_the_backends_agree_on_the_probe_and_the_sample_corpus(sample_texts):
    added = [t.content for t in Tokenizer.from_str(PROJECT_JSON).get_added_tokens_decoder().values()]
    texts = probe_texts(added, sample_texts)
    reference = load_encoder("tokenizers", PROJECT_JSON).encode(texts)
    fast = load_encoder("fastokens", PROJECT_JSON).encode(texts)
    assert first_difference(reference, fast) is None
    assert reference.ids.tolist() == fast.ids.tolist() and int(reference.offsets[-1]) > 100_000


def test_the_probe_covers_every_general_category_and_the_added_tokens():
    texts = probe_texts(["<extra_id_0>", "[R]"], ["a corpus document"])
    categories = {unicodedata.category(c) for text in texts for c in text}
    every = {"Lu", "Ll", "Lt", "Lm", "Lo", "Mn", "Mc", "Me", "Nd", "Nl", "No", "Pc", "Pd", "Ps", "Pe", "Pi", "Pf",
             "Po", "Sm", "Sc", "Sk", "So", "Zs", "Zl", "Zp", "Cc", "Cf", "Co", "Cn"}
    assert every <= categories and "Cs" not in categories  # surrogates cannot be UTF-8 encoded
    assert {"<extra_id_0>", "x<extra_id_0>y", "[R][R][R]", "<extra_id_0> [R]"} <= set(texts)
    assert texts[-1] == "a corpus document"
    assert any(set(t) == {" "} and len(t) >= 1000 for t in texts)  # long runs of spaces
    assert any(set(t) == {"\n"} and len(t) >= 1000 for t in texts)


def test_auto_takes_fastokens_when_the_probe_passes():
    choice = choose_encoder("auto", PROJECT_JSON, documents=["some text", "more text"])
    assert (choice.backend, choice.reason, choice.probe["result"]) == ("fastokens", None, "passed")
    entry = choice.to_json()
    assert entry["backend"] == "fastokens" and entry["fastokens_version"] and entry["tokenizers_version"]
    assert entry["probe"]["texts"] == len(probe_texts(
        [t.content for t in Tokenizer.from_str(PROJECT_JSON).get_added_tokens_decoder().values()])) + 2


def test_tokenizers_is_taken_as_asked_without_a_probe():
    choice = choose_encoder("tokenizers", PROJECT_JSON)
    assert (choice.backend, choice.reason, choice.probe) == ("tokenizers", None, {"result": "not_run"})


def mismatching_tokenizer_json() -> str:
    """A tokenizer.json that fastokens loads but encodes differently from tokenizers: words
    split at ``\\s+`` first, a regex by which U+180E (MONGOLIAN VOWEL SEPARATOR, a format
    character since Unicode 6.3) is whitespace to one backend's regex engine and not to the other's."""
    config = json.loads(PROJECT_JSON)
    byte_level = {**config["pre_tokenizer"], "use_regex": False}
    config["pre_tokenizer"] = {"type": "Sequence", "pretokenizers": [
        {"type": "Split", "pattern": {"Regex": "\\s+"}, "behavior": "Removed", "invert": False}, byte_level]}
    return Tokenizer.from_str(json.dumps(config)).to_str()  # canonical, as a job writes it


def test_the_probe_catches_a_tokenizer_fastokens_encodes_differently():
    data = mismatching_tokenizer_json()
    fast = load_encoder("fastokens", data)  # it loads...
    reference = load_encoder("tokenizers", data)
    assert _ids(fast, ["The cat sat."]) == _ids(reference, ["The cat sat."])
    assert _ids(fast, ["a\u180eb"]) != _ids(reference, ["a\u180eb"])  # ...and differs
    choice = choose_encoder("auto", data)
    assert choice.backend == "tokenizers" and choice.probe["result"] == "mismatch"
    assert "differently from tokenizers" in choice.reason and "\\u180e" in choice.probe["first_difference"]
    with pytest.raises(ValueError, match=r"^--encoder fastokens: fastokens encodes the probe text .* differently"):
        choose_encoder("fastokens", data)


def test_a_verdict_is_probed_once_per_tokenizer_and_sample_and_handed_out_as_a_copy():
    data = mismatching_tokenizer_json()
    encoder_choice._VERDICTS.clear()
    first = choose_encoder("auto", data, documents=["one document"])
    assert list(encoder_choice._VERDICTS) and first.probe["result"] == "mismatch"
    first.probe["result"] = "edited by the caller"
    again = choose_encoder("auto", data, documents=["one document"])
    assert again == choose_encoder("auto", data, documents=["one document"]) and again.probe["result"] == "mismatch"
    with pytest.raises(ValueError, match="^--encoder fastokens: fastokens encodes the probe text"):
        choose_encoder("fastokens", data, documents=["one document"])  # the kept verdict, asked for strictly
    assert len(encoder_choice._VERDICTS) == 1
    first_key = next(iter(encoder_choice._VERDICTS))
    for n in range(encoder_choice._VERDICTS_KEPT):  # another sample is another probe; only the last are kept
        assert choose_encoder("auto", PROJECT_JSON, documents=[f"document {n}"]).probe["texts"] == again.probe["texts"]
    assert len(encoder_choice._VERDICTS) == encoder_choice._VERDICTS_KEPT and first_key not in encoder_choice._VERDICTS


def _trained(kind: str, texts: list[str]) -> str:
    if kind == "wordpiece":
        tokenizer = Tokenizer(models.WordPiece(unk_token="[UNK]"))
        tokenizer.normalizer = normalizers.BertNormalizer()
        tokenizer.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
        trainer = trainers.WordPieceTrainer(vocab_size=400, special_tokens=["[UNK]", "[SEP]"], show_progress=False)
    else:
        tokenizer = Tokenizer(models.Unigram())
        tokenizer.pre_tokenizer = pre_tokenizers.Metaspace()
        trainer = trainers.UnigramTrainer(vocab_size=200, special_tokens=["</s>", "<unk>"], unk_token="<unk>",
                                          show_progress=False)
    tokenizer.train_from_iterator(texts, trainer=trainer)
    return tokenizer.to_str()


@pytest.mark.parametrize("kind", ["wordpiece", "unigram"])
def test_wordpiece_and_unigram_fall_back_cleanly(kind, sample_texts):
    data = _trained(kind, sample_texts[:30])  # enough text for either vocabulary (Unigram's training grows with it)
    with pytest.raises(EncoderUnavailable, match="fastokens cannot load this tokenizer"):
        load_encoder("fastokens", data)
    choice = choose_encoder("auto", data)
    assert choice.backend == "tokenizers" and choice.reason.startswith("fastokens cannot load this tokenizer (")
    with pytest.raises(ValueError, match="^--encoder fastokens: fastokens cannot load this tokenizer"):
        choose_encoder("fastokens", data)
    reference = load_encoder("tokenizers", data)
    direct = Tokenizer.from_str(data)
    assert _ids(reference, sample_texts[:5]) == [e.ids for e in direct.encode_batch(sample_texts[:5],
                                                                                   add_special_tokens=False)]


def test_a_job_that_needs_offsets_or_word_ids_encodes_with_tokenizers():
    choice = choose_encoder("auto", PROJECT_JSON, needs_full=True)
    assert choice.backend == "tokenizers" and "offsets and word ids" in choice.reason
    with pytest.raises(ValueError, match="^--encoder fastokens: .*offsets and word ids"):
        choose_encoder("fastokens", PROJECT_JSON, needs_full=True)
    with pytest.raises(EncoderUnavailable):
        load_encoder("fastokens", PROJECT_JSON, full=True)
    full = load_encoder("tokenizers", PROJECT_JSON, full=True).encode(["The cat sat."])
    assert full.encodings[0].offsets[1] == (3, 7) and full.ids.tolist() == [629, 5506, 408, 407, 152]


def test_unknown_backends_are_refused():
    with pytest.raises(ValueError, match="--encoder rust: expected one of auto, fastokens, tokenizers"):
        choose_encoder("rust", PROJECT_JSON)
    with pytest.raises(ValueError, match="--encoder rust"):
        load_encoder("rust", PROJECT_JSON)


def test_first_difference_names_the_first_text_that_differs():
    def batch(*rows):
        offsets = np.concatenate([[0], np.cumsum([len(r) for r in rows])]).astype(np.int64)
        return EncodedBatch(np.array([i for r in rows for i in r], dtype=np.int32), offsets)

    assert first_difference(batch([1, 2], [3]), batch([1, 2], [3])) is None
    assert first_difference(batch([1, 2], [3], [4]), batch([1, 2], [3], [5])) == 2
    assert first_difference(batch([1, 2], [3]), batch([1], [2, 3])) == 0  # same ids, other boundaries


@pytest.mark.parametrize("backend", ["fastokens", "tokenizers"])
def test_long_texts_are_encoded_in_bounded_pieces_with_the_ids_of_the_whole(backend, sample_texts):
    from transforms.tokenizing.encoder import encode_bounded, pieces_are_exact_for
    from transforms.tokenizing.long_text import PIECE_CHARS

    long_text = "\n\n".join(sample_texts)[: 3 * PIECE_CHARS + 12345]  # four pieces
    texts = ["a short one", long_text, "another short one"]
    encoder = load_encoder(backend, PROJECT_JSON)
    assert pieces_are_exact_for(encoder, PROJECT_JSON)
    bounded = encode_bounded(encoder, texts, pieces=True)
    whole = load_encoder("tokenizers", PROJECT_JSON).encode(texts)
    assert first_difference(whole, bounded) is None and bounded.ids_of(1).size > 100_000
    full = encode_bounded(load_encoder("tokenizers", PROJECT_JSON, full=True), texts, pieces=True)
    assert first_difference(whole, full) is None
    assert full.encodings[1].offset_ends[-1] == len(long_text)  # a PiecedEncoding, offsets across pieces
