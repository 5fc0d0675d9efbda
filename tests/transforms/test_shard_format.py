"""Tests of the shard encoders (transforms/writing/shard_format.py, tar_format.py, columns.py, hashing_writer.py)."""

from __future__ import annotations

import hashlib
import io
import tarfile

import numpy as np
import pyarrow as pa
import pytest
from lmshards_testing import write_arrow, write_tar

from schemas.examples import example_schema
from transforms.writing import shard_format
from transforms.writing.shard_format import ExampleColumns, HashingWriter, npy_bytes

DECODER = example_schema("decoder", seq_len=4, prefix_length=True)
SEQ2SEQ = example_schema("seq2seq", denoiser=True)


def _decoder_examples() -> list[dict]:
    return [
        {"key": "k0", "input_ids": np.array([5, 6, 7, 8]), "doc_lengths": np.array([4]), "prefix_length": 1},
        {"key": "k1", "input_ids": [9, 10, 11, 12], "doc_lengths": [1, 3], "prefix_length": np.int64(3)},
        {"key": "k2", "input_ids": np.array([13, 1, 14, 1], np.int64), "doc_lengths": [2, 1, 1], "prefix_length": 2},
    ]


def examples_to_batch(examples, schema) -> pa.RecordBatch:
    """One record batch of ``examples`` (dicts of column -> value), as the shard writers make them."""
    columns = ExampleColumns.from_examples(examples, schema)
    if columns.count == 0:
        return pa.RecordBatch.from_pylist([], schema=schema.schema)
    return next(columns.record_batches(columns.count))


def example_members(example: dict, schema) -> list[tuple[str, bytes]]:
    """``(member name, payload)`` of one example, sorted by name: the oracle of the tar writer's
    members (token and integer-list columns as int32 ``.npy``, scalar ints a 0-d int32 ``.npy``,
    strings other than the key a UTF-8 ``.txt``)."""
    key = example["key"]
    members = []
    for column in (*schema.array_columns, *schema.scalar_columns):
        members.append((f"{key}.{column}.npy", npy_bytes(np.asarray(example[column], dtype=np.int32))))
    for column in schema.string_columns:
        if column != "key":
            members.append((f"{key}.{column}.txt", str(example[column]).encode("utf-8")))
    return sorted(members)


def _arrow_bytes(examples, schema) -> bytes:
    buffer = io.BytesIO()
    write_arrow(buffer, examples, schema)
    return buffer.getvalue()


def _tar_bytes(examples, schema) -> bytes:
    buffer = io.BytesIO()
    write_tar(buffer, examples, schema)
    return buffer.getvalue()


# --- Arrow ----------------------------------------------------------------------------------


def test_arrow_round_trip_exact_values():
    data = _arrow_bytes(_decoder_examples(), DECODER)
    table = pa.ipc.open_stream(data).read_all()
    assert table.schema == DECODER.schema
    assert table.schema.field("input_ids").type == pa.list_(pa.int32(), 4)
    assert table.schema.field("doc_lengths").type == pa.list_(pa.int32())
    assert table.to_pydict() == {
        "key": ["k0", "k1", "k2"],
        "input_ids": [[5, 6, 7, 8], [9, 10, 11, 12], [13, 1, 14, 1]],
        "doc_lengths": [[4], [1, 3], [2, 1, 1]],
        "prefix_length": [1, 3, 2],
    }
    assert all(column.null_count == 0 for column in table.columns)


def test_arrow_fixed_size_list_is_a_zero_copy_view(tmp_path):
    path = tmp_path / "shard.arrow"
    path.write_bytes(_arrow_bytes(_decoder_examples(), DECODER))
    with pa.memory_map(str(path)) as source:
        batch = next(iter(pa.ipc.open_stream(source)))
        column = batch.column("input_ids")
        values = column.values
        view = values.to_numpy(zero_copy_only=True).reshape(len(column), column.type.list_size)
        assert view.dtype == np.int32
        assert view.tolist() == [[5, 6, 7, 8], [9, 10, 11, 12], [13, 1, 14, 1]]
        # The numpy view points into the memory-mapped Arrow buffer (no copy).
        assert view.ctypes.data == values.buffers()[1].address
        assert not view.flags.writeable


