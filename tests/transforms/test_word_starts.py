"""Word starts of a byte-level BPE from the text equal the encoder's own word ids."""

from __future__ import annotations

import bisect
import glob
import json

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, trainers

from tests.lmshards_testing import ROOT, SAMPLE_GLOB
from transforms.tokenizing.tokenizer_utils import byte_level_lengths
from transforms.tokenizing.word_starts import LETTER, NUMBER, OTHER, SPACE_CLASS, ByteLevelWords

PROJECT_TOKENIZER = str(ROOT / "data" / "tokenizer.json")
#: Pieces that exercise every rule: contractions (and near misses), plain and other spaces,
#: runs of each class, combining marks, characters outside the BMP.
PIECES = ["'", "s", "t", "re", "ve", "ll", "d", "m", "S", "a", "Z", " ", "  ", "\n", "\t", "\r", "\u00a0",
          "\u3000", "\x1c", "\x85", "\u2028", "1", "\u0663", "\u00bd", "!", ".", "\u00e9", "e\u0301", "\u0301",
          "\u4f60", "\U0001F600", "\U0001F1FA", "\u01c5", "\u2167", "_", "-", "\x0b", "'s", "'ll", "'re", "'S"]


def _encoder(path: str = PROJECT_TOKENIZER) -> Tokenizer:
    tokenizer = Tokenizer.from_file(path)
    tokenizer.encode_special_tokens = True  # as the pipeline encodes
    return tokenizer


TOKENIZER = _encoder()
LENGTHS = byte_level_lengths(TOKENIZER)
WORDS = ByteLevelWords.of(TOKENIZER, LENGTHS)


def _both(texts: list[str]) -> list[tuple[list[bool], list[bool] | None]]:
    """(the encoder's word starts, ours) per text."""
    out = []
    for text, encoding in zip(texts, TOKENIZER.encode_batch(texts, add_special_tokens=False)):
        words = np.array([np.nan if w is None else w for w in encoding.word_ids])
        expected = [True] + (words[1:] != words[:-1]).tolist()
        ends = np.cumsum(LENGTHS[np.asarray(encoding.ids, dtype=np.int64)])
        assert ends[-1] == len(text.encode("utf-8"))  # the project's tokenizer spells every byte
        flags = WORDS.token_flags(text, text.encode("utf-8"), ends)
        out.append((expected, None if flags is None else flags.tolist()))
    return out


def test_the_project_tokenizer_qualifies():
    assert WORDS is not None


@settings(max_examples=300, deadline=None)
@given(st.lists(st.lists(st.sampled_from(PIECES), min_size=1, max_size=40).map("".join), min_size=1, max_size=20))
def test_word_starts_match_the_encoder_on_awkward_text(texts):
    for expected, ours in _both(texts):
        assert ours == expected


def test_word_starts_match_the_encoder_on_the_sample_corpus():
    texts = [json.loads(line)["text"] for path in sorted(glob.glob(SAMPLE_GLOB)) for line in open(path)]
    assert len(texts) > 600
    results = _both(texts)
    assert all(ours == expected for expected, ours in results)
    assert sum(sum(expected) for expected, _ in results) > 100_000  # real work: many words


def test_exact_word_starts_of_a_small_text():
    text = "It's  ok!\n\n 42 caf\u00e9s"
    # Words: "It" "'s" " " " ok" "!" "\n\n" " 42" " caf\u00e9s" (characters 0 2 4 5 8 9 11 14)
    code_points = np.frombuffer(text.encode("utf-32-le"), dtype=np.uint32)
    assert WORDS.start_chars(code_points).tolist() == [0, 2, 4, 5, 8, 9, 11, 14]
    # In UTF-8 bytes the same, up to the "\u00e9" (2 bytes) after the last start.
    assert WORDS.start_bytes(text, text.encode("utf-8")).tolist() == [0, 2, 4, 5, 8, 9, 11, 14]
    assert WORDS.start_bytes("\u00e9\u00e9 x", "\u00e9\u00e9 x".encode("utf-8")).tolist() == [0, 4]


def test_classes_come_from_the_tokenizer_on_first_sight():
    chars = "a\u4f60\u01c5" + "1\u0663\u2167" + "!\u0301_" + " \u00a0\u3000\x85"
    classes = WORDS.classes(np.frombuffer(chars.encode("utf-32-le"), dtype=np.uint32)).tolist()
    assert classes == [LETTER] * 3 + [NUMBER] * 3 + [OTHER] * 3 + [SPACE_CLASS] * 4


def test_a_word_start_inside_a_token_is_reported_not_guessed():
    # "ab cd" (words "ab", " cd") with a token claimed to span "ab ": the start at " " falls inside it.
    assert WORDS.token_flags("ab cd", b"ab cd", np.array([3, 5])) is None
    assert WORDS.token_flags("ab cd", b"ab cd", np.array([2, 4, 5])).tolist() == [True, True, False]
    assert WORDS.token_flags("ab cd", b"ab cd", np.array([2, 5])).tolist() == [True, True]
    assert WORDS.token_flags("ab cd", b"ab cd", np.array([1, 2, 5])).tolist() == [True, False, True]


