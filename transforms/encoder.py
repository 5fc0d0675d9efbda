"""The encoder seam: token ids of a batch of texts, from one of two exact backends.

- ``tokenizers`` (HF, the reference): ``Tokenizer.encode_batch_fast``, or ``encode_batch``
  when the caller needs the encodings' offsets and word ids.
- ``fastokens``: a Rust BPE encoder that reads the same tokenizer.json and gives the same
  ids; ``encode_batch_flat`` returns one id buffer and offsets, with no per-token Python
  objects. It does not load every tokenizer (WordPiece, Unigram and some normalizers and
  pre-tokenizers are refused at load) and gives no offsets or word ids.

Exactness is the contract: a dataset's bytes never depend on the backend. So ``auto``
(:func:`choose_encoder`, run once when a job is planned) takes fastokens only when it
loads the tokenizer, the job needs nothing but ids from the encoder, and a parity probe
passes: :func:`probe_texts` (hard strings: every Unicode general category, emoji, CJK,
combining marks, runs of whitespace, digits, the tokenizer's own added-token text in
several contexts) plus the first documents of the corpus encode to identical ids with both
backends. Otherwise the job uses ``tokenizers`` and says why. Workers then load the backend
the plan chose (:func:`load_encoder`) and fail loudly if they cannot.

Literal special-token text is text: both backends encode ``</s>`` or ``<extra_id_0>`` in a
document as ordinary characters (``encode_special_tokens = True`` for ``tokenizers``,
``split_special_tokens=True`` for fastokens), never as control ids.
"""

from __future__ import annotations

import abc
import functools
import struct
import unicodedata
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import numpy as np
from tokenizers import Tokenizer

from schemas.errors import LmshardsError
from transforms.long_text import PIECE_CHARS, PiecedEncoding, encode_pieces, pieces_are_exact

__all__ = [
    "BACKENDS",
    "ENCODER_CHOICES",
    "EncodedBatch",
    "Encoder",
    "EncoderChoice",
    "EncoderUnavailable",
    "FastokensEncoder",
    "TokenizersEncoder",
    "choose_encoder",
    "encode_bounded",
    "error_line",
    "full_encoding",
    "offset_ends",
    "pieces_are_exact_for",
    "fastokens_version",
    "first_difference",
    "load_encoder",
    "probe_texts",
]

BACKENDS = ("fastokens", "tokenizers")
ENCODER_CHOICES = ("auto", *BACKENDS)


class EncoderUnavailable(LmshardsError, RuntimeError):
    """A backend cannot encode with this tokenizer here (not installed, or it refuses the tokenizer)."""


class EncodedBatch(NamedTuple):
    """Token ids of a batch of texts, laid end to end.

    Attributes:
        ids: int32 ids of every text, concatenated.
        offsets: int64, ``len(texts) + 1`` values: text ``i``'s ids are ``ids[offsets[i]:offsets[i + 1]]``.
        encodings: the ``tokenizers`` encodings (with offsets and word ids) when the caller asked
            for them, else None.
    """

    ids: np.ndarray
    offsets: np.ndarray
    encodings: list | None = None

    def ids_of(self, index: int) -> np.ndarray:
        return self.ids[self.offsets[index]:self.offsets[index + 1]]


class Encoder(abc.ABC):
    """One backend, loaded for one tokenizer."""

    name: str = ""

    @abc.abstractmethod
    def encode(self, texts: list[str]) -> EncodedBatch:
        """The ids of ``texts``, laid end to end."""


def _offsets_of(lengths: list[int]) -> np.ndarray:
    offsets = np.zeros(len(lengths) + 1, dtype=np.int64)
    np.cumsum(lengths, out=offsets[1:])
    return offsets


class TokenizersEncoder(Encoder):
    """HF ``tokenizers``, the reference.

    Args:
        tokenizer: a loaded tokenizer; it is switched to encode special-token text as text.
        full: also return the encodings (offsets and word ids cost the encoder about half as
            much again), else ids only through ``encode_batch_fast``.
    """

    name = "tokenizers"

    def __init__(self, tokenizer: Tokenizer, *, full: bool = False):
        tokenizer.encode_special_tokens = True
        self.tokenizer = tokenizer
        self.full = full

    def encode(self, texts: list[str]) -> EncodedBatch:
        if self.full:
            encodings = self.tokenizer.encode_batch(texts, add_special_tokens=False)
        else:
            encodings = self.tokenizer.encode_batch_fast(texts, add_special_tokens=False)
        id_lists = [encoding.ids for encoding in encodings]
        offsets = _offsets_of([len(ids) for ids in id_lists])
        # struct packs id lists into int32 bytes faster than numpy converts Python ints.
        data = b"".join(struct.pack(f"={len(ids)}i", *ids) for ids in id_lists)  # "=": native order, 4 bytes
        return EncodedBatch(np.frombuffer(data, dtype=np.int32), offsets, encodings if self.full else None)


