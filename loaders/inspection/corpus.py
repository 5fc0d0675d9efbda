"""What a dataset was made from, read from its manifest and ``rejected/`` files: the input
files and their shares, document lengths, per-source statistics and rejected records.

Everything here is JSON-able data for the report and ``lmshards diff``; nothing reads a shard.
The manifest is untrusted: a malformed block gives an empty answer, never an exception.

- Document lengths: ``stats[split]["document_lengths"]["log2_histogram"]`` counts documents
  by ``"<2**b"`` (lengths in ``[2**(b-1), 2**b)`` tokens, ``"<1"`` for empty ones, as
  :func:`transforms.objectives.counters.length_counters` bins them).
- Sources (``materialize --source-field NAME``): ``stats[split]["sources"]`` maps each
  source value to ``{"documents": int, "tokens": int, "log2_histogram": {...}}`` (the
  histogram as above; a ``document_lengths`` block with its own ``log2_histogram`` is read too).
- Rejected records: the manifest's ``counts["rejected_files"]`` (``rejected/rejected.jsonl``;
  a path that is not a file of ``rejected/`` is refused, not read) hold one JSON record a
  line with ``source``, ``position``, ``reason`` and ``excerpt``. At most
  :data:`MAX_REJECTED_LINES` lines are read, each cut at :data:`MAX_LINE_BYTES`; a sample's
  excerpt is shown with the characters that would not show escaped (:func:`shown_excerpt`).
"""

from __future__ import annotations

import json
import math
from typing import Any

from loaders.inspection.source import InspectedDataset

__all__ = ["MAX_LINE_BYTES", "MAX_REJECTED_LINES", "document_length_bins", "input_files", "rejected_samples",
           "shown_excerpt", "source_stats"]

MAX_REJECTED_LINES = 200_000
MAX_LINE_BYTES = 4096
_MAX_FILES = 50


def _int(value: Any) -> int:
    return int(value) if isinstance(value, (int, float)) and not isinstance(value, bool) and value >= 0 else 0


def document_length_bins(log2_histogram: Any) -> list[tuple[str, int]]:
    """``(label, documents)`` per log2 bin in increasing order, every bin from the first to the
    last present: ``"<16"`` becomes ``"8-15"`` (``"<1"``: ``"0"``, ``"<2"``: ``"1"``)."""
    if not isinstance(log2_histogram, dict):
        return []
    counts: dict[int, int] = {}
    for key, value in log2_histogram.items():
        try:
            bound = int(str(key).lstrip("<"))
        except ValueError:
            continue
        if bound >= 1 and bound & (bound - 1) == 0:  # a power of two
            counts[int(math.log2(bound))] = counts.get(int(math.log2(bound)), 0) + _int(value)
    if not counts:
        return []
    out = []
    for b in range(min(counts), max(counts) + 1):
        low, high = (0, 0) if b == 0 else (2 ** (b - 1), 2**b - 1)
        out.append((str(low) if low == high else f"{low:,}-{high:,}", counts.get(b, 0)))
    return out


def shown_excerpt(excerpt: str) -> str:
    """An excerpt as a person is to see it: a character that would not show (NUL, other control
    characters, a lone surrogate, a zero-width space) escaped as Python writes it (``\\x00``,
    ``\\t``, ``\\u200b``); line breaks and spaces kept. Invalid bytes are ``\\xNN`` already in
    what materialize writes (excerpts of older runs hold U+FFFD, the bytes lost)."""
    return "".join(c if c.isprintable() or c in " \n" else repr(c)[1:-1] for c in excerpt)


def input_files(ds: InspectedDataset) -> dict[str, Any]:
    """``{"files": [{path, bytes, share}], "total_files", "total_bytes", "more_files", "more_bytes"}``:
    the largest files first, at most 50 listed."""
    files = ds.manifest.run.get("input_files") if isinstance(ds.manifest.run, dict) else None
    rows = [{"path": str(f.get("path", "?")), "bytes": _int(f.get("bytes"))}
            for f in (files if isinstance(files, list) else []) if isinstance(f, dict)]
    total = sum(r["bytes"] for r in rows)
    rows.sort(key=lambda r: (-r["bytes"], r["path"]))
    for row in rows:
        row["share"] = round(row["bytes"] / total, 6) if total else None
    listed = rows[:_MAX_FILES]
    return {"files": listed, "total_files": len(rows), "total_bytes": total,
            "more_files": len(rows) - len(listed), "more_bytes": sum(r["bytes"] for r in rows[_MAX_FILES:])}


