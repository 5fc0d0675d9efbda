"""T5 span corruption: random noise spans replaced by sentinels (pure numpy).

Reference: google-research/text-to-text-transfer-transformer ``t5/data/preprocessors.py``
(``random_spans_helper``, ``random_spans_noise_mask``, ``noise_span_to_unique_sentinel``,
``nonnoise_span_to_unique_sentinel``) and its port in huggingface/transformers
``run_t5_mlm_flax.py``. Semantics matched exactly:

- :func:`random_spans_helper` is T5's length helper: the largest raw chunk length ``T``
  whose encoded inputs (EOS included) fit ``inputs_length``, Python ``round`` (half to
  even), and the ``noise_density == 0.5`` "minor hack". (3, .15, 512) -> 568 raw, 114 targets.
- :func:`random_spans_noise_mask`: ``n_noise = clip(round(L*r), 1, L-1)``,
  ``n_spans = max(round(n_noise/mu), 1)``, noise and non-noise run lengths are uniformly
  random compositions (every composition equally likely), runs alternate non-noise first
  and noise last; ``r == 0`` gives no noise; lengths below 2 are computed as 2 and cut
  back, so a 1-token chunk is never noised.
- Layout: ``inputs = c0 <X0> c1 <X1> ... </s>``, ``targets = <X0> n0 <X1> n1 ... </s>``
  where ``<Xk>`` is ``special.sentinels[k]`` (``<extra_id_k>``) in order of appearance.

Deliberate differences:

- Span cap: ``n_spans = min(n_spans, L - n_noise)`` so that every non-noise run is
  non-empty. T5 has no guard (the shape breaks when spans outnumber non-noise tokens);
  HF caps with ``round(min(n_noise, n_nonnoise)/mu)``, which also changes well-formed
  configurations with ``r > 0.5``. Ours is identical to T5 whenever T5 is well formed.
- The raw length actually used (:func:`fit_raw_length`) is the helper's ``T``, shrunk
  only in degenerate tiny configurations where the mask's clip/max guards would make the
  inputs overflow the budget (the helper has no such guards). All realistic settings,
  and every golden value, are unchanged.
- Randomness comes from a per-example ``numpy.random.Generator`` (content-addressed
  seeds, DESIGN.md section 3), not TF stateless seeds, so ids differ from T5's bit for
  bit while the distribution is the same.
- A final chunk shorter than ``T`` is noised at its own length (counts from its length,
  as T5 does for the short tail of ``split_tokens``): inputs and targets come out shorter
  than the budgets, never longer, and the writer pads them to the schema lengths.

Assumption: chunks hold no sentinel ids (the tokenizer must not turn literal
``<extra_id_k>`` text into them); otherwise inputs/targets cannot be read back unambiguously.
"""

from __future__ import annotations

import collections
import functools
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from transforms.objectives.base import BuiltRows
from transforms.objectives.common import SpecialIds, generator_of, index_range, padded_rows
from transforms.objectives.counters import add_counters_times
from transforms.objectives.packing import Piece

__all__ = [
    "SPAN_LENGTH_HISTOGRAM_CAP",
    "SpanCorruption",
    "SpanCorruptionConfig",
    "apply_noise_mask",
    "corrupt_spans",
    "encoded_lengths",
    "fit_raw_length",
    "noise_counts",
    "random_spans_helper",
    "random_spans_noise_mask",
    "raw_length_from_encoded",
    "span_corruption",
    "span_counters",
    "span_length_histogram",
    "special_span_histogram",
]

SPAN_LENGTH_HISTOGRAM_CAP = 64
"""Span lengths >= this value share the last histogram bucket ``span_len_hist_64``."""


def _check_density_and_span(noise_density: float, mean_noise_span_length: float) -> None:
    if not 0.0 <= noise_density < 1.0:
        raise ValueError(f"noise_density must be in [0, 1), got {noise_density!r}")
    if not mean_noise_span_length > 0.0:
        raise ValueError(f"mean_noise_span_length must be > 0, got {mean_noise_span_length!r}")


