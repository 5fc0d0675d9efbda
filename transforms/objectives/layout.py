"""Where things go in a dataset: the hashes that place examples in shards, order rows
inside a shard, and seed a chunk's plan (pure; shared by the writer and the readers).

- shard of an example: ``digest_u64(f"{seed}:{key}", salt=b"lmshards-shard") % num_shards``;
- row order inside a shard: ascending ``digest(f"{seed}:{key}", salt=b"lmshards-order")``
  (this is the dataset's global shuffle);
- the shard count of a split: ``--num-shards`` for train, otherwise sized by
  ``--shard-size-mb`` from the split's document tokens (:func:`shard_count`);
- a chunk's plan (chunk length, UL2 denoiser): drawn from
  ``example_rng(seed, chunk_key, PLAN_SALT)``, independent of the example's own noise.

Changing any of these changes the bytes of every dataset: they are part of the format.
"""

from __future__ import annotations

import math

import numpy as np

from transforms.objectives.common import LazyGenerator, digest, digest_u64

__all__ = ["PLAN_SALT", "SHARD_SALT", "plan_rng", "row_order_key", "shard_count", "shard_hash", "shard_key", "shard_of"]

PLAN_SALT = 0x504C414E  # "PLAN"
SHARD_SALT = b"lmshards-shard"


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


def shard_key(seed: int, key: str) -> str:
    """The string whose salted digest places example ``key`` (see :func:`shard_of`)."""
    return f"{seed}:{key}"


def shard_hash(seed: int, key: str) -> int:
    """The 64-bit digest that places example ``key``: its shard is this modulo the shard count."""
    return digest_u64(shard_key(seed, key), salt=SHARD_SALT)


def shard_of(seed: int, key: str, num_shards: int) -> int:
    """Index of the shard that holds example ``key``."""
    return shard_hash(seed, key) % num_shards


def row_order_key(seed: int, key: str) -> bytes:
    """Sort key of example ``key`` inside its shard."""
    return digest(f"{seed}:{key}", salt=b"lmshards-order")


def plan_rng(seed: int, chunk_key: str) -> np.random.Generator:
    """The generator an objective plans chunk ``chunk_key`` with (seeded on first use)."""
    return LazyGenerator(seed, chunk_key, PLAN_SALT)  # type: ignore[return-value]
