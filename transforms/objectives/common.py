"""Helpers shared by every objective and by both sides of the project.

Owns: stable digests of keys (never Python's ``hash()``), per-example random
generators seeded from (seed, digest of the example key, extra ints), and the
:class:`SpecialIds` record that tells an objective which token ids are special.

Objectives run once per example, so the per-call costs here matter: seeding takes a
shortcut that yields the very same stream as ``np.random.default_rng([...])``,
:class:`SpecialIds` builds its lookup tables once, and :func:`index_range` hands out
slices of one shared ``arange``.

Determinism contract (DESIGN.md section 3): an example's noise is a pure function of
``(seed, example key, config)``; nothing here depends on arrival order, process or time.
"""

from __future__ import annotations

import hashlib
import sys
from dataclasses import dataclass, field

import numpy as np

__all__ = [
    "LazyGenerator",
    "SpecialIds",
    "digest",
    "digest_u64",
    "first_uniforms",
    "example_rng",
    "example_rngs",
    "generator_of",
    "ids_out_of_range",
    "index_range",
    "padded_rows",
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


_RNG_HASH = hashlib.blake2b(digest_size=8, person=b"lmshards-rng".ljust(16, b"\0"))


def _entropy(values: list[int]) -> int | list[int]:
    """``values`` as one int whose 32-bit words are the words of each value in turn.

    ``SeedSequence`` turns a list of ints into the concatenation of each int's 32-bit words
    (at least one word each); one int with the same words seeds it identically, and skips
    the list's per-element conversion. A last value of 0 would lose its word: keep the list.
    """
    if values[-1] == 0:
        return values
    packed, shift = 0, 0
    for value in values:
        packed |= value << shift
        shift += 32 * max(1, (value.bit_length() + 31) // 32)
    return packed


def _seed_hash_constants() -> tuple[tuple[int, int], ...]:
    # SeedSequence.generate_state hashes pool word i % pool_size with a running constant:
    # ``w ^= c; c *= MULT; w *= c; w ^= w >> 16`` (32-bit). The constants do not depend on the data.
    constants, current = [], 0x8B51F9DD  # INIT_B
    for _ in range(8):
        following = (current * 0x58F38DED) & 0xFFFFFFFF  # MULT_B
        constants.append((current, following))
        current = following
    return tuple(constants)


_STATE_HASH = _seed_hash_constants()


class _SeedSequence(np.random.SeedSequence):
    """``SeedSequence`` whose ``generate_state(4, np.uint64)`` (what ``PCG64`` asks for) runs
    as a few Python int operations on the mixed pool instead of numpy's general routine,
    which costs more than the rest of seeding. Same words, same generator; anything else
    goes to the base class."""

    def generate_state(self, n_words, dtype=np.uint32):
        if n_words != 4 or dtype is not np.uint64 or self.pool_size != 4 or sys.byteorder != "little":
            return super().generate_state(n_words, dtype)
        return np.array(_state_words(self.pool.tolist()), dtype=np.uint64)


def _state_words(pool: list) -> list:
    """``generate_state(4, np.uint64)`` of a 4-word mixed pool: four 64-bit words. The pool
    words are ints or numpy uint64 arrays (values below 2**32), and so are the results."""
    words = []
    for index, (xor, multiplier) in enumerate(_STATE_HASH):
        word = ((pool[index & 3] ^ xor) * multiplier) & 0xFFFFFFFF
        words.append(word ^ (word >> 16))
    return [words[i] | words[i + 1] << 32 for i in range(0, 8, 2)]


def _key_u64(key: bytes | str) -> int:
    """The 64-bit digest of an example key that seeds its generator."""
    hasher = _RNG_HASH.copy()
    hasher.update(key.encode("utf-8") if isinstance(key, str) else key)
    return int.from_bytes(hasher.digest(), "little")


def example_rng(seed: int, key: bytes | str, *extra: int) -> np.random.Generator:
    """A generator seeded by ``(seed, u64(digest(key)), *extra)``.

    Every example draws its noise from its own generator, so output never depends on
    the order in which a runner delivers elements. Same stream as
    ``np.random.default_rng([seed, digest_u64(key, salt=b"lmshards-rng"), *extra])``.
    """
    if seed < 0:
        raise ValueError(f"seed must be >= 0, got {seed}")
    key_u64 = _key_u64(key)
    if not extra and seed <= 0xFFFFFFFF and key_u64:  # the pipeline's case: words [seed, key_lo, key_hi]
        entropy: int | list[int] = seed | key_u64 << 32
    else:
        entropy = _entropy([seed & _MASK64, key_u64, *(int(e) & _MASK64 for e in extra)])
    return np.random.Generator(np.random.PCG64(_SeedSequence(entropy)))


# SeedSequence's entropy mixing (numpy/random/bit_generator.pyx): a hash constant that starts
# at INIT_A and is multiplied by MULT_A on every hashmix call, and the mix of two pool words.
_INIT_A, _MULT_A = 0x43B0D7E5, 0x931E8875
_MIX_MULT_L, _MIX_MULT_R = 0xCA01F9DD, 0x4973F715
_MASK32 = 0xFFFFFFFF
_MASK128 = (1 << 128) - 1
#: PCG64's 128-bit LCG multiplier (numpy/random/src/pcg64/pcg64.h, PCG_DEFAULT_MULTIPLIER_128).
_PCG_MULT = (2549297995355413924 << 64) + 4865540595714422341


def _words(value: int) -> list[int]:
    """``SeedSequence``'s 32-bit words of a non-negative int (at least one)."""
    words = []
    while True:
        words.append(value & _MASK32)
        value >>= 32
        if not value:
            return words


def _pool_words(entropy: list) -> list:
    """The four mixed pool words of ``SeedSequence`` for entropy words given as numpy
    uint64 arrays (values below 2**32, all the same length) or ints; vectorized over them."""
    constant = _INIT_A

    def hashmix(value):
        nonlocal constant
        value = value ^ constant
        constant = (constant * _MULT_A) & _MASK32
        value = (value * constant) & _MASK32
        return value ^ (value >> 16)

    def mix(x, y):
        result = (x * _MIX_MULT_L - y * _MIX_MULT_R) & _MASK32
        return result ^ (result >> 16)

    pool = [hashmix(entropy[i] if i < len(entropy) else 0) for i in range(4)]
    for source in range(4):
        for target in range(4):
            if source != target:
                pool[target] = mix(pool[target], hashmix(pool[source]))
    for source in range(4, len(entropy)):
        for target in range(4):
            pool[target] = mix(pool[target], hashmix(entropy[source]))
    return pool


def _initial_states(seed: int, keys: list[bytes | str], extra: tuple) -> tuple[np.ndarray, list[list[int]]]:
    """For the keys whose 64-bit digest has two 32-bit words (all but about one in 2**32):
    which keys those are, and ``generate_state(4, np.uint64)`` of their ``SeedSequence``
    (four lists of ints, one entry per such key), vectorized over the keys."""
    if seed < 0:
        raise ValueError(f"seed must be >= 0, got {seed}")
    key_u64 = np.fromiter(map(_key_u64, keys), dtype=np.uint64, count=len(keys))
    two_words = key_u64 > _MASK32  # a digest below 2**32 (one word) is left to example_rng
    head = _words(seed & _MASK64)
    tail = [w for value in extra for w in _words(int(value) & _MASK64)]
    keyed = key_u64[two_words]
    pool = _pool_words([*head, keyed & _MASK32, keyed >> 32, *tail])
    return two_words, [words.tolist() for words in _state_words(pool)]


def first_uniforms(seed: int, keys: list[bytes | str], *extra: int) -> np.ndarray:
    """``[example_rng(seed, key, *extra).random() for key in keys]``, without making generators.

    The first double of PCG64 seeded through ``SeedSequence`` is worked out directly: the
    entropy mixing and ``generate_state`` vectorized over the keys (32-bit words in uint64
    arrays), then PCG64's seeding and first step as Python ints. About twenty times faster
    than seeding a generator per key, for planners that draw one number per chunk.
    """
    two_words, values = _initial_states(seed, keys, extra)
    out = np.empty(len(keys), dtype=np.float64)
    draws = []
    for seed_high, seed_low, inc_high, inc_low in zip(*values):
        increment = (((inc_high << 64 | inc_low) << 1) | 1) & _MASK128
        lcg = (increment + (seed_high << 64 | seed_low)) & _MASK128  # pcg64_srandom_r: step from 0, add, step
        lcg = (lcg * _PCG_MULT + increment) & _MASK128
        lcg = (lcg * _PCG_MULT + increment) & _MASK128  # the first draw's step
        xored, rotation = ((lcg >> 64) ^ lcg) & _MASK64, lcg >> 122
        draws.append((((xored >> rotation) | (xored << (64 - rotation))) & _MASK64) >> 11)
    out[two_words] = np.asarray(draws, dtype=np.float64) * (1.0 / 9007199254740992.0)
    for index in np.flatnonzero(~two_words).tolist():
        out[index] = example_rng(seed, keys[index], *extra).random()
    return out


class _StateWords:
    """A seed sequence that hands ``PCG64`` state words worked out beforehand (registered as an
    ``ISeedSequence``, which is all ``BitGenerator`` asks of its seed)."""

    __slots__ = ("_words",)

    def __init__(self, words: np.ndarray):
        self._words = words

    def generate_state(self, n_words, dtype=np.uint32):
        if n_words != 4 or dtype is not np.uint64:
            raise ValueError(f"precomputed PCG64 state words, asked for {n_words} of {dtype}")
        return self._words


np.random.bit_generator.ISeedSequence.register(_StateWords)


def example_rngs(seed: int, keys: list[bytes | str], *extra: int) -> list[np.random.Generator]:
    """``[example_rng(seed, key, *extra) for key in keys]``, seeded together.

    The seed sequences' mixing runs vectorized over the keys (:func:`first_uniforms`' way)
    and each ``PCG64`` starts from its words: about 3 us a generator instead of 14.
    """
    two_words, values = _initial_states(seed, keys, extra)
    # one C-contiguous row of four words per generator: PCG64 reads the array's buffer as it is
    states = np.ascontiguousarray(np.array(values, dtype=np.uint64).T) if values[0] else np.zeros((0, 4), np.uint64)
    out: list[np.random.Generator | None] = [None] * len(keys)
    for index, words in zip(np.flatnonzero(two_words).tolist(), states):
        out[index] = np.random.Generator(np.random.PCG64(_StateWords(words)))
    for index in np.flatnonzero(~two_words).tolist():
        out[index] = example_rng(seed, keys[index], *extra)
    return out


def padded_rows(rows: list[np.ndarray], width: int, pad: int) -> tuple[np.ndarray, np.ndarray, int]:
    """``rows`` as one ``(len(rows), width)`` int32 array, each padded with ``pad`` at its end:
    ``(flat values, int64 row offsets, padding tokens)``.

    Raises:
        ValueError: a row longer than ``width``.
    """
    lengths = np.fromiter(map(len, rows), dtype=np.int64, count=len(rows))
    if rows and int(lengths.max()) > width:
        raise ValueError(f"a row of {int(lengths.max())} tokens does not fit the fixed length {width}")
    padded = np.full((len(rows), width), pad, dtype=np.int32)
    if rows:
        padded[index_range(width) < lengths[:, None]] = np.concatenate(rows)
    return padded.reshape(-1), np.arange(len(rows) + 1, dtype=np.int64) * width, len(rows) * width - int(lengths.sum())


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


class LazyGenerator:
    """Behaves as ``example_rng(seed, key, *extra)``, built on first use.

    Seeding a generator costs about 10 us, more than a clm example takes to build; most
    chunk plans and some objectives never draw, so the pipeline hands out these instead.
    """

    __slots__ = ("_args", "_generator")

    def __init__(self, seed: int, key: bytes | str, *extra: int):
        self._args = (seed, key, *extra)
        self._generator: np.random.Generator | None = None

    def generator(self) -> np.random.Generator:
        """The seeded generator (seeded now if it was not yet)."""
        generator = self._generator
        if generator is None:
            generator = self._generator = example_rng(*self._args)
        return generator

    def __getattr__(self, name: str):
        generator = self._generator
        if generator is None:
            generator = self._generator = example_rng(*self._args)
        return getattr(generator, name)


def generator_of(rng: np.random.Generator) -> np.random.Generator:
    """The generator behind ``rng``: a :class:`LazyGenerator` is seeded and unwrapped.

    Objectives that draw on every example call this once, so that each draw skips the
    lazy wrapper's attribute forwarding; the stream is the same.
    """
    return rng.generator() if type(rng) is LazyGenerator else rng


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

    def sentinel_array(self) -> np.ndarray:
        """int64 array of :attr:`sentinels` in order; read-only, built once."""
        cached = self.__dict__.get("_sentinel_array")
        if cached is None:
            cached = np.array(self.sentinels, dtype=np.int64)
            cached.setflags(write=False)
            object.__setattr__(self, "_sentinel_array", cached)
        return cached

    def sentinel_range(self) -> tuple[int, int] | None:
        """``(lowest, highest)`` sentinel id when the sentinels are exactly the ids of that
        range (T5's descending ``<extra_id_k>`` ids too), so a range test can replace ``np.isin``;
        None otherwise (no sentinels, gaps, repeats)."""
        cached = self.__dict__.get("_sentinel_range", False)
        if cached is False:
            ids = set(self.sentinels)
            cached = None
            if ids and max(ids) - min(ids) + 1 == len(ids) == len(self.sentinels):
                cached = (int(min(ids)), int(max(ids)))
            object.__setattr__(self, "_sentinel_range", cached)
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

    def non_special_rank_list(self) -> list[int]:
        """The ``shifted`` array of :meth:`non_special_ranks` as a list (for ``bisect``); built once."""
        cached = self.__dict__.get("_non_special_rank_list")
        if cached is None:
            cached = self.non_special_ranks()[1].tolist()
            object.__setattr__(self, "_non_special_rank_list", cached)
        return cached

    def non_special_ids(self) -> np.ndarray:
        """int32 array of every id a random replacement may produce."""
        keep = np.ones(self.vocab_size, dtype=bool)
        special = self.special_array()
        # -1 marks a role the tokenizer lacks; as an index it would drop the last id.
        keep[special[(special >= 0) & (special < self.vocab_size)]] = False
        return np.flatnonzero(keep).astype(np.int32)
