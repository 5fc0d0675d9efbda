"""The parity probe: the texts fastokens must encode to the ids of HF tokenizers before a
job takes it (:func:`transforms.tokenizing.encoder_choice.choose_encoder`).

The probe is hard strings (every Unicode general category, emoji, CJK, combining marks, runs
of whitespace, digits, the tokenizer's own added-token text in several contexts) plus the
first documents of the corpus (:func:`probe_texts`); :func:`first_difference` names the first
text whose ids differ.
"""

from __future__ import annotations

import functools
import unicodedata

import numpy as np

from transforms.tokenizing.encoder import EncodedBatch

__all__ = ["first_difference", "probe_texts"]

#: Code points taken from each Unicode general category: the first ones and others spread
#: over the whole range (surrogates cannot be UTF-8 encoded and are left out).
_PER_CATEGORY_FIRST, _PER_CATEGORY_SPREAD = 6, 24
#: Every code point below this one is looked at (the scripts of most text), then every 61st.
_DENSE_BELOW = 0x3400


@functools.lru_cache(maxsize=1)
def _category_samples() -> dict[str, list[str]]:
    seen: dict[str, list[int]] = {}
    for code in (*range(_DENSE_BELOW), *range(_DENSE_BELOW, 0x110000, 61)):
        category = unicodedata.category(chr(code))
        if category != "Cs":
            seen.setdefault(category, []).append(code)
    samples = {}
    for category, codes in sorted(seen.items()):
        step = max(1, len(codes) // _PER_CATEGORY_SPREAD)
        picked = dict.fromkeys(codes[:_PER_CATEGORY_FIRST] + codes[::step])
        samples[category] = [chr(c) for c in picked]
    return samples


_FIXED_PROBES = (
    "Hello, world! It's a test: don't, won't, I'M, we've, they'll, she'd; 'quoted' \"double\".",
    "The cat sat.\nIt was (very) happy, wasn't it?",
    "emoji \U0001f600\U0001f44d\U0001f3fd \U0001f468\u200d\U0001f469\u200d\U0001f467 \U0001f1e9\U0001f1ea "
    "\U0001f3f3\ufe0f\u200d\U0001f308 \u2764\ufe0f \u2705 \U0001f937\u200d\u2640\ufe0f text\U0001f600text",
    "日本語のテキストです。中文字符，标点！한국어 텍스트입니다. ภาษาไทย ລາວ ខ្មែរ",
    "combining e\u0301 a\u0308\u0323 n\u0303 Z\u0351\u0352\u0353\u0354\u0355\u0356\u0357 "
    "\u0915\u094d\u0937 \u05e9\u05c1",
    "zalgo " + "a" + "\u0300\u0301\u0302\u0303\u0304" * 40,
    "rtl שלום עולם مرحبا بالعالم \u200f\u200e mixed עברית and English",
    "digits 0123456789 12345678901234567890123 3.14159 1,000,000 1e-10 0x1F -42 +7 ١٢٣٤ ۱۲۳ １２３ ½ Ⅻ",
    "whitespace\u00a0nbsp\u2003em\u3000ideographic\u200bzero-width\ufefffeff \x0bvt\x0cff\x85nel",
    "code: def f(x):\n    return x ** 2  # comment\n\tif a != b and c <= d: pass\n",
    "urls https://example.com/a?b=c&d=e#f mail user@example.org <html><b>bold</b></html> {\"k\": [1, 2]}",
    "control \x01\x02\x1b[31mred\x1b[0m \x7f del",
    "a" * 3000,
    "ab" * 1500 + " " + "xyz" * 1000,
    "!" * 1000 + "?" * 500 + "." * 500,
    "word " * 1000,
    "\n" * 500 + "x" + "\r\n" * 200 + "y" + "\r" * 50,
    "\t" * 300 + "tab",
)

#: Runs of whitespace of these lengths, alone, between words and around punctuation.
_RUN_LENGTHS = (1, 2, 3, 4, 7, 8, 15, 16, 17, 31, 64, 100, 257, 1000)


def probe_texts(added_tokens: list[str] = (), documents: list[str] = ()) -> list[str]:
    """The texts both backends must encode to the same ids.

    Args:
        added_tokens: the tokenizer's added-token strings (special or not); each is used alone,
            between spaces, glued to words, repeated and inside a sentence, since added-token
            matching is where encoders differ most.
        documents: the corpus sample (the first documents of the first input file).
    """
    texts = list(_FIXED_PROBES)
    for category, chars in _category_samples().items():
        texts.append("".join(chars))
        texts.append(" ".join(chars))
        texts.append(" ".join(f"a{c}b" for c in chars))
        texts.append(f"{category}: " + "  ".join(c * 3 for c in chars))
    for n in _RUN_LENGTHS:
        for run in (" " * n, "\n" * n, "\t" * n, " \n" * n, "\u3000" * n):
            texts.extend((run, f"a{run}b", f"end.{run}", f"{run}start", f"x,{run}(y){run}z"))
        texts.append("9" * n)
        texts.append(" ".join(["12", "345", "6789"] * n))
    for token in added_tokens:
        texts.extend((
            token,
            f" {token} ",
            f"x{token}y",
            f"{token}{token}{token}",
            f"The {token} sat on the{token}mat, {token}.",
            f"{token}\n{token}\t {token}  end",
            token.lower() if token.lower() != token else token.upper(),
        ))
    if len(added_tokens) > 1:
        texts.append(" ".join(added_tokens))
        texts.append("".join(added_tokens))
    texts.extend(documents)
    return texts


def first_difference(reference: EncodedBatch, other: EncodedBatch) -> int | None:
    """Index of the first text whose ids differ between two encodings of the same texts, or None."""
    if np.array_equal(reference.offsets, other.offsets) and np.array_equal(reference.ids, other.ids):
        return None
    for index in range(len(reference.offsets) - 1):
        if not np.array_equal(reference.ids_of(index), other.ids_of(index)):
            return index
    return None