class FastokensEncoder(Encoder):
    """fastokens through its flat-buffer API (ids only).

    Raises:
        EncoderUnavailable: fastokens is not importable, or it refuses this tokenizer.json.
    """

    name = "fastokens"

    def __init__(self, tokenizer_json: str):
        try:
            import fastokens
        except Exception as exc:  # an ImportError, or a broken native module
            raise EncoderUnavailable(f"fastokens is not importable ({type(exc).__name__}: {exc})") from None
        try:
            self.tokenizer = fastokens.Tokenizer.from_json_str(tokenizer_json)
        except Exception as exc:
            raise EncoderUnavailable(f"fastokens cannot load this tokenizer ({error_line(exc)})") from None

    def encode(self, texts: list[str]) -> EncodedBatch:
        ids, offsets = self.tokenizer.encode_batch_flat(texts, add_special_tokens=False, split_special_tokens=True)
        # Ids are below 2**31 (vocabularies are far smaller), so the uint32 buffer reads as int32.
        offsets = np.frombuffer(offsets, dtype=np.uint64).astype(np.int64)
        return EncodedBatch(np.frombuffer(ids, dtype=np.int32), offsets)


def error_line(exc: BaseException) -> str:
    """The first line of an exception's message (its class name when it has none)."""
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def fastokens_version() -> str | None:
    """The installed fastokens version, or None when it is not installed."""
    from importlib import metadata

    try:
        return metadata.version("fastokens")
    except metadata.PackageNotFoundError:
        return None


def load_encoder(backend: str, tokenizer_json: str, *, full: bool = False) -> Encoder:
    """The ``backend`` encoder of a tokenizer.json.

    Args:
        backend: ``fastokens`` or ``tokenizers``.
        full: the caller needs offsets and word ids (only ``tokenizers`` gives them).

    Raises:
        EncoderUnavailable: the backend cannot be used here.
        ValueError: an unknown backend.
    """
    if backend == "tokenizers":
        return TokenizersEncoder(Tokenizer.from_str(tokenizer_json), full=full)
    if backend == "fastokens":
        if full:
            raise EncoderUnavailable("fastokens gives no offsets or word ids, which this job needs")
        return FastokensEncoder(tokenizer_json)
    raise ValueError(f"--encoder {backend}: expected one of {', '.join(ENCODER_CHOICES)}")


class _Ids(NamedTuple):
    ids: np.ndarray


def _encodings_of(encoder: Encoder):
    """``texts -> encodings`` (objects with ``ids``, and word ids and offsets for a full
    ``tokenizers`` encoder), as :func:`transforms.long_text.encode_pieces` calls it."""

    def encode(texts: list[str]) -> list:
        batch = encoder.encode(texts)
        if batch.encodings is not None:
            return batch.encodings
        return [_Ids(batch.ids_of(i)) for i in range(len(texts))]

    return encode


def pieces_are_exact_for(encoder: Encoder, tokenizer_json: str) -> bool:
    """Whether a long text's ids are those of its pieces laid end to end
    (:func:`transforms.long_text.pieces_are_exact`), probed with ``encoder``, or with
    ``tokenizers`` where ``encoder`` refuses a probe string (both give the same ids)."""

    def ids_with(backend: Encoder):
        return lambda texts: [ids.tolist() for ids in (backend.encode(texts).ids_of(i) for i in range(len(texts)))]

    try:
        return pieces_are_exact(ids_with(encoder))
    except Exception:
        if encoder.name == "tokenizers":
            raise
        return pieces_are_exact(ids_with(load_encoder("tokenizers", tokenizer_json)))


def encode_bounded(encoder: Encoder, texts: list[str], pieces: bool) -> EncodedBatch:
    """``encoder.encode(texts)``, with every text longer than
    :data:`~transforms.long_text.PIECE_CHARS` characters encoded in bounded pieces when
    ``pieces`` (:func:`pieces_are_exact_for` the encoder): no text makes the encoder hold
    gigabytes. A long text's entry in ``encodings`` is then a
    :class:`~transforms.long_text.PiecedEncoding`."""
    if not pieces or all(len(text) <= PIECE_CHARS for text in texts):
        return encoder.encode(texts)
    short = [index for index, text in enumerate(texts) if len(text) <= PIECE_CHARS]
    batch = encoder.encode([texts[index] for index in short])
    ids: list[np.ndarray] = [np.zeros(0, np.int32)] * len(texts)
    full = batch.encodings is not None
    encodings: list | None = [None] * len(texts) if full else None
    for position, index in enumerate(short):
        ids[index] = batch.ids_of(position)
        if full:
            encodings[index] = batch.encodings[position]
    encode = _encodings_of(encoder)
    for index, text in enumerate(texts):
        if len(text) > PIECE_CHARS:
            pieced = encode_pieces(encode, text, full=full)
            ids[index] = pieced.ids
            if full:
                encodings[index] = pieced
    offsets = _offsets_of([len(row) for row in ids])
    return EncodedBatch(np.concatenate(ids).astype(np.int32, copy=False), offsets, encodings)


