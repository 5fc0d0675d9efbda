"""T5 span corruption's arithmetic and array work, shared by span corruption
(:mod:`transforms.objectives.span_corruption`) and UL2's span denoisers
(:mod:`transforms.objectives.ul2`): T5's length helper, the noise counts of a chunk, the
corruption of rows of one length at once, the span-length histogram, and the checks of a
block's chunks and of the tokenizer's sentinels (their inspection is
:mod:`transforms.objectives.span_views`'). The semantics, and where they differ from T5, are in
:mod:`transforms.objectives.span_corruption`'s docstring.
"""

from __future__ import annotations

import functools

import numpy as np

from transforms.objectives.base import Block
from transforms.objectives.common import SpecialIds, ids_out_of_range
from transforms.objectives.counters import SPAN_LENGTH_HISTOGRAM_CAP
from transforms.objectives.randoms import Randoms, compositions

__all__ = [
    "KEEP_STREAM",
    "NOISE_STREAM",
    "SPAN_LENGTH_HISTOGRAM_CAP",
    "check_chunks",
    "check_sentinels",
    "corrupt_rows",
    "encoded_lengths",
    "fit_raw_length",
    "noise_counts",
    "random_spans_helper",
    "span_histogram",
]

NOISE_STREAM, KEEP_STREAM = 1, 2
_HISTOGRAM_NAMES = tuple(f"span_len_hist_{k}" for k in range(SPAN_LENGTH_HISTOGRAM_CAP + 1))

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
    # Pure in its arguments and called once per block with the same few lengths.
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

def check_sentinels(special: SpecialIds, needed: int, context: str) -> np.ndarray:
    """The first ``needed`` sentinel ids (int32).

    Raises:
        ValueError: the tokenizer has fewer sentinels.
    """
    if needed > len(special.sentinels):
        raise ValueError(
            f"{context} needs {needed} sentinel ids (<extra_id_0>..<extra_id_{needed - 1}>) but the "
            f"tokenizer provides {len(special.sentinels)}; add sentinel tokens or lower the span count"
        )
    return special.sentinel_array()[:needed].astype(np.int32)


