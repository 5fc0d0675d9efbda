"""Tests of transforms/objectives/packing.py: exact small packings and hypothesis properties."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from transforms.objectives.packing import (
    PACKING_MODES,
    ConcatPacker,
    Piece,
    concat_documents,
    concat_pieces,
    document_piece,
    pack_best_fit,
    pack_concat,
    pack_none,
)

EOS = 1


def _doc(*ids: int) -> Piece:
    return document_piece(np.array(ids, dtype=np.int32), EOS)


def _lists(piece: Piece) -> tuple[list[int], list[int]]:
    return piece.tokens.tolist(), piece.doc_lengths.tolist()


# --- Piece, document_piece, concat_pieces ---------------------------------------------------


def test_packing_modes():
    assert PACKING_MODES == ("concat", "best_fit", "none")


def test_document_piece_appends_eos_and_features():
    piece = document_piece(
        np.array([7, 8, 9]),
        EOS,
        {"word_starts": [True, False, True], "sentence_starts": np.array([1, 0, 0])},
    )
    assert piece.tokens.dtype == np.int32
    assert _lists(piece) == ([7, 8, 9, 1], [4])
    assert len(piece) == 4
    # The EOS is a word start of its own but never a sentence start.
    assert piece.features["word_starts"].tolist() == [True, False, True, True]
    assert piece.features["sentence_starts"].tolist() == [True, False, False, False]
    assert piece.features["sentence_starts"].dtype == bool


def test_without_a_separator_documents_are_joined_as_they_are():
    piece = document_piece(np.array([7, 8, 9]), None, {"space_starts": [False, True, True]})
    assert _lists(piece) == ([7, 8, 9], [3]) and piece.features["space_starts"].tolist() == [False, True, True]
    documents = [(np.array([10, 11], dtype=np.int32).tobytes(), {"space_starts": np.array([False, True])}),
                 (np.array([20], dtype=np.int32), {"space_starts": [False]})]
    joined = concat_documents(documents, None)
    assert _lists(joined) == ([10, 11, 20], [2, 1])  # T5's reduce_concat_tokens: no EOS, boundaries kept
    assert joined.features["space_starts"].tolist() == [False, True, False]


def test_document_piece_empty_document_is_just_eos():
    assert _lists(document_piece(np.zeros(0, np.int32), 5)) == ([5], [1])


def test_slice_cuts_segments_to_window():
    piece = Piece(
        np.arange(12, dtype=np.int32), np.array([4, 3, 5], dtype=np.int32), {"word_starts": np.arange(12) % 2 == 0}
    )
    assert _lists(piece.slice(2, 9)) == ([2, 3, 4, 5, 6, 7, 8], [2, 3, 2])
    assert _lists(piece.slice(4, 7)) == ([4, 5, 6], [3])
    assert _lists(piece.slice(0, 12)) == (list(range(12)), [4, 3, 5])
    assert _lists(piece.slice(11, 12)) == ([11], [1])
    assert _lists(piece.slice(5, 5)) == ([], [])
    assert piece.slice(3, 6).features["word_starts"].tolist() == [False, True, False]
    assert piece.slice(2, 9).doc_lengths.dtype == np.int32


def test_concat_pieces_keeps_boundaries_and_features():
    a = document_piece(np.array([10, 11]), EOS, {"word_starts": [True, False]})
    b = document_piece(np.array([20]), EOS, {"word_starts": [False]})
    joined = concat_pieces([a, b])
    assert _lists(joined) == ([10, 11, 1, 20, 1], [3, 2])
    assert joined.features["word_starts"].tolist() == [True, False, True, False, True]
    assert joined.tokens.dtype == np.int32 and joined.doc_lengths.dtype == np.int32


def test_concat_pieces_empty():
    empty = concat_pieces([])
    assert len(empty) == 0
    assert empty.tokens.dtype == np.int32 and empty.doc_lengths.dtype == np.int32
    assert empty.features == {}


def test_concat_documents_exact():
    documents = [(np.array([10, 11], dtype=np.int32).tobytes(), {"word_starts": np.array([True, False]),
                                                                  "sentence_starts": np.array([True, False])}),
                 (b"", {"word_starts": np.zeros(0, bool), "sentence_starts": np.zeros(0, bool)}),
                 (np.array([20], dtype=np.int64), {"word_starts": [False], "sentence_starts": [True]})]
    joined = concat_documents(documents, EOS)
    assert _lists(joined) == ([10, 11, 1, 1, 20, 1], [3, 1, 2])
    assert joined.features["word_starts"].tolist() == [True, False, True, True, False, True]  # EOS starts a word
    assert joined.features["sentence_starts"].tolist() == [True, False, False, False, True, False]
    assert joined.tokens.dtype == np.int32 and joined.doc_lengths.dtype == np.int32
    assert joined.tokens.flags.writeable
    assert len(concat_documents([], EOS)) == 0


@settings(max_examples=100, deadline=None)
@given(st.lists(st.lists(st.integers(0, 2**31 - 1), max_size=12), max_size=8), st.booleans(),
       st.sampled_from([EOS, None]))
def test_concat_documents_equals_concatenated_document_pieces(documents, as_bytes, eos):
    rng = np.random.default_rng(len(documents))
    arrays = [np.array(ids, dtype=np.int32) for ids in documents]
    features = [{"word_starts": rng.random(len(ids)) < 0.5} for ids in arrays]
    inputs = [(ids.tobytes() if as_bytes else ids, f) for ids, f in zip(arrays, features)]
    joined = concat_documents(inputs, eos)
    expected = concat_pieces([document_piece(ids, eos, f) for ids, f in zip(arrays, features)])
    assert _lists(joined) == _lists(expected)
    assert joined.features.keys() == expected.features.keys()
    for name in expected.features:
        assert joined.features[name].tolist() == expected.features[name].tolist()


def test_concat_documents_casts_narrow_ids_and_keeps_the_head():
    head = _doc(7, 8)
    narrow = [(np.array([65535, 0, 3], dtype=np.uint16), {}), (np.array([9], dtype=np.uint16), {})]
    joined = concat_documents(narrow, EOS, head=head)
    assert joined.tokens.dtype == np.int32
    assert _lists(joined) == ([7, 8, 1, 65535, 0, 3, 1, 9, 1], [3, 4, 2])
    assert _lists(concat_documents(narrow, None)) == ([65535, 0, 3, 9], [3, 1])


# --- pack_concat ----------------------------------------------------------------------------

STREAM = concat_pieces([_doc(10, 11, 12), _doc(20, 21), _doc(30, 31, 32, 33)])


def test_stream_layout():
    assert _lists(STREAM) == ([10, 11, 12, 1, 20, 21, 1, 30, 31, 32, 33, 1], [4, 3, 5])


def test_pack_concat_fixed_length():
    calls = []

    def planned(index):
        calls.append(index)
        return 5

    chunks, rest = pack_concat(STREAM, planned)
    assert [_lists(c) for c in chunks] == [
        ([10, 11, 12, 1, 20], [4, 1]),
        ([21, 1, 30, 31, 32], [2, 3]),
    ]
    assert _lists(rest) == ([33, 1], [2])
    assert calls == [0, 1, 2]


def test_pack_concat_variable_lengths():
    lengths = [3, 6, 2, 4]
    calls = []

    def planned(index):
        calls.append(index)
        return lengths[index]

    chunks, rest = pack_concat(STREAM, planned)
    assert [_lists(c) for c in chunks] == [
        ([10, 11, 12], [3]),
        ([1, 20, 21, 1, 30, 31], [1, 3, 2]),
        ([32, 33], [2]),
    ]
    assert _lists(rest) == ([1], [1])
    assert calls == [0, 1, 2, 3]


def test_pack_concat_exact_fill_leaves_empty_remainder():
    chunks, rest = pack_concat(STREAM, lambda i: 4)
    assert [_lists(c) for c in chunks] == [
        ([10, 11, 12, 1], [4]),
        ([20, 21, 1, 30], [3, 1]),
        ([31, 32, 33, 1], [4]),
    ]
    assert _lists(rest) == ([], [])


def test_pack_concat_short_stream_is_all_remainder():
    chunks, rest = pack_concat(STREAM, lambda i: 100)
    assert chunks == []
    assert _lists(rest) == _lists(STREAM)


def test_pack_concat_empty_stream():
    chunks, rest = pack_concat(concat_pieces([]), lambda i: 3)
    assert chunks == [] and len(rest) == 0


@pytest.mark.parametrize("bad", [0, -3])
def test_pack_concat_rejects_non_positive_length(bad):
    with pytest.raises(ValueError, match=f"planned chunk length must be > 0, got {bad}"):
        pack_concat(STREAM, lambda i: bad)


# --- pack_none ------------------------------------------------------------------------------


def test_pack_none_splits_long_documents():
    pieces = pack_none([_doc(10, 11, 12, 13), _doc(20, 21), _doc(30, 31, 32, 33, 34, 35, 36)], 4)
    assert [_lists(p) for p in pieces] == [
        ([10, 11, 12, 13], [4]),
        ([1], [1]),
        ([20, 21, 1], [3]),
        ([30, 31, 32, 33], [4]),
        ([34, 35, 36, 1], [4]),
    ]


# --- pack_best_fit --------------------------------------------------------------------------


def test_pack_best_fit_exact():
    a = _doc(10, 11, 12, 13)  # 5 tokens
    b = _doc(20, 21)  # 3
    c = _doc(30, 31, 32, 33, 34)  # 6
    d = _doc(40)  # 2
    e = _doc(*range(50, 59))  # 10 -> split into 8 + 2
    full, rest = pack_best_fit([a, b, c, d, e], 8)
    # Decreasing order: e[:8] (own bin), c (new bin, room 2), a (new bin, room 3),
    # b (best fit: the bin with room 3), d (the bin with room 2), e[8:] (new bin, 2/8 full).
    assert [_lists(p) for p in full] == [
        (list(range(50, 58)), [8]),
        ([30, 31, 32, 33, 34, 1, 40, 1], [6, 2]),
        ([10, 11, 12, 13, 1, 20, 21, 1], [5, 3]),
    ]
    assert [_lists(p) for p in rest] == [([58, 1], [2])]


def test_pack_best_fit_prefers_tightest_bin_and_breaks_ties_by_order():
    # Items 6, 5, 3, 2 (with EOS) into bins of 10: 6 -> bin0 (room 4), 5 -> bin1 (room 5),
    # 3 -> bin0 (tightest room 4 >= 3, room 1), 2 -> bin1 (room 5 is the only fit).
    items = [_doc(2, 2, 2, 2, 2), _doc(3, 3, 3, 3), _doc(4, 4), _doc(5)]
    full, rest = pack_best_fit(items, 10)
    assert [_lists(p) for p in full] == [
        ([2, 2, 2, 2, 2, 1, 4, 4, 1], [6, 3]),
        ([3, 3, 3, 3, 1, 5, 1], [5, 2]),
    ]
    assert rest == []
    # Equal sizes keep input order.
    full, rest = pack_best_fit([_doc(7), _doc(8), _doc(9)], 4)
    assert [_lists(p) for p in full] == [([7, 1, 8, 1], [2, 2])]
    assert [_lists(p) for p in rest] == [([9, 1], [2])]


def test_pack_best_fit_half_full_bin_is_remainder():
    full, rest = pack_best_fit([_doc(1, 2, 3)], 8)  # exactly half full
    assert full == []
    assert [_lists(p) for p in rest] == [([1, 2, 3, 1], [4])]
    full, rest = pack_best_fit([_doc(1, 2, 3, 4)], 8)  # more than half
    assert [_lists(p) for p in full] == [([1, 2, 3, 4, 1], [5])]
    assert rest == []


def test_pack_best_fit_keeps_features_aligned():
    a = document_piece(np.array([10, 11, 12]), EOS, {"word_starts": [True, False, False]})
    b = document_piece(np.array([20]), EOS, {"word_starts": [True]})
    (bin_,), rest = pack_best_fit([a, b], 6)
    assert _lists(bin_) == ([10, 11, 12, 1, 20, 1], [4, 2])
    assert bin_.features["word_starts"].tolist() == [True, False, False, True, True, True]
    assert rest == []


# --- properties -----------------------------------------------------------------------------

_DOC_SIZES = st.lists(st.integers(0, 40), min_size=0, max_size=25)
_SETTINGS = settings(max_examples=150, deadline=None)


def _documents(sizes: list[int]) -> list[Piece]:
    """Document d has tokens 1000*(d+1) + position (never EOS), plus its EOS."""
    docs = []
    for d, size in enumerate(sizes):
        ids = 1000 * (d + 1) + np.arange(size, dtype=np.int32)
        docs.append(document_piece(ids, EOS, {"word_starts": np.arange(size) % 3 == 0}))
    return docs


def _check_piece(piece: Piece) -> None:
    assert piece.doc_lengths.dtype == np.int32
    assert int(piece.doc_lengths.sum()) == len(piece)
    assert (piece.doc_lengths > 0).all()
    for values in piece.features.values():
        assert len(values) == len(piece)


def _segments(piece: Piece) -> list[np.ndarray]:
    return np.split(piece.tokens, np.cumsum(piece.doc_lengths)[:-1]) if len(piece) else []


def _check_segment(segment: np.ndarray) -> int:
    """A segment is a contiguous run of one document, EOS only at its end; returns the doc id."""
    body = segment[:-1] if segment[-1] == EOS else segment
    assert (body != EOS).all()
    doc = int(body[0]) // 1000 if len(body) else -1
    if len(body):
        assert (body // 1000 == doc).all()
        assert (np.diff(body) == 1).all()
    return doc


@_SETTINGS
@given(sizes=_DOC_SIZES, lengths=st.lists(st.integers(1, 30), min_size=1, max_size=10))
def test_concat_keeps_every_token_once_in_order(sizes, lengths):
    stream = concat_pieces(_documents(sizes))
    calls = []

    def planned(index):
        calls.append(index)
        return lengths[index % len(lengths)]

    chunks, rest = pack_concat(stream, planned)
    assert calls == list(range(len(chunks) + 1))
    for index, chunk in enumerate(chunks):
        assert len(chunk) == lengths[index % len(lengths)]
    assert len(rest) < lengths[len(chunks) % len(lengths)]
    everything = chunks + [rest]
    for piece in everything:
        if len(piece):
            _check_piece(piece)
    assert np.array_equal(np.concatenate([p.tokens for p in everything]), stream.tokens)
    if sizes:
        features = np.concatenate([p.features["word_starts"] for p in everything])
        assert np.array_equal(features, stream.features["word_starts"])
    # Segment boundaries = document boundaries plus chunk cuts.
    doc_bounds = set(np.cumsum(stream.doc_lengths).tolist())
    cut_bounds = set(np.cumsum([len(p) for p in everything]).tolist())
    piece_bounds = np.cumsum(np.concatenate([p.doc_lengths for p in everything])).tolist()
    assert piece_bounds == sorted((doc_bounds | cut_bounds) - {0})


@_SETTINGS
@given(sizes=_DOC_SIZES, length=st.integers(1, 30))
def test_best_fit_never_truncates_and_respects_capacity(sizes, length):
    docs = _documents(sizes)
    full, rest = pack_best_fit(docs, length)
    for piece in full:
        _check_piece(piece)
        assert length / 2 < len(piece) <= length  # no bin over capacity, every full bin > half
    for piece in rest:
        _check_piece(piece)
    # The remainder is the pieces of at most one bin, and that bin is at most half full.
    assert 2 * sum(len(p) for p in rest) <= length
    # Every document's tokens are present exactly once, each segment one contiguous run.
    seen: dict[int, list[np.ndarray]] = {}
    eos_count = 0
    for piece in full + rest:
        for segment in _segments(piece):
            doc = _check_segment(segment)
            eos_count += int(segment[-1] == EOS)
            if doc >= 0:
                seen.setdefault(doc, []).append(segment[segment != EOS])
    assert eos_count == len(docs)
    for d, size in enumerate(sizes):
        got = np.sort(np.concatenate(seen.get(d + 1, [np.zeros(0, np.int32)])))
        assert got.tolist() == (1000 * (d + 1) + np.arange(size)).tolist()
    assert sum(len(p) for p in full + rest) == sum(len(doc) for doc in docs)
    # Pure function of the ordered input.
    again_full, again_rest = pack_best_fit(_documents(sizes), length)
    assert [_lists(p) for p in again_full] == [_lists(p) for p in full]
    assert [_lists(p) for p in again_rest] == [_lists(p) for p in rest]


@_SETTINGS
@given(sizes=_DOC_SIZES, length=st.integers(1, 30))
def test_pack_none_one_document_per_piece(sizes, length):
    docs = _documents(sizes)
    pieces = pack_none(docs, length)
    for piece in pieces:
        _check_piece(piece)
        assert len(piece) <= length
        assert piece.doc_lengths.tolist() == [len(piece)]
    assert len(pieces) == sum(-(-len(doc) // length) for doc in docs)
    if docs:
        assert np.array_equal(np.concatenate([p.tokens for p in pieces]), concat_pieces(docs).tokens)


@_SETTINGS
@given(
    lengths=st.lists(st.integers(1, 10), min_size=1, max_size=8),
    data=st.data(),
)
def test_slice_segments_sum_to_window(lengths, data):
    total = sum(lengths)
    piece = Piece(np.arange(total, dtype=np.int32), np.array(lengths, dtype=np.int32))
    start = data.draw(st.integers(0, total))
    stop = data.draw(st.integers(start, total))
    part = piece.slice(start, stop)
    assert part.tokens.tolist() == list(range(start, stop))
    assert int(part.doc_lengths.sum()) == stop - start
    bounds = set(np.cumsum(lengths).tolist())
    expected = sorted({b - start for b in bounds if start < b < stop} | ({stop - start} if stop > start else set()))
    assert np.cumsum(part.doc_lengths).tolist() == expected


# --- ConcatPacker (the one-copy, block-at-a-time pack_concat) -----------------------------


def _raw_documents(sizes: list[int], as_bytes: bool) -> list[tuple]:
    docs = []
    for d, size in enumerate(sizes):
        ids = 1000 * (d + 1) + np.arange(size, dtype=np.int32)
        docs.append((ids.tobytes() if as_bytes else ids, {"word_starts": np.arange(size) % 3 == 0}))
    return docs


@_SETTINGS
@given(sizes=_DOC_SIZES, lengths=st.lists(st.integers(1, 30), min_size=1, max_size=10),
       block_tokens=st.integers(1, 80), as_bytes=st.booleans())
def test_concat_packer_cuts_the_chunks_of_the_one_stream_packing(sizes, lengths, block_tokens, as_bytes):
    documents = _raw_documents(sizes, as_bytes)
    calls = []

    def planned(index):
        calls.append(index)
        return lengths[index % len(lengths)]

    expected, expected_rest = pack_concat(concat_documents(documents, EOS), planned)
    expected_calls, calls[:] = list(calls), []
    packer = ConcatPacker(list(documents), EOS, planned, block_tokens=block_tokens)
    chunks = list(packer)
    assert calls == expected_calls  # every index planned once, in order
    assert [_lists(c) for c in chunks] == [_lists(c) for c in expected]
    assert _lists(packer.rest) == _lists(expected_rest)
    for got, want in zip(chunks + [packer.rest], expected + [expected_rest]):
        assert got.tokens.dtype == np.int32 and got.doc_lengths.dtype == np.int32
        if sizes:
            assert got.features["word_starts"].tolist() == want.features["word_starts"].tolist()


def test_concat_packer_lets_go_of_each_document_once_copied():
    documents = _raw_documents([5, 5, 5, 5], as_bytes=True)
    held = list(documents)
    packer = ConcatPacker(held, EOS, lambda i: 4, block_tokens=6)
    iterator = iter(packer)
    first = next(iterator)
    assert first.tokens.tolist() == [1000, 1001, 1002, 1003]
    assert held[0] is None and held[2] is not None  # the first block holds documents 0 and 1
    rest = list(iterator)
    assert held == [None] * 4 and len(rest) == 5 and len(packer.rest) == 0


@_SETTINGS
@given(sizes=_DOC_SIZES, length=st.integers(1, 30))
def test_best_fit_releasing_its_input_packs_the_same_bins(sizes, length):
    docs = _documents(sizes)
    full, rest = pack_best_fit(list(docs), length)
    held = list(docs)
    released_full, released_rest = pack_best_fit(held, length, release=True)
    assert held == []
    assert [_lists(p) for p in released_full] == [_lists(p) for p in full]
    assert [_lists(p) for p in released_rest] == [_lists(p) for p in rest]