def test_token_flags_with_empty_tokens_and_tokens_past_the_text():
    # Words of "ab cd" start at bytes 0 and 2; a start flags the first token that holds its byte.
    assert WORDS.token_flags("ab cd", b"ab cd", np.array([2, 2, 5])).tolist() == [True, False, True]
    assert WORDS.token_flags("ab cd", b"ab cd", np.array([0, 2, 5])).tolist() == [False, True, True]
    assert WORDS.token_flags("ab cd", b"ab cd", np.array([0, 0, 2, 5])).tolist() == [False, False, True, True]
    assert WORDS.token_flags("ab cd", b"ab cd", np.array([2, 5, 5])).tolist() == [True, True, False]
    assert WORDS.token_flags("ab cd", b"ab cd", np.array([2, 5, 7])).tolist() == [True, True, False]
    assert WORDS.token_flags("ab cd", b"ab cd", np.array([2, 7])).tolist() == [True, True]
    assert WORDS.token_flags("ab cd", b"ab cd", np.array([2])) is None  # a start after the last token
    assert WORDS.token_flags("ab cd", b"ab cd", np.array([], dtype=np.int64)) is None
    assert WORDS.token_flags("", b"", np.array([], dtype=np.int64)).tolist() == []
    assert WORDS.token_flags("", b"", np.array([0])).tolist() == [False]


def _reference_word_starts(text: str) -> list[int]:
    """Character positions where words start, by the module docstring's rules one character
    at a time (with the tokenizer's classes)."""
    classes = WORDS.classes(np.frombuffer(text.encode("utf-32-le"), dtype=np.uint32)).tolist()
    starts = []
    for i, kind in enumerate(classes):
        space = kind == SPACE_CLASS
        # A new run starts a word, unless a plain space before it begins the word.
        start = i == 0 or (kind != classes[i - 1] and (text[i - 1] != " " or space))
        # The last whitespace before a run starts a word (not whitespace that ends the text).
        start = start or (space and i + 1 < len(classes) and classes[i + 1] != SPACE_CLASS)
        starts.append(start)
    for at in [i for i, char in enumerate(text) if char == "'" and starts[i]]:
        size = 0
        if text[at + 1 : at + 2] in ("s", "t", "m", "d"):
            size = 2
        elif text[at + 1 : at + 3] in ("re", "ve", "ll"):
            size = 3
        if size:
            starts[at + 1 : at + size] = [False] * (size - 1)
            if at + size < len(text):
                starts[at + size] = True
    return [i for i, start in enumerate(starts) if start]


def _reference_token_flags(byte_starts: list[int], ends: list[int]) -> list[bool] | None:
    """The first token that ends after each start, which must begin there."""
    flags = [False] * len(ends)
    for start in byte_starts:
        token = bisect.bisect_right(ends, start)
        if token == len(ends) or (ends[token - 1] if token else 0) != start:
            return None
        flags[token] = True
    return flags


ASCII_PIECES = [piece for piece in PIECES if piece.isascii()]


@settings(max_examples=400, deadline=None)
@given(st.one_of(st.lists(st.sampled_from(ASCII_PIECES), max_size=30).map("".join),
                 st.lists(st.sampled_from(PIECES), max_size=30).map("".join)),
       st.data())
def test_word_starts_match_the_reference_rules(text, data):
    encoded = text.encode("utf-8")
    expected = _reference_word_starts(text)
    byte_starts = [len(text[:i].encode("utf-8")) for i in expected]
    assert WORDS.start_chars(np.frombuffer(text.encode("utf-32-le"), dtype=np.uint32)).tolist() == expected
    if text.isascii():
        assert WORDS.start_chars(np.frombuffer(encoded, dtype=np.uint8)).tolist() == expected
    assert WORDS.start_bytes(text, encoded).tolist() == byte_starts
    # Token ends at word starts and anywhere else, empty tokens, past the text, or short of its end.
    cuts = data.draw(st.lists(st.sampled_from(byte_starts), max_size=12)) if byte_starts else []
    cuts += data.draw(st.lists(st.integers(0, len(encoded) + 2), max_size=2))
    ends = sorted(cuts) + [len(encoded)] * data.draw(st.integers(0, 2))
    flags = WORDS.token_flags(text, encoded, np.array(ends, dtype=np.int64))
    assert flags is None or flags.dtype == bool
    assert (None if flags is None else flags.tolist()) == _reference_token_flags(byte_starts, ends)


def _byte_level(tmp_path, name: str, *, use_regex: bool = True, added: list | None = None) -> Tokenizer:
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=use_regex)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=300, special_tokens=["</s>"], show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tokenizer.train_from_iterator(["Some text to train on. It's short!"] * 10, trainer=trainer)
    if added:
        tokenizer.add_tokens(added)
    path = tmp_path / f"{name}.json"
    tokenizer.save(str(path))
    return _encoder(str(path))


@pytest.mark.parametrize("case", ["regex", "no regex", "non-special added token", "special added token", "unigram"])
def test_which_tokenizers_qualify(case, tmp_path):
    if case == "unigram":
        tokenizer = Tokenizer(models.Unigram())
        tokenizer.pre_tokenizer = pre_tokenizers.Metaspace()
        trainer = trainers.UnigramTrainer(vocab_size=60, special_tokens=["</s>"], show_progress=False)
        tokenizer.train_from_iterator(["Some text to train on."] * 10, trainer=trainer)
    else:
        added = {"non-special added token": [AddedToken("[R]", special=False)],
                 "special added token": [AddedToken("[R]", special=True)]}.get(case)
        tokenizer = _byte_level(tmp_path, case.replace(" ", "-"), use_regex=case != "no regex", added=added)
    words = ByteLevelWords.of(tokenizer, byte_level_lengths(tokenizer))
    assert (words is not None) == (case in ("regex", "special added token"))