def random_spans_helper(
    inputs_length: int,
    noise_density: float,
    mean_noise_span_length: float,
    extra_tokens_per_span_inputs: int = 1,
    extra_tokens_per_span_targets: int = 1,
) -> tuple[int, int]:
    """T5's ``random_spans_helper``: raw chunk length and targets length for an inputs budget.

    Args:
        inputs_length: inputs budget, EOS included.
        noise_density: fraction of raw tokens that are noise.
        mean_noise_span_length: mean length of a noise span.
        extra_tokens_per_span_inputs: tokens each span adds to the inputs (the sentinel).
        extra_tokens_per_span_targets: tokens each span adds to the targets (the sentinel).

    Returns:
        ``(raw_tokens_length, targets_length)``, e.g. ``(568, 114)`` for (512, .15, 3).

    Raises:
        ValueError: a length below 2 or a density/span length out of range.
    """
    if inputs_length < 2:
        raise ValueError(f"inputs_length must be >= 2, got {inputs_length!r}")
    _check_density_and_span(noise_density, mean_noise_span_length)

    def lengths(tokens_length: int) -> tuple[int, int]:
        num_noise = int(round(tokens_length * noise_density))
        num_spans = int(round(num_noise / mean_noise_span_length))
        return (
            tokens_length - num_noise + num_spans * extra_tokens_per_span_inputs + 1,
            num_noise + num_spans * extra_tokens_per_span_targets + 1,
        )

    tokens_length = inputs_length - 1
    while lengths(tokens_length + 1)[0] <= inputs_length:
        tokens_length += 1
    _, targets_length = lengths(tokens_length)
    # T5's "minor hack": with r = .5 make targets equal the (round) inputs length.
    if noise_density == 0.5 and targets_length > inputs_length:
        tokens_length -= 1
        targets_length -= 1
    return tokens_length, targets_length


def noise_counts(length: int, noise_density: float, mean_noise_span_length: float) -> tuple[int, int]:
    """Noise tokens and noise spans of the mask :func:`random_spans_noise_mask` returns.

    ``n_noise = clip(round(L*r), 1, L-1)``, ``n_spans = max(round(n_noise/mu), 1)`` capped
    at ``n_noise`` and at the non-noise count ``L - n_noise`` (so every run is non-empty).
    Lengths below 2 and ``r == 0`` give ``(0, 0)``, as T5's cut-back mask has no noise.

    Raises:
        ValueError: negative length or a density/span length out of range.
    """
    if length < 0:
        raise ValueError(f"length must be >= 0, got {length!r}")
    _check_density_and_span(noise_density, mean_noise_span_length)
    if noise_density == 0.0 or length < 2:
        return 0, 0
    num_noise = min(max(int(round(length * noise_density)), 1), length - 1)
    num_spans = max(int(round(num_noise / mean_noise_span_length)), 1)
    return num_noise, min(num_spans, num_noise, length - num_noise)


@functools.lru_cache(maxsize=4096)
def _cached_noise_counts(length: int, noise_density: float, mean_noise_span_length: float) -> tuple[int, int]:
    # Pure in its arguments and called once per example with the same few lengths.
    return noise_counts(length, noise_density, mean_noise_span_length)


def encoded_lengths(length: int, noise_density: float, mean_noise_span_length: float) -> tuple[int, int]:
    """``(inputs, targets)`` lengths, EOS included, of :func:`span_corruption` on ``length`` tokens."""
    num_noise, num_spans = noise_counts(length, noise_density, mean_noise_span_length)
    return length - num_noise + num_spans + 1, num_noise + num_spans + 1


