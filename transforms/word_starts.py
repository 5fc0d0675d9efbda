"""Word starts of a byte-level BPE from the text, without the encoder's word ids.

Whole-word masking (mlm ``--whole-word-mask``, bart's spans) needs to know which tokens
start a pre-tokenizer word. The encoder reports it as word ids, but only on its slow path
(``encode_batch``), which also builds every token's string and character offsets and costs
about half as much again as ``encode_batch_fast``, whose word ids are all None.

For the GPT-2 style ``ByteLevel`` pre-tokenizer (``use_regex``) the words are the matches of

    's|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+

and where they start follows from each character's class (letter, number, whitespace,
other), a few rules about spaces and the seven contractions:

- a run of letters, of numbers or of other characters is one word, which begins at the
  space before it when that character is a plain space (``" ?"``);
- a run of whitespace before such a run leaves its last character to the run when it is a
  plain space; any other last whitespace character is a word of its own; a run of whitespace
  at the end of the text is one word;
- a word that begins at an apostrophe followed by ``s t m d re ve ll`` is that contraction,
  and the letters after it begin the next word.

Character classes are never guessed from Python's Unicode tables (whose version may differ
from the encoder's regex library): each code point is classified once, on first sight, by
asking the tokenizer's own pre-tokenizer how it splits two-character probes. A tokenizer
whose splits disagree with these rules on a fixed set of awkward strings is not used this
way (:meth:`ByteLevelWords.of` returns None), and a document whose computed starts do not
fall on token boundaries gets its word ids from the encoder.
"""

from __future__ import annotations

import numpy as np
from tokenizers import Tokenizer, pre_tokenizers

from transforms.text_rules import byte_positions

__all__ = ["ByteLevelWords", "word_start_flags"]

LETTER, NUMBER, OTHER, SPACE_CLASS = 0, 1, 2, 3
_UNKNOWN = 255
_SPACE = ord(" ")
_APOSTROPHE = ord("'")
#: Letters after an apostrophe that make a contraction: s t m d, and re ve ll.
_ONE_LETTER = (ord("s"), ord("t"), ord("m"), ord("d"))
_TWO_LETTERS = ((ord("r"), ord("e")), (ord("v"), ord("e")), (ord("l"), ord("l")))
#: Awkward strings the rules are checked on against the encoder's word ids before use.
SELF_CHECK = (
    "Hello world, it's  a test.\n\nAnother   sentence here!  ",
    "don't I'll we've you're she'd I'm 'sup ''s 's 'S x'LL rock'n'roll '",
    "  \t\n leading and trailing \u00a0 spaces \u3000 ideographic\u2028sep\x85nel\x0bvt\x1cfs  ",
    "numbers 123 4.5e-6 \u0663\u0664 \u00bd \u2167 mixed abc123def 1st",
    "caf\u00e9 cafe\u0301 \u0301 na\u00efve \u4f60\u597d\u4e16\u754c \U0001F600\U0001F1FA\U0001F1F8 \u01c5 _-_ --x--",
    "\u250c\u2500 box \u2502 \u2514\u2500\u2518 ends.\n\n\n",
    "'s'll're've'd'm't",
    " 's '  ' x '\n's \t's",
)


def word_start_flags(word_ids: list) -> np.ndarray:
    """True where a token starts a pre-tokenizer word (or has no word: special tokens), from
    the encoder's word ids.

    ``None`` becomes NaN, and NaN differs from everything, itself included.
    """
    try:  # ints only (the usual case): converting without a float detour is twice as fast
        words = np.fromiter(word_ids, dtype=np.int64, count=len(word_ids))
    except TypeError:
        words = np.array(word_ids, dtype=np.float64)
    flags = np.ones(len(words), dtype=bool)
    flags[1:] = words[1:] != words[:-1]
    return flags