def source_stats(ds: InspectedDataset, split: str) -> dict[str, dict[str, Any]]:
    """Per-source ``documents``, ``tokens`` and length ``bins`` of ``split`` (empty without a
    ``sources`` block), the most documents first."""
    stats = ds.manifest.stats.get(split, {}) if isinstance(ds.manifest.stats, dict) else {}
    sources = stats.get("sources") if isinstance(stats, dict) else None
    if not isinstance(sources, dict):
        return {}
    out = {}
    for name, entry in sources.items():
        if not isinstance(entry, dict):
            continue
        lengths = entry.get("document_lengths")
        histogram = lengths.get("log2_histogram") if isinstance(lengths, dict) else entry.get("log2_histogram")
        out[str(name)] = {"documents": _int(entry.get("documents")), "tokens": _int(entry.get("tokens")),
                          "bins": document_length_bins(histogram)}
    return dict(sorted(out.items(), key=lambda item: (-item[1]["documents"], item[0])))


def _inside_rejected(path: str) -> bool:
    """A manifest path that names a file of ``rejected/`` and nothing else (never ``..``, never absolute)."""
    parts = path.split("/")
    return len(parts) == 2 and parts[0] == "rejected" and parts[1] not in ("", ".", "..") and "\\" not in path


def _rejected_paths(ds: InspectedDataset) -> tuple[list[str], list[str]]:
    """The rejected files to read, and the manifest paths refused (outside ``rejected/``)."""
    counts = ds.manifest.counts if isinstance(ds.manifest.counts, dict) else {}
    files = counts.get("rejected_files") if isinstance(counts.get("rejected_files"), list) else []
    paths = [str(f["path"]) for f in files if isinstance(f, dict) and isinstance(f.get("path"), str)]
    refused = [p for p in paths if not _inside_rejected(p)]
    kept = [p for p in paths if _inside_rejected(p)]
    return kept or (["rejected/rejected.jsonl"] if counts.get("rejected") and not refused else []), refused


def rejected_samples(ds: InspectedDataset, per_reason: int = 3) -> dict[str, Any]:
    """Up to ``per_reason`` records of each rejection reason, in file order.

    Returns:
        ``{"by_reason": {reason: count}, "samples": {reason: [record, ...]}, "lines_read": n,
        "complete": bool, "problems": [str]}``; ``complete`` is false when the files were
        longer than :data:`MAX_REJECTED_LINES` lines (samples then come from their start).
    """
    counts = ds.manifest.counts if isinstance(ds.manifest.counts, dict) else {}
    by_reason = counts.get("rejected_by_reason") if isinstance(counts.get("rejected_by_reason"), dict) else {}
    samples: dict[str, list[dict[str, Any]]] = {}
    paths, refused = _rejected_paths(ds)
    problems = [f"the manifest names {p!r} as a rejected file: not a file of rejected/, not read" for p in refused]
    lines, complete = 0, True
    for relative in paths:
        try:
            path = ds.files.local_file(relative)
            handle = open(path, "rb")  # closed by the with below
        except (OSError, ValueError) as exc:  # missing, unreadable, or a download that failed
            problems.append(f"{relative}: {exc}")
            continue
        with handle:
            while True:
                if lines >= MAX_REJECTED_LINES:
                    complete = not handle.read(1)
                    break
                line = handle.readline(MAX_LINE_BYTES)
                if not line:
                    break
                lines += 1
                rest = line
                while rest and not rest.endswith(b"\n"):  # skip the rest of an over-long line, bounded
                    rest = handle.readline(MAX_LINE_BYTES)
                try:
                    record = json.loads(line.decode("utf-8", "replace"))
                except ValueError:
                    continue
                if not isinstance(record, dict):
                    continue
                reason = str(record.get("reason", "?"))
                kept = samples.setdefault(reason, [])
                if len(kept) < per_reason:
                    kept.append({"source": str(record.get("source", "")), "position": record.get("position"),
                                 "excerpt": shown_excerpt(str(record.get("excerpt", "")))[:400]})
    return {"by_reason": {str(k): _int(v) for k, v in by_reason.items()}, "samples": samples, "lines_read": lines,
            "complete": complete, "problems": problems}