def test_arrow_variable_length_seq2seq():
    examples = [
        {"key": "a", "inputs": [1, 2, 3], "targets": [4], "denoiser": "R"},
        {"key": "b", "inputs": np.array([], np.int32), "targets": np.array([5, 6]), "denoiser": "X"},
        {"key": "c", "inputs": [7], "targets": [8, 9, 10], "denoiser": "S"},
    ]
    batch = examples_to_batch(examples, SEQ2SEQ)
    assert batch.schema.field("inputs").type == pa.list_(pa.int32())
    assert batch.column("inputs").offsets.to_pylist() == [0, 3, 3, 4]
    table = pa.ipc.open_stream(_arrow_bytes(examples, SEQ2SEQ)).read_all()
    assert table.to_pydict() == {
        "key": ["a", "b", "c"],
        "inputs": [[1, 2, 3], [], [7]],
        "targets": [[4], [5, 6], [8, 9, 10]],
        "denoiser": ["R", "X", "S"],
    }


def test_arrow_fixed_length_mismatch_raises():
    examples = _decoder_examples()
    examples[1]["input_ids"] = [1, 2, 3]
    with pytest.raises(ValueError, match="column 'input_ids' is fixed at 4 tokens, got a row of 3"):
        examples_to_batch(examples, DECODER)


def test_arrow_fixed_batch_rows():
    examples = _decoder_examples() * 2
    buffer = io.BytesIO()
    write_arrow(buffer, examples, DECODER, batch_rows=2)
    reader = pa.ipc.open_stream(buffer.getvalue())
    assert [batch.num_rows for batch in reader] == [2, 2, 2]
    assert shard_format.ARROW_BATCH_ROWS == 1000
    reader = pa.ipc.open_stream(_arrow_bytes(_decoder_examples() * 834, DECODER))  # 2502 rows
    assert [batch.num_rows for batch in reader] == [1000, 1000, 502]
    with pytest.raises(ValueError, match="batch_rows must be >= 1"):
        write_arrow(io.BytesIO(), examples, DECODER, batch_rows=0)


def test_arrow_default_batch_rows_and_empty_shard():
    assert shard_format.ARROW_BATCH_ROWS == 1000
    table = pa.ipc.open_stream(_arrow_bytes([], DECODER)).read_all()
    assert table.num_rows == 0 and table.schema == DECODER.schema


def test_arrow_bytes_deterministic_and_hashed():
    first = _arrow_bytes(_decoder_examples(), DECODER)
    assert first == _arrow_bytes(_decoder_examples(), DECODER)
    sink = io.BytesIO()
    writer = HashingWriter(sink)
    write_arrow(writer, _decoder_examples(), DECODER)
    assert sink.getvalue() == first
    assert writer.bytes == len(first) == writer.tell()
    assert writer.sha256.hexdigest() == hashlib.sha256(first).hexdigest()


class _WriteOnly:
    """A non-seekable sink, like an upload stream."""

    def __init__(self):
        self.chunks: list[bytes] = []

    def write(self, data) -> int:
        self.chunks.append(bytes(data))
        return len(data)

    def flush(self) -> None:
        pass


def test_writers_accept_non_seekable_handles():
    arrow_sink, tar_sink = _WriteOnly(), _WriteOnly()
    write_arrow(HashingWriter(arrow_sink), _decoder_examples(), DECODER)
    write_tar(HashingWriter(tar_sink), _decoder_examples(), DECODER)
    assert b"".join(arrow_sink.chunks) == _arrow_bytes(_decoder_examples(), DECODER)
    assert b"".join(tar_sink.chunks) == _tar_bytes(_decoder_examples(), DECODER)


# --- WebDataset tar -------------------------------------------------------------------------


def test_npy_bytes_exact():
    header = b"\x93NUMPY\x01\x00v\x00{'descr': '<i4', 'fortran_order': False, 'shape': (3,), }"
    assert npy_bytes(np.array([1, 2, 3], np.int32)) == header + b" " * 60 + b"\n" + bytes(
        [1, 0, 0, 0, 2, 0, 0, 0, 3, 0, 0, 0]
    )
    scalar = npy_bytes(np.asarray(7, np.int32))
    assert b"'shape': ()," in scalar and scalar.endswith(b"\n\x07\x00\x00\x00")
    assert np.load(io.BytesIO(scalar)).shape == ()
    # A transposed (Fortran-ordered) array is written in C order with the same header.
    matrix = np.arange(6, dtype=np.int32).reshape(2, 3)
    assert npy_bytes(matrix.T) == npy_bytes(np.ascontiguousarray(matrix.T))
    assert len(npy_bytes(matrix)) % 64 == 24  # 128-byte header + 24 bytes of data


