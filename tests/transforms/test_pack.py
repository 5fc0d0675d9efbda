"""Pack on Beam's TestPipeline: blocks of documents in, chunks and counters out (exact values).

A group's blocks meet in Pack's own shuffle; exact duplicates (equal keys) are packed once and
counted; the remainders of a split's groups are re-packed together.
"""

from __future__ import annotations

import collections

import apache_beam as beam
import numpy as np
import pytest
from apache_beam.testing.test_pipeline import TestPipeline
from apache_beam.testing.util import assert_that, equal_to

from transforms.elements import DocumentBatch
from transforms.objectives.counters import sum_counters
from transforms.objectives.registry import make_objective
from transforms.packing.pack import Pack

EOS = 1
SEQ = 8
#: Documents by key letter: ids without their EOS.
DOCS = {"a": [10, 11, 12], "b": [20, 21, 22, 23, 24], "c": [30], "d": [40, 41, 42, 43, 44, 45, 46],
        "e": [50, 51, 52, 53], "f": list(range(60, 71))}
#: Group 0 holds a-d, group 1 e and f (longer than a chunk).
GROUP = {"a": 0, "b": 0, "c": 0, "d": 0, "e": 1, "f": 1}
#: Counters Pack's stats are compared on (the document length histograms are length_counters').
COUNTED = ("documents", "duplicates", "packed_tokens", "dropped_tokens")


def _key(letter: str) -> bytes:
    return letter.encode() * 16  # keys sort as their letters


def _block(letters: str) -> tuple:
    """``((split, group), encoded DocumentBatch)`` of the documents ``letters``, one group's."""
    ids = [DOCS[letter] for letter in letters]
    offsets = np.concatenate([[0], np.cumsum([len(d) for d in ids])]).astype(np.int64)
    batch = DocumentBatch(np.frombuffer(b"".join(_key(c) for c in letters), np.uint8).reshape(-1, 16),
                          np.array([GROUP[c] for c in letters], dtype=np.uint64), offsets,
                          np.array([t for d in ids for t in d], dtype=np.uint16), {})
    (group,) = {GROUP[c] for c in letters}
    return ("train", group), batch.encode()


def _packed(blocks: list, mode: str, expected_chunks: list, expected_stats: dict) -> None:
    """Pack ``blocks`` (clm, chunks of SEQ tokens) and compare every chunk ``(key, tokens,
    doc_lengths)`` and the summed counters of COUNTED."""
    objective = make_objective("clm", {"seq_len": SEQ})
    with TestPipeline(runner="FnApiRunner") as pipeline:
        (chunks, repacked), stats = pipeline | beam.Create(blocks) | Pack(objective, mode=mode, seed=0, eos=EOS)
        every = (chunks, repacked) | beam.Flatten()
        described = every | beam.Map(lambda c: (c.split, c.key, c.piece.tokens.tolist(),
                                                c.piece.doc_lengths.tolist()))
        assert_that(described, equal_to(expected_chunks), label="Chunks")
        summed = (stats | beam.CombinePerKey(sum_counters)
                  | beam.MapTuple(lambda split, c: (split, {k: c[k] for k in COUNTED if k in c})))
        assert_that(summed, equal_to([("train", expected_stats)]), label="Stats")


@pytest.mark.parametrize("copies", [False, True])
def test_duplicates_are_packed_once_and_counted_where_their_group_meets(copies):
    """Copies of a document, in its own block and in others of its group, are dropped where the
    group's blocks meet: the chunks are those of the documents without the copies."""
    blocks = [_block("dbac"), _block("e")]  # (f: the test below)
    if copies:
        blocks = [_block("dbacb"), _block("bb"), _block("e"), _block("e")]
    # Group 0's stream (keys in order, EOS after each): a(4) b(6) c(2) d(8) = 20 tokens, two
    # chunks and 4 left; group 1's: e(5), all left. The split's remainders, group by group,
    # make one more chunk; its last token is dropped.
    expected = [
        ("train", "train-g00000-c000000", [10, 11, 12, 1, 20, 21, 22, 23], [4, 4]),
        ("train", "train-g00000-c000001", [24, 1, 30, 1, 40, 41, 42, 43], [2, 2, 4]),
        ("train", "train-r-c000000", [44, 45, 46, 1, 50, 51, 52, 53], [4, 4]),
    ]
    stats = {"documents": 5, "packed_tokens": 16 + 0 + 8, "dropped_tokens": 1}
    _packed(blocks, "concat", expected, {**stats, "duplicates": 4} if copies else stats)


@pytest.mark.parametrize("mode", ["best_fit", "none"])
def test_best_fit_and_none_keep_every_token_of_every_document_and_drop_none(mode):
    """No document is cut short (none: one document per chunk, a long one in pieces of SEQ); a
    chunk is at most SEQ tokens; nothing is dropped."""
    blocks = [_block("dbac"), _block("fe"), _block("b")]  # b once more: a duplicate
    if mode == "none":
        # each document (with its EOS) alone, in pieces of at most SEQ tokens; nothing to re-pack
        expected = [("train", f"train-g00000-c{i:06d}", tokens, [len(tokens)]) for i, tokens in enumerate(
            [[10, 11, 12, 1], [20, 21, 22, 23, 24, 1], [30, 1], [40, 41, 42, 43, 44, 45, 46, 1]])]
        expected += [("train", f"train-g00001-c{i:06d}", tokens, [len(tokens)]) for i, tokens in enumerate(
            [[50, 51, 52, 53, 1], list(range(60, 68)), [68, 69, 70, 1]])]
    else:
        # best fit, longest piece first (f cut into 8 + 4 first): d fills a chunk, b(6) + c(2)
        # another, a(4) is only half full; f's first 8 fill a chunk, e(5) is more than half full,
        # f's last 4 only half. The two half-full bins are the split's remainder, re-packed together.
        expected = [
            ("train", "train-g00000-c000000", [40, 41, 42, 43, 44, 45, 46, 1], [8]),
            ("train", "train-g00000-c000001", [20, 21, 22, 23, 24, 1, 30, 1], [6, 2]),
            ("train", "train-g00001-c000000", list(range(60, 68)), [8]),
            ("train", "train-g00001-c000001", [50, 51, 52, 53, 1], [5]),
            ("train", "train-r-c000000", [10, 11, 12, 1, 68, 69, 70, 1], [4, 4]),
        ]
    tokens = collections.Counter(t for *_, chunk, _ in expected for t in chunk)
    assert tokens == collections.Counter(t for d in DOCS.values() for t in [*d, EOS])
    assert all(len(chunk) <= SEQ for *_, chunk, _ in expected)
    packed = 37  # every token of the six documents and their EOS
    _packed(blocks, mode, expected, {"documents": 6, "duplicates": 1, "packed_tokens": packed,
                                     **({"dropped_tokens": 0} if mode == "best_fit" else {})})
