"""Helpers shared by every objective and by both sides of the project.

Owns: stable digests of keys (never Python's ``hash()``), per-example random
generators seeded from (seed, digest of the example key, extra ints), and the
:class:`SpecialIds` record that tells an objective which token ids are special.

Determinism contract (DESIGN.md section 3): an example's noise is a pure function of
``(seed, example key, config)``; nothing here depends on arrival order, process or time.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field

import numpy as np

__all__ = [
    "LazyGenerator",
    "SpecialIds",
    "digest",
    "digest_u64",
    "example_rng",
    "unit_interval",
]

_MASK64 = (1 << 64) - 1


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


def example_rng(seed: int, key: bytes | str, *extra: int) -> np.random.Generator:
    """A generator seeded by ``(seed, u64(digest(key)), *extra)``.

    Every example draws its noise from its own generator, so output never depends on
    the order in which a runner delivers elements.
    """
    if seed < 0:
        raise ValueError(f"seed must be >= 0, got {seed}")
    entropy = [seed & _MASK64, digest_u64(key, salt=b"lmshards-rng"), *(int(e) & _MASK64 for e in extra)]
    return np.random.default_rng(entropy)


class LazyGenerator:
    """Behaves as ``example_rng(seed, key, *extra)``, built on first use.

    Seeding a generator costs about 10 us, more than a clm example takes to build; most
    chunk plans and some objectives never draw, so the pipeline hands out these instead.
    """

    __slots__ = ("_args", "_generator")

    def __init__(self, seed: int, key: bytes | str, *extra: int):
        self._args = (seed, key, *extra)
        self._generator: np.random.Generator | None = None

    def __getattr__(self, name: str):
        generator = self._generator
        if generator is None:
            generator = self._generator = example_rng(*self._args)
        return getattr(generator, name)


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
        mode_tokens: UL2 mode token string -> id (for example ``"[R]"`` -> 260).
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

    def non_special_ids(self) -> np.ndarray:
        """int32 array of every id a random replacement may produce."""
        keep = np.ones(self.vocab_size, dtype=bool)
        special = self.special_array()
        # -1 marks a role the tokenizer lacks; as an index it would drop the last id.
        keep[special[(special >= 0) & (special < self.vocab_size)]] = False
        return np.flatnonzero(keep).astype(np.int32)
