"""Between Tokenize and Pack: pack groups planned, documents assigned to them."""

from __future__ import annotations

import pickle
import tempfile

import apache_beam as beam
import numpy as np
from apache_beam.testing.test_pipeline import TestPipeline
from apache_beam.testing.util import assert_that, equal_to
from hypothesis import given, settings
from hypothesis import strategies as st
from lmshards_testing import group_of

from transforms.elements import DocumentBatch
from transforms.packing.group import (
    SUB_BUCKETS,
    AssignGroups,
    PlanGroups,
    _PlanCombineFn,
    groups_of,
    plan_groups,
    plan_summary,
    split_tokens,
)


def _batch(split, documents, features=()):
    """``(split, encoded DocumentBatch)`` of ``documents``: ``(sub-bucket, 16-byte key, token ids)``
    each (uint16 ids; each feature flags a document's first token)."""
    lengths = [len(tokens) for _, _, tokens in documents]
    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
    flags = np.zeros(int(offsets[-1]), dtype=bool)
    flags[offsets[:-1][np.array(lengths) > 0]] = True
    keys = b"".join(key.ljust(16, b".") for _, key, _ in documents)
    batch = DocumentBatch(np.frombuffer(keys, np.uint8).reshape(-1, 16),
                          np.array([bucket for bucket, _, _ in documents], dtype=np.uint64), offsets,
                          np.array([t for _, _, tokens in documents for t in tokens], dtype=np.uint16),
                          {name: flags for name in features})
    return split, batch.encode()


# --- the plan of pack groups -----------------------------------------------------------------


def test_plan_cuts_sub_buckets_in_order_before_the_one_that_would_overflow():
    plan = plan_groups([(9, 30), (2, 50), (4, 40), (7, 15), (100, 70)], 100)
    assert plan == {"starts": [2, 7, 100], "tokens": [90, 45, 70]}
    assert [group_of(plan, b) for b in (2, 4, 7, 9, 100, 5000)] == [0, 0, 1, 1, 2, 2]
    assert plan_summary(plan) == {"groups": 3, "tokens": 205, "largest_group_tokens": 90}


def test_a_sub_bucket_larger_than_a_group_is_a_group_of_its_own():
    plan = plan_groups([(1, 10), (2, 500), (3, 10)], 100)
    assert plan == {"starts": [1, 2, 3], "tokens": [10, 500, 10]}


def test_fixed_buckets_are_their_own_groups():
    plan = plan_groups([(5, 7), (1, 3)], None)
    assert plan == {"starts": None, "tokens": [3, 7]}
    assert group_of(plan, 5) == 5
    assert groups_of(plan, np.array([5, 1, 2**63 + 3], dtype=np.uint64)).tolist() == [5, 1, 2**63 + 3]
    assert plan_summary(None) == {"groups": 0, "tokens": 0, "largest_group_tokens": 0}


@settings(max_examples=200, deadline=None)
@given(counts=st.dictionaries(st.integers(0, SUB_BUCKETS - 1), st.integers(1, 1000), max_size=60),
       limit=st.integers(1, 3000))
def test_plan_bounds_every_group_and_covers_every_bucket_in_order(counts, limit):
    pairs = list(counts.items())
    plan = plan_groups(pairs, limit)
    assert plan == plan_groups(list(reversed(pairs)), limit)  # order of arrival never matters
    assert sum(plan["tokens"]) == sum(counts.values())
    groups = [group_of(plan, bucket) for bucket in sorted(counts)]
    assert groups_of(plan, np.array(sorted(counts), dtype=np.uint64)).tolist() == groups
    assert groups == sorted(groups) and set(groups) == set(range(len(plan["tokens"])))
    for index, tokens in enumerate(plan["tokens"]):
        members = [counts[b] for b in counts if group_of(plan, b) == index]
        assert sum(members) == tokens
        assert tokens <= limit or len(members) == 1  # over the limit only a lone large sub-bucket
    # a group closes only when the next sub-bucket would overflow it
    for index in range(len(plan["tokens"]) - 1):
        assert plan["tokens"][index] + counts[plan["starts"][index + 1]] > limit


def test_plan_groups_transform_counts_every_document_with_its_eos():
    batches = [_batch("train", [(3, b"k1", (1, 2, 3)), (9, b"k2", tuple(range(10)))]),
               _batch("train", [(3, b"k1", (1, 2, 3))]), _batch("validation", [(4, b"k3", (7,))])]
    with TestPipeline(runner="FnApiRunner") as pipeline:
        plan = pipeline | beam.Create(batches) | PlanGroups(12)
        # train: sub-bucket 3 holds 8 tokens (two copies, 4 each), sub-bucket 9 holds 11
        assert_that(plan, equal_to([{"train": {"starts": [3, 9], "tokens": [8, 11]},
                                     "validation": {"starts": [4], "tokens": [2]}}]))
    assert split_tokens(batches[0]) == ("train", 15)


