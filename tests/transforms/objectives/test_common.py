"""Tests of transforms/objectives/common.py and layout.py: pinned digests, SpecialIds.

The hex values below pin the hashing: if one changes, every key, split, bucket and shard
of every dataset changes with it (docs/design.md section 3), so such a change must be deliberate.
"""

from __future__ import annotations

import hashlib

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from transforms.objectives.common import SpecialIds, digest, digest_u64, unit_interval
from transforms.objectives.layout import example_digests, plan_uniforms, row_order_key, shard_hash, shard_of

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


# --- the example digest (layout.py) -------------------------------------------------------


def test_one_digest_gives_shard_order_and_noise_key():
    """Bytes 0-7, 8-23 and 24-31 of blake2b-256(f"{seed}:{key}", person=lmshards-example)."""
    key = "train-b00001-c000002-d0"
    full = hashlib.blake2b(f"7:{key}".encode(), digest_size=32, person=b"lmshards-example").digest()
    digests = example_digests(7, [key])
    assert int(digests.shard_hashes[0]) == int.from_bytes(full[:8], "little") == shard_hash(7, key)
    assert digests.orders[0].tobytes() == full[8:24] == row_order_key(7, key)
    assert int(digests.randoms.keys[0]) == int.from_bytes(full[24:], "little")
    assert shard_of(7, key, 16) == int.from_bytes(full[:8], "little") % 16
    # pinned: a change here moves every example of every dataset
    assert hex(shard_hash(7, key)) == "0x19af44b438085e10"
    assert row_order_key(7, key).hex() == "f8637f74ee9d172bd2034be6ddd6e998"


def test_plan_uniforms_come_from_the_chunk_key():
    chunk = hashlib.blake2b(b"3:train-b00000-c000000", digest_size=8, person=b"lmshards-plan").digest()
    from transforms.objectives.randoms import Randoms

    expected = Randoms(np.array([int.from_bytes(chunk, "little")], dtype=np.uint64)).uniforms(0, 1)[0, 0]
    assert plan_uniforms(3, ["train-b00000-c000000"]).tolist() == [expected]
    assert plan_uniforms(3, []).tolist() == []
    with pytest.raises(ValueError, match="seed must be >= 0, got -1"):
        plan_uniforms(-1, ["k"])
    with pytest.raises(ValueError, match="seed must be >= 0, got -1"):
        example_digests(-1, ["k"])


# --- SpecialIds -----------------------------------------------------------------------------


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


def test_ids_of_ranks_skip_the_special_ids():
    special = SpecialIds(vocab_size=10, pad=0, eos=1, mask=4, all_special=frozenset({7}))
    assert special.ids_of_ranks(np.arange(6)).tolist() == special.non_special_ids().tolist() == [2, 3, 5, 6, 8, 9]


def test_special_ids_defaults_and_frozen():
    special = SpecialIds(vocab_size=4, pad=0, eos=1)
    assert special.bos is None and special.mask is None and special.sentinels == ()
    assert special.mode_tokens == {} and special.all_special == frozenset()
    assert special.non_special_ids().tolist() == [2, 3]
    with pytest.raises(AttributeError):
        special.pad = 3  # type: ignore[misc]
