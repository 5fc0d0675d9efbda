"""Where words start, in the two senses the objectives use.

``space_starts`` (BART, fairseq's rule): a token starts a word when its text begins with a
space, as fairseq's ``get_whole_word_mask`` decides per dictionary id with GPT-2's
``is_beginning_of_word`` (``decode(token).startswith(" ")``), and every special token
starts one. For a byte-level BPE that is a property of the id (:func:`space_start_table`:
the token's first byte is 0x20, spelled ``Ġ``); for other tokenizers it is read from the text
(:func:`space_start_flags`: the character before the token, or its own first one, is
whitespace). On ``The cat sat.\nIt was (very) happy, wasn't it?`` GPT-2's pieces start words
at `` cat``, `` sat``, `` was``, `` (``, `` happy``, `` wasn`` and `` it``: 7, where the
pre-tokenizer has 16 words (``.``, ``\n``, ``It``, ``)``, ``,``, ``'t`` and ``?`` each start one).

``word_starts`` (whole-word MLM): a token starts a pre-tokenizer word, which splits
punctuation off as BERT's basic tokenizer does. The rest of this module computes them for a
byte-level BPE from the text, without the encoder's word ids.

The encoder reports pre-tokenizer words as word ids, but only on its slow path
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

import itertools
import re

import numpy as np
from tokenizers import Tokenizer, pre_tokenizers

__all__ = ["ByteLevelWords", "space_start_flags", "space_start_table", "word_start_flags"]

LETTER, NUMBER, OTHER, SPACE_CLASS = 0, 1, 2, 3
_UNKNOWN = 255
_SPACE = ord(" ")
#: What the start rules tell apart besides the four classes: the plain space (a word may begin
#: with it) and the edge of the text (one before it; two after it, so that one more window
#: than characters gives a False after the last).
_PLAIN, _EDGE = 4, 5
_KINDS = 6
#: A byte no ASCII text holds, so the ASCII kind table can map it to the edge.
_EDGE_BYTE = b"\x80"
#: An apostrophe followed by s t m d, or re ve ll.
_CONTRACTION = re.compile(r"'(?:[stmd]|re|ve|ll)")
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


#: The byte-level alphabet's character for the byte 0x20 (GPT-2's ``Ġ``).
_BYTE_LEVEL_SPACE = "\u0120"


def space_start_table(tokenizer: Tokenizer, byte_lengths: np.ndarray | None) -> np.ndarray | None:
    """bool per id of a lossless byte-level BPE (``byte_lengths`` from
    :func:`transforms.tokenizing.tokenizer_utils.byte_level_lengths`, None otherwise): True where the
    token's text begins with a space, and for every special token; None for other tokenizers."""
    if byte_lengths is None:
        return None
    table = np.zeros(byte_lengths.shape[0], dtype=bool)
    for token, index in tokenizer.get_vocab(with_added_tokens=False).items():
        if index < table.shape[0]:
            table[index] = token.startswith(_BYTE_LEVEL_SPACE)
    for index, added in tokenizer.get_added_tokens_decoder().items():
        if index < table.shape[0]:
            table[index] = added.special or added.content.startswith(" ")
    return table


_AFTER_SPACE = re.compile(r"\s+(?=\S)")


def space_start_flags(text: str, offsets: list[tuple[int, int]], special: list[int] | None = None) -> np.ndarray:
    """Word starts of tokens given by their character ``offsets`` in ``text``: for every run of
    whitespace before a non-space character, the first token that covers any of the run or
    that character (the space-prefixed piece of a BPE, the lone ``▁`` of a Metaspace
    tokenizer, or the first piece after the space where the tokenizer drops spaces); and the
    special tokens (``special``: 1 per special token, as ``Encoding.special_tokens_mask``).
    The text's first token starts a word only after leading whitespace, as in fairseq."""
    flags = np.zeros(len(offsets), dtype=bool)
    if offsets:
        ends = np.maximum.accumulate(np.array([end for _, end in offsets], dtype=np.int64))
        runs = np.array([match.start() for match in _AFTER_SPACE.finditer(text)], dtype=np.int64)
        index = np.searchsorted(ends, runs, side="right")  # the first token ending after the run starts
        flags[index[index < flags.shape[0]]] = True
    if special is not None:
        flags |= np.asarray(special, dtype=bool)
    return flags


