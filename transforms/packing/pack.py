"""Pack: tokenized documents -> chunks ready for the objective.

Documents are grouped by ``(split, pack group)`` (groups of at most ``--pack-group-tokens``
tokens, or the ``--num-buckets`` hash buckets: :mod:`transforms.packing.group`), sorted by key, and
packed with the pure functions of :mod:`transforms.objectives.packing`, holding one copy of the
group. Exact duplicates are dropped here, in the same shuffle: equal texts have equal keys, so
the same sub-bucket and the same group, and sorted by key they are neighbours; one of each key
is packed (which one does not matter: equal keys mean equal texts, so equal tokens and
features) and the others are counted (``duplicates``). A group's size is planned with its
duplicates' tokens (:mod:`transforms.packing.group`), so they never make it larger than planned.
Remainders of all groups of a split (each shorter than a chunk) are grouped once more,
sorted by group, and re-packed, so at most one partial chunk per split is dropped
(``--last-chunk drop``) or padded (``pad``).

Chunk keys name where a chunk came from: ``train-g00012-c000034`` (group 12, chunk 34;
``b`` for a ``--num-buckets`` bucket) or ``train-r-c000002`` (re-packed remainders). The
chunk length an objective needs is planned from a number derived from the chunk key
(:func:`transforms.objectives.layout.plan_uniforms`), so UL2 can pick its denoiser (and with
it the raw length) before the cut.
"""

from __future__ import annotations

from collections.abc import Iterator

import apache_beam as beam
import numpy as np

from transforms.elements import Chunk, DocumentBatch, key_order
from transforms.free_memory import return_freed_memory
from transforms.handoff import let_go
from transforms.objectives.counters import length_counters
from transforms.objectives.layout import plan_uniforms
from transforms.objectives.packing import (
    ConcatPacker,
    Piece,
    concat_pieces,
    document_piece,
    pack_best_fit,
    pack_concat,
    pack_none,
)
from transforms.progress import PROGRESS

__all__ = ["Pack"]



class _Planner:
    """next_length callback for pack_concat that remembers each chunk's plan.

    An objective with a fixed raw length plans nothing. Others (UL2) are planned in blocks of
    chunks by :meth:`~transforms.objectives.base.Objective.plan`, from each chunk key's number
    (:func:`plan_uniforms`). With the ``total`` tokens to cut known, a small first block
    measures the mean planned length and the next is sized to what is left (about 10% more
    chunks planned than cut, instead of up to twice as many); a chunk's plan depends on its
    key alone, never on the blocks.
    """

    FIRST_BLOCK = 128
    PROBE_BLOCK = 32

    def __init__(self, objective, seed: int, prefix: str, total: int | None = None):
        self._objective = objective
        self._seed = seed
        self._prefix = prefix
        self._total = total  # tokens to cut, if known: later blocks are sized to what is left
        self._fixed = objective.fixed_raw_length
        self._planned: list[tuple[int, int]] = []
        self._planned_tokens = 0
        self.plans: list[int] = []

    def key(self, index: int) -> str:
        return f"{self._prefix}-c{index:06d}"

    def __call__(self, index: int) -> int:
        if self._fixed is not None:
            length, plan = self._fixed, 0
        else:
            while index >= len(self._planned):  # plan the next block
                start = len(self._planned)
                if self._total is None:  # each block twice the last
                    size = max(self.FIRST_BLOCK, start)
                elif not start:  # a small block to learn the mean planned length
                    size = self.PROBE_BLOCK
                else:  # what is left at that mean length, and a little more
                    left = max(0, self._total - self._planned_tokens)
                    size = max(self.PROBE_BLOCK, int(1.1 * left * start / self._planned_tokens) + 16)
                keys = [self.key(i) for i in range(start, start + size)]
                lengths, plans = self._objective.plan(plan_uniforms(self._seed, keys))
                self._planned.extend(zip(lengths.tolist(), plans.tolist()))
                self._planned_tokens += int(lengths.sum())
            length, plan = self._planned[index]
        self.plans.append(plan)
        return length


def _fixed_length(objective) -> int:
    if objective.fixed_raw_length is None:
        raise ValueError(f"packing modes best_fit and none need a fixed chunk length; {objective.name} varies it")
    return objective.fixed_raw_length


