"""Tests of transforms/tokenizing/text_rules.py: sentence starts on hand-checked strings."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from tokenizers import Tokenizer

from transforms.tokenizing.text_rules import byte_positions, sentence_start_chars, token_flags
from transforms.tokenizing.tokenizer_utils import byte_level_lengths

PROJECT_TOKENIZER = Path(__file__).resolve().parents[2] / "data" / "tokenizer.json"


@pytest.mark.parametrize(
    "text, starts",
    [
        ("Hello world. This is it.", [0, 13]),
        ("One! Two? Three\u2026 Four.", [0, 5, 10, 17]),
        ("  Leading space. Next", [2, 17]),
        ("Version 2. 3 apples.", [0, 11]),
        ('He said "Stop." Then left.', [0, 16]),
        ('Done." Next one.', [0, 7]),
        ("Done.) Next", [0, 7]),
        ("Ask. (Aside) And", [0, 5]),  # ")" alone ends no sentence
        ("End. 'Quoted' start", [0, 5]),
        ("End. \u201cCurly\u201d start", [0, 5]),
        ("no split. lowercase next", [0]),
        ("e.g. this stays one", [0]),
        ("x...Y no space", [0]),
        ("3.14 is pi. Yes", [0, 12]),
        ("first\n\nsecond para", [0, 7]),
        ("first\n \t\n  indented para", [0, 11]),
        ("end.\n\n  lower after blank line", [0, 8]),
        ("single\nnewline Is not a break", [0]),
        ("Trailing stop. ", [0]),
        ("Trailing blank line\n\n", [0]),
        ("Dr. Who. Mr. Smith", [0, 4, 9, 13]),  # the rule has no abbreviation list
        # Uppercase is Unicode uppercase, digits are Unicode digits.
        ("Hi. \u00c9lan vital. \u00fcber alles. \u00dcber", [0, 4, 28]),
        ("\u041f\u0440\u0438\u0432\u0435\u0442. \u041c\u0438\u0440", [0, 8]),
        ("\u4f60\u597d\u3002\u4e16\u754c", [0]),  # CJK full stop is not in the rule
    ],
)
def test_sentence_start_chars(text, starts):
    got = sentence_start_chars(text)
    assert got.dtype == np.int64
    assert got.tolist() == starts


def test_sentence_start_chars_blank_text_has_none():
    assert sentence_start_chars("").tolist() == []
    assert sentence_start_chars("  \n\t ").tolist() == []


@settings(max_examples=200, deadline=None)
@given(st.text(max_size=60))
def test_sentence_starts_are_sorted_in_range_and_non_space(text):
    starts = sentence_start_chars(text)
    assert starts.tolist() == sorted(set(starts.tolist()))
    assert all(0 <= s < len(text) for s in starts)
    assert all(not text[s].isspace() for s in starts)
    if text.strip():
        assert starts[0] == len(text) - len(text.lstrip())


@pytest.mark.parametrize(
    "text, starts",
    [
        # After a terminator only Python's str.isupper/isdigit decide a non-ASCII character.
        ("x. \u00e9lan", [0]),
        ("x. \u00c9lan", [0, 3]),
        ("x. \u0663 items", [0, 3]),  # Arabic-Indic three
        ("x. \u00b2 y", [0, 3]),  # superscript two: isdigit
        ("a. \u00bd b", [0]),  # one half: numeric, not a digit
        ("a. \u2167 b", [0, 3]),  # Roman numeral eight: isupper
        ("Ok.\u2028\u01c5x", [0]),  # titlecase is not uppercase
        ("Ok. \u201cx", [0, 4]),
        ("Ok. \u00ab x", [0]),  # not one of the opening quotes
        ("Ok.\u201d\u2019 (x", [0, 6]),
        ('He left.) "Yes', [0, 10]),
        ("Wait\u2026 What", [0, 6]),
        # Unicode whitespace after a terminator; one offset for a sentence end and a blank line.
        ("End.\u00a0Next", [0, 5]),
        ("End.\u3000next", [0]),
        ("one.  \n  Two", [0, 9]),
        ("End.\n\nNext", [0, 6]),
        ("End.\n\n \u00e9lan", [0, 7]),
        # Blank lines: only spaces and tabs between the newlines, whitespace after them skipped.
        ("\n\nHi", [2]),
        ("a\n\t\n\r b", [0, 6]),
        ("a\n\r\nb", [0]),
        ("a.\r\n\r\nb", [0]),  # CRLF: no blank line by the rule, and "b" is lowercase
    ],
)
def test_sentence_start_chars_unicode_and_whitespace_edges(text, starts):
    got = sentence_start_chars(text)
    assert got.dtype == np.int64
    assert got.tolist() == starts


def _reference_sentence_starts(text: str) -> list[int]:
    """The rule as first written, its specification: one regex for all terminators and Python's
    check of the character after every match, the blank lines, the first non-space character."""
    sentence_end = re.compile(r"[.!?\u2026][\"'\u201d\u2019)\]]*\s+(?=\S)")
    blank_line = re.compile(r"\n[ \t]*\n\s*")
    first = len(text) - len(text.lstrip())
    starts = {first} if first < len(text) else set()
    for match in sentence_end.finditer(text):
        char = text[match.end()]
        if char.isupper() or char.isdigit() or char in "\"'\u201c\u2018([":
            starts.add(match.end())
    starts |= {match.end() for match in blank_line.finditer(text) if match.end() < len(text)}
    return sorted(starts)


#: Pieces that stress the rule: terminators, closers, openers, ASCII and Unicode uppercase,
#: digits and their look-alikes, lowercase, and every kind of whitespace and line break.
SENTENCE_PIECES = ["a", "x", "Z", "I", "3", "e.g.", ".", "!", "?", "...", '"', "'", ")", "]", "(", "[", " ", "  ",
                   "\n", "\n\n", "\t", "\r", "\r\n", "\x0b", "\x0c", "\x1c", "\u2026", "\u201d", "\u2019",
                   "\u201c", "\u2018", "\u00ab", "\u00c9lan", "\u00e9", "\u00dc", "\u0663", "\u00b2", "\u00bd",
                   "\u2167", "\u01c5", "\u4f60", "\U0001F600", "\x85", "\u00a0", "\u2028", "\u3000"]
ASCII_SENTENCE_PIECES = [piece for piece in SENTENCE_PIECES if piece.isascii()]


@settings(max_examples=500, deadline=None)
@given(st.one_of(st.lists(st.sampled_from(ASCII_SENTENCE_PIECES), max_size=30).map("".join),
                 st.lists(st.sampled_from(SENTENCE_PIECES), max_size=30).map("".join)))
def test_sentence_starts_match_the_reference_rule(text):
    got = sentence_start_chars(text)
    assert got.dtype == np.int64
    assert got.tolist() == _reference_sentence_starts(text)


def test_token_flags_hand_checked():
    token_ends = np.array([5, 11, 12, 17, 20])  # "Hello", " world", ".", " This", " is"
    assert token_flags(token_ends, np.array([0, 13])).tolist() == [True, False, False, True, False]
    # A position at a token's first unit flags that token; one at its end, the next token.
    assert token_flags(token_ends, np.array([12])).tolist() == [False, False, False, True, False]
    assert token_flags(token_ends, np.array([11])).tolist() == [False, False, True, False, False]
    # Zero-length tokens never hold a position.
    assert token_flags(np.array([2, 2, 4]), np.array([2])).tolist() == [False, False, True]
    # A position no token covers (dropped by a normalizer) flags the next token; after the last, nothing.
    assert token_flags(np.array([2, 4, 9]), np.array([4, 9, 12])).tolist() == [False, False, True]
    assert token_flags(np.array([], np.int64), np.array([0])).tolist() == []
    assert token_flags(np.array([1, 2]), np.array([], np.int64)).tolist() == [False, False]


def test_byte_positions():
    assert byte_positions("abc", b"abc", np.array([0, 2])).tolist() == [0, 2]
    text = "a\u00e9\u250cb\U0001f600c"  # 1 + 2 + 3 + 1 + 4 + 1 bytes
    assert byte_positions(text, text.encode("utf-8"), np.arange(len(text))).tolist() == [0, 1, 3, 6, 7, 11]


def _flags_both_ways(tokenizer, text):
    """(tokens, flags from byte lengths, flags from character offsets)."""
    encoding = tokenizer.encode(text, add_special_tokens=False)
    lengths = byte_level_lengths(tokenizer)
    ends = np.cumsum(lengths[encoding.ids])
    encoded = text.encode("utf-8")
    assert ends[-1] == len(encoded)
    chars = sentence_start_chars(text)
    by_bytes = token_flags(ends, byte_positions(text, encoded, chars))
    by_offsets = token_flags(np.array([end for _, end in encoding.offsets]), chars)
    return encoding.tokens, by_bytes, by_offsets


def test_sentence_starts_map_to_the_right_bpe_tokens():
    tokenizer = Tokenizer.from_file(str(PROJECT_TOKENIZER))
    text = "Hello world. This is it. \u00c9lan.\n\nnew para."
    tokens, by_bytes, by_offsets = _flags_both_ways(tokenizer, text)
    # Byte-level BPE tokens carry the space before a word ("\u0120This" is " This"); "\u00c9"
    # is two byte tokens: the one holding its first byte is flagged.
    assert sentence_start_chars(text).tolist() == [0, 13, 25, 32]
    assert np.flatnonzero(by_bytes).tolist() == [0, 3, 8, 14]
    assert [token for token, flag in zip(tokens, by_bytes) if flag] == ["Hello", "\u0120This", "\u00c3", "new"]
    np.testing.assert_array_equal(by_bytes, by_offsets)


def _tiny_byte_level_bpe(corpus: list[str], vocab_size: int = 300) -> Tokenizer:
    from tokenizers import decoders, models, pre_tokenizers, trainers

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    tokenizer.train_from_iterator(corpus, trainer)
    return tokenizer


def test_a_token_holding_a_space_and_part_of_a_character():
    # Trained on four box corners (3 bytes each, the first two shared) so that " \u250c"
    # encodes as a token holding the space and the corner's first two bytes, then one
    # holding its last byte. Both tokens' character offsets cover the corner; the sentence
    # starts in the first, which holds the character's first byte (by byte lengths and by
    # offset ends alike).
    tokenizer = _tiny_byte_level_bpe(["\u250c \u2510 \u2514 \u2518 " * 3] * 50, vocab_size=258)
    text = "go.\n\n \u250c"  # a blank line starts a sentence at the corner, character 6
    encoding = tokenizer.encode(text, add_special_tokens=False)
    tokens, by_bytes, by_offsets = _flags_both_ways(tokenizer, text)
    corner = encoding.char_to_token(6)
    assert tokens[corner] == "\u0120\u00e2\u0136" and tokens[corner + 1] == "\u012e"
    assert encoding.offsets[corner + 1][0] == 6  # the later token starts at the corner too
    assert np.flatnonzero(by_bytes).tolist() == [0, corner]
    np.testing.assert_array_equal(by_bytes, by_offsets)


@pytest.fixture(scope="module")
def project_tokenizer():
    return Tokenizer.from_file(str(PROJECT_TOKENIZER))


@settings(max_examples=300, deadline=None)
@given(st.text(alphabet=st.sampled_from(list("aZ. !?\n\u00e9\u00c9\u250c\u4f60\U0001f600\"(1")), max_size=40))
def test_byte_and_offset_mappings_agree_on_any_text(project_tokenizer, text):
    tokenizer = project_tokenizer
    if not tokenizer.encode(text, add_special_tokens=False).ids:
        return
    _, by_bytes, by_offsets = _flags_both_ways(tokenizer, text)
    np.testing.assert_array_equal(by_bytes, by_offsets)
