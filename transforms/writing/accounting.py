"""Document accounting of a run (docs/design.md section 7), pure functions used by WriteManifest.

The unit is the *document*: a record the reader produced (a non-blank line, a paragraph,
a file, a JSON line, a Parquet row), a long record split by ``--long-docs split``
counting as its pieces, and a file that breaks off (``unreadable_file``) counting its
unread rest as one rejected document. Every document read ends in exactly one bucket::

    documents_read = documents_written + duplicates + rejected + filtered

``rejected`` is broken down by reason (the same reasons as ``OUT/rejected/``); nothing is
filtered yet (``filtered`` is there for quality filters, always 0 today). Blank lines are
separators, not records, so they are not counted at all.

Per split, tokens, examples and rows are conserved too (:func:`check_conservation`): each
law compares what two different stages counted, so a runner that loses or repeats a
bundle's work between them fails the job instead of writing a short dataset.
"""

from __future__ import annotations

from typing import Any

from schemas.errors import JobFailedError

__all__ = [
    "DEFAULT_MAX_REJECTED_FRACTION",
    "EmptySplitError",
    "RejectedFractionError",
    "UnreconciledCountsError",
    "check_conservation",
    "check_reconciled",
    "check_rejected_fraction",
    "check_splits_have_examples",
    "document_counts",
    "rejected_fraction",
]

REPAIRS = ("invalid_utf8_replaced", "nul_bytes_stripped", "long_documents_split", "split_pieces")
#: ``--max-rejected-fraction`` unless given: a run that rejects more than half of what it read
#: is a mistake (a wrong --text-field, the wrong files), not a dataset.
DEFAULT_MAX_REJECTED_FRACTION = 0.5
#: What to look at first, by the most common rejection reason.
_REASON_HINTS = {
    "missing_text_field": "check --text-field",
    "text_not_string": "check --text-field (it names a field that is not a string)",
    "malformed_json": "are the inputs JSON lines? (--text-mode applies to .txt files)",
    "not_an_object": "each JSON line must be an object",
    "invalid_utf8": "--invalid-utf8 replace keeps such records",
    "nul_bytes": "--nul-bytes strip keeps such records",
    "too_long": "--long-docs split keeps such records",
    "empty_text": "the text fields are empty",
    "unreadable_file": "the files are damaged or not of the format their names say",
    "empty_file": "the input files are empty",
}


class RejectedFractionError(JobFailedError):
    """More documents were rejected than ``--max-rejected-fraction`` allows.

    Raised by WriteManifest before it writes anything, so the failed run leaves no
    manifest. The message is one line that starts with the flag.
    """


class UnreconciledCountsError(JobFailedError):
    """The documents, tokens, examples or rows of a run do not add up: some were lost (or
    made up) between stages.

    Raised by WriteManifest before it writes anything: a dataset that silently misses
    documents or examples must never look complete. The message is one line.
    """


def document_counts(
    read_stats: dict[str, int], reasons: dict[str, int], written: int, duplicates: int, filtered: int = 0
) -> dict[str, Any]:
    """The ``counts`` block of the manifest.

    Args:
        read_stats: the reader's summed counters (``documents``, ``rejected`` and repairs,
            see :class:`transforms.reading.read.ReadCorpus`).
        reasons: rejected documents by reason, over every stage (reader and tokenizer).
        written: documents packed into examples (all splits).
        duplicates: exact duplicates dropped.
        filtered: documents dropped on purpose by a filter.
    """
    documents_read = int(read_stats.get("documents", 0)) + int(read_stats.get("rejected", 0))
    rejected = int(sum(reasons.values()))
    repaired = {name: int(read_stats.get(name, 0)) for name in REPAIRS}
    return {
        "records_read": documents_read - repaired["split_pieces"] + repaired["long_documents_split"],
        "documents_read": documents_read,
        "documents_written": written,
        "duplicates": duplicates,
        "rejected": rejected,
        "rejected_by_reason": dict(sorted(reasons.items())),
        "filtered": filtered,
        "repaired": repaired,
        "reconciled": documents_read == written + duplicates + rejected + filtered,
    }


def rejected_fraction(counts: dict[str, Any]) -> float:
    """Share of the documents read that were rejected (0 when nothing was read)."""
    return counts["rejected"] / counts["documents_read"] if counts["documents_read"] else 0.0


