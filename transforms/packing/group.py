"""Between Tokenize and Pack: documents assigned to pack groups.

Pack groups (docs/design.md section 2, step 3) are sized in tokens, so that what one worker holds while
it packs a group is bounded by configuration, never by the corpus, and the number of groups
(the parallelism of Pack and BuildExamples) grows with the corpus:

- Tokenize puts each document in one of :data:`SUB_BUCKETS` hash sub-buckets per split (a
  salted digest of its key, :func:`transforms.tokenizing.tokenize.bucket_of`);
- PlanGroups sums the tokens (EOS included) of every sub-bucket with a combiner (its
  accumulator: arrays of at most a few pairs per sub-bucket seen) and cuts the
  sub-buckets, in order, into consecutive ranges of at most ``--pack-group-tokens`` tokens
  (:func:`plan_groups`; a range closes before the sub-bucket that would overflow it, so a
  group is only larger when one sub-bucket alone is);
- AssignGroups splits each batch of documents by group and sends the documents of a group that
  a bundle holds as blocks (:class:`~transforms.elements.DocumentBatch`, about
  :data:`BLOCK_BYTES` of ids each) keyed by ``(split, group)``, so that Pack's shuffle carries
  a few large elements, not one per document.

Tokenize's batches travel whole until AssignGroups: every step before Pack handles a batch of
documents with numpy, never a document at a time.

The plan is a pure function of the multiset of documents and the config: the token counts
are those of every document read, duplicates included (they are counted before they are
dropped, in the same pass that tokenizes them, so the plan waits for no other stage), and
nothing of file splits, bundles, the runner or its memory enters it. Duplicates only make
groups smaller than planned, never larger. ``--num-buckets N`` (an expert override, the
grouping of format 1) puts each document in one of N hash buckets instead, whatever their
sizes; the plan then only records them.

Exact duplicates are dropped in Pack's own shuffle (:mod:`transforms.packing.pack`): equal texts have
equal keys, so the same sub-bucket and the same group. A separate shuffle by document key
would carry every document once more for that alone; the cost of dropping them in Pack is that
the copies of a document cross Pack's shuffle too, within the group size planned with them.
"""

from __future__ import annotations

from typing import Any

import apache_beam as beam
import numpy as np
from apache_beam.transforms.window import GlobalWindows

from transforms.elements import DocumentBatch
from transforms.handoff import let_go

__all__ = ["BLOCK_BYTES", "HELD_BYTES", "SUB_BUCKETS", "AssignGroups", "PlanGroups", "groups_of",
           "plan_groups", "plan_summary", "split_tokens"]

#: Hash sub-buckets per split that pack groups are made of: fine enough that a sub-bucket
#: stays far below a group of the default size up to about 10**13 tokens (a sub-bucket holds
#: 1/1,048,576 of a split), few enough that their token counts are a small aggregate.
SUB_BUCKETS = 1 << 20


def plan_groups(bucket_tokens: list[tuple[int, int]], group_tokens: int | None) -> dict[str, Any]:
    """The pack groups of one split.

    Args:
        bucket_tokens: ``(bucket, tokens)`` of every non-empty (sub-)bucket, each bucket once.
        group_tokens: the most tokens of a group; None keeps every bucket a group of its own
            (``--num-buckets``).

    Returns:
        ``{"starts": first bucket of each group, ascending (None: groups are buckets),
        "tokens": tokens of each group}``.
    """
    ordered = sorted(bucket_tokens)
    if group_tokens is None:
        return {"starts": None, "tokens": [tokens for _, tokens in ordered]}
    starts: list[int] = []
    totals: list[int] = []
    for bucket, tokens in ordered:
        if not starts or totals[-1] + tokens > group_tokens:
            starts.append(bucket)
            totals.append(0)
        totals[-1] += tokens
    return {"starts": starts, "tokens": totals}


def plan_summary(split_plan: dict[str, Any] | None) -> dict[str, int]:
    """What the manifest records of a split's plan: groups, their tokens, the largest one."""
    tokens = (split_plan or {}).get("tokens") or []
    return {"groups": len(tokens), "tokens": int(sum(tokens)), "largest_group_tokens": int(max(tokens, default=0))}


