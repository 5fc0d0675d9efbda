"""Tests of transforms/objectives/common.py: pinned digests, per-example RNGs, SpecialIds.

The hex values below pin the hashing: if one changes, every key, split, bucket and shard
of every dataset changes with it (DESIGN.md section 3), so such a change must be deliberate.
"""

from __future__ import annotations

import hashlib

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from transforms.objectives.common import (
    SpecialIds,
    _pool_words,
    _words,
    digest,
    digest_u64,
    example_rng,
    first_uniforms,
    unit_interval,
)

# --- digests --------------------------------------------------------------------------------


def test_digest_pinned_values():
    assert digest("hello").hex() == "46fb7408d4f285228f4af516ea25851b"
    assert digest(b"hello").hex() == "46fb7408d4f285228f4af516ea25851b"
    assert digest("héllo").hex() == "249a5c7589499a8866064c0d58459744"
    assert digest("hello", salt=b"lmshards-doc").hex() == "b8a7f59fffb7341ffe8bc4be3c03a399"
    assert digest("hello", size=32).hex() == "324dcf027dd4a30a932c441f365a25e86b173defa4b8e58948253471b81b72cf"
    assert digest("", size=8).hex() == "e4a6a0577479b2b4"


def test_digest_is_plain_blake2b_without_salt():
    for data in (b"", b"hello", "ünïcödé".encode()):
        assert digest(data) == hashlib.blake2b(data, digest_size=16).digest()
    assert digest("x", salt=b"abc") == hashlib.blake2b(b"x", digest_size=16, person=b"abc" + b"\0" * 13).digest()


def test_digest_salt_separates_and_is_truncated_to_16_bytes():
    assert digest("a", salt=b"one") != digest("a", salt=b"two")
    assert digest("a", salt=b"") == digest("a")
    assert digest("a" * 20, salt=b"0123456789abcdefXYZ") == digest("a" * 20, salt=b"0123456789abcdef")
    assert digest("a" * 20, salt=b"0123456789abcdef").hex() == "e1d8cdfb028e5d89977c933ceb68f0ef"


def test_digest_u64_pinned_values():
    assert digest_u64("hello") == 9022087748821825191
    assert digest_u64("hello", salt=b"x") == 8509153302285254276
    assert digest_u64("key", salt=b"lmshards-rng") == 9923749311477697975
    # Little-endian integer of the 8-byte digest.
    assert digest_u64("hello") == int.from_bytes(digest("hello", size=8), "little")


def test_unit_interval_pinned_values():
    assert unit_interval("hello") == 0.48908835688137375
    assert unit_interval("hello", salt=b"lmshards-split") == 0.11510761448378248
    assert unit_interval("hello") == (digest_u64("hello") >> 11) / 2.0**53


@settings(max_examples=200, deadline=None)
@given(data=st.one_of(st.binary(max_size=64), st.text(max_size=32)), salt=st.binary(max_size=20))
def test_digest_properties(data, salt):
    raw = data.encode("utf-8") if isinstance(data, str) else data
    assert digest(data, salt=salt) == digest(raw, salt=salt)
    assert len(digest(data, salt=salt)) == 16
    assert 0 <= digest_u64(data, salt=salt) < 2**64
    assert 0.0 <= unit_interval(data, salt=salt) < 1.0


# --- example_rng ----------------------------------------------------------------------------


def test_example_rng_pinned_streams():
    # PCG64 raw output of the seeded bit generator: stable across numpy versions.
    assert example_rng(0, "key").bit_generator.random_raw(3).tolist() == [
        16628662350969570609,
        15845274626644801146,
        7216232634063496693,
    ]
    assert example_rng(7, "key", 3).bit_generator.random_raw(3).tolist() == [
        9023063137421896011,
        4433048912742159177,
        11087951999190259012,
    ]