def fit_raw_length(inputs_length: int, noise_density: float, mean_noise_span_length: float) -> int:
    """Raw chunk length whose span-corrupted inputs fit ``inputs_length``.

    This is :func:`random_spans_helper`'s length, reduced only where the mask's guards
    (at least one noise token and one span) would overflow the budget of a tiny config.
    """
    raw_length, _ = random_spans_helper(inputs_length, noise_density, mean_noise_span_length)
    while raw_length > 0 and encoded_lengths(raw_length, noise_density, mean_noise_span_length)[0] > inputs_length:
        raw_length -= 1
    return raw_length


def raw_length_from_encoded(
    inputs_length: int, targets_length: int, noise_density: float, mean_noise_span_length: float, max_raw: int
) -> int:
    """Invert :func:`encoded_lengths`: the raw length that produced an example.

    ``inputs + targets = L + 2*n_spans + 2`` grows strictly with ``L``, so the raw length
    is unique; counters can then be recomputed from an example without its sentinel ids.

    Raises:
        ValueError: no raw length up to ``max_raw`` gives these lengths.
    """
    total = inputs_length + targets_length
    low, high = 0, max_raw
    while low < high:
        middle = (low + high) // 2
        if sum(encoded_lengths(middle, noise_density, mean_noise_span_length)) < total:
            low = middle + 1
        else:
            high = middle
    if encoded_lengths(low, noise_density, mean_noise_span_length) != (inputs_length, targets_length):
        raise ValueError(
            f"no raw length <= {max_raw} gives inputs {inputs_length} and targets {targets_length} "
            f"at noise_density={noise_density}, mean_noise_span_length={mean_noise_span_length}"
        )
    return low


def _random_composition(total: int, parts: int, rng: np.random.Generator) -> np.ndarray:
    """Uniformly random composition of ``total`` into ``parts`` positive integers."""
    if parts == 1:
        return np.array([total], dtype=np.int64)
    # Choosing parts-1 distinct cut points among the total-1 gaps is the same
    # distribution as T5's shuffled 0/1 vector: every composition equally likely.
    cuts = rng.choice(total - 1, size=parts - 1, replace=False, shuffle=False)
    cuts.sort()
    parts_lengths = np.empty(parts, dtype=np.int64)
    parts_lengths[0] = cuts[0] + 1
    parts_lengths[1:-1] = cuts[1:] - cuts[:-1]
    parts_lengths[-1] = total - 1 - cuts[-1]
    return parts_lengths


def random_spans_noise_mask(
    length: int, noise_density: float, mean_noise_span_length: float, rng: np.random.Generator
) -> np.ndarray:
    """T5's noise mask: ``True`` marks noise; non-noise run first, noise run last.

    Args:
        length: number of tokens.
        noise_density: fraction of tokens to noise.
        mean_noise_span_length: mean noise span length.
        rng: the example's generator (noise lengths are drawn first, then non-noise).

    Returns:
        bool array of ``length``.
    """
    num_noise, num_spans = noise_counts(length, noise_density, mean_noise_span_length)
    if num_spans == 0:
        return np.zeros(length, dtype=bool)
    noise_lengths = _random_composition(num_noise, num_spans, rng)
    nonnoise_lengths = _random_composition(length - num_noise, num_spans, rng)
    run_lengths = np.stack([nonnoise_lengths, noise_lengths], axis=1).reshape(-1)
    return np.repeat(np.tile(np.array([False, True]), num_spans), run_lengths)