class ByteLevelWords:
    """Word starts of the GPT-2 byte-level regex, by character class (see module docstring).

    Build with :meth:`of`, which also checks the rules against the tokenizer.
    """

    def __init__(self, tokenizer: Tokenizer):
        self._pre_tokenizer = tokenizer.pre_tokenizer
        self._classes = np.full(0x110000, _UNKNOWN, dtype=np.uint8)
        self._classify(np.arange(128, dtype=np.uint32))
        self._ascii = self._classes[:256].copy()  # a small table for ASCII bytes (cache-friendly)

    @classmethod
    def of(cls, tokenizer: Tokenizer, byte_lengths: np.ndarray | None) -> ByteLevelWords | None:
        """The word-start rules for ``tokenizer`` (its ``encode_special_tokens`` as it will be
        used), or None when they do not apply: no lossless byte-level lengths
        (:func:`transforms.tokenizer_utils.byte_level_lengths`), a pre-tokenizer other than one
        regex ``ByteLevel``, added tokens that are not special (the encoder splits those out
        of the text first), or splits that differ from the rules on :data:`SELF_CHECK`."""
        if byte_lengths is None:
            return None
        pre_tokenizer = tokenizer.pre_tokenizer
        if not isinstance(pre_tokenizer, pre_tokenizers.ByteLevel) or not pre_tokenizer.use_regex:
            return None
        if any(not added.special for added in tokenizer.get_added_tokens_decoder().values()):
            return None
        words = cls(tokenizer)
        checked = 0
        for text, encoding in zip(SELF_CHECK, tokenizer.encode_batch(list(SELF_CHECK), add_special_tokens=False)):
            ids = np.asarray(encoding.ids, dtype=np.int64)
            ends = np.cumsum(byte_lengths[ids])
            encoded = text.encode("utf-8")
            if not len(ids) or ends[-1] != len(encoded):
                continue  # characters the vocabulary lacks (<unk>): such texts always fall back
            checked += 1
            flags = words.token_flags(text, encoded, ends)
            if flags is None or not np.array_equal(flags, word_start_flags(encoding.word_ids)):
                return None
        return words if checked else None

    def _words(self, text: str) -> int:
        return len(self._pre_tokenizer.pre_tokenize_str(text))

    def _classify(self, code_points: np.ndarray) -> None:
        for code_point in code_points.tolist():
            char = chr(code_point)
            if self._words("a" + char) == 1:
                kind = LETTER
            elif self._words("1" + char) == 1:
                kind = NUMBER
            elif self._words("!" + char) == 1:
                kind = OTHER
            else:
                kind = SPACE_CLASS
            self._classes[code_point] = kind

    def classes(self, code_points: np.ndarray) -> np.ndarray:
        """Class of each code point (uint8: LETTER, NUMBER, OTHER or SPACE_CLASS)."""
        if code_points.dtype == np.uint8:  # ASCII bytes: all classified in __init__
            return self._ascii[code_points]
        classes = self._classes[code_points]
        unknown = classes == _UNKNOWN
        if unknown.any():
            self._classify(np.unique(code_points[unknown]))
            classes = self._classes[code_points]
        return classes

    def start_chars(self, code_points: np.ndarray) -> np.ndarray:
        """Sorted positions (in ``code_points``) where the pre-tokenizer's words start."""
        n = len(code_points)
        if n == 0:
            return np.zeros(0, dtype=np.int64)
        classes = self.classes(code_points)
        space = classes == SPACE_CLASS
        starts = np.empty(n, dtype=bool)
        starts[0] = True
        np.not_equal(classes[1:], classes[:-1], out=starts[1:])  # a run of one class starts here
        # A run of letters, numbers or others starts a word unless a plain space precedes it
        # (then the space starts it: whitespace before a run ends with its own word, below).
        starts[1:] &= (code_points[:-1] != _SPACE) | space[1:]
        # Whitespace followed by a run: its last character starts a word (the run's, for a plain
        # space; its own, for any other); whitespace at the end of the text stays one word.
        starts[:-1] |= space[:-1] & ~space[1:]
        positions = np.flatnonzero(starts)
        # Contractions: a word that begins at an apostrophe (never a whitespace word's start).
        apostrophes = np.flatnonzero(code_points == _APOSTROPHE)
        contractions = [(at, size) for at in apostrophes[starts[apostrophes]].tolist()
                        if (size := self._contraction(code_points, at))]
        if contractions:
            for at, size in contractions:
                starts[at + 1 : at + size] = False
                if at + size < n:
                    starts[at + size] = True  # the rest of the letter run, or the next run
            positions = np.flatnonzero(starts)
        return positions

    @staticmethod
    def _contraction(code_points: np.ndarray, at: int) -> int:
        n = len(code_points)
        following = int(code_points[at + 1]) if at + 1 < n else -1
        if following in _ONE_LETTER:
            return 2
        if at + 2 < n and (following, int(code_points[at + 2])) in _TWO_LETTERS:
            return 3
        return 0

    def start_bytes(self, text: str, encoded: bytes) -> np.ndarray:
        """UTF-8 byte offsets (in ``encoded``, the text's UTF-8 bytes) where words start."""
        if len(encoded) == len(text):  # ASCII: bytes are characters
            return self.start_chars(np.frombuffer(encoded, dtype=np.uint8))
        code_points = np.frombuffer(text.encode("utf-32-le"), dtype=np.uint32)
        return byte_positions(text, encoded, self.start_chars(code_points))

    def token_flags(self, text: str, encoded: bytes, token_ends: np.ndarray) -> np.ndarray | None:
        """True for each token that starts a word, given the tokens' byte ends (whose last is
        ``len(encoded)``); None when a word would start inside a token (the rules do not
        describe this text's split)."""
        flags = np.zeros(len(token_ends), dtype=bool)
        starts = self.start_bytes(text, encoded)
        token = np.searchsorted(token_ends, starts, side="right")
        if len(token) and token[-1] >= len(token_ends):
            return None
        token_starts = token_ends[token - 1]
        token_starts[token == 0] = 0
        if not np.array_equal(token_starts, starts):
            return None
        flags[token] = True
        return flags
