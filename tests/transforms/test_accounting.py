"""Document accounting: counts of a run and the checks made before the manifest is written."""

import pytest

from transforms.writing.accounting import UnreconciledCountsError, check_conservation, check_reconciled, document_counts


def _counts(written, duplicates=1, rejected=2):
    read_stats = {"documents": 10, "rejected": 1}  # 11 documents read, 1 rejected by the reader
    return document_counts(read_stats, {"nul_bytes": 1, "no_tokens": rejected - 1}, written, duplicates)


def test_reconciled_counts_pass():
    counts = _counts(written=8)
    assert counts["documents_read"] == 11 and counts["rejected"] == 2 and counts["reconciled"]
    check_reconciled(counts)


def test_lost_documents_fail_with_the_numbers():
    counts = _counts(written=5)
    assert not counts["reconciled"]
    with pytest.raises(UnreconciledCountsError) as info:
        check_reconciled(counts)
    message = str(info.value)
    assert message == ("documents do not add up: read 11 != written 5 + duplicates 1 + rejected 2 + filtered 0 "
                       "(3 documents were lost between stages, a runner fault); no manifest written")


def test_documents_counted_twice_fail():
    with pytest.raises(UnreconciledCountsError, match="2 documents were counted twice"):
        check_reconciled(_counts(written=10))


def _split_info(rows=(3, 2), tokens=(30, 20), indices=(0, 1), document_tokens=57, dropped=7):
    shards = [{"index": i, "rows": r, "tokens": t} for i, r, t in zip(indices, rows, tokens)]
    return {"document_tokens": document_tokens, "dropped_tokens": dropped, "shards": shards}


def test_conserved_split_passes():
    check_conservation("train", _split_info(), {"examples": 5, "chunk_tokens": 50}, {"packed_tokens": 50}, 1)
    # two draws: every chunk built twice
    check_conservation("train", _split_info(document_tokens=32), {"examples": 5, "chunk_tokens": 50},
                       {"packed_tokens": 25}, 2)


@pytest.mark.parametrize("info, objective, packing, message", [
    (_split_info(dropped=6), {"examples": 5, "chunk_tokens": 50}, {"packed_tokens": 50},
     "document tokens 57 != packed 50 + dropped 6 (Pack)"),
    (_split_info(document_tokens=61), {"examples": 5, "chunk_tokens": 50}, {"packed_tokens": 54},
     "examples were built from 50 tokens, not packed 54 x draws 1 (BuildExamples)"),
    (_split_info(rows=(3, 1), tokens=(30, 20)), {"examples": 5, "chunk_tokens": 50}, {"packed_tokens": 50},
     "shard files hold 4 rows, not the 5 examples built (WriteShards)"),
    (_split_info(tokens=(30, 10)), {"examples": 5, "chunk_tokens": 50}, {"packed_tokens": 50},
     "shard rows were built from 40 tokens, not 50 (WriteShards)"),
    (_split_info(indices=(1, 1)), {"examples": 5, "chunk_tokens": 50}, {"packed_tokens": 50},
     "shard indices 1, 1 are not 0..1 once"),
])
def test_each_broken_law_fails_the_split_with_the_numbers(info, objective, packing, message):
    with pytest.raises(UnreconciledCountsError) as error:
        check_conservation("validation", info, objective, packing, 1)
    assert str(error.value) == (f"validation: counts do not add up: {message}, a runner or writer lost or repeated "
                                "work; no manifest written")


def test_one_combine_sums_every_kind_of_counter_by_key_and_gives_the_kinds_back():
    import apache_beam as beam
    from apache_beam.testing.test_pipeline import TestPipeline
    from apache_beam.testing.util import assert_that, equal_to

    from transforms.writing.manifest import SumStatistics, split_statistics

    with TestPipeline(runner="FnApiRunner") as pipeline:
        kinds = {
            "read": pipeline | "Read" >> beam.Create([{"documents": 2}, {"documents": 3, "rejected": 1}]),
            "source": pipeline | "Source" >> beam.Create([(("train", "web"), {"documents": 1}),
                                                          (("train", "web"), {"documents": 2}),
                                                          (("train", "books"), {"documents": 4})]),
            "pack": pipeline | "Pack" >> beam.Create([("train", {"documents": 4, "duplicates": 1}),
                                                      ("validation", {"documents": 1}),
                                                      ("train", {"documents": 3})]),
            "objective": pipeline | "Objective" >> beam.Create([("train", {"examples": 5})]),
        }
        summed = kinds | SumStatistics()
        assert_that(summed, equal_to([
            (("read", ""), {"documents": 5, "rejected": 1}),
            (("source", ("train", "web")), {"documents": 3}),
            (("source", ("train", "books")), {"documents": 4}),
            (("pack", "train"), {"documents": 7, "duplicates": 1}),
            (("pack", "validation"), {"documents": 1}),
            (("objective", "train"), {"examples": 5}),
        ]))
    objective, pack, read, sources = split_statistics({
        ("read", ""): {"documents": 5}, ("pack", "train"): {"documents": 7},
        ("source", ("train", "web")): {"documents": 3}, ("objective", "train"): {"examples": 5}})
    assert (objective, pack, read, sources) == ({"train": {"examples": 5}}, {"train": {"documents": 7}},
                                                {"documents": 5}, [(("train", "web"), {"documents": 3})])
    assert split_statistics({}) == ({}, {}, {}, [])  # nothing read: every kind empty
    with pytest.raises(ValueError, match="unknown kinds"):
        SumStatistics().expand({"reader": None})
