"""The encoder seam: token ids of a batch of texts, from one of two exact backends.

- ``tokenizers`` (HF, the reference): ``Tokenizer.encode_batch_fast``, or ``encode_batch``
  when the caller needs the encodings' offsets and word ids.
- ``fastokens``: a Rust BPE encoder that reads the same tokenizer.json and gives the same
  ids; ``encode_batch_flat`` returns one id buffer and offsets, with no per-token Python
  objects. It does not load every tokenizer (WordPiece, Unigram and some normalizers and
  pre-tokenizers are refused at load) and gives no offsets or word ids.

Exactness is the contract: a dataset's bytes never depend on the backend. Which backend a
job uses is decided once, when it is planned (:func:`transforms.tokenizing.encoder_choice.choose_encoder`,
with the parity probe of :mod:`transforms.tokenizing.encoder_probe`); workers then load the backend the
plan chose (:func:`load_encoder`) and fail loudly if they cannot. Texts longer than
:data:`~transforms.tokenizing.long_text.PIECE_CHARS` characters are encoded in bounded pieces
(:func:`encode_bounded`).

Literal special-token text is text: both backends encode ``</s>`` or ``<extra_id_0>`` in a
document as ordinary characters (``encode_special_tokens = True`` for ``tokenizers``,
``split_special_tokens=True`` for fastokens), never as control ids.
"""

from __future__ import annotations

import abc
import struct
from typing import NamedTuple

import numpy as np
from tokenizers import Tokenizer

from schemas.errors import ConfigError, LmshardsError
from transforms.tokenizing.long_text import PIECE_CHARS, PiecedEncoding, encode_pieces, pieces_are_exact

__all__ = [
    "BACKENDS",
    "ENCODER_CHOICES",
    "EncodedBatch",
    "Encoder",
    "EncoderUnavailable",
    "FastokensEncoder",
    "TokenizersEncoder",
    "encode_bounded",
    "error_line",
    "full_encoding",
    "offset_ends",
    "pieces_are_exact_for",
    "fastokens_version",
    "load_encoder",
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
        ConfigError: an unknown backend.
    """
    if backend == "tokenizers":
        return TokenizersEncoder(Tokenizer.from_str(tokenizer_json), full=full)
    if backend == "fastokens":
        if full:
            raise EncoderUnavailable("fastokens gives no offsets or word ids, which this job needs")
        return FastokensEncoder(tokenizer_json)
    raise ConfigError(f"--encoder {backend}: expected one of {', '.join(ENCODER_CHOICES)}")


class _Ids(NamedTuple):
    ids: np.ndarray


def _encodings_of(encoder: Encoder):
    """``texts -> encodings`` (objects with ``ids``, and word ids and offsets for a full
    ``tokenizers`` encoder), as :func:`transforms.tokenizing.long_text.encode_pieces` calls it."""

    def encode(texts: list[str]) -> list:
        batch = encoder.encode(texts)
        if batch.encodings is not None:
            return batch.encodings
        return [_Ids(batch.ids_of(i)) for i in range(len(texts))]

    return encode


def pieces_are_exact_for(encoder: Encoder, tokenizer_json: str) -> bool:
    """Whether a long text's ids are those of its pieces laid end to end
    (:func:`transforms.tokenizing.long_text.pieces_are_exact`), probed with ``encoder``, or with
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
    :data:`~transforms.tokenizing.long_text.PIECE_CHARS` characters encoded in bounded pieces when
    ``pieces`` (:func:`pieces_are_exact_for` the encoder): no text makes the encoder hold
    gigabytes. A long text's entry in ``encodings`` is then a
    :class:`~transforms.tokenizing.long_text.PiecedEncoding`."""
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
    (then a :class:`~transforms.tokenizing.long_text.PiecedEncoding`)."""
    if pieces and len(text) > PIECE_CHARS:
        return encode_pieces(lambda texts: tokenizer.encode_batch(texts, add_special_tokens=False), text, full=True)
    return tokenizer.encode(text, add_special_tokens=False)


def offset_ends(encoding) -> np.ndarray:
    """Where each token of a full encoding ends, in characters of its text."""
    if isinstance(encoding, PiecedEncoding):
        return encoding.offset_ends
    return np.array([end for _, end in encoding.offsets], dtype=np.int64)
