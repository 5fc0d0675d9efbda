"""What flows between the stages of the pipeline (docs/design.md section 2), named.

- :class:`DocumentBatch`: tokenized documents as columns (flat ids with offsets, keys,
  sub-buckets, features), from Tokenize (one per encoding batch and split, keyed by split) to
  AssignGroups, and from AssignGroups (the documents of one pack group a bundle holds, keyed
  by ``(split, pack group)``) through the pack-group shuffle to Pack: the shuffles carry a few
  blocks of megabytes, never one element per document. It crosses them encoded
  (:meth:`DocumentBatch.encode`: bytes and ints, which Beam's default coder writes without
  pickling);
- :class:`Document`: one document of a batch (:meth:`DocumentBatch.document`), a view;
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
from transforms.objectives.packing import Piece
from transforms.writing.columns import ExampleColumns, MergedColumns, narrowest

__all__ = ["ID_DTYPES", "Chunk", "Document", "DocumentBatch", "ShardPiece", "key_order", "narrow_ids"]


class Document(NamedTuple):
    """One document of a :class:`DocumentBatch` (:meth:`DocumentBatch.document`): views of its arrays.

    Attributes:
        key: the 16-byte digest of its text (:func:`transforms.tokenizing.tokenize.document_key`); also the
            order documents are packed in.
        ids: its token ids (uint16 or int32).
        features: per-token feature name -> one bool per token.
    """

    key: bytes
    ids: np.ndarray
    features: dict[str, np.ndarray]

    @property
    def tokens(self) -> int:
        """Number of token ids."""
        return int(self.ids.shape[0])


#: The dtype of a :class:`DocumentBatch`'s ids, by their width in bytes.
ID_DTYPES = {2: np.dtype("<u2"), 4: np.dtype("<i4")}


def narrow_ids(ids: np.ndarray) -> tuple[np.ndarray, int]:
    """``(ids, width)``: ``ids`` as uint16 when every one fits (width 2), else as int32 (4)."""
    narrow = narrowest(ids, ("<u2",))
    return narrow, narrow.dtype.itemsize


#: Sub-buckets travel as uint64 (``--num-buckets`` may be any positive number).
_BUCKET_DTYPE = np.dtype("<u8")
_OFFSET_DTYPE = np.dtype("<i8")


class DocumentBatch:
    """Tokenized documents as columns: what moves from Tokenize to Pack.

    Attributes:
        keys: ``(n, 16)`` uint8: each document's key (:func:`transforms.tokenizing.tokenize.document_key`).
        buckets: ``(n,)`` uint64: each document's sub-bucket (or ``--num-buckets`` bucket).
        offsets: ``(n + 1,)`` int64: document ``i``'s ids are ``ids[offsets[i]:offsets[i + 1]]``
            (``offsets[0]`` is 0, they never decrease).
        ids: every document's ids end to end, uint16 when every id fits (any vocabulary of up to
            65,536 entries: half the bytes to send and to hold until Pack), else int32.
        features: per-token feature name -> ``(offsets[-1],)`` bool, aligned with ``ids``.

    The documents of a batch are in no particular order: which documents share a batch depends
    on bundles and the runner, never the output (Pack sorts a group's documents by key).
    """

    __slots__ = ("keys", "buckets", "offsets", "ids", "features")

    def __init__(self, keys: np.ndarray, buckets: np.ndarray, offsets: np.ndarray, ids: np.ndarray,
                 features: dict[str, np.ndarray] | None = None):
        self.keys, self.buckets, self.offsets, self.ids = keys, buckets, offsets, ids
        self.features = features or {}

    @property
    def count(self) -> int:
        """Number of documents."""
        return int(self.buckets.shape[0])

    @property
    def tokens(self) -> int:
        """Token ids of all documents (no separators)."""
        return int(self.offsets[-1])

    def lengths(self) -> np.ndarray:
        """``(n,)`` int64 token ids of each document."""
        return np.diff(self.offsets)

    def document(self, index: int) -> Document:
        """Document ``index`` (views of this batch's arrays)."""
        start, end = int(self.offsets[index]), int(self.offsets[index + 1])
        return Document(self.keys[index].tobytes(), self.ids[start:end],
                        {name: flags[start:end] for name, flags in self.features.items()})

    def take(self, indices: np.ndarray) -> DocumentBatch:
        """The documents at ``indices`` (in that order), copied into a batch of their own."""
        indices = np.asarray(indices, dtype=np.int64)
        starts, ends = self.offsets[indices], self.offsets[indices + 1]
        offsets = np.zeros(indices.shape[0] + 1, dtype=np.int64)
        np.cumsum(ends - starts, out=offsets[1:])
        # position p of the new ids reads old position p + (start of its document - its new start)
        source = np.repeat(starts - offsets[:-1], ends - starts) + np.arange(offsets[-1], dtype=np.int64)
        return DocumentBatch(self.keys[indices], self.buckets[indices], offsets, self.ids[source],
                             {name: flags[source] for name, flags in self.features.items()})

    @classmethod
    def concat(cls, batches: list[DocumentBatch]) -> DocumentBatch:
        """The documents of ``batches`` in order, in one batch (ids as wide as the widest)."""
        if len(batches) == 1:
            return batches[0]
        if not batches:
            raise ValueError("no batch to concatenate")
        lengths = np.concatenate([batch.lengths() for batch in batches])
        offsets = np.zeros(lengths.shape[0] + 1, dtype=np.int64)
        np.cumsum(lengths, out=offsets[1:])
        ids = np.concatenate([batch.ids for batch in batches])  # numpy widens uint16 + int32 to int32
        names = batches[0].features.keys()
        return cls(np.concatenate([batch.keys for batch in batches]), np.concatenate([b.buckets for b in batches]),
                   offsets, ids, {name: np.concatenate([batch.features[name] for batch in batches]) for name in names})

    def encode(self) -> tuple:
        """Bytes, ints and a dict only: Beam's default coder writes them without pickling."""
        return (self.keys.tobytes(), self.buckets.astype(_BUCKET_DTYPE, copy=False).tobytes(),
                self.offsets.astype(_OFFSET_DTYPE, copy=False).tobytes(), self.ids.dtype.itemsize,
                self.ids.tobytes(), {name: flags.tobytes() for name, flags in self.features.items()})

    @classmethod
    def decode(cls, encoded) -> DocumentBatch:
        """Inverse of :meth:`encode` (views of its bytes); a malformed tuple raises ``ValueError``."""
        keys, buckets, offsets, width, ids, features = encoded
        if width not in ID_DTYPES:
            raise ValueError(f"document ids of {width} bytes each: expected 2 or 4")
        batch = cls(np.frombuffer(keys, dtype=np.uint8).reshape(-1, 16), np.frombuffer(buckets, dtype=_BUCKET_DTYPE),
                    np.frombuffer(offsets, dtype=_OFFSET_DTYPE), np.frombuffer(ids, dtype=ID_DTYPES[width]),
                    {name: np.frombuffer(flags, dtype=np.bool_) for name, flags in features.items()})
        n = batch.buckets.shape[0]
        if (batch.keys.shape[0] != n or batch.offsets.shape[0] != n + 1 or int(batch.offsets[0]) != 0
                or int(batch.offsets[-1]) != batch.ids.shape[0]
                or any(flags.shape[0] != batch.ids.shape[0] for flags in batch.features.values())):
            raise ValueError("a document batch whose columns disagree in length")
        return batch


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


def key_order(orders: np.ndarray) -> np.ndarray:
    """Stable ascending order of ``(n, 16)`` uint8 keys compared bytewise (as ``bytes`` sort)."""
    high = orders[:, :8].copy().view(">u8").reshape(-1)
    low = orders[:, 8:].copy().view(">u8").reshape(-1)
    return np.lexsort((low, high))


class ShardPiece:
    """Rows of one split on their way to the shard writers.

    Attributes:
        orders: ``(n, 16)`` uint8 row-order keys (:func:`transforms.objectives.layout.row_order_key`).
        shard_hashes: ``(n,)`` uint64; a row's shard is ``shard_hashes % num_shards``.
        chunk_tokens: ``(n,)`` int64 source tokens of each row.
        columns: the rows' :class:`~transforms.writing.columns.ExampleColumns`.
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
        order = key_order(orders)
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
