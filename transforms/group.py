"""Between Tokenize and Pack: documents assigned to pack groups.

Pack groups (docs/design.md section 2, step 3) are sized in tokens, so that what one worker holds while
it packs a group is bounded by configuration, never by the corpus, and the number of groups
(the parallelism of Pack and BuildExamples) grows with the corpus:

- Tokenize puts each document in one of :data:`SUB_BUCKETS` hash sub-buckets per split (a
  salted digest of its key, :func:`transforms.tokenize.bucket_of`);
- PlanGroups sums the tokens (EOS included) of every sub-bucket with a combiner and cuts the
  sub-buckets, in order, into consecutive ranges of at most ``--pack-group-tokens`` tokens
  (:func:`plan_groups`; a range closes before the sub-bucket that would overflow it, so a
  group is only larger when one sub-bucket alone is);
- AssignGroups keys each document by ``(split, group of its sub-bucket)`` and sends the
  documents of a group that a bundle holds as blocks (:class:`~transforms.elements.DocumentBlock`,
  at most :data:`BLOCK_DOCUMENTS` documents or :data:`BLOCK_BYTES` of ids each), so that Pack's
  shuffle carries a few large elements, not one per document.

The plan is a pure function of the multiset of documents and the config: the token counts
are those of every document read, duplicates included (they are counted before they are
dropped, in the same pass that tokenizes them, so the plan waits for no other stage), and
nothing of file splits, bundles, the runner or its memory enters it. Duplicates only make
groups smaller than planned, never larger. ``--num-buckets N`` (an expert override, the
grouping of format 1) puts each document in one of N hash buckets instead, whatever their
sizes; the plan then only records them.

Exact duplicates are dropped in Pack's own shuffle (:mod:`transforms.pack`): equal texts have
equal keys, so the same sub-bucket and the same group. A separate shuffle by document key
would carry every document once more for that alone; the cost of dropping them in Pack is that
the copies of a document cross Pack's shuffle too, within the group size planned with them.
"""

from __future__ import annotations

import bisect
from typing import Any

import apache_beam as beam
from apache_beam.transforms.window import GlobalWindows

from transforms.elements import Document, DocumentBlock

__all__ = ["BLOCK_BYTES", "BLOCK_DOCUMENTS", "HELD_BYTES", "REFERENCE_BYTES", "SUB_BUCKETS", "AssignGroups",
           "PlanGroups", "group_of", "plan_groups", "plan_summary"]

#: Hash sub-buckets per split that pack groups are made of: fine enough that a sub-bucket
#: stays far below a group up to about 10**14 tokens (a sub-bucket of 2**20 holds 1/1,048,576
#: of a split), few enough that their token counts are a small aggregate.
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


def group_of(split_plan: dict[str, Any], bucket: int) -> int:
    """The group of a (sub-)bucket in a split's plan (:func:`plan_groups`)."""
    starts = split_plan["starts"]
    return bucket if starts is None else bisect.bisect_right(starts, bucket) - 1


def plan_summary(split_plan: dict[str, Any] | None) -> dict[str, int]:
    """What the manifest records of a split's plan: groups, their tokens, the largest one."""
    tokens = (split_plan or {}).get("tokens") or []
    return {"groups": len(tokens), "tokens": int(sum(tokens)), "largest_group_tokens": int(max(tokens, default=0))}


class _PlanCombineFn(beam.CombineFn):
    """``((split, bucket), tokens)`` (each key once) -> ``{split: plan_groups(...)}``."""

    def __init__(self, group_tokens: int | None):
        self._group_tokens = group_tokens

    def create_accumulator(self):
        return {}

    def add_input(self, accumulator, element):
        (split, bucket), tokens = element
        accumulator.setdefault(split, []).append((bucket, tokens))
        return accumulator

    def merge_accumulators(self, accumulators):
        merged: dict[str, list] = {}
        for accumulator in accumulators:
            for split, pairs in accumulator.items():
                merged.setdefault(split, []).extend(pairs)
        return merged

    def extract_output(self, accumulator):
        return {split: plan_groups(pairs, self._group_tokens) for split, pairs in sorted(accumulator.items())}


def _bucket_tokens(element):
    bucket, document = element
    return bucket, document.tokens + 1


class PlanGroups(beam.PTransform):
    """Tokenized documents -> a one-element PCollection: the plan of every split's pack groups.

    Args:
        group_tokens: ``--pack-group-tokens``; None: the documents' buckets are the groups
            (``--num-buckets``).
    """

    def __init__(self, group_tokens: int | None):
        super().__init__()
        self._group_tokens = group_tokens

    def expand(self, documents):
        return (
            documents
            | "BucketTokens" >> beam.Map(_bucket_tokens)
            | "SumBucketTokens" >> beam.CombinePerKey(sum)
            | "CutIntoGroups" >> beam.CombineGlobally(_PlanCombineFn(self._group_tokens))
        )


#: Documents in one block at most.
BLOCK_DOCUMENTS = 4096
#: Bytes of token ids in one block at most (counted for documents held as values; a reference a
#: runner hands a document over by counts as :data:`REFERENCE_BYTES`: what it stands for is
#: stored elsewhere, and reading its size would load it).
BLOCK_BYTES = 4 << 20
#: What a reference to a handed-over document counts for.
REFERENCE_BYTES = 256
#: Bytes of token ids a bundle's unfinished blocks hold at most before all of them are sent.
HELD_BYTES = 64 << 20


class _AssignBlocks(beam.DoFn):
    """Keys each document by its group (the plan: a side input) and gathers a bundle's documents
    of each group into blocks; a block goes out when full, every block at the end of the bundle
    (or when together they hold :data:`HELD_BYTES`)."""

    def __init__(self, block_documents: int, block_bytes: int, held_bytes: int):
        self._block_documents, self._block_bytes, self._held_bytes = block_documents, block_bytes, held_bytes

    def start_bundle(self):
        self._blocks: dict[tuple, list] = {}  # (split, group) -> [documents, bytes]
        self._held = 0

    def process(self, element, plan):
        (split, bucket), document = element
        key = (split, group_of(plan[split], bucket))
        block = self._blocks.get(key)
        if block is None:
            block = self._blocks[key] = [[], 0]
        block[0].append(document)
        size = len(document.ids) if isinstance(document, Document) else REFERENCE_BYTES  # a reference is not read
        block[1] += size
        self._held += size
        if len(block[0]) >= self._block_documents or block[1] >= self._block_bytes:
            del self._blocks[key]
            self._held -= block[1]
            yield key, DocumentBlock(block[0])
        elif self._held > self._held_bytes:
            yield from self._sent()

    def _sent(self):
        blocks, self._blocks, self._held = self._blocks, {}, 0
        for key, (documents, _) in blocks.items():
            yield key, DocumentBlock(documents)

    def finish_bundle(self):
        for element in self._sent():
            yield GlobalWindows.windowed_value(element)


class AssignGroups(beam.PTransform):
    """``((split, sub-bucket), document)`` -> ``((split, group), DocumentBlock)`` by the plan
    (a side input: :class:`PlanGroups`' output); the documents only travel in global windows
    (a batch job's)."""

    def __init__(self, plan, *, block_documents: int = BLOCK_DOCUMENTS, block_bytes: int = BLOCK_BYTES,
                 held_bytes: int = HELD_BYTES):
        super().__init__()
        self._plan = plan
        self._limits = (block_documents, block_bytes, held_bytes)

    def expand(self, documents):
        return documents | "GroupOfBucket" >> beam.ParDo(_AssignBlocks(*self._limits),
                                                          plan=beam.pvalue.AsSingleton(self._plan))