def word_start_flags(word_ids: list) -> np.ndarray:
    """True where a token starts a pre-tokenizer word (or has no word: special tokens), from
    the encoder's word ids.

    ``None`` becomes NaN, and NaN differs from everything, itself included (a float array,
    NaN for no word, is taken as it is).
    """
    if isinstance(word_ids, np.ndarray):
        words = word_ids.astype(np.float64, copy=False)
        flags = np.ones(len(words), dtype=bool)
        flags[1:] = words[1:] != words[:-1]
        return flags
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
        self._kinds = self._classes.copy()  # the classes, but _PLAIN for " "
        self._classify(np.arange(128, dtype=np.uint32))
        self._ascii = self._classes[:256].copy()  # a small table for ASCII bytes (cache-friendly)
        # bytes.translate tables, a C loop that costs less than numpy's fancy indexing (which
        # first widens every index to 64 bits): ASCII byte -> kind, and window -> start.
        kinds = self._kinds[:256].copy()
        kinds[128:] = _EDGE
        self._ascii_kinds = kinds.tobytes()
        self._window_starts = self._start_rules(int(self._classes[_SPACE]))

    @classmethod
    def of(cls, tokenizer: Tokenizer, byte_lengths: np.ndarray | None) -> ByteLevelWords | None:
        """The word-start rules for ``tokenizer`` (its ``encode_special_tokens`` as it will be
        used), or None when they do not apply: no lossless byte-level lengths
        (:func:`transforms.tokenizing.tokenizer_utils.byte_level_lengths`), a pre-tokenizer other than one
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
            self._kinds[code_point] = _PLAIN if code_point == _SPACE else kind

    def classes(self, code_points: np.ndarray) -> np.ndarray:
        """Class of each code point (uint8: LETTER, NUMBER, OTHER or SPACE_CLASS)."""
        if code_points.dtype == np.uint8:  # ASCII bytes: all classified in __init__
            return self._ascii[code_points]
        return self._look_up(self._classes, code_points)

    def _look_up(self, table: np.ndarray, code_points: np.ndarray) -> np.ndarray:
        """``table`` (classes or kinds) at ``code_points``, classifying code points on first sight."""
        values = table.take(code_points)  # faster than table[code_points]
        unknown = values == _UNKNOWN
        if unknown.any():
            self._classify(np.unique(code_points[unknown]))
            values = table.take(code_points)
        return values

    @staticmethod
    def _start_rules(space_class: int) -> bytes:
        """Whether a word starts at a character, for every window of kinds around it (the
        byte ``36 * before + 6 * character + after``): the rules of the module docstring."""
        def class_of(kind: int) -> int:
            return space_class if kind == _PLAIN else kind

        starts = bytearray(256)
        for before, kind, after in itertools.product(range(_KINDS), repeat=3):
            if kind == _EDGE:  # after the text: never
                continue
            if before == _EDGE:  # the text's first character
                start = True
            else:
                space = class_of(kind) == SPACE_CLASS
                # A run of letters, numbers or others starts a word unless a plain space precedes
                # it (then the space starts it: whitespace before a run ends with its own word).
                start = class_of(kind) != class_of(before) and (before != _PLAIN or space)
                # Whitespace followed by a run: its last character starts a word (the run's, for
                # a plain space; its own, for any other); whitespace ending the text stays one word.
                start = start or (space and after != _EDGE and class_of(after) != SPACE_CLASS)
            starts[(before * _KINDS + kind) * _KINDS + after] = start
        return bytes(starts)

    def _char_starts(self, text: str) -> np.ndarray:
        """Word starts: one bool per character of ``text`` and a False after the last.

        Whether a word starts at a character depends on the kinds of it and its neighbours
        only (but for contractions), so one table lookup per window of three decides it.
        """
        if text.isascii():  # a byte is a character: one translate gives the kinds
            padded = _EDGE_BYTE + text.encode("ascii") + 2 * _EDGE_BYTE
            kinds = np.frombuffer(padded.translate(self._ascii_kinds), dtype=np.uint8)
        else:
            code_points = np.frombuffer(text.encode("utf-32-le"), dtype=np.uint32)
            kinds = np.full(len(text) + 3, _EDGE, dtype=np.uint8)
            kinds[1:-2] = self._look_up(self._kinds, code_points)
        windows = kinds[:-2] * (_KINDS * _KINDS)
        windows += kinds[1:-1] * _KINDS
        windows += kinds[2:]
        starts = np.frombuffer(windows.tobytes().translate(self._window_starts), dtype=bool)
        # Contractions: a word that begins at an apostrophe (never a whitespace word's start).
        contractions = []
        if "'" in text:  # a memchr, far cheaper than the regex's scan of a text without one
            contractions = [match.span() for match in _CONTRACTION.finditer(text) if starts[match.start()]]
        if contractions:
            starts = starts.copy()  # frombuffer of bytes is read-only
            for begin, end in contractions:
                starts[begin + 1 : end] = False
                if end < len(text):
                    starts[end] = True  # the rest of the letter run, or the next run
        return starts

    def _byte_starts(self, text: str, encoded: bytes) -> np.ndarray:
        """Word starts: one bool per byte of ``encoded`` (the text's UTF-8 bytes), True at the
        first byte of a character that starts a word, and a False after the last."""
        chars = self._char_starts(text)
        if len(encoded) == len(text):  # ASCII: bytes are characters
            return chars
        starts = np.zeros(len(encoded) + 1, dtype=bool)
        starts[:-1][(np.frombuffer(encoded, dtype=np.uint8) & 0xC0) != 0x80] = chars[:-1]  # first bytes
        return starts

    def start_chars(self, code_points: np.ndarray) -> np.ndarray:
        """Sorted positions (in ``code_points``) where the pre-tokenizer's words start."""
        text = code_points.astype(np.uint32).tobytes().decode("utf-32-le")
        return np.flatnonzero(self._char_starts(text)[:-1])

    def start_bytes(self, text: str, encoded: bytes) -> np.ndarray:
        """UTF-8 byte offsets (in ``encoded``, the text's UTF-8 bytes) where words start."""
        return np.flatnonzero(self._byte_starts(text, encoded)[:-1])

    def token_flags(self, text: str, encoded: bytes, token_ends: np.ndarray) -> np.ndarray | None:
        """True for each token that starts a word, given the tokens' byte ends (non-decreasing,
        the last ``len(encoded)``); None when a word would start inside a token (the rules do not
        describe this text's split)."""
        starts = self._byte_starts(text, encoded)
        flags = np.empty(len(token_ends), dtype=bool)
        if len(flags):
            # A token is flagged when a word starts where it begins (where the previous one ends)
            # and it holds a byte. Non-empty tokens begin at distinct bytes, so every word start
            # fell on a token's beginning when the counts agree. Clipping sends a token that
            # begins past the text to the False after it.
            flags[0] = token_ends[0] > 0 and starts[0]
            starts.take(token_ends[:-1], out=flags[1:], mode="clip")
            flags[1:] &= token_ends[1:] != token_ends[:-1]
        if np.count_nonzero(flags) != np.count_nonzero(starts):
            return None
        return flags