def apply_noise_mask(
    tokens: np.ndarray, mask: np.ndarray, sentinels: np.ndarray, eos: int
) -> tuple[np.ndarray, np.ndarray]:
    """Replace each noise run by one sentinel in inputs; gather sentinel + run in targets.

    Args:
        tokens: 1-D token ids.
        mask: bool noise mask aligned with ``tokens``.
        sentinels: sentinel ids, ``sentinels[k]`` for the k-th noise run.
        eos: id appended to both sequences.

    Returns:
        ``(inputs, targets)`` as int32.
    """
    previous = np.zeros_like(mask)
    previous[1:] = mask[:-1]
    run_starts = mask & ~previous
    num_spans = int(np.count_nonzero(run_starts))
    span_sentinels = sentinels[:num_spans]
    # inputs: the non-noise tokens and the first token of each noise run, which becomes its sentinel.
    kept = ~mask | run_starts
    inputs = np.empty(int(np.count_nonzero(kept)) + 1, dtype=np.int32)
    inputs[:-1] = tokens[kept]
    inputs[:-1][run_starts[kept]] = span_sentinels
    inputs[-1] = eos
    # targets: every noise token, shifted right by the sentinels placed before it.
    noise_tokens = tokens[mask]
    starts_in_noise = run_starts[mask]
    targets = np.empty(noise_tokens.shape[0] + num_spans + 1, dtype=np.int32)
    targets[np.arange(noise_tokens.shape[0]) + np.cumsum(starts_in_noise)] = noise_tokens
    targets[np.flatnonzero(starts_in_noise) + np.arange(num_spans)] = span_sentinels
    targets[-1] = eos
    return inputs, targets


@dataclass(frozen=True)
class SpanCorruptionConfig:
    """Parameters of T5 span corruption.

    Attributes:
        inputs_length: inputs budget, EOS included (the raw chunk length follows from it).
        noise_density: fraction of raw tokens that become noise.
        mean_noise_span_length: mean length of a noise span.
    """

    inputs_length: int = 512
    noise_density: float = 0.15
    mean_noise_span_length: float = 3.0

    def __post_init__(self) -> None:
        if not isinstance(self.inputs_length, int) or isinstance(self.inputs_length, bool) or self.inputs_length < 3:
            raise ValueError(f"inputs_length must be an int >= 3, got {self.inputs_length!r}")
        if not 0.0 < self.noise_density < 1.0:
            raise ValueError(f"noise_density must be in (0, 1), got {self.noise_density!r}")
        if not self.mean_noise_span_length >= 1.0:
            raise ValueError(f"mean_noise_span_length must be >= 1, got {self.mean_noise_span_length!r}")

    @property
    def raw_length(self) -> int:
        """Raw tokens of a full chunk (568 for the T5 defaults)."""
        return fit_raw_length(self.inputs_length, self.noise_density, self.mean_noise_span_length)

    def full_lengths(self) -> tuple[int, int, int]:
        """``(inputs, targets, spans)`` of an example made from a full raw chunk."""
        raw_length = self.raw_length
        inputs, targets = encoded_lengths(raw_length, self.noise_density, self.mean_noise_span_length)
        return inputs, targets, noise_counts(raw_length, self.noise_density, self.mean_noise_span_length)[1]

    @property
    def targets_length(self) -> int:
        """Targets budget: T5's helper value (114 for the defaults), never below a full chunk's targets.

        The two agree except where T5's r = .5 hack leaves a slot unused, e.g.
        (mu=8, r=.5, inputs 2048) budgets 2048 targets for 2047-token full examples.
        """
        helper_targets = random_spans_helper(self.inputs_length, self.noise_density, self.mean_noise_span_length)[1]
        return max(helper_targets, self.full_lengths()[1])


def _sentinel_array(special: SpecialIds, needed: int, context: str) -> np.ndarray:
    if needed > len(special.sentinels):
        raise ValueError(
            f"{context} needs {needed} sentinel ids (<extra_id_0>..<extra_id_{needed - 1}>) but the "
            f"tokenizer provides {len(special.sentinels)}; add sentinel tokens or lower the span count"
        )
    return np.asarray(special.sentinels[:needed], dtype=np.int64)


