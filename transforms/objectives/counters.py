"""Integer counters that add up exactly in any order (pure, no Beam).

A counters dict maps names to ints. Names ending in ``_min`` / ``_max`` combine with
min / max, names containing ``hist_`` are histogram bins, everything else is summed.
Floats are never accumulated, so merged statistics are byte-identical whatever the
order in which a runner combines partial results.
"""

from __future__ import annotations

import numpy as np

__all__ = ["add_counters", "log2_bin", "merge_counters", "length_counters"]


def add_counters(total: dict[str, int], counters: dict[str, int]) -> None:
    """Combine ``counters`` into ``total`` in place (no copy: for per-example accumulation)."""
    for name, value in counters.items():
        if name not in total:
            total[name] = int(value)
        elif name.endswith("_min"):
            total[name] = min(total[name], int(value))
        elif name.endswith("_max"):
            total[name] = max(total[name], int(value))
        else:
            total[name] = total[name] + int(value)


def merge_counters(a: dict[str, int], b: dict[str, int]) -> dict[str, int]:
    """Combine two counter dicts into a new one."""
    out = dict(a)
    add_counters(out, b)
    return out


def log2_bin(length: int) -> int:
    """Histogram bin of a length: 0 for 0, else floor(log2(length)) + 1."""
    return int(length).bit_length()


def length_counters(prefix: str, lengths: np.ndarray) -> dict[str, int]:
    """count, sum, min, max and a log2 histogram of ``lengths`` under ``prefix``."""
    lengths = np.asarray(lengths, dtype=np.int64)
    if lengths.size == 0:
        return {}
    out = {
        f"{prefix}_count": int(lengths.size),
        f"{prefix}_sum": int(lengths.sum()),
        f"{prefix}_min": int(lengths.min()),
        f"{prefix}_max": int(lengths.max()),
    }
    bins = np.bincount([log2_bin(x) for x in lengths])
    for b, n in enumerate(bins):
        if n:
            out[f"{prefix}_hist_{b:02d}"] = int(n)
    return out