def check_rejected_fraction(counts: dict[str, Any], max_fraction: float | None, rejected_path: str) -> None:
    """Raise :class:`RejectedFractionError` when the rejected share exceeds ``max_fraction``.

    Args:
        counts: a :func:`document_counts` result.
        max_fraction: the ``--max-rejected-fraction`` limit, or None for no limit.
        rejected_path: where the rejected records are (named in the message).
    """
    if max_fraction is None:
        return
    fraction = rejected_fraction(counts)
    if fraction <= max_fraction:
        return
    by_reason = counts["rejected_by_reason"]
    reasons = ", ".join(f"{reason} {n:,}" for reason, n in by_reason.items())
    top = max(by_reason, key=lambda reason: (by_reason[reason], reason)) if by_reason else None
    hint = f"; mostly {top}: {_REASON_HINTS[top]}" if top in _REASON_HINTS else ""
    raise RejectedFractionError(
        f"--max-rejected-fraction {max_fraction:g} exceeded: {fraction:.2%} of documents rejected "
        f"({counts['rejected']:,} of {counts['documents_read']:,} read: {reasons}){hint}; "
        f"no manifest written, the rejected records are in {rejected_path}"
    )


class EmptySplitError(JobFailedError):
    """A split of the run holds no example: a dataset a training job cannot use.

    Raised by WriteManifest before it writes anything; the message is one line naming the split.
    """


def check_splits_have_examples(splits: dict[str, dict[str, Any]], last_chunk: str | None = None) -> None:
    """Raise :class:`EmptySplitError` when a split has no example.

    Args:
        splits: the manifest's ``splits`` block (``examples``, ``documents``, ``document_tokens``).
        last_chunk: the ``--last-chunk`` mode (``drop`` explains where a short split's tokens went).
    """
    for split, info in splits.items():
        if info["examples"]:
            continue
        hint = ("--last-chunk pad keeps a split's last partial chunk, or lower the example length"
                if last_chunk == "drop" else "lower the example length")
        if split == "validation":
            hint += ", or raise --validation-fraction"
        raise EmptySplitError(
            f"split {split} has no examples: {info['documents']:,} documents of {info['document_tokens']:,} "
            f"tokens in all make no example ({hint}); no manifest written")


def check_reconciled(counts: dict[str, Any]) -> None:
    """Raise :class:`UnreconciledCountsError` unless read = written + duplicates + rejected + filtered."""
    if counts["reconciled"]:
        return
    accounted = counts["documents_written"] + counts["duplicates"] + counts["rejected"] + counts["filtered"]
    missing = counts["documents_read"] - accounted
    what = f"{missing:,} documents were lost" if missing > 0 else f"{-missing:,} documents were counted twice"
    raise UnreconciledCountsError(
        f"documents do not add up: read {counts['documents_read']:,} != written {counts['documents_written']:,} "
        f"+ duplicates {counts['duplicates']:,} + rejected {counts['rejected']:,} + filtered {counts['filtered']:,} "
        f"({what} between stages, a runner fault); no manifest written"
    )


def check_conservation(split: str, info: dict[str, Any], objective: dict[str, int], packing: dict[str, int],
                       draws: int) -> None:
    """Raise :class:`UnreconciledCountsError` unless a split's tokens, examples and rows add up.

    Each law is counted by two different stages, so that a runner (or a writer) that loses
    or repeats work between them breaks one:

    - packing: document tokens (EOS included) = tokens packed into chunks + tokens dropped;
    - building: source tokens of the examples built = tokens packed times ``draws``;
    - writing: rows the shard files hold = examples built, and their source tokens add up;
    - shards: every shard index from 0 to the shard count, once.

    Args:
        split: the split's name (for the message).
        info: the split's manifest entry (``document_tokens``, ``dropped_tokens``, ``shards``).
        objective: the split's summed BuildExamples counters (``examples``, ``chunk_tokens``).
        packing: the split's summed Pack counters (``packed_tokens``).
        draws: examples built per chunk.
    """
    document_tokens, dropped = info["document_tokens"], info["dropped_tokens"]
    packed = int(packing.get("packed_tokens", 0))
    built, built_tokens = int(objective.get("examples", 0)), int(objective.get("chunk_tokens", 0))
    rows = sum(int(shard["rows"]) for shard in info["shards"])
    row_tokens = sum(int(shard["tokens"]) for shard in info["shards"])
    indices = sorted(int(shard["index"]) for shard in info["shards"])
    laws = [
        (document_tokens == packed + dropped,
         f"document tokens {document_tokens:,} != packed {packed:,} + dropped {dropped:,} (Pack)"),
        (built_tokens == packed * draws,
         f"examples were built from {built_tokens:,} tokens, not packed {packed:,} x draws {draws} (BuildExamples)"),
        (rows == built, f"shard files hold {rows:,} rows, not the {built:,} examples built (WriteShards)"),
        (row_tokens == built_tokens,
         f"shard rows were built from {row_tokens:,} tokens, not {built_tokens:,} (WriteShards)"),
        (indices == list(range(len(indices))), f"shard indices {_ranges(indices)} are not 0..{len(indices) - 1} once"),
    ]
    for holds, message in laws:
        if not holds:
            raise UnreconciledCountsError(
                f"{split}: counts do not add up: {message}, a runner or writer lost or repeated work; "
                "no manifest written"
            )


def _ranges(indices: list[int]) -> str:
    return ", ".join(map(str, indices[:8])) + (", ..." if len(indices) > 8 else "")