def test_example_rng_matches_documented_seeding():
    expected = np.random.default_rng([7, digest_u64("key", salt=b"lmshards-rng"), 3])
    assert (
        example_rng(7, "key", 3).bit_generator.random_raw(4).tolist() == expected.bit_generator.random_raw(4).tolist()
    )
    # str keys are UTF-8 encoded; extras are taken mod 2**64.
    assert example_rng(7, b"key", 3).random() == example_rng(7, "key", 3).random()
    assert example_rng(7, "key", 2**70).random() == example_rng(7, "key", 0).random()
    assert example_rng(7, "key", -1).random() == example_rng(7, "key", 2**64 - 1).random()
    assert example_rng(7, "key", np.int64(3)).random() == example_rng(7, "key", 3).random()


def test_example_rng_independent_of_call_order():
    keys = [f"example-{i}" for i in range(20)]
    forward = {k: example_rng(11, k, 1).integers(0, 2**31, 8).tolist() for k in keys}
    # Draw in reverse order, interleaved with unrelated generators, several times.
    for _ in range(2):
        for k in reversed(keys):
            example_rng(11, "noise").random(100)
            assert example_rng(11, k, 1).integers(0, 2**31, 8).tolist() == forward[k]
    assert len({tuple(v) for v in forward.values()}) == len(keys)


def test_example_rng_inputs_change_stream():
    base = example_rng(1, "k", 0).random()
    assert example_rng(2, "k", 0).random() != base
    assert example_rng(1, "j", 0).random() != base
    assert example_rng(1, "k", 1).random() != base
    assert example_rng(1, "k", 0, 1).random() != base


def test_example_rng_rejects_negative_seed():
    with pytest.raises(ValueError, match="seed must be >= 0, got -1"):
        example_rng(-1, "k")


# --- SpecialIds -----------------------------------------------------------------------------


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(0, 2**64 - 1), min_size=1, max_size=6))
def test_pool_words_are_seed_sequence_mixing(values):
    words = [w for value in values for w in _words(value)]
    assert _pool_words(words) == np.random.SeedSequence(values).pool.tolist()
    arrays = _pool_words([np.array([w, w], dtype=np.uint64) for w in words])  # vectorized: the same per element
    assert [a.tolist() for a in arrays] == [[w, w] for w in np.random.SeedSequence(values).pool.tolist()]


@pytest.mark.parametrize("seed", [0, 1, 1234, 2**32 - 1, 2**32, 2**63 + 5])
@pytest.mark.parametrize("extra", [(), (0x504C414E,), (0,), (2**40, 3)])
def test_first_uniforms_are_the_first_draw_of_example_rng(seed, extra):
    keys = [f"train-b{b:05d}-c{c:06d}" for b in (0, 7, 99999) for c in range(300)] + [b"", b"\x00" * 3, "\u00e9"]
    expected = [example_rng(seed, key, *extra).random() for key in keys]
    assert first_uniforms(seed, keys, *extra).tolist() == expected
    assert first_uniforms(seed, [], *extra).tolist() == []


def test_first_uniforms_rejects_negative_seed():
    with pytest.raises(ValueError, match="seed must be >= 0"):
        first_uniforms(-1, ["k"])


def test_special_array_and_non_special_ids():
    special = SpecialIds(
        vocab_size=10,
        pad=0,
        eos=1,
        bos=None,
        unk=2,
        mask=4,
        sentinels=(9, 8),
        mode_tokens={"[R]": 12},
        all_special=frozenset({3, 1}),
    )
    assert special.special_array().tolist() == [0, 1, 2, 3, 4, 8, 9, 12]
    assert special.special_array().dtype == np.int32
    assert special.non_special_ids().tolist() == [5, 6, 7]
    assert special.non_special_ids().dtype == np.int32


def test_non_special_ids_ignores_missing_role_marker():
    # resolve_special_tokens reports a role the tokenizer lacks as -1.
    special = SpecialIds(vocab_size=6, pad=-1, eos=-1, mask=2)
    assert special.special_array().tolist() == [-1, 2]
    assert special.non_special_ids().tolist() == [0, 1, 3, 4, 5]


def test_special_ids_defaults_and_frozen():
    special = SpecialIds(vocab_size=4, pad=0, eos=1)
    assert special.bos is None and special.mask is None and special.sentinels == ()
    assert special.mode_tokens == {} and special.all_special == frozenset()
    assert special.non_special_ids().tolist() == [2, 3]
    with pytest.raises(AttributeError):
        special.pad = 3  # type: ignore[misc]