def test_example_members_names_and_payloads():
    members = example_members(_decoder_examples()[1], DECODER)
    assert [name for name, _ in members] == ["k1.doc_lengths.npy", "k1.input_ids.npy", "k1.prefix_length.npy"]
    payload = dict(members)
    assert np.load(io.BytesIO(payload["k1.input_ids.npy"])).tolist() == [9, 10, 11, 12]
    assert np.load(io.BytesIO(payload["k1.input_ids.npy"])).dtype == np.int32
    assert np.load(io.BytesIO(payload["k1.doc_lengths.npy"])).tolist() == [1, 3]
    prefix = np.load(io.BytesIO(payload["k1.prefix_length.npy"]))
    assert prefix.shape == () and prefix.dtype == np.int32 and int(prefix) == 3

    seq = example_members({"key": "s", "inputs": [1], "targets": [2, 3], "denoiser": "X"}, SEQ2SEQ)
    assert [name for name, _ in seq] == ["s.denoiser.txt", "s.inputs.npy", "s.targets.npy"]
    assert dict(seq)["s.denoiser.txt"] == b"X"


@pytest.mark.parametrize("key", ["has.dot", "a/b", "."])
def test_key_with_dot_or_slash_rejected(key):
    example = dict(_decoder_examples()[0], key=key)
    with pytest.raises(ValueError, match=r"may not contain '\.' or '/' \(it is the WebDataset __key__\)"):
        _tar_bytes([example], DECODER)


def test_tar_members_sorted_with_fixed_headers():
    data = _tar_bytes(_decoder_examples(), DECODER)
    assert len(data) % tarfile.RECORDSIZE == 0
    with tarfile.open(fileobj=io.BytesIO(data), mode="r:") as tar:
        infos = tar.getmembers()
        assert [i.name for i in infos] == [
            f"{key}.{field}.npy"
            for key in ("k0", "k1", "k2")
            for field in ("doc_lengths", "input_ids", "prefix_length")
        ]
        for info in infos:
            assert info.isfile()
            assert (info.mtime, info.uid, info.gid, info.uname, info.gname, info.mode) == (0, 0, 0, "", "", 0o644)
        ids = np.load(io.BytesIO(tar.extractfile("k2.input_ids.npy").read()))
        assert ids.tolist() == [13, 1, 14, 1]
    # USTAR magic in the first header.
    assert data[257:263] == b"ustar\x00"


def test_tar_bytes_deterministic():
    first = _tar_bytes(_decoder_examples(), DECODER)
    assert first == _tar_bytes(_decoder_examples(), DECODER)
    # Different content, different bytes; same rows as other array types, same bytes.
    other = _decoder_examples()
    other[0]["input_ids"] = np.array([5, 6, 7, 9])
    assert _tar_bytes(other, DECODER) != first
    as_lists = [
        {k: (v.tolist() if isinstance(v, np.ndarray) else v) for k, v in ex.items()} for ex in _decoder_examples()
    ]
    assert _tar_bytes(as_lists, DECODER) == first


def test_tar_reads_with_webdataset(tmp_path):
    import webdataset
    path = tmp_path / "shard.tar"
    path.write_bytes(_tar_bytes(_decoder_examples(), DECODER))
    samples = list(webdataset.WebDataset(str(path), shardshuffle=False).decode())
    assert [s["__key__"] for s in samples] == ["k0", "k1", "k2"]
    assert samples[1]["input_ids.npy"].tolist() == [9, 10, 11, 12]
    assert samples[2]["doc_lengths.npy"].tolist() == [2, 1, 1]
    assert int(samples[0]["prefix_length.npy"]) == 1


def test_background_hashing_writer_same_bytes_and_digest():
    rng = np.random.default_rng(3)
    pieces = [rng.integers(0, 256, int(n), dtype=np.uint8).tobytes() for n in rng.integers(0, 3000, 50)]
    reused = bytearray(700)  # a caller that reuses its buffer after each write, as pyarrow may
    sink = io.BytesIO()
    writer = HashingWriter(sink, background=True, block_bytes=1000, max_pending=2)
    expected = bytearray()
    for piece in pieces:
        writer.write(piece)
        reused[:] = piece[:700].ljust(700, b"x")
        writer.write(reused)
        expected += piece + bytes(reused)
    assert writer.bytes == len(expected) == writer.tell()
    writer.finish()
    assert sink.getvalue() == bytes(expected)
    assert writer.sha256.hexdigest() == hashlib.sha256(expected).hexdigest()


def test_background_hashing_writer_reraises_write_errors():

    class Full(io.RawIOBase):
        def writable(self):
            return True

        def write(self, data):
            raise OSError("no space left on device")

    writer = HashingWriter(Full(), background=True, block_bytes=10)
    writer.write(b"0123456789abc")
    with pytest.raises(OSError, match="no space left"):
        writer.finish()