def _pieces(documents: list, eos: int) -> Iterator[Piece]:
    """Each document as a piece (tokens + EOS), letting go of its entry in ``documents`` once copied."""
    for index, (ids, features) in enumerate(documents):
        documents[index] = None
        yield document_piece(ids, eos, features)


def _sorted_documents(batches: list[DocumentBatch]) -> tuple[list, np.ndarray, int]:
    """``(kept, lengths, duplicates)``: one ``(ids, features)`` of each key among the documents of
    ``batches`` in ascending key order (views of the batches' arrays), their token counts, and
    how many copies of a key already kept were left out. Equal keys mean equal texts, so which
    copy is kept changes nothing."""
    keys = np.concatenate([batch.keys for batch in batches]) if batches else np.zeros((0, 16), np.uint8)
    order = key_order(keys)
    ordered = keys[order]
    first = np.ones(order.shape[0], dtype=bool)
    if order.shape[0] > 1:
        np.any(ordered[1:] != ordered[:-1], axis=1, out=first[1:])
    chosen = order[first]
    counts = np.array([batch.count for batch in batches], dtype=np.int64)
    starts = np.concatenate([[0], np.cumsum(counts)])
    part = np.searchsorted(starts, chosen, side="right") - 1
    local = chosen - starts[part]
    kept = [(document.ids, document.features)
            for document in (batches[index].document(row) for index, row in zip(part.tolist(), local.tolist()))]
    lengths = np.concatenate([batch.lengths() for batch in batches])[chosen] if batches else np.zeros(0, np.int64)
    return kept, lengths, int(order.shape[0] - chosen.shape[0])


class _PackBucket(beam.DoFn):
    """Packs one group. What it holds is one copy of the group's documents: the blocks as they
    came, their documents sorted by key as views of them, each view let go of once copied into a
    chunk (:class:`ConcatPacker`, or a piece of ``best_fit`` and ``none``; a block's bytes go
    when its last document is copied); chunks go downstream as they are cut."""

    def __init__(self, objective, mode, seed, eos, group_name="g"):
        self._objective, self._mode, self._seed, self._eos = objective, mode, seed, eos
        self._group_name = group_name

    def start_bundle(self):
        PROGRESS.stage("packing and building examples")

    def process(self, element):
        (split, bucket), grouped = element
        batches = []
        for value in grouped:  # blocks of documents (AssignGroups)
            batches.append(DocumentBatch.decode(tuple(value)))
            let_go(value)  # the blocks' last reader: ``batches`` holds their arrays
        value = None
        if isinstance(grouped, list):
            # Beam's runner holds the element (and with it this list) until process returns:
            # emptied, the list no longer keeps the group's bytes alive while its chunks are cut
            # (only the documents not yet copied into a chunk do, through ``kept``).
            grouped.clear()
        del grouped, element
        kept, lengths, duplicates = _sorted_documents(batches)
        del batches
        stats = {"documents": len(kept), **length_counters("doc_tokens", lengths)}
        if duplicates:
            stats["duplicates"] = duplicates
        total = int(lengths.sum()) + (len(kept) if self._eos is not None else 0)  # separators included
        prefix = f"{split}-{self._group_name}{bucket:05d}"
        if self._mode == "concat":
            planner = _Planner(self._objective, self._seed, prefix, total=total)
            packer = ConcatPacker(kept, self._eos, planner)
            for index, chunk in enumerate(packer):
                yield Chunk(split, planner.key(index), planner.plans[index], chunk)
                # the documents copied so far leave holes that the chunks' blocks do not fit in
                return_freed_memory()
            rest = packer.rest
            yield beam.pvalue.TaggedOutput(Pack.STATS, (split, {**stats, "packed_tokens": total - len(rest)}))
            if len(rest):
                yield beam.pvalue.TaggedOutput(Pack.REST, (split, (bucket, [rest])))
            return
        length = _fixed_length(self._objective)
        if self._mode == "best_fit":
            full, rest = pack_best_fit(list(_pieces(kept, self._eos)), length, release=True)
            packed = total - sum(len(piece) for piece in rest)
            yield beam.pvalue.TaggedOutput(Pack.STATS, (split, {**stats, "packed_tokens": packed}))
            for index in range(len(full)):
                chunk, full[index] = full[index], None
                yield Chunk(split, f"{prefix}-c{index:06d}", 0, chunk)
            if rest:
                yield beam.pvalue.TaggedOutput(Pack.REST, (split, (bucket, rest)))
        else:
            yield beam.pvalue.TaggedOutput(Pack.STATS, (split, {**stats, "packed_tokens": total}))
            index = 0
            for piece in _pieces(kept, self._eos):
                for chunk in pack_none([piece], length):
                    yield Chunk(split, f"{prefix}-c{index:06d}", 0, chunk)
                    index += 1


