"""Documents travel as columnar batches, their ids as narrow as their encoding batch allows."""

import pickle

import numpy as np
import pytest

from transforms.elements import DocumentBatch, key_order, narrow_ids


def _batch(lengths, ids=None, features=("word_starts",)):
    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
    ids = np.arange(offsets[-1], dtype=np.uint16) if ids is None else ids
    keys = np.array([[n] * 16 for n in range(len(lengths))], dtype=np.uint8)
    flags = (np.arange(offsets[-1]) % 3 == 0)
    return DocumentBatch(keys, np.arange(len(lengths), dtype=np.uint64) * 7, offsets, ids,
                         {name: flags for name in features})


def test_ids_below_two_to_the_sixteen_travel_as_uint16():
    ids = np.array([0, 1, 65535, 42], dtype=np.int32)
    narrow, width = narrow_ids(ids)
    assert width == 2 and narrow.dtype == np.dtype("<u2") and narrow.tolist() == [0, 1, 65535, 42]
    batch = DocumentBatch.decode(_batch([1, 3], narrow).encode())
    assert batch.ids.dtype == np.dtype("<u2") and batch.document(1).ids.tolist() == [1, 65535, 42]


def test_one_larger_id_keeps_the_batch_int32():
    ids = np.array([3, 65536, 7], dtype=np.int32)
    wide, width = narrow_ids(ids)
    assert width == 4 and wide.dtype == np.dtype("<i4") and wide.tolist() == [3, 65536, 7]
    batch = DocumentBatch.decode(_batch([2, 1], wide).encode())
    assert batch.document(0).ids.tolist() == [3, 65536] and batch.document(1).tokens == 1
    assert narrow_ids(np.zeros(0, np.int32))[1] == 2


def test_a_batch_survives_its_encoding_and_pickling_with_every_column():
    batch = _batch([3, 0, 5])
    encoded = batch.encode()
    assert {type(part) for part in encoded} <= {bytes, int, dict}  # no pickling needed
    again = DocumentBatch.decode(pickle.loads(pickle.dumps(encoded)))
    assert again.count == 3 and again.tokens == 8 and again.lengths().tolist() == [3, 0, 5]
    assert again.keys.tolist() == batch.keys.tolist() and again.buckets.tolist() == [0, 7, 14]
    third = again.document(2)
    assert third.key == bytes([2] * 16) and third.ids.tolist() == [3, 4, 5, 6, 7]
    assert np.flatnonzero(third.features["word_starts"]).tolist() == [0, 3]  # tokens 3 and 6


def test_take_and_concat_move_each_documents_ids_and_flags_with_it():
    batch = _batch([2, 3, 1])
    taken = batch.take(np.array([2, 0]))
    assert taken.keys[:, 0].tolist() == [2, 0] and taken.buckets.tolist() == [14, 0]
    assert taken.ids.tolist() == [5, 0, 1] and taken.offsets.tolist() == [0, 1, 3]
    assert taken.features["word_starts"].tolist() == [False, True, False]
    wide = DocumentBatch(batch.keys[:1], batch.buckets[:1], np.array([0, 1]), np.array([70000], np.int32),
                         {"word_starts": np.array([True])})
    joined = DocumentBatch.concat([taken, wide])
    assert joined.ids.dtype == np.int32 and joined.ids.tolist() == [5, 0, 1, 70000]
    assert joined.offsets.tolist() == [0, 1, 3, 4] and joined.features["word_starts"].tolist() == [False, True,
                                                                                                   False, True]


def test_a_malformed_batch_is_refused():
    keys, buckets, offsets, width, ids, features = _batch([2, 2]).encode()
    with pytest.raises(ValueError, match="3 bytes each"):
        DocumentBatch.decode((keys, buckets, offsets, 3, ids, features))
    with pytest.raises(ValueError, match="disagree"):
        DocumentBatch.decode((keys, buckets, offsets, width, ids[:-2], features))
    with pytest.raises(ValueError, match="disagree"):
        DocumentBatch.decode((keys[:16], buckets, offsets, width, ids, features))


def test_keys_sort_bytewise():
    keys = np.array([[2] + [0] * 15, [1] + [9] * 15, [1] + [0] * 14 + [5], [2] + [0] * 15], dtype=np.uint8)
    assert key_order(keys).tolist() == sorted(range(4), key=lambda i: (keys[i].tobytes(), i))
