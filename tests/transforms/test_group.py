"""Between Tokenize and Pack: pack groups planned, documents assigned to them."""

from __future__ import annotations

import pickle
import tempfile

import apache_beam as beam
from apache_beam.testing.test_pipeline import TestPipeline
from apache_beam.testing.util import assert_that, equal_to
from hypothesis import given, settings
from hypothesis import strategies as st

from transforms.elements import Document
from transforms.group import (
    REFERENCE_BYTES,
    SUB_BUCKETS,
    AssignGroups,
    PlanGroups,
    group_of,
    plan_groups,
    plan_summary,
)


def _document(split, bucket, key, tokens=(5, 6)):
    data = bytes(bytearray(b"".join(t.to_bytes(4, "little") for t in tokens)))
    return (split, bucket), Document(key, data, {})


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
    assert groups == sorted(groups) and set(groups) == set(range(len(plan["tokens"])))
    for index, tokens in enumerate(plan["tokens"]):
        members = [counts[b] for b in counts if group_of(plan, b) == index]
        assert sum(members) == tokens
        assert tokens <= limit or len(members) == 1  # over the limit only a lone large sub-bucket
    # a group closes only when the next sub-bucket would overflow it
    for index in range(len(plan["tokens"]) - 1):
        assert plan["tokens"][index] + counts[plan["starts"][index + 1]] > limit


def test_plan_groups_transform_counts_every_document_with_its_eos():
    documents = [_document("train", 3, b"k1", (1, 2, 3)), _document("train", 3, b"k1", (1, 2, 3)),
                 _document("train", 9, b"k2", tuple(range(10))), _document("validation", 4, b"k3", (7,))]
    with TestPipeline(runner="FnApiRunner") as pipeline:
        plan = pipeline | beam.Create(documents) | PlanGroups(12)
        # train: sub-bucket 3 holds 8 tokens (two copies, 4 each), sub-bucket 9 holds 11
        assert_that(plan, equal_to([{"train": {"starts": [3, 9], "tokens": [8, 11]},
                                     "validation": {"starts": [4], "tokens": [2]}}]))


# --- documents sent to their groups in blocks ------------------------------------------------


def _blocks(documents, plan, **limits):
    """What AssignGroups sends: ``(key, its type's name, [document keys], ids bytes)`` per block
    (gathered in a file: the matcher runs on a copy of itself)."""
    with tempfile.NamedTemporaryFile(suffix=".pickle") as seen:

        def check(blocks, path=seen.name):
            with open(path, "wb") as handle:
                pickle.dump(list(blocks), handle)

        with TestPipeline(runner="FnApiRunner") as pipeline:
            plans = pipeline | "Plan" >> beam.Create([plan])
            sent = pipeline | "Documents" >> beam.Create(documents) | AssignGroups(plans, **limits)
            described = sent | beam.Map(lambda kv: (kv[0], type(kv[1]).__name__,
                                                    [d.key if isinstance(d, Document) else d for d in kv[1]],
                                                    sum(len(d.ids) for d in kv[1] if isinstance(d, Document))))
            assert_that(described, check)
        with open(seen.name, "rb") as handle:
            return pickle.load(handle)


PLAN = {"train": {"starts": [0, 100], "tokens": [0, 0]}, "validation": {"starts": [0], "tokens": [0]}}


def test_assign_groups_sends_every_document_to_its_group_in_blocks_of_bounded_count():
    documents = [_document("train", bucket, bytes([bucket, n])) for bucket in (3, 7, 150) for n in range(5)]
    documents.append(_document("validation", 9, b"v"))
    blocks = _blocks(documents, PLAN, block_documents=3)
    assert {name for _, name, _, _ in blocks} == {"DocumentBlock"}
    assert max(len(keys) for _, _, keys, _ in blocks) == 3
    placed = sorted((key, document) for key, _, keys, _ in blocks for document in keys)
    expected = sorted([(("train", 0), bytes([b, n])) for b in (3, 7) for n in range(5)]
                      + [(("train", 1), bytes([150, n])) for n in range(5)] + [(("validation", 0), b"v")])
    assert placed == expected  # each document once, in the group of its sub-bucket
    assert len([1 for key, *_ in blocks if key == ("train", 0)]) >= 4  # 10 documents, at most 3 a block


def test_a_block_closes_at_its_byte_limit_and_a_bundle_sends_all_at_its_held_limit():
    documents = [_document("train", 3, bytes([n]), tuple(range(10))) for n in range(12)]  # 40 bytes of ids each
    by_bytes = _blocks(documents, PLAN, block_bytes=100)
    assert sorted(len(keys) for _, _, keys, _ in by_bytes) == [3, 3, 3, 3]  # the third reaches 120 >= 100
    documents += [_document("train", 150, bytes([100 + n]), tuple(range(10))) for n in range(12)]
    held = _blocks(documents, PLAN, held_bytes=200)
    assert sum(len(keys) for _, _, keys, _ in held) == 24
    assert max(size for *_, size in held) <= 240  # both groups' blocks together hold at most 200 + 40 bytes


def test_a_reference_a_document_is_handed_over_by_counts_a_fixed_size_and_is_not_read():
    references = [(("train", 3), ("handed over", n)) for n in range(7)]  # no ids to read
    blocks = _blocks(references, PLAN, block_documents=4)
    assert sorted(len(keys) for _, _, keys, _ in blocks) == [3, 4]
    # references of many groups are bounded together: 256 bytes each against the bundle's limit
    many = [(("train", 3 if n % 2 else 150), ("handed over", n)) for n in range(20)]
    held = _blocks(many, PLAN, held_bytes=REFERENCE_BYTES * 5)
    assert max(len(keys) for _, _, keys, _ in held) <= 3  # six references held send them all
    assert sorted(n for _, _, keys, _ in blocks for _, n in keys) == list(range(7))