def _composition_bounds(total: int, parts: int, rng: np.random.Generator, out: np.ndarray) -> None:
    """Write ``[0, *cumsum(_random_composition(total, parts, rng))]`` into ``out``, drawing
    exactly what :func:`_random_composition` draws."""
    out[0], out[parts] = 0, total
    if parts > 1:
        cuts = rng.choice(total - 1, size=parts - 1, replace=False, shuffle=False)
        cuts.sort()
        np.add(cuts, 1, out=out[1:parts])


def corrupt_spans(
    tokens: np.ndarray,
    rng: np.random.Generator,
    noise_density: float,
    mean_noise_span_length: float,
    special: SpecialIds,
    *,
    lead: int = 0,
) -> tuple[np.ndarray, np.ndarray]:
    """Draw T5's noise mask for ``tokens`` and apply it (shared by span corruption and UL2).

    The result equals ``apply_noise_mask(tokens, random_spans_noise_mask(len(tokens), ...),
    sentinels, eos)`` with the same draws, computed without the mask.

    Args:
        lead: free slots left at the start of ``inputs`` (UL2 writes its mode token there).

    Returns:
        ``(inputs, targets)`` as :func:`apply_noise_mask`, ``inputs`` after ``lead`` slots.

    Raises:
        ValueError: tokens not 1-D, or fewer sentinels than noise spans.
    """
    tokens = np.asarray(tokens)
    if tokens.ndim != 1:
        raise ValueError(f"tokens must be 1-D, got shape {tokens.shape}")
    rng = generator_of(rng)
    # Same draws and output as ``apply_noise_mask(tokens, random_spans_noise_mask(...))``,
    # gathered straight from the cumulative run lengths ``keep`` and ``noise`` (from 0):
    # run ``k`` of kept tokens starts at ``keep[k] + noise[k]`` in the chunk, and noise run
    # ``k`` at ``keep[k + 1] + noise[k]``. The inputs are blocks "kept run k, sentinel k",
    # the targets blocks "sentinel k, noise run k"; one gather fills both, each block from
    # its run's first token minus one slot, and the sentinels overwrite their slots.
    length = tokens.shape[0]
    num_noise, num_spans = _cached_noise_counts(length, noise_density, mean_noise_span_length)
    sentinels = special.sentinel_array()
    if num_spans > sentinels.shape[0]:
        context = f"span corruption of {length} tokens (r={noise_density}, mu={mean_noise_span_length})"
        _sentinel_array(special, num_spans, context)  # raises
    eos = special.eos
    if num_spans == 0:
        inputs = np.empty(lead + length + 1, dtype=np.int32)
        inputs[lead:-1] = tokens
        inputs[-1] = eos
        return inputs, np.array([eos], dtype=np.int32)
    num_keep = length - num_noise
    bounds = np.empty((2, num_spans + 1), dtype=np.int64)  # rows: keep, noise
    _composition_bounds(num_noise, num_spans, rng, bounds[1])  # noise lengths are drawn first
    _composition_bounds(num_keep, num_spans, rng, bounds[0])
    inputs_body = num_keep + num_spans
    # block sizes: kept run + 1 (inputs), then noise run + 1 (targets)
    blocks = bounds[:, 1:] - bounds[:, :-1]
    blocks += 1
    # gather offsets (source minus destination): inputs block k starts at keep[k] + k and
    # reads from noise[k] + keep[k]; targets block k starts at inputs_body + noise[k] + k and
    # reads from keep[k + 1] - 1 + noise[k].
    shifted = bounds - index_range(num_spans + 1)
    offsets = np.empty((2, num_spans), dtype=np.int64)
    offsets[0] = shifted[1, :-1]
    np.subtract(shifted[0, 1:], inputs_body, out=offsets[1])
    gather = offsets.reshape(-1).repeat(blocks.reshape(-1))
    gather += index_range(gather.shape[0])
    body = tokens[gather]
    span_sentinels = sentinels[:num_spans]

    inputs = np.empty(lead + inputs_body + 1, dtype=np.int32)
    inputs[lead:-1] = body[:inputs_body]
    sentinel_slots = bounds[0, 1:] + index_range(num_spans)  # keep[k + 1] + k
    if lead:
        sentinel_slots += lead
    inputs[sentinel_slots] = span_sentinels
    inputs[-1] = eos
    targets = np.empty(num_noise + num_spans + 1, dtype=np.int32)
    targets[:-1] = body[inputs_body:]
    targets[bounds[1, :-1] + index_range(num_spans)] = span_sentinels  # noise[k] + k
    targets[-1] = eos
    return inputs, targets


