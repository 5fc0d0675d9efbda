"""What flows between the stages of the pipeline (docs/design.md section 2), named.

- :class:`Document`: a tokenized document, from Tokenize to AssignGroups keyed by
  ``(split, sub-bucket)``;
- :class:`DocumentBlock`: documents of one pack group, from AssignGroups through the pack-group
  shuffle to Pack, keyed by ``(split, pack group)``: the shuffle groups blocks, not documents;
- :class:`Chunk`: a packed chunk, from Pack to BuildExamples.
- :class:`ShardPiece`: the examples of one block bound for one shard, from BuildExamples to
  WriteShards (keyed by ``(split, shard, shard count)``), crossing the shuffle encoded
  (:meth:`ShardPiece.encode`).

Shuffle keys stay plain tuples: Beam encodes them deterministically without pickling.
This module imports no Beam, so that build workers can use it.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from schemas.examples import ExampleSchema
from transforms.columns import narrowest
from transforms.objectives.packing import Piece
from transforms.shard_format import ExampleColumns, MergedColumns

__all__ = ["ID_DTYPES", "Chunk", "Document", "DocumentBlock", "ShardPiece", "narrow_ids"]


class Document(NamedTuple):
    """A tokenized document.

    Attributes:
        key: the 16-byte digest of its text (:func:`transforms.tokenize.document_key`); also the
            order documents are packed in.
        ids: its token ids as raw bytes of ``width``-byte unsigned (2) or int32 (4) integers (raw
            bytes cross a shuffle far cheaper than pickled arrays), or an integer array.
        features: per-token feature name (``word_starts``, ...) -> one bool per token.
        width: bytes per id in ``ids`` when they are bytes: 2 when every id of the document's
            encoding batch is below 2**16 (every vocabulary of up to 65,536 entries), which halves
            what the shuffle carries and what is held until Pack; else 4.
    """

    key: bytes
    ids: bytes | np.ndarray
    features: dict[str, np.ndarray]
    width: int = 4

    @property
    def tokens(self) -> int:
        """Number of token ids."""
        return len(self.ids) // self.width if isinstance(self.ids, bytes) else len(self.ids)

    def array(self) -> np.ndarray:
        """The ids as an array (a view of the bytes: ``<u2`` for width 2, ``<i4`` for 4)."""
        if not isinstance(self.ids, bytes):
            return self.ids
        if self.width not in ID_DTYPES:
            raise ValueError(f"document ids of {self.width} bytes each: expected 2 or 4")
        return np.frombuffer(self.ids, dtype=ID_DTYPES[self.width])


class DocumentBlock(tuple):
    """Documents bound for one pack group, one element of Pack's shuffle (a tuple of
    :class:`Document`, or of the references a runner hands them over by). Which documents share
    a block depends on bundles and the runner, never the output: Pack sorts a group's
    documents by key."""

    __slots__ = ()


#: The dtype of a :class:`Document`'s id bytes, by width.
ID_DTYPES = {2: np.dtype("<u2"), 4: np.dtype("<i4")}


def narrow_ids(ids: np.ndarray) -> tuple[np.ndarray, int]:
    """``(ids, width)``: ``ids`` as uint16 when every one fits (width 2), else as int32 (4)."""
    narrow = narrowest(ids, ("<u2",))
    return narrow, narrow.dtype.itemsize


class Chunk(NamedTuple):
    """A packed chunk, ready for the objective.

    Attributes:
        split: ``train`` or ``validation``.
        key: the chunk key (``train-g00012-c000034``: pack group 12, chunk 34).
        plan: the objective's plan of the chunk (UL2's denoiser; 0 for other objectives).
        piece: its tokens, document lengths and features.
    """

    split: str
    key: str
    plan: int
    piece: Piece


def _order_of(orders: np.ndarray) -> np.ndarray:
    """Stable ascending order of ``(n, 16)`` uint8 keys compared bytewise."""
    high = orders[:, :8].copy().view(">u8").reshape(-1)
    low = orders[:, 8:].copy().view(">u8").reshape(-1)
    return np.lexsort((low, high))


class ShardPiece:
    """Rows of one split on their way to the shard writers.

    Attributes:
        orders: ``(n, 16)`` uint8 row-order keys (:func:`transforms.objectives.layout.row_order_key`).
        shard_hashes: ``(n,)`` uint64; a row's shard is ``shard_hashes % num_shards``.
        chunk_tokens: ``(n,)`` int64 source tokens of each row.
        columns: the rows' :class:`~transforms.shard_format.ExampleColumns`.
    """

    __slots__ = ("orders", "shard_hashes", "chunk_tokens", "columns")

    def __init__(self, orders, shard_hashes, chunk_tokens, columns: ExampleColumns):
        self.orders, self.shard_hashes, self.chunk_tokens, self.columns = orders, shard_hashes, chunk_tokens, columns

    @property
    def count(self) -> int:
        return self.columns.count

    @classmethod
    def merge_sorted(cls, parts: list[ShardPiece], schema: ExampleSchema) -> ShardPiece:
        """The rows of all ``parts`` in ascending order of their order keys (bytewise, like sorting
        ``bytes``); their token values stay in the parts until written (:class:`MergedColumns`)."""
        if not parts:
            return cls(np.zeros((0, 16), np.uint8), np.zeros(0, np.uint64), np.zeros(0, np.int64),
                       ExampleColumns.from_examples([], schema))
        orders = np.concatenate([p.orders for p in parts])
        order = _order_of(orders)
        part = np.repeat(np.arange(len(parts)), [p.count for p in parts])[order]
        starts = np.zeros(len(parts) + 1, dtype=np.int64)
        np.cumsum([p.count for p in parts], out=starts[1:])
        row = order - starts[part]
        return cls(
            orders[order],
            np.concatenate([p.shard_hashes for p in parts])[order],
            np.concatenate([p.chunk_tokens for p in parts])[order],
            MergedColumns([p.columns for p in parts], part, row, schema),
        )

    def encode(self) -> tuple:
        """Bytes, ints, lists and dicts only: Beam's default coder handles them without pickling."""
        return (self.orders.tobytes(), self.shard_hashes.tobytes(), self.chunk_tokens.tobytes(),
                self.columns.encode())

    @classmethod
    def decode(cls, encoded: tuple, schema: ExampleSchema) -> ShardPiece:
        orders, hashes, tokens, columns = encoded
        return cls(
            np.frombuffer(orders, dtype=np.uint8).reshape(-1, 16),
            np.frombuffer(hashes, dtype=np.uint64),
            np.frombuffer(tokens, dtype=np.int64),
            ExampleColumns.decode(columns, schema),
        )
