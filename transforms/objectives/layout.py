"""Where things go in a dataset: the hashes that place examples in shards, order rows
inside a shard, key their noise, and plan chunks (pure; shared by the writer and the readers).

One blake2b digest of ``f"{seed}:{key}"`` (32 bytes, personalised ``lmshards-example``) per
example gives all three of its numbers (:func:`example_digests`):

- bytes 0-7: the shard of the example is this little-endian uint64 modulo ``num_shards``;
- bytes 8-23: its row order inside the shard (ascending bytes: the dataset's global shuffle);
- bytes 24-31: the row key of its counter-based noise (:mod:`transforms.objectives.randoms`).

The shard count of a split is ``--num-shards`` for train, otherwise sized by ``--shard-size-mb``
from the split's document tokens (:func:`shard_count`). A chunk's plan (UL2's denoiser) comes
from :func:`plan_uniforms`: stream 0 of the chunk key's own digest (personalised
``lmshards-plan``), independent of the example's noise.

Changing any of these changes the bytes of every dataset: they are part of the format.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Sequence
from typing import NamedTuple

import numpy as np

from transforms.objectives.randoms import Randoms

__all__ = ["ExampleDigests", "chunk_key_of", "example_digests", "example_randoms", "plan_uniforms", "row_order_key",
           "shard_count", "shard_hash", "shard_of"]

_EXAMPLE = hashlib.blake2b(digest_size=32, person=b"lmshards-example")
_PLAN = hashlib.blake2b(digest_size=8, person=b"lmshards-plan")


def shard_count(
    split: str,
    tokens: int,
    *,
    num_shards: int | None,
    tokens_per_example: int,
    draws: int,
    bytes_per_example: int,
    shard_bytes: int,
) -> int:
    """Number of shards of a split.

    ``num_shards`` for train when given; otherwise the smallest count that keeps shards
    under ``shard_bytes``, estimated from the split's document tokens (EOS included): about
    ``ceil(tokens / tokens_per_example) * draws`` examples of ``bytes_per_example`` bytes.
    The estimate is known before any example is built, so every example's shard is decided
    where it is made.
    """
    if split == "train" and num_shards:
        return num_shards
    examples = math.ceil(tokens / max(1, tokens_per_example)) * draws
    return max(1, math.ceil(examples * bytes_per_example / shard_bytes))


class ExampleDigests(NamedTuple):
    """The numbers :func:`example_digests` derives from examples' keys.

    Attributes:
        shard_hashes: ``(n,)`` uint64; an example's shard is its value modulo the shard count.
        orders: ``(n, 16)`` uint8 row-order keys, compared bytewise.
        randoms: the examples' counter-based random numbers.
    """

    shard_hashes: np.ndarray
    orders: np.ndarray
    randoms: Randoms


def _keyed_digests(salted, seed: int, keys: Sequence[str]) -> bytes:
    """The digests of ``keys`` by a copy of hasher ``salted`` fed ``"<seed>:"`` first, joined."""
    if seed < 0:
        raise ValueError(f"seed must be >= 0, got {seed}")
    prefix = salted.copy()
    prefix.update(f"{seed}:".encode())
    parts = []
    for key in keys:
        hasher = prefix.copy()
        hasher.update(key.encode("utf-8"))
        parts.append(hasher.digest())
    return b"".join(parts)


def _digests(seed: int, keys: Sequence[str]) -> np.ndarray:
    return np.frombuffer(_keyed_digests(_EXAMPLE, seed, keys), dtype=np.uint8).reshape(len(keys), 32)


def example_digests(seed: int, keys: Sequence[str]) -> ExampleDigests:
    """Shard hashes, row-order keys and noise row keys of examples (one digest each)."""
    digests = _digests(seed, keys)
    words = digests.view("<u8")
    return ExampleDigests(words[:, 0].astype(np.uint64), digests[:, 8:24], Randoms(words[:, 3].astype(np.uint64)))


def example_randoms(seed: int, keys: Sequence[str], *extra: int) -> Randoms:
    """The counter-based randoms of examples (``extra`` ints, e.g. the loader's epoch, mixed in)."""
    randoms = example_digests(seed, keys).randoms
    return randoms.with_extra(*extra) if extra else randoms


def shard_hash(seed: int, key: str) -> int:
    """The 64-bit digest that places example ``key``: its shard is this modulo the shard count."""
    return int(example_digests(seed, [key]).shard_hashes[0])


def shard_of(seed: int, key: str, num_shards: int) -> int:
    """Index of the shard that holds example ``key``."""
    return shard_hash(seed, key) % num_shards


def row_order_key(seed: int, key: str) -> bytes:
    """Sort key of example ``key`` inside its shard (16 bytes, compared bytewise)."""
    return example_digests(seed, [key]).orders[0].tobytes()


def chunk_key_of(example_key: str) -> str:
    """The chunk key an example key derives from (``<chunk>-d<draw>``, transforms/building/parallel.py)."""
    return example_key.rsplit("-d", 1)[0]


def plan_uniforms(seed: int, chunk_keys: Sequence[str]) -> np.ndarray:
    """One number in [0, 1) per chunk key: what :meth:`~transforms.objectives.base.Objective.plan`
    plans the chunk with (stream 0, counter 0 of the chunk key's own row key)."""
    keys = np.frombuffer(_keyed_digests(_PLAN, seed, chunk_keys), dtype="<u8").astype(np.uint64)
    return Randoms(keys).uniforms(0, 1).reshape(-1)