def span_corruption(
    tokens: np.ndarray, rng: np.random.Generator, config: SpanCorruptionConfig, special: SpecialIds
) -> dict[str, np.ndarray]:
    """Span-corrupt one chunk.

    Args:
        tokens: 1-D raw token ids, ``config.raw_length`` long (shorter for a final chunk).
        rng: the example's generator.
        config: noise density and mean span length (``inputs_length`` is not used here).
        special: ``eos`` and ``sentinels`` are used.

    Returns:
        ``{"inputs": int32, "targets": int32}``.

    Raises:
        ValueError: tokens not 1-D, or fewer sentinels than noise spans.
    """
    inputs, targets = corrupt_spans(tokens, rng, config.noise_density, config.mean_noise_span_length, special)
    return {"inputs": inputs, "targets": targets}


def span_counters(
    inputs_length: int, targets_length: int, noise_density: float, mean_noise_span_length: float, max_raw: int
) -> dict[str, int]:
    """Raw, noise and span counts of a span-corrupted example, recomputed from its lengths.

    Raises:
        ValueError: lengths that span corruption cannot produce (e.g. a padded example).
    """
    return dict(_span_counts(inputs_length, targets_length, noise_density, mean_noise_span_length, max_raw))


@functools.lru_cache(maxsize=4096)
def _span_counts(
    inputs_length: int, targets_length: int, noise_density: float, mean_noise_span_length: float, max_raw: int
) -> tuple[tuple[str, int], ...]:
    # Pure in its arguments, and nearly every example has the same lengths: cache it.
    raw = raw_length_from_encoded(inputs_length, targets_length, noise_density, mean_noise_span_length, max_raw)
    num_noise, num_spans = noise_counts(raw, noise_density, mean_noise_span_length)
    return (("raw_tokens", raw), ("noise_tokens", num_noise), ("noise_spans", num_spans))


_HISTOGRAM_NAMES = tuple(f"span_len_hist_{k}" for k in range(SPAN_LENGTH_HISTOGRAM_CAP + 1))


def _span_buckets(targets: np.ndarray, eos_at: np.ndarray, is_sentinel) -> list[int]:
    """Bucket counts (index = capped span length) of the spans of one or more targets rows laid
    end to end, ``eos_at`` holding each row's last slot (its EOS).

    A span runs from its sentinel to the next sentinel or to its row's EOS, sentinel excluded.
    ``is_sentinel(targets)`` flags the sentinel positions (a new array).
    """
    if targets.shape[0] == 0:
        return []
    starts = is_sentinel(targets)
    starts[eos_at] = False  # an EOS ends its row's last span, whatever its id
    boundary = starts.copy()
    boundary[eos_at] = True
    starts = starts.nonzero()[0]
    if starts.shape[0] == 0:
        return []
    boundaries = boundary.nonzero()[0]
    lengths = boundaries[boundaries.searchsorted(starts, side="right")]
    lengths -= starts
    lengths -= 1
    np.minimum(lengths, SPAN_LENGTH_HISTOGRAM_CAP, out=lengths)
    return np.bincount(lengths).tolist()


def _last_slot(targets: np.ndarray) -> list[int]:
    return [targets.shape[0] - 1]


