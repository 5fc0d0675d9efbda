"""Integer counters that add up exactly in any order (pure, no Beam).

A counters dict maps names to ints. Names ending in ``_min`` / ``_max`` combine with
min / max, names containing ``hist_`` are histogram bins, everything else is summed.
Floats are never accumulated, so merged statistics are byte-identical whatever the
order in which a runner combines partial results: :func:`sum_counters` is the combiner of
every statistics stream of the pipeline (``beam.CombinePerKey(sum_counters)``; Beam calls
it on inputs, on partial sums and on both together, which suits an operation that is
associative and commutative).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

import numpy as np

__all__ = ["SPAN_LENGTH_HISTOGRAM_CAP", "add_counters", "length_counters", "sum_counters"]

SPAN_LENGTH_HISTOGRAM_CAP = 64
"""Noise span lengths >= this value share the last histogram bin ``span_len_hist_64`` (span
corruption and UL2's span denoisers; here so that summaries and objectives share it)."""


_SUM, _MIN, _MAX = 0, 1, 2
#: How each counter name combines, decided once per name (a few dozen names per objective).
_COMBINE: dict[str, int] = {}


def _combine_of(name: str) -> int:
    kind = _COMBINE.get(name)
    if kind is None:
        kind = _MIN if name.endswith("_min") else _MAX if name.endswith("_max") else _SUM
        if len(_COMBINE) < 100_000:
            _COMBINE[name] = kind
    return kind


def add_counters(total: dict[str, int], counters: dict[str, int]) -> None:
    """Combine ``counters`` into ``total`` in place (no copy: for per-example accumulation)."""
    for name, value in counters.items():
        value = int(value)
        old = total.get(name)
        if old is None:
            total[name] = value
            continue
        kind = _combine_of(name)
        if kind == _SUM:
            total[name] = old + value
        elif kind == _MIN:
            total[name] = min(old, value)
        else:
            total[name] = max(old, value)


def sum_counters(parts: Iterable[Mapping[str, int]]) -> dict[str, int]:
    """Counter dicts combined into one, its names sorted (the pipeline's statistics combiner)."""
    total: dict[str, int] = {}
    for counters in parts:
        add_counters(total, counters)
    return dict(sorted(total.items()))


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
    # each length's bin is its bit length (0 for 0, else floor(log2) + 1): frexp's exponent
    # (exact below 2**53)
    bins = np.bincount(np.frexp(lengths.astype(np.float64))[1])
    for b, n in enumerate(bins):
        if n:
            out[f"{prefix}_hist_{b:02d}"] = int(n)
    return out