#: Pairs an accumulator of :class:`_PlanCombineFn` lists before it sums those of equal
#: buckets (and again whenever it lists twice as many as its distinct buckets).
_COMPACT_PAIRS = 1 << 16


def _compacted(buckets: np.ndarray, tokens: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``(distinct buckets ascending, int64 tokens of each)``: the pairs' tokens summed per bucket."""
    order = np.argsort(buckets, kind="stable")
    buckets, tokens = buckets[order], tokens[order].astype(np.int64, copy=False)
    if not buckets.shape[0]:
        return buckets, tokens
    starts = np.flatnonzero(np.concatenate([[True], buckets[1:] != buckets[:-1]]))
    return buckets[starts], np.add.reduceat(tokens, starts)


class _Tally:
    """Tokens per (sub-)bucket of one split: pairs listed as they come, summed per bucket once
    there are many (so a tally holds at most a few times as many pairs as distinct buckets)."""

    __slots__ = ("buckets", "tokens", "listed", "distinct")

    def __init__(self):
        self.buckets: list[np.ndarray] = []
        self.tokens: list[np.ndarray] = []
        self.listed = self.distinct = 0

    def add(self, buckets: np.ndarray, tokens: np.ndarray) -> None:
        self.buckets.append(buckets)
        self.tokens.append(tokens)
        self.listed += buckets.shape[0]
        if self.listed > max(_COMPACT_PAIRS, 2 * self.distinct):
            self.compact()

    def compact(self) -> tuple[np.ndarray, np.ndarray]:
        if not self.buckets:
            return np.zeros(0, np.uint64), np.zeros(0, np.int64)
        buckets, tokens = _compacted(np.concatenate(self.buckets), np.concatenate(self.tokens))
        self.buckets, self.tokens = [buckets], [tokens]
        self.listed = self.distinct = buckets.shape[0]
        return buckets, tokens


class _PlanCombineFn(beam.CombineFn):
    """``(split, encoded DocumentBatch)`` -> ``{split: plan_groups(...)}``.

    An accumulator holds, per split, the tokens (EOS included) of each (sub-)bucket it has seen:
    at most a few times :data:`SUB_BUCKETS` pairs per split (or the ``--num-buckets`` buckets
    seen), whatever the corpus size."""

    def __init__(self, group_tokens: int | None):
        self._group_tokens = group_tokens

    def create_accumulator(self):
        return {}

    def add_input(self, accumulator, element):
        split, encoded = element
        batch = DocumentBatch.decode(encoded)
        tally = accumulator.get(split)
        if tally is None:
            tally = accumulator[split] = _Tally()
        tally.add(batch.buckets.copy(), batch.lengths() + 1)  # copies: nothing keeps the batch's bytes
        return accumulator

    def compact(self, accumulator):
        for tally in accumulator.values():
            tally.compact()
        return accumulator

    def merge_accumulators(self, accumulators):
        merged: dict[str, _Tally] = {}
        for accumulator in accumulators:
            for split, tally in accumulator.items():
                into = merged.get(split)
                if into is None:
                    into = merged[split] = _Tally()
                for buckets, tokens in zip(tally.buckets, tally.tokens):
                    into.add(buckets, tokens)
        return merged

    def extract_output(self, accumulator):
        plans = {}
        for split, tally in sorted(accumulator.items()):
            buckets, tokens = tally.compact()
            plans[split] = plan_groups(list(zip(buckets.tolist(), tokens.tolist())), self._group_tokens)
        return plans


class PlanGroups(beam.PTransform):
    """Tokenized documents (``(split, encoded DocumentBatch)``) -> a PCollection of one element: the
    plan of every split's pack groups (``{split: groups}``); of none when there are no documents,
    which its readers take as ``{}`` (a global combine with a default would cost the graph a
    Create and a side-input stage).

    Args:
        group_tokens: ``--pack-group-tokens``; None: the documents' buckets are the groups
            (``--num-buckets``).
    """

    def __init__(self, group_tokens: int | None):
        super().__init__()
        self._group_tokens = group_tokens

    def expand(self, documents):
        plan = beam.CombineGlobally(_PlanCombineFn(self._group_tokens)).without_defaults()
        return documents | "CutIntoGroups" >> plan


#: Bytes of token ids (and features) in one block at most, about (a batch is cut only between
#: documents, and a block is at least one of Tokenize's pieces of a batch).
BLOCK_BYTES = 4 << 20
#: Bytes a bundle's unfinished blocks hold at most before all of them are sent.
HELD_BYTES = 64 << 20


def groups_of(split_plan: dict[str, Any], buckets: np.ndarray) -> np.ndarray:
    """The group of each of ``buckets`` (``(n,)`` uint64) in a split's plan (:func:`plan_groups`):
    uint64 buckets where they are the groups (``--num-buckets`` may exceed int64), else int64."""
    starts = split_plan["starts"]
    if starts is None:
        return buckets
    return np.searchsorted(np.asarray(starts, dtype=np.uint64), buckets, side="right").astype(np.int64) - 1


def split_tokens(element) -> tuple[str, int]:
    """``(split, encoded DocumentBatch)`` -> ``(split, its documents' tokens and an EOS each)``."""
    split, encoded = element
    batch = DocumentBatch.decode(encoded)
    return split, batch.tokens + batch.count


def _batch_bytes(batch: DocumentBatch) -> int:
    return batch.ids.nbytes + sum(flags.nbytes for flags in batch.features.values()) + 24 * batch.count


class _AssignBlocks(beam.DoFn):
    """Splits each batch of documents by group (the plan: a side input) and gathers a bundle's
    documents of each group into blocks; a block goes out when it holds :data:`BLOCK_BYTES`,
    every block at the end of the bundle (or when together they hold :data:`HELD_BYTES`)."""

    def __init__(self, block_bytes: int, held_bytes: int):
        self._block_bytes, self._held_bytes = block_bytes, held_bytes

    def start_bundle(self):
        self._blocks: dict[tuple, list] = {}  # (split, group) -> [batches, bytes]
        self._held = 0

    def process(self, element, plan):
        split, value = element
        batch = DocumentBatch.decode(tuple(value))
        let_go(value)  # the documents' last reader: what goes on are the blocks made here
        groups = groups_of(plan[split], batch.buckets)
        if batch.count and (groups == groups[0]).all():
            parts = [(int(groups[0]), batch)]
        else:
            order = np.argsort(groups, kind="stable")
            distinct, starts = np.unique(groups[order], return_index=True)
            ends = [*starts[1:].tolist(), order.shape[0]]
            parts = [(group, batch.take(order[start:end]))
                     for group, start, end in zip(distinct.tolist(), starts.tolist(), ends)]
        for group, part in parts:
            key = (split, group)
            block = self._blocks.get(key)
            if block is None:
                block = self._blocks[key] = [[], 0]
            block[0].append(part)
            size = _batch_bytes(part)
            block[1] += size
            self._held += size
            if block[1] >= self._block_bytes:
                del self._blocks[key]
                self._held -= block[1]
                yield key, DocumentBatch.concat(block[0]).encode()
        if self._held > self._held_bytes:
            yield from self._sent()

    def _sent(self):
        blocks, self._blocks, self._held = self._blocks, {}, 0
        for key, (batches, _) in blocks.items():
            yield key, DocumentBatch.concat(batches).encode()

    def finish_bundle(self):
        for element in self._sent():
            yield GlobalWindows.windowed_value(element)


class AssignGroups(beam.PTransform):
    """``(split, encoded DocumentBatch)`` -> ``((split, group), encoded DocumentBatch)`` by the
    plan (a side input: :class:`PlanGroups`' output); the documents only travel in global
    windows (a batch job's)."""

    def __init__(self, plan, *, block_bytes: int = BLOCK_BYTES, held_bytes: int = HELD_BYTES):
        super().__init__()
        self._plan = plan
        self._limits = (block_bytes, held_bytes)

    def expand(self, documents):
        return documents | "GroupOfBucket" >> beam.ParDo(_AssignBlocks(*self._limits),
                                                          plan=beam.pvalue.AsSingleton(self._plan, default_value={}))