def full_encoding(tokenizer: Tokenizer, text: str, pieces: bool):
    """One text's ``tokenizers`` encoding with word ids and offsets, in pieces when it is long
    (then a :class:`~transforms.long_text.PiecedEncoding`)."""
    if pieces and len(text) > PIECE_CHARS:
        return encode_pieces(lambda texts: tokenizer.encode_batch(texts, add_special_tokens=False), text, full=True)
    return tokenizer.encode(text, add_special_tokens=False)


def offset_ends(encoding) -> np.ndarray:
    """Where each token of a full encoding ends, in characters of its text."""
    if isinstance(encoding, PiecedEncoding):
        return encoding.offset_ends
    return np.array([end for _, end in encoding.offsets], dtype=np.int64)


# -- the parity probe -------------------------------------------------------------------------

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


@dataclass
class EncoderChoice:
    """The backend a job encodes with, decided when it is planned.

    Attributes:
        requested: the ``--encoder`` value.
        backend: ``fastokens`` or ``tokenizers``.
        reason: why ``auto`` did not take fastokens (None when it did, or when asked for tokenizers).
        probe: the parity probe: ``result`` (``passed``, ``mismatch`` or ``not_run``), the number of
            ``texts`` and ``characters`` compared, and for a mismatch the ``first_difference``.
    """

    requested: str
    backend: str
    reason: str | None = None
    probe: dict[str, Any] = field(default_factory=lambda: {"result": "not_run"})

    def to_json(self) -> dict[str, Any]:
        """The manifest's ``run.encoder`` entry."""
        from importlib import metadata

        return {
            "requested": self.requested,
            "backend": self.backend,
            "fastokens_version": fastokens_version(),
            "tokenizers_version": metadata.version("tokenizers"),
            "reason": self.reason,
            "probe": dict(self.probe),
        }


def _excerpt(text: str, limit: int = 60) -> str:
    shown = text if len(text) <= limit else text[:limit] + "..."
    return repr(shown)


def choose_encoder(requested: str, tokenizer_json: str, *, needs_full: bool = False,
                   documents: list[str] = ()) -> EncoderChoice:
    """Decide the job's encoder backend (``--encoder``), probing fastokens against tokenizers.

    Args:
        requested: ``auto``, ``fastokens`` or ``tokenizers``.
        tokenizer_json: the tokenizer the job encodes with (added tokens included).
        needs_full: the job needs offsets or word ids from the encoder (its per-token features
            cannot be derived from the ids and the text for this tokenizer).
        documents: the corpus sample for the probe.

    Raises:
        ValueError: ``--encoder fastokens`` where fastokens cannot be used or the probe fails
            (a configuration error), or an unknown value.
    """
    if requested not in ENCODER_CHOICES:
        raise ValueError(f"--encoder {requested}: expected one of {', '.join(ENCODER_CHOICES)}")
    if requested == "tokenizers":
        return EncoderChoice(requested, "tokenizers")

    def refuse(reason: str, probe: dict[str, Any] | None = None) -> EncoderChoice:
        if requested == "fastokens":
            raise ValueError(f"--encoder fastokens: {reason} (use --encoder auto or tokenizers)")
        return EncoderChoice(requested, "tokenizers", reason, probe or {"result": "not_run"})

    if needs_full:
        return refuse("this tokenizer's word or sentence starts need the offsets and word ids of tokenizers, "
                      "which fastokens does not give")
    try:
        fast = FastokensEncoder(tokenizer_json)
    except EncoderUnavailable as exc:
        return refuse(str(exc))
    reference_tokenizer = Tokenizer.from_str(tokenizer_json)
    added = [token.content for token in reference_tokenizer.get_added_tokens_decoder().values()]
    reference = TokenizersEncoder(reference_tokenizer)
    texts = probe_texts(added, documents)
    probe: dict[str, Any] = {"texts": len(texts), "characters": sum(map(len, texts))}
    try:
        fast_ids = fast.encode(texts)
    except Exception as exc:
        return refuse(f"fastokens failed on the parity probe ({error_line(exc)})", {**probe, "result": "error"})
    index = first_difference(reference.encode(texts), fast_ids)
    if index is not None:
        where = "corpus document" if index >= len(texts) - len(documents) else "probe text"
        probe.update(result="mismatch", first_difference=_excerpt(texts[index]))
        return refuse(f"fastokens encodes the {where} {_excerpt(texts[index])} differently from tokenizers", probe)
    probe["result"] = "passed"
    return EncoderChoice(requested, "fastokens", None, probe)
