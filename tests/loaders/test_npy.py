"""``.npy`` members of WebDataset shards: the cached-header fast path decodes exactly what numpy does."""

import io

import numpy as np
import pytest

from loaders.access.tar_shard import decode_npy


def _npy(array, version=None) -> bytes:
    buffer = io.BytesIO()
    np.lib.format.write_array(buffer, array, version=version, allow_pickle=array.dtype.hasobject)
    return buffer.getvalue()


@pytest.mark.parametrize("array", [
    np.arange(7, dtype=np.int32),
    np.array(5, dtype=np.int64),
    np.arange(12, dtype=np.float16).reshape(3, 4),
    np.asfortranarray(np.arange(6, dtype=np.int16).reshape(2, 3)),
    np.arange(4, dtype=">i4"),
    np.array(["ab", "c"]),
    np.zeros((0, 3), dtype=np.int32),
])
@pytest.mark.parametrize("version", [None, (2, 0), (3, 0)])
def test_same_values_dtype_and_shape_as_numpy(array, version):
    payload = _npy(array, version)
    expected = np.lib.format.read_array(io.BytesIO(payload), allow_pickle=False)
    for _ in range(2):  # second time from the header cache
        value = decode_npy(payload)
        assert value.dtype == expected.dtype and value.shape == expected.shape
        np.testing.assert_array_equal(value, expected)


def test_object_arrays_are_never_unpickled():
    with pytest.raises(ValueError, match="allow_pickle=False"):
        decode_npy(_npy(np.array([{"a": 1}], dtype=object)))


def test_truncated_payload_raises():
    payload = _npy(np.arange(5, dtype=np.int32))
    with pytest.raises(ValueError):
        decode_npy(payload[:-4])
    with pytest.raises(ValueError):
        decode_npy(payload + b"\0\0\0\0")
