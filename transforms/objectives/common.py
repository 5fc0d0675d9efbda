"""Helpers shared by every objective and by both sides of the project.

Owns: stable digests of keys (never Python's ``hash()``), the :class:`SpecialIds` record
that tells an objective which token ids are special, with lookup tables built once, and
:data:`IGNORE_INDEX`, the label of a position without loss. The
counter-based random numbers are :mod:`transforms.objectives.randoms`, keyed by
:func:`transforms.objectives.layout.example_digests`.

Determinism contract (docs/design.md section 3): an example's noise is a pure function of
``(seed, example key, config)``; nothing here depends on arrival order, process or time.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field

import numpy as np

__all__ = ["IGNORE_INDEX", "SpecialIds", "digest", "digest_u64", "ids_out_of_range", "index_range", "unit_interval"]

#: The label of a position that carries no loss (PyTorch's ``CrossEntropyLoss`` default, HF's -100):
#: what MLM stores in ``labels`` and the collators put where nothing is predicted.
IGNORE_INDEX = -100


def digest(data: bytes | str, *, salt: bytes = b"", size: int = 16) -> bytes:
    """Stable blake2b digest of ``data`` (str is UTF-8 encoded)."""
    if isinstance(data, str):
        data = data.encode("utf-8")
    return hashlib.blake2b(data, digest_size=size, person=salt[:16].ljust(16, b"\0")).digest()


def digest_u64(data: bytes | str, *, salt: bytes = b"") -> int:
    """Stable unsigned 64-bit integer digest of ``data``."""
    return int.from_bytes(digest(data, salt=salt, size=8), "little")


def unit_interval(data: bytes | str, *, salt: bytes = b"") -> float:
    """Map ``data`` to a stable float in [0, 1) (53 bits of a digest)."""
    return (digest_u64(data, salt=salt) >> 11) / float(1 << 53)


def index_range(size: int) -> np.ndarray:
    """Read-only ``np.arange(size)`` (int64): a slice of one shared array, so objectives
    need not allocate the same ranges for every example."""
    global _INDEX_RANGE
    if size > _INDEX_RANGE.size:  # only ever grows, so a slice is always complete
        grown = np.arange(max(size, 2 * _INDEX_RANGE.size), dtype=np.int64)
        grown.setflags(write=False)
        _INDEX_RANGE = grown
    return _INDEX_RANGE[:size]


_INDEX_RANGE = np.arange(1024, dtype=np.int64)
_INDEX_RANGE.setflags(write=False)


def ids_out_of_range(tokens: np.ndarray, vocab_size: int) -> bool:
    """Whether some id of a non-empty integer array (any shape) lies outside ``[0, vocab_size)``.

    One pass instead of ``min`` and ``max``: read as unsigned, negative ids are huge.
    """
    dtype = tokens.dtype
    if dtype.kind == "i":
        tokens = tokens.view(_UNSIGNED.get(dtype) or dtype.str.replace("i", "u"))
    return int(np.maximum.reduce(tokens, axis=None)) >= vocab_size


_UNSIGNED = {np.dtype(np.int32): np.dtype(np.uint32), np.dtype(np.int64): np.dtype(np.uint64)}


@dataclass(frozen=True)
class SpecialIds:
    """Token ids an objective needs to know about.

    Attributes:
        vocab_size: size of the tokenizer vocabulary, added tokens included.
        pad: padding id.
        eos: end-of-sequence id (``</s>``).
        bos: beginning-of-sequence id (``<s>``), or None when the tokenizer has none.
        unk: unknown-token id, or None.
        mask: the MLM/BART mask id, or None when the objective does not need one.
        cls: classifier id for BERT-style framing, or None.
        sep: separator id for BERT-style framing, or None.
        sentinels: ids of ``<extra_id_0>``, ``<extra_id_1>``, ... in that order.
        mode_tokens: the objective's own tokens (``Objective.token_needs().tokens``), token
            string -> id: UL2's mode tokens (for example ``"[R]"`` -> 260), a plugin's markers.
            Named after UL2's, the first objective with tokens of its own, as the manifest's
            tokenizer key that records them is.
        all_special: every id that must never be masked, selected or produced as a
            random replacement (the ids above plus any other added special token).
    """

    vocab_size: int
    pad: int
    eos: int
    bos: int | None = None
    unk: int | None = None
    mask: int | None = None
    cls: int | None = None
    sep: int | None = None
    sentinels: tuple[int, ...] = ()
    mode_tokens: dict[str, int] = field(default_factory=dict)
    all_special: frozenset[int] = frozenset()

    def special_array(self) -> np.ndarray:
        """Sorted int32 array of every special id (for ``np.isin``); read-only, built once."""
        cached = self.__dict__.get("_special_array")
        if cached is None:
            ids = set(self.all_special)
            for value in (self.pad, self.eos, self.bos, self.unk, self.mask, self.cls, self.sep):
                if value is not None:
                    ids.add(value)
            ids.update(self.sentinels)
            ids.update(self.mode_tokens.values())
            cached = np.array(sorted(ids), dtype=np.int32)
            cached.setflags(write=False)
            # Not a field: equality, hashing and repr ignore it (objectives call this per example).
            object.__setattr__(self, "_special_array", cached)
        return cached

    def sentinel_array(self) -> np.ndarray:
        """int64 array of :attr:`sentinels` in order; read-only, built once."""
        cached = self.__dict__.get("_sentinel_array")
        if cached is None:
            cached = np.array(self.sentinels, dtype=np.int64)
            cached.setflags(write=False)
            object.__setattr__(self, "_sentinel_array", cached)
        return cached

    def sentinel_index(self) -> dict[int, int]:
        """Sentinel id -> its index ``k`` (``<extra_id_k>``); read-only use, built once."""
        cached = self.__dict__.get("_sentinel_index")
        if cached is None:
            cached = {int(t): k for k, t in enumerate(self.sentinels)}
            object.__setattr__(self, "_sentinel_index", cached)
        return cached

    def special_flags(self) -> np.ndarray:
        """bool array over the vocabulary, True at every special id (``flags[tokens]`` is
        ``np.isin(tokens, special_array())`` for ids in ``[0, vocab_size)``); read-only, built once."""
        cached = self.__dict__.get("_special_flags")
        if cached is None:
            cached = np.zeros(max(self.vocab_size, 0), dtype=bool)
            special = self.special_array()
            cached[special[(special >= 0) & (special < self.vocab_size)]] = True
            cached.setflags(write=False)
            object.__setattr__(self, "_special_flags", cached)
        return cached

    def non_special_ranks(self) -> tuple[int, np.ndarray]:
        """``(n, shifted)``: the number of non-special ids, and the sorted in-vocabulary special
        ids minus their rank, so that the j-th non-special id is
        ``j + searchsorted(shifted, j, side="right")``; read-only, built once."""
        cached = self.__dict__.get("_non_special_ranks")
        if cached is None:
            specials = self.special_array()
            specials = specials[(specials >= 0) & (specials < self.vocab_size)]
            shifted = specials.astype(np.int64) - np.arange(specials.size)
            shifted.setflags(write=False)
            cached = (int(self.vocab_size - specials.size), shifted)
            object.__setattr__(self, "_non_special_ranks", cached)
        return cached

    def ids_of_ranks(self, ranks: np.ndarray) -> np.ndarray:
        """int32 non-special ids of ``ranks`` in ``[0, n)`` (:meth:`non_special_ranks`): rank ``j``
        is the ``j``-th smallest id that is not special."""
        ranks = np.asarray(ranks, dtype=np.int64)
        return (ranks + self.non_special_ranks()[1].searchsorted(ranks, side="right")).astype(np.int32)

    def non_special_ids(self) -> np.ndarray:
        """int32 array of every id a random replacement may produce."""
        keep = np.ones(self.vocab_size, dtype=bool)
        special = self.special_array()
        # -1 marks a role the tokenizer lacks; as an index it would drop the last id.
        keep[special[(special >= 0) & (special < self.vocab_size)]] = False
        return np.flatnonzero(keep).astype(np.int32)