def test_the_plans_accumulators_sum_many_batches_exactly_and_stay_small():
    rng = np.random.default_rng(3)
    combine = _PlanCombineFn(1000)
    expected: dict[int, int] = {}
    accumulators = []
    for _ in range(3):
        accumulator = combine.create_accumulator()
        for _batch_number in range(60):  # 60 batches of 2,000 documents over 5,000 sub-buckets, per part
            buckets = rng.integers(0, 5000, size=2000)
            lengths = rng.integers(1, 40, size=2000)
            for bucket, length in zip(buckets.tolist(), lengths.tolist()):
                expected[bucket] = expected.get(bucket, 0) + length + 1
            documents = [(bucket, b"k", (7,) * length) for bucket, length in zip(buckets.tolist(), lengths.tolist())]
            accumulator = combine.add_input(accumulator, _batch("train", documents))
        # 120,000 pairs listed, summed per sub-bucket as they come: at most 2**16 and a batch are held
        assert sum(len(b) for b in accumulator["train"].buckets) <= 65536 + 2000
        accumulators.append(pickle.loads(pickle.dumps(accumulator)))  # as a runner moves it
    merged = combine.merge_accumulators(accumulators)
    assert combine.extract_output(merged) == {"train": plan_groups(sorted(expected.items()), 1000)}


# --- documents sent to their groups in blocks ------------------------------------------------


def _blocks(batches, plan, **limits):
    """What AssignGroups sends: ``(key, [document keys], ids, first-token flags)`` per block (gathered
    in a file: the matcher runs on a copy of itself)."""
    with tempfile.NamedTemporaryFile(suffix=".pickle") as seen:

        def check(blocks, path=seen.name):
            with open(path, "wb") as handle:
                pickle.dump(list(blocks), handle)

        def described(kv):
            block = DocumentBatch.decode(kv[1])
            return (kv[0], [block.keys[i].tobytes().rstrip(b".") for i in range(block.count)], block.ids.tolist(),
                    {name: np.flatnonzero(flags).tolist() for name, flags in block.features.items()},
                    block.offsets.tolist())

        with TestPipeline(runner="FnApiRunner") as pipeline:
            plans = pipeline | "Plan" >> beam.Create([plan])
            sent = pipeline | "Documents" >> beam.Create(batches) | AssignGroups(plans, **limits)
            assert_that(sent | beam.Map(described), check)
        with open(seen.name, "rb") as handle:
            return pickle.load(handle)


PLAN = {"train": {"starts": [0, 100], "tokens": [0, 0]}, "validation": {"starts": [0], "tokens": [0]}}


def test_assign_groups_splits_batches_by_group_and_keeps_each_documents_tokens_and_features():
    batches = [_batch("train", [(bucket, bytes([bucket, n]), (bucket, n, n + 1)) for bucket in (3, 150, 7)
                                for n in range(5)], features=("word_starts",)),
               _batch("validation", [(9, b"v", (4, 4))], features=("word_starts",))]
    blocks = _blocks(batches, PLAN)
    placed = sorted((key, document) for key, keys, *_ in blocks for document in keys)
    expected = sorted([(("train", 0), bytes([b, n])) for b in (3, 7) for n in range(5)]
                      + [(("train", 1), bytes([150, n])) for n in range(5)] + [(("validation", 0), b"v")])
    assert placed == expected  # each document once, in the group of its sub-bucket
    for _, keys, ids, flags, offsets in blocks:
        for index, key in enumerate(keys):  # the ids and flags of each document came with it
            if len(key) == 2:
                assert ids[offsets[index]:offsets[index + 1]] == [key[0], key[1], key[1] + 1]
        assert flags == {"word_starts": offsets[:-1]}


def test_a_block_closes_at_its_byte_limit_and_a_bundle_sends_all_at_its_held_limit():
    batches = [_batch("train", [(3, bytes([n]), tuple(range(20)))]) for n in range(12)]  # 40 bytes of ids each
    by_bytes = _blocks(batches, PLAN, block_bytes=100)  # a document counts its ids and 24 bytes
    assert sorted(len(keys) for _, keys, *_ in by_bytes) == [2, 2, 2, 2, 2, 2]  # 2 x 64 >= 100
    batches += [_batch("train", [(150, bytes([100 + n]), tuple(range(20)))]) for n in range(12)]
    held = _blocks(batches, PLAN, held_bytes=200)
    assert sum(len(keys) for _, keys, *_ in held) == 24
    assert max(len(keys) for _, keys, *_ in held) <= 4  # both groups' blocks together hold at most 200 + 64 bytes