def span_length_histogram(targets: np.ndarray, sentinels: np.ndarray) -> dict[str, int]:
    """``span_len_hist_<k>`` counters from targets (bucket ``SPAN_LENGTH_HISTOGRAM_CAP`` is ">= cap")."""
    # The usual case: sentinels are consecutive ids, so a range test replaces np.isin.
    consecutive = len(sentinels) and sentinels[-1] - sentinels[0] == len(sentinels) - 1 and np.all(
        np.diff(sentinels) == 1)
    test = _membership_test((sentinels[0], sentinels[-1]) if consecutive else None, sentinels)
    buckets = _span_buckets(targets, _last_slot(targets), test)
    return {_HISTOGRAM_NAMES[k]: count for k, count in enumerate(buckets) if count}


def _membership_test(bounds: tuple[int, int] | None, values):
    """``targets -> bool array`` flagging ``values``: a range test when they are exactly the ids
    ``bounds`` (lowest, highest), else ``np.isin`` (``values`` is only read then)."""
    if bounds is not None:
        low, high = bounds
        return lambda targets: (targets >= low) & (targets <= high)
    return lambda targets: np.isin(targets, values)


def _sentinel_test(special: SpecialIds):
    """:func:`_membership_test` of ``special.sentinels``, without converting them per call."""
    bounds = special.sentinel_range()
    return _membership_test(bounds, None if bounds is not None else special.sentinel_array())


def special_span_histogram(targets: np.ndarray, special: SpecialIds) -> list[int]:
    """Bucket counts of :func:`span_length_histogram` for ``special.sentinels``."""
    return _span_buckets(targets, _last_slot(targets), _sentinel_test(special))


def add_block_span_histograms(counters: dict[str, int], names: Sequence[str], targets_of: list[np.ndarray],
                              special: SpecialIds) -> None:
    """Add to ``counters`` the span-length buckets (named ``names[k]``) of all ``targets_of``
    rows at once, as :func:`special_span_histogram` of each row would."""
    if not targets_of:
        return
    eos_at = np.cumsum([row.shape[0] for row in targets_of]) - 1
    for length, number in enumerate(_span_buckets(np.concatenate(targets_of), eos_at, _sentinel_test(special))):
        if number:
            counters[names[length]] = counters.get(names[length], 0) + number