@pytest.mark.parametrize("max_len", [3, 300])  # short rows: one vectorized gather; long rows: row slices
def test_example_columns_take_concat_and_encode_round_trip(max_len):
    from transforms.writing.shard_format import ExampleColumns

    schema = example_schema("seq2seq", denoiser=True)
    rng = np.random.default_rng(max_len)
    examples = [{"key": f"k{i}", "inputs": rng.integers(0, 1000, rng.integers(0, max_len)).astype(np.int32),
                 "targets": rng.integers(0, 1000, rng.integers(1, max_len)).astype(np.int32),
                 "denoiser": "RSX"[i % 3]} for i in range(40)]
    columns = ExampleColumns.from_examples(examples, schema)
    order = rng.permutation(40)[:25]
    taken = columns.take(order)
    assert taken.count == 25
    for row, i in enumerate(order):
        got = taken.row(row)
        assert got["key"] == examples[i]["key"] and got["denoiser"] == examples[i]["denoiser"]
        assert got["inputs"].tolist() == examples[i]["inputs"].tolist()
        assert got["targets"].tolist() == examples[i]["targets"].tolist()
        assert got["inputs"].dtype == np.int32
    both = ExampleColumns.concat([taken, ExampleColumns.decode(columns.encode(), schema)], schema)
    assert both.count == 65 and both.row(25)["inputs"].tolist() == examples[0]["inputs"].tolist()
    assert both.row(64)["key"] == "k39"


def _merged_both_ways(parts, schema, rng):
    """MergedColumns of a random order over ``parts``, and concat-then-take of the same order."""
    from transforms.writing.shard_format import ExampleColumns, MergedColumns

    starts = np.cumsum([0] + [p.count for p in parts])
    order = rng.permutation(starts[-1])
    part = np.searchsorted(starts, order, side="right") - 1
    return (MergedColumns(parts, part, order - starts[part], schema),
            ExampleColumns.concat(parts, schema).take(order))


def _written(columns) -> tuple[bytes, bytes, list[bytes]]:
    """Arrow and tar bytes of ``columns``, and its Arrow batches of 7 rows serialized."""
    from transforms.writing.shard_format import write_arrow_columns, write_tar_columns

    arrow, tar = io.BytesIO(), io.BytesIO()
    write_arrow_columns(arrow, columns)
    write_tar_columns(tar, columns)
    small = [batch.serialize().to_pybytes() for batch in columns.record_batches(7)]
    return arrow.getvalue(), tar.getvalue(), small


@pytest.mark.parametrize("max_len", [3, 300])
def test_merged_columns_write_what_concat_then_take_writes(max_len):
    from transforms.writing.shard_format import ExampleColumns

    schema = example_schema("seq2seq", denoiser=True)
    rng = np.random.default_rng(7 + max_len)
    parts = [ExampleColumns.from_examples(
        [{"key": f"k{size}-{i}", "inputs": rng.integers(0, 99, rng.integers(0, max_len)).astype(np.int32),
          "targets": rng.integers(0, 99, rng.integers(1, max_len)).astype(np.int32),
          "denoiser": "RSX"[i % 3]} for i in range(size)], schema) for size in (5, 0, 9, 4)]
    merged, expected = _merged_both_ways(parts, schema, rng)
    assert merged.count == expected.count == 18
    assert merged.strings == expected.strings
    for name in ("inputs", "targets"):
        lengths, rows = merged.array_rows(name)
        want_lengths, want_rows = expected.array_rows(name)
        assert lengths.tolist() == want_lengths.tolist()
        assert [bytes(r) for r in rows] == [bytes(r) for r in want_rows]
    assert _written(merged) == _written(expected)


def test_merged_columns_of_fixed_length_rows_write_what_concat_then_take_writes():
    from transforms.writing.shard_format import ExampleColumns

    schema = example_schema("decoder", seq_len=6, prefix_length=True)
    rng = np.random.default_rng(11)
    parts = [ExampleColumns.from_examples(
        [{"key": f"k{size}-{i}", "input_ids": rng.integers(0, 99, 6).astype(np.int32),
          "doc_lengths": rng.integers(1, 6, rng.integers(1, 4)).astype(np.int32),
          "prefix_length": int(rng.integers(0, 6))} for i in range(size)], schema) for size in (3, 0, 7, 1, 5)]
    parts[2] = parts[2].take(np.array([6, 0, 3, 1, 2, 5, 4]))  # a part that is itself a gather
    merged, expected = _merged_both_ways(parts, schema, rng)
    assert merged.count == expected.count == 16
    np.testing.assert_array_equal(merged.scalars["prefix_length"], expected.scalars["prefix_length"])
    assert merged.strings["key"] == expected.strings["key"]
    assert _written(merged) == _written(expected)


