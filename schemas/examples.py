"""Arrow schemas of the three example families and their WebDataset field names.

Families (docs/design.md section 5):

- ``decoder`` (clm, prefix_lm, ul2 decoder-only): ``input_ids`` fixed_size_list<int32>[L],
  ``doc_lengths`` list<int32>, optionally ``prefix_lengths`` list<int32> (one per document
  segment: its bidirectional prefix; format 3, where format 2 had one ``prefix_length`` int32).
- ``encoder`` (mlm): ``input_ids`` and ``labels`` fixed_size_list<int32>[L] (-100 where no loss).
- ``seq2seq`` (span_corruption, bart, ul2 encoder-decoder): ``inputs`` and ``targets``,
  fixed_size_list when every example has the same length, list<int32> otherwise.

Every family has a ``key`` string column (the example key, no dots, so it is also the
WebDataset ``__key__``) and optionally a ``denoiser`` string column (ul2). Token columns
never hold nulls. In a WebDataset tar an example is ``KEY.<field>.npy`` per token column
(int32 .npy) and ``KEY.<field>.txt`` for strings and scalars that are not arrays.
"""

from __future__ import annotations

from dataclasses import dataclass

import pyarrow as pa

__all__ = [
    "DECODER_FAMILY",
    "ENCODER_FAMILY",
    "FAMILIES",
    "SEQ2SEQ_FAMILY",
    "TOKEN_TYPE",
    "ExampleSchema",
    "example_schema",
]

DECODER_FAMILY = "decoder"
ENCODER_FAMILY = "encoder"
SEQ2SEQ_FAMILY = "seq2seq"
FAMILIES = (DECODER_FAMILY, ENCODER_FAMILY, SEQ2SEQ_FAMILY)

TOKEN_TYPE = pa.int32()


@dataclass(frozen=True)
class ExampleSchema:
    """The columns of one dataset's examples.

    Attributes:
        family: one of :data:`FAMILIES`.
        schema: the Arrow schema, column order included.
        token_columns: columns holding token ids (fixed or variable lists of int32).
        int_list_columns: other list<int32> columns (``doc_lengths``, ``prefix_lengths``).
        scalar_columns: int32 scalar columns (format 2's ``prefix_length``).
        string_columns: string columns (``key``, ``denoiser``).
    """

    family: str
    schema: pa.Schema
    token_columns: tuple[str, ...]
    int_list_columns: tuple[str, ...]
    scalar_columns: tuple[str, ...]
    string_columns: tuple[str, ...]

    @property
    def array_columns(self) -> tuple[str, ...]:
        """Columns stored as int32 ``.npy`` arrays in WebDataset tars."""
        return self.token_columns + self.int_list_columns

    def fixed_length(self, column: str) -> int | None:
        """Row length of a fixed_size_list column, None for a variable one."""
        field_type = self.schema.field(column).type
        if pa.types.is_fixed_size_list(field_type):
            return field_type.list_size
        return None

    def to_metadata(self) -> dict:
        """A JSON-able description for the manifest."""
        return {
            "family": self.family,
            "columns": [{"name": f.name, "type": str(f.type)} for f in self.schema],
        }


def _tokens(length: int | None) -> pa.DataType:
    if length is None:
        return pa.list_(TOKEN_TYPE)
    if length <= 0:
        raise ValueError(f"fixed token length must be > 0, got {length}")
    return pa.list_(TOKEN_TYPE, length)


def example_schema(
    family: str,
    *,
    seq_len: int | None = None,
    inputs_length: int | None = None,
    targets_length: int | None = None,
    prefix_lengths: bool = False,
    prefix_length: bool = False,
    denoiser: bool = False,
) -> ExampleSchema:
    """Build the schema of an example family.

    Args:
        family: ``decoder``, ``encoder`` or ``seq2seq``.
        seq_len: row length of ``input_ids`` (decoder, encoder); required there.
        inputs_length: fixed length of ``inputs`` (seq2seq), None for variable.
        targets_length: fixed length of ``targets`` (seq2seq), None for variable.
        prefix_lengths: add a list<int32> ``prefix_lengths`` column, aligned with ``doc_lengths``
            (decoder family).
        prefix_length: add format 2's int32 ``prefix_length`` scalar (one prefix per row; read,
            no longer written by an objective).
        denoiser: add a string ``denoiser`` column (ul2).

    Raises:
        ValueError: unknown family or a missing length.
    """
    fields = [pa.field("key", pa.string(), nullable=False)]
    token_columns: tuple[str, ...]
    int_list_columns: tuple[str, ...] = ()
    scalar_columns: tuple[str, ...] = ()
    if family in (DECODER_FAMILY, ENCODER_FAMILY):
        if seq_len is None:
            raise ValueError(f"family {family!r} needs seq_len")
        fields.append(pa.field("input_ids", _tokens(seq_len), nullable=False))
        if family == DECODER_FAMILY:
            token_columns = ("input_ids",)
            fields.append(pa.field("doc_lengths", pa.list_(pa.int32()), nullable=False))
            int_list_columns = ("doc_lengths",)
            if prefix_lengths:
                fields.append(pa.field("prefix_lengths", pa.list_(pa.int32()), nullable=False))
                int_list_columns = ("doc_lengths", "prefix_lengths")
            if prefix_length:
                fields.append(pa.field("prefix_length", pa.int32(), nullable=False))
                scalar_columns = ("prefix_length",)
        else:
            fields.append(pa.field("labels", _tokens(seq_len), nullable=False))
            token_columns = ("input_ids", "labels")
    elif family == SEQ2SEQ_FAMILY:
        fields.append(pa.field("inputs", _tokens(inputs_length), nullable=False))
        fields.append(pa.field("targets", _tokens(targets_length), nullable=False))
        token_columns = ("inputs", "targets")
    else:
        raise ValueError(f"unknown example family {family!r}; expected one of {FAMILIES}")
    string_columns: tuple[str, ...] = ("key",)
    if denoiser:
        fields.append(pa.field("denoiser", pa.string(), nullable=False))
        string_columns = ("key", "denoiser")
    return ExampleSchema(
        family=family,
        schema=pa.schema(fields),
        token_columns=token_columns,
        int_list_columns=int_list_columns,
        scalar_columns=scalar_columns,
        string_columns=string_columns,
    )
