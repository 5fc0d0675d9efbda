"""Documents carry their ids as narrow as their encoding batch allows."""

import pickle

import numpy as np
import pytest

from transforms.elements import Document, narrow_ids


def test_ids_below_two_to_the_sixteen_travel_as_uint16():
    ids = np.array([0, 1, 65535, 42], dtype=np.int32)
    narrow, width = narrow_ids(ids)
    assert width == 2 and narrow.dtype == np.dtype("<u2") and narrow.tolist() == [0, 1, 65535, 42]
    document = Document(b"k" * 16, narrow.tobytes(), {}, width)
    assert len(document.ids) == 8 and document.tokens == 4
    assert document.array().tolist() == [0, 1, 65535, 42]


def test_one_larger_id_keeps_the_batch_int32():
    ids = np.array([3, 65536, 7], dtype=np.int32)
    wide, width = narrow_ids(ids)
    assert width == 4 and wide.dtype == np.dtype("<i4") and wide.tolist() == [3, 65536, 7]
    document = Document(b"k" * 16, wide.tobytes(), {}, width)
    assert document.tokens == 3 and document.array().tolist() == [3, 65536, 7]
    assert narrow_ids(np.zeros(0, np.int32))[1] == 2


def test_a_document_without_a_width_is_int32_and_survives_pickling():
    document = Document(b"k" * 16, np.array([1, 70000], dtype=np.int32).tobytes(), {})
    assert document.width == 4 and document.array().tolist() == [1, 70000]
    again = pickle.loads(pickle.dumps(Document(b"k" * 16, b"\x01\x00\x02\x00", {}, 2)))
    assert again.width == 2 and again.array().tolist() == [1, 2]


def test_an_unknown_width_is_refused():
    with pytest.raises(ValueError, match="3 bytes each"):
        Document(b"k" * 16, b"\x00" * 6, {}, 3).array()