class SpanCorruption:
    """T5 span corruption as an :class:`~transforms.objectives.base.Objective`.

    The schema's fixed lengths are the budgets ``config.inputs_length`` and
    ``config.targets_length``. Full chunks fill them exactly (all of T5's table, e.g.
    512/114); an example that comes out shorter (a final partial chunk, or the rare
    one-slot gap of T5's r = .5 hack) is returned unpadded and the writer pads it with
    ``special.pad`` up to the schema lengths. :meth:`stats` expects the unpadded example.

    Args:
        config: span corruption parameters (T5 defaults when omitted).
    """

    name = "span_corruption"
    family = "seq2seq"
    features: frozenset[str] = frozenset()
    required_specials: frozenset[str] = frozenset({"eos", "pad", "sentinels"})

    def __init__(self, config: SpanCorruptionConfig | None = None) -> None:
        self.config = config if config is not None else SpanCorruptionConfig()
        self.raw_length = self.config.raw_length
        self.inputs_length = self.config.inputs_length
        self.targets_length = self.config.targets_length
        self.num_spans = self.config.full_lengths()[2]

    def plan_chunk(self, rng: np.random.Generator) -> tuple[int, int]:
        """Always ``(raw_length, 0)``; consumes no randomness."""
        return self.raw_length, 0

    def build(
        self,
        tokens: np.ndarray,
        rng: np.random.Generator,
        plan: int,
        special: SpecialIds,
        features: dict[str, np.ndarray],
    ) -> dict[str, Any]:
        """Span-corrupt ``tokens`` (at most ``raw_length`` of them).

        Raises:
            ValueError: too many tokens or too few sentinels.
        """
        if len(tokens) > self.raw_length:
            raise ValueError(f"span_corruption chunk has {len(tokens)} tokens, more than raw_length {self.raw_length}")
        return span_corruption(tokens, rng, self.config, special)

    def build_many(
        self,
        pieces: Sequence[Piece],
        plans: Sequence[int],
        rngs: Sequence[np.random.Generator],
        special: SpecialIds,
    ) -> BuiltRows:
        """:meth:`build` and :meth:`stats` (with ``special``) of many chunks at once, rows padded
        to the schema lengths with ``special.pad`` as the pipeline's builder pads one example
        (``padding_tokens``): each row is :meth:`build` of its chunk and generator; the
        columns are laid out and the counters summed once for the block.

        Raises:
            ValueError: as :meth:`build`.
        """
        inputs_of, targets_of = [], []
        for piece, rng in zip(pieces, rngs, strict=True):
            example = self.build(piece.tokens, rng, 0, special, {})
            inputs_of.append(example["inputs"])
            targets_of.append(example["targets"])
        count = len(inputs_of)
        inputs_lengths = np.fromiter(map(len, inputs_of), dtype=np.int64, count=count)
        targets_lengths = np.fromiter(map(len, targets_of), dtype=np.int64, count=count)
        counters: dict[str, int] = {}
        for lengths, times in collections.Counter(zip(inputs_lengths.tolist(), targets_lengths.tolist())).items():
            add_counters_times(counters, self._length_stats(*lengths), times)
        add_block_span_histograms(counters, _HISTOGRAM_NAMES, targets_of, special)
        arrays = {}
        padding = 0
        for name, rows, width in (("inputs", inputs_of, self.inputs_length),
                                  ("targets", targets_of, self.targets_length)):
            flat, offsets, pads = padded_rows(rows, width, special.pad)
            arrays[name] = (flat, offsets)
            padding += pads
        if padding:
            counters["padding_tokens"] = padding
        return arrays, {}, {}, counters

    def stats(self, example: dict[str, Any], special: SpecialIds | None = None) -> dict[str, int]:
        """Counters of one example: examples, raw/noise tokens, spans, partial examples.

        Counts are recomputed from the example's lengths (the mask's counts depend only on
        the chunk length). Passing ``special`` adds the ``span_len_hist_<k>`` histogram,
        which needs the sentinel ids to find the spans.
        """
        counters = self._length_stats(len(example["inputs"]), len(example["targets"]))
        if special is not None:
            buckets = special_span_histogram(np.asarray(example["targets"]), special)
            counters.update({_HISTOGRAM_NAMES[k]: count for k, count in enumerate(buckets) if count})
        return counters

    def _length_stats(self, inputs_tokens: int, targets_tokens: int) -> dict[str, int]:
        """Every counter of :meth:`stats` but the histogram: they follow from the two lengths."""
        counters = span_counters(inputs_tokens, targets_tokens, self.config.noise_density,
                                 self.config.mean_noise_span_length, self.raw_length)
        counters["examples"] = 1
        counters["partial_examples"] = int(counters["raw_tokens"] < self.raw_length)
        counters["inputs_tokens"] = inputs_tokens
        counters["targets_tokens"] = targets_tokens
        return counters

    def schema_kwargs(self) -> dict[str, Any]:
        """Fixed-length ``inputs`` and ``targets`` columns."""
        return {"inputs_length": self.inputs_length, "targets_length": self.targets_length}

    def max_sentinels(self) -> int:
        """Noise spans of a full chunk (the most any example uses)."""
        return self.num_spans

    def params(self) -> dict[str, Any]:
        """Configuration and derived lengths for the manifest."""
        return {
            "reference": "t5.data.preprocessors.span_corruption",
            "inputs_length": self.inputs_length,
            "targets_length": self.targets_length,
            "raw_length": self.raw_length,
            "noise_density": self.config.noise_density,
            "mean_noise_span_length": self.config.mean_noise_span_length,
            "noise_spans": self.num_spans,
        }