def test_merged_columns_of_no_rows():
    from transforms.writing.shard_format import ExampleColumns, MergedColumns

    schema = example_schema("seq2seq")
    empty = MergedColumns([ExampleColumns.from_examples([], schema)], np.zeros(0, np.int64), np.zeros(0, np.int64),
                          schema)
    assert empty.count == 0 and list(empty.record_batches()) == []
    assert _written(empty)[:2] == _written(ExampleColumns.from_examples([], schema))[:2]


def _tarfile_bytes(examples, schema) -> bytes:
    """What Python's tarfile writes for the examples' members (stream mode, USTAR, fixed metadata)."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w|", format=tarfile.USTAR_FORMAT) as tar:
        for example in examples:
            for name, payload in example_members(example, schema):
                info = tarfile.TarInfo(name)
                info.size, info.mtime, info.mode, info.uname, info.gname = len(payload), 0, 0o644, "", ""
                tar.addfile(info, io.BytesIO(payload))
    return buffer.getvalue()


@pytest.mark.parametrize("rows", [0, 1, 3, 40])
def test_columnar_tar_writer_writes_what_tarfile_writes(rows):
    rng = np.random.default_rng(rows)
    seq2seq = [{"key": f"validation-r-c{i:06d}-d{i % 3}", "inputs": rng.integers(0, 9, rng.integers(0, 700)),
                "targets": rng.integers(0, 9, rng.integers(1, 40)), "denoiser": ["R", "S", "X\u00e9"][i % 3]}
               for i in range(rows)]
    assert _tar_bytes(seq2seq, SEQ2SEQ) == _tarfile_bytes(seq2seq, SEQ2SEQ)
    decoder = [dict(_decoder_examples()[i % 3], key=f"k{i}") for i in range(rows)]
    assert _tar_bytes(decoder, DECODER) == _tarfile_bytes(decoder, DECODER)


def test_tar_member_name_too_long_is_a_clear_error():
    example = dict(_decoder_examples()[0], key="k" * 90)
    with pytest.raises(ValueError, match="longer than 100 bytes"):
        _tar_bytes([example], DECODER)


# --- columns across the shuffle -----------------------------------------------------------------

@pytest.mark.parametrize("values, dtype", [([5, 65535, 0, 9], "<u2"), ([-100, 32767, 3, -32768], "<i2"),
                                           ([70000, -1, 2, 3], "<i4"), ([-40000, 1, 2, 3], "<i4")])
def test_columns_travel_narrow_and_write_the_same_bytes(values, dtype):
    """Encoded for the shuffle, array values take the narrowest dtype that holds them all; decoded,
    they are the same integers, and both writers (one part or merged parts) write the same bytes."""
    from transforms.writing.columns import ExampleColumns, MergedColumns
    from transforms.writing.shard_format import write_arrow_columns
    from transforms.writing.tar_format import write_tar_columns

    examples = [dict(example, input_ids=np.array(values) if i == 0 else example["input_ids"])
                for i, example in enumerate(_decoder_examples())]
    columns = ExampleColumns.from_examples(examples, DECODER)
    count, arrays, _, _ = encoded = columns.encode()
    assert arrays["input_ids"][1] == dtype
    assert len(arrays["input_ids"][0]) == 12 * np.dtype(dtype).itemsize
    decoded = ExampleColumns.decode(encoded, DECODER)
    assert decoded.arrays["input_ids"][0].dtype == np.dtype(dtype)
    assert decoded.arrays["input_ids"][0].tolist() == columns.arrays["input_ids"][0].tolist()
    for writer, expected in ((write_arrow_columns, _arrow_bytes(examples, DECODER)),
                             (write_tar_columns, _tar_bytes(examples, DECODER))):
        for form in (decoded, MergedColumns([decoded], np.zeros(3, np.int64), np.arange(3), DECODER)):
            buffer = io.BytesIO()
            writer(buffer, form)
            assert buffer.getvalue() == expected, (writer, form)


def test_columns_of_an_unknown_travel_dtype_are_refused():
    from transforms.writing.columns import ExampleColumns

    count, arrays, scalars, strings = ExampleColumns.from_examples(_decoder_examples(), DECODER).encode()
    flat, _, offsets = arrays["input_ids"]
    with pytest.raises(ValueError, match="'<f8'"):
        ExampleColumns.decode((count, {**arrays, "input_ids": (flat, "<f8", offsets)}, scalars, strings), DECODER)
