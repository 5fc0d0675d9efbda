"""Tests of schemas/examples.py: the three example families."""

from __future__ import annotations

import pyarrow as pa
import pytest

import schemas
from schemas.examples import (
    DECODER_FAMILY,
    ENCODER_FAMILY,
    FAMILIES,
    SEQ2SEQ_FAMILY,
    TOKEN_TYPE,
    example_schema,
)


def _fields(schema: pa.Schema) -> list[tuple[str, pa.DataType, bool]]:
    return [(f.name, f.type, f.nullable) for f in schema]


def test_family_names():
    assert FAMILIES == ("decoder", "encoder", "seq2seq") == (DECODER_FAMILY, ENCODER_FAMILY, SEQ2SEQ_FAMILY)
    assert TOKEN_TYPE == pa.int32()
    assert schemas.example_schema is example_schema


def test_decoder_family():
    s = example_schema("decoder", seq_len=8)
    assert s.family == "decoder"
    assert _fields(s.schema) == [
        ("key", pa.string(), False),
        ("input_ids", pa.list_(pa.int32(), 8), False),
        ("doc_lengths", pa.list_(pa.int32()), False),
    ]
    assert s.token_columns == ("input_ids",)
    assert s.int_list_columns == ("doc_lengths",)
    assert s.array_columns == ("input_ids", "doc_lengths")
    assert s.scalar_columns == ()
    assert s.string_columns == ("key",)
    assert s.fixed_length("input_ids") == 8
    assert s.fixed_length("doc_lengths") is None


def test_decoder_family_with_prefix_length_and_denoiser():
    s = example_schema("decoder", seq_len=16, prefix_length=True, denoiser=True)
    assert s.schema.names == ["key", "input_ids", "doc_lengths", "prefix_length", "denoiser"]
    assert s.schema.field("prefix_length").type == pa.int32()
    assert s.scalar_columns == ("prefix_length",)
    assert s.string_columns == ("key", "denoiser")
    assert not any(f.nullable for f in s.schema)
    assert s.to_metadata() == {
        "family": "decoder",
        "columns": [
            {"name": "key", "type": "string"},
            {"name": "input_ids", "type": "fixed_size_list<item: int32>[16]"},
            {"name": "doc_lengths", "type": "list<item: int32>"},
            {"name": "prefix_length", "type": "int32"},
            {"name": "denoiser", "type": "string"},
        ],
    }


def test_encoder_family():
    s = example_schema("encoder", seq_len=128)
    assert _fields(s.schema) == [
        ("key", pa.string(), False),
        ("input_ids", pa.list_(pa.int32(), 128), False),
        ("labels", pa.list_(pa.int32(), 128), False),
    ]
    assert s.token_columns == ("input_ids", "labels")
    assert s.int_list_columns == () and s.scalar_columns == ()
    assert s.array_columns == ("input_ids", "labels")
    assert s.fixed_length("labels") == 128


def test_seq2seq_family_fixed_and_variable():
    fixed = example_schema("seq2seq", inputs_length=512, targets_length=114)
    assert _fields(fixed.schema) == [
        ("key", pa.string(), False),
        ("inputs", pa.list_(pa.int32(), 512), False),
        ("targets", pa.list_(pa.int32(), 114), False),
    ]
    assert (fixed.fixed_length("inputs"), fixed.fixed_length("targets")) == (512, 114)
    variable = example_schema("seq2seq", denoiser=True)
    assert variable.schema.names == ["key", "inputs", "targets", "denoiser"]
    assert variable.fixed_length("inputs") is None and variable.fixed_length("targets") is None
    assert variable.token_columns == ("inputs", "targets")
    assert variable.to_metadata()["columns"][1] == {"name": "inputs", "type": "list<item: int32>"}
    mixed = example_schema("seq2seq", inputs_length=8)
    assert (mixed.fixed_length("inputs"), mixed.fixed_length("targets")) == (8, None)


def test_schema_is_frozen_and_equal_by_value():
    assert example_schema("encoder", seq_len=4) == example_schema("encoder", seq_len=4)
    assert example_schema("encoder", seq_len=4) != example_schema("encoder", seq_len=5)
    with pytest.raises(AttributeError):
        example_schema("encoder", seq_len=4).family = "decoder"  # type: ignore[misc]


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"family": "clm", "seq_len": 8}, "unknown example family 'clm'; expected one of"),
        ({"family": "decoder"}, "family 'decoder' needs seq_len"),
        ({"family": "encoder"}, "family 'encoder' needs seq_len"),
        ({"family": "decoder", "seq_len": 0}, "fixed token length must be > 0, got 0"),
        ({"family": "encoder", "seq_len": -4}, "fixed token length must be > 0, got -4"),
        ({"family": "seq2seq", "inputs_length": 0}, "fixed token length must be > 0, got 0"),
        ({"family": "seq2seq", "targets_length": -1}, "fixed token length must be > 0, got -1"),
    ],
)
def test_errors(kwargs, message):
    family = kwargs.pop("family")
    with pytest.raises(ValueError, match=message.replace("(", r"\(")):
        example_schema(family, **kwargs)


def test_unknown_family_lists_families():
    with pytest.raises(ValueError) as info:
        example_schema("bart", seq_len=8)
    assert str(info.value) == "unknown example family 'bart'; expected one of ('decoder', 'encoder', 'seq2seq')"
