"""Document accounting: counts of a run and the checks made before the manifest is written."""

import pytest

from transforms.accounting import UnreconciledCountsError, check_reconciled, document_counts


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