def corrupt_rows(
    tokens: np.ndarray,
    randoms: Randoms,
    noise_density: float,
    mean_noise_span_length: float,
    special: SpecialIds,
    *,
    lead: int = 0,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Span-corrupt rows of one length at once (shared by span corruption and UL2).

    Args:
        tokens: ``(rows, L)`` chunks.
        randoms: the rows' randoms.
        noise_density: fraction of tokens to noise.
        mean_noise_span_length: mean noise span length.
        special: ``eos`` and ``sentinels`` are used.
        lead: free slots left at the start of every inputs row (UL2 writes its mode token there).

    Returns:
        ``(inputs, targets, noise_lengths)``: ``(rows, lead + L - n_noise + n_spans + 1)`` and
        ``(rows, n_noise + n_spans + 1)`` int32, and the ``(rows, n_spans)`` noise run lengths.

    Raises:
        ValueError: fewer sentinels than noise spans.
    """
    rows, length = tokens.shape
    num_noise, num_spans = _cached_noise_counts(length, noise_density, mean_noise_span_length)
    eos = special.eos
    if num_spans == 0:
        inputs = np.empty((rows, lead + length + 1), dtype=np.int32)
        inputs[:, lead:-1] = tokens
        inputs[:, -1] = eos
        return inputs, np.full((rows, 1), eos, dtype=np.int32), np.zeros((rows, 0), dtype=np.int64)
    sentinels = check_sentinels(special, num_spans,
                                f"span corruption of {length} tokens (r={noise_density}, mu={mean_noise_span_length})")
    noise = compositions(randoms, NOISE_STREAM, num_noise, num_spans)
    keep = compositions(randoms, KEEP_STREAM, length - num_noise, num_spans)
    # Runs alternate kept run 0, noise run 0, kept run 1, ... The inputs are blocks "kept run k,
    # sentinel k" and the targets blocks "sentinel k, noise run k"; one gather of the chunk fills
    # both, each block reading on from its first slot's source: kept run k's start for an inputs
    # block (its sentinel slot reads the noise run's first token), one before noise run k for a
    # targets block; the sentinels then overwrite their slots.
    keep_ends = np.cumsum(keep, axis=1)  # end of kept run k, counted in kept tokens
    noise_ends = np.cumsum(noise, axis=1)
    noise_starts = noise_ends - noise  # noise tokens before noise run k
    keep_starts = keep_ends - keep
    blocks = np.empty((rows, 2 * num_spans), dtype=np.int64)
    blocks[:, :num_spans] = keep + 1
    blocks[:, num_spans:] = noise + 1
    # source position of each block's first slot (the chunk position it reads from)
    sources = np.empty((rows, 2 * num_spans), dtype=np.int64)
    sources[:, :num_spans] = keep_starts + noise_starts  # kept run k starts after k noise runs
    sources[:, num_spans:] = keep_ends + noise_starts - 1  # noise run k starts after k + 1 kept runs
    width = length + 2 * num_spans
    sources -= _exclusive_cumsum_rows(blocks)  # minus each block's first slot: source - destination
    sources += (np.arange(rows) * length)[:, None]  # rows of the flattened chunks
    gather = np.repeat(sources.reshape(-1), blocks.reshape(-1)).reshape(rows, width)
    gather += np.arange(width)
    body = tokens.reshape(-1)[gather]
    inputs_body = length - num_noise + num_spans
    inputs = np.empty((rows, lead + inputs_body + 1), dtype=np.int32)
    inputs[:, lead:-1] = body[:, :inputs_body]
    inputs[:, -1] = eos
    targets = np.empty((rows, num_noise + num_spans + 1), dtype=np.int32)
    targets[:, :-1] = body[:, inputs_body:]
    targets[:, -1] = eos
    slots = np.arange(num_spans)
    rows_index = np.arange(rows)[:, None]
    inputs[rows_index, lead + keep_ends + slots] = sentinels  # after kept run k: its k earlier sentinels
    targets[rows_index, noise_starts + slots] = sentinels
    return inputs, targets, noise


def _exclusive_cumsum_rows(values: np.ndarray) -> np.ndarray:
    out = np.zeros_like(values)
    np.cumsum(values[:, :-1], axis=1, out=out[:, 1:])
    return out


def span_histogram(noise_lengths: np.ndarray, names: tuple[str, ...] = _HISTOGRAM_NAMES) -> dict[str, int]:
    """``span_len_hist_<k>`` counters of noise run lengths (``k`` capped at :data:`SPAN_LENGTH_HISTOGRAM_CAP`)."""
    counts = np.bincount(np.minimum(noise_lengths.reshape(-1), SPAN_LENGTH_HISTOGRAM_CAP))
    return {names[k]: int(n) for k, n in enumerate(counts.tolist()) if n}


def check_chunks(block: Block, special: SpecialIds, limit: int, what: str, least: int = 0) -> np.ndarray:
    """The rows' lengths, after checking that each has ``least`` to ``limit`` tokens of the vocabulary.

    Raises:
        ValueError: a chunk too short or too long, or an id outside the vocabulary.
    """
    lengths = block.lengths
    if lengths.size and (int(lengths.max()) > limit or int(lengths.min()) < least):
        raise ValueError(f"{what} takes chunks of {least} to {limit} tokens, got one of "
                         f"{int(lengths.max()) if int(lengths.max()) > limit else int(lengths.min())}")
    if block.tokens.size and ids_out_of_range(block.tokens, special.vocab_size):
        raise ValueError(f"token ids must be in [0, {special.vocab_size}), got "
                         f"[{block.tokens.min()}, {block.tokens.max()}]")
    return lengths
