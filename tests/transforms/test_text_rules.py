"""Tests of transforms/text_rules.py: sentence starts on hand-checked strings."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from tokenizers import Tokenizer

from transforms.text_rules import sentence_start_chars, token_flags_from_chars

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


def test_token_flags_from_chars_hand_checked():
    token_starts = np.array([0, 5, 11, 12, 17])  # "Hello", " world", ".", " This", " is"
    assert token_flags_from_chars(token_starts, np.array([0, 13])).tolist() == [True, False, False, True, False]
    # A position exactly at a token start flags that token.
    assert token_flags_from_chars(token_starts, np.array([12])).tolist() == [False, False, False, True, False]
    # Several tokens sharing a start (the bytes of one character): the first one.
    assert token_flags_from_chars(np.array([0, 3, 3, 4]), np.array([3])).tolist() == [False, True, False, False]
    # A position before the first token (stripped whitespace) flags the first token.
    assert token_flags_from_chars(np.array([2, 4]), np.array([0])).tolist() == [True, False]
    assert token_flags_from_chars(np.array([], np.int64), np.array([0])).tolist() == []
    assert token_flags_from_chars(np.array([0, 1]), np.array([], np.int64)).tolist() == [False, False]


def test_sentence_starts_map_to_the_right_bpe_tokens():
    tokenizer = Tokenizer.from_file(str(PROJECT_TOKENIZER))
    text = "Hello world. This is it. \u00c9lan.\n\nnew para."
    encoding = tokenizer.encode(text, add_special_tokens=False)
    starts = np.array([start for start, _ in encoding.offsets])
    flags = token_flags_from_chars(starts, sentence_start_chars(text))
    flagged = [token for token, flag in zip(encoding.tokens, flags) if flag]
    # Byte-level BPE tokens carry the space before a word ("\u0120This" is " This"); "\u00c9"
    # is two byte tokens sharing offsets (25, 26): the first is flagged.
    assert sentence_start_chars(text).tolist() == [0, 13, 25, 32]
    assert np.flatnonzero(flags).tolist() == [0, 3, 8, 14]
    assert flagged == ["Hello", "\u0120This", "\u00c3", "new"]