class _RepackRest(beam.DoFn):
    def __init__(self, objective, mode, seed, last_chunk):
        self._objective, self._mode, self._seed, self._last_chunk = objective, mode, seed, last_chunk

    def process(self, element):
        split, rests = element
        pieces = [piece for _, bucket_pieces in sorted(rests, key=lambda r: r[0]) for piece in bucket_pieces]
        prefix = f"{split}-r"
        dropped = 0
        total = sum(len(piece) for piece in pieces)
        if self._mode == "concat":
            planner = _Planner(self._objective, self._seed, prefix)
            chunks, final = pack_concat(concat_pieces(pieces), planner)
            for index, chunk in enumerate(chunks):
                yield Chunk(split, planner.key(index), planner.plans[index], chunk)
            if len(final) and self._last_chunk == "pad":
                index = len(chunks)
                yield Chunk(split, planner.key(index), planner.plans[index], final)
            else:
                dropped = len(final)
        else:
            full, rest = pack_best_fit(pieces, _fixed_length(self._objective))
            if rest:
                full.append(concat_pieces(rest))
            for index, chunk in enumerate(full):
                yield Chunk(split, f"{prefix}-c{index:06d}", 0, chunk)
        stats = {"dropped_tokens": dropped, "packed_tokens": total - dropped}
        yield beam.pvalue.TaggedOutput(Pack.STATS, (split, stats))


class Pack(beam.PTransform):
    """Group documents by pack group, pack chunks, re-pack remainders.

    Input: ``((split, group), Document)`` elements, every copy of a document included (each
    group packs one per key and counts the others).

    Args:
        objective: the objective (plans chunk lengths).
        mode: ``concat``, ``best_fit`` or ``none``.
        seed: global seed.
        eos: EOS id appended to every document; None joins documents without a separator
            (``--document-separator none``).
        last_chunk: ``drop`` or ``pad`` the split's final partial chunk (concat).
        group_name: the letter of a group in chunk keys (``g``; ``b`` for ``--num-buckets``).

    Returns ``((bucket chunks, re-packed chunks), stats)``: two PCollections of
    :class:`~transforms.elements.Chunk`, kept apart because flattening them would make the runner encode every
    chunk (consumers apply the same transform to each), and ``(split, counters)`` elements
    (several per split: sum them):
    ``documents`` (one per key), ``duplicates`` (the other copies; absent when none),
    ``doc_tokens_*`` (document lengths), ``packed_tokens``
    (tokens of the chunks emitted, re-packed ones included) and ``dropped_tokens``.
    """

    STATS = "stats"
    REST = "rest"

    def __init__(self, objective, *, mode: str, seed: int, eos: int | None, last_chunk: str = "drop",
                 group_name: str = "g"):
        super().__init__()
        self._objective, self._mode, self._seed, self._eos, self._last_chunk = objective, mode, seed, eos, last_chunk
        self._group_name = group_name

    def expand(self, documents):
        packed = (
            documents
            | "GroupByPackGroup" >> beam.GroupByKey()
            | "PackBuckets"
            >> beam.ParDo(
                _PackBucket(self._objective, self._mode, self._seed, self._eos, self._group_name)
            ).with_outputs(self.STATS, self.REST, main="chunks")
        )
        repacked = (
            packed[self.REST]
            | "GroupRemainders" >> beam.GroupByKey()
            | "RepackRemainders"
            >> beam.ParDo(_RepackRest(self._objective, self._mode, self._seed, self._last_chunk)).with_outputs(
                self.STATS, main="chunks"
            )
        )
        stats = (packed[self.STATS], repacked[self.STATS]) | "AllPackStats" >> beam.Flatten()
        return (packed.chunks, repacked.chunks), stats
