"""Counter-based random numbers for a block of examples, and the samplers the objectives use.

Every random number of an example is a pure function of ``(row key, stream, counter)``:

- the *row key* is 64 bits of a blake2b digest of ``f"{seed}:{example key}"``
  (:func:`transforms.objectives.layout.example_digests`; the example key names the chunk and
  the draw), optionally mixed with extra integers (the loader's epoch);
- a *stream* is a small integer that names what the numbers are for (span lengths, span
  starts, random ids, ...), so the draws of one purpose never shift those of another;
- the *counter* numbers the draws of a stream from 0.

The 64-bit word is ``mix64(row_key + mix64(GOLDEN * (stream * 2**32 + counter + 1)))``, where
``mix64`` is the SplitMix64 finalizer (Steele, Lea and Flood 2014, constants of Stafford's
"variant 13"): a bijection of 64-bit integers with full avalanche. The inner mix makes the
offsets of different counters unrelated, so two rows' streams never run in step the way two
SplitMix64 sequences with nearby seeds do; the outer one decorrelates rows. A block's words are
one array expression (``rows x counters``), with no Python loop per row. The generator's
statistics (uniformity of buckets and bits, independence across rows, counters and streams)
are checked in ``tests/transforms/objectives/test_randoms.py``.

Why not numpy's generators: numpy's public API draws from one seed per ``Generator``
(``default_rng(key)``: SeedSequence and PCG64; or ``Generator(Philox(key=key))``, its
counter-based one), and has no way to draw for many keys in one call, so a block would need a
generator object and a Python call per row and per draw. ``benchmarks/bench_handwritten.py``
(``random numbers``) measures that against this module on a block of objective-sized draws:
numpy's way is an order of magnitude slower, which is the whole cost of an objective. Nothing
here touches numpy's internals or registers anything with numpy; the words are plain uint64
array arithmetic. (Output bytes depend on this generator: switching would change every shard.)

Samplers on top (each exact in distribution up to float64 resolution):

- :meth:`Randoms.uniforms`: doubles in [0, 1) from the top 53 bits;
- :meth:`Randoms.integers`: ``floor(u * bound)``, uniform on ``[0, bound)`` up to a bias below
  ``bound / 2**53``;
- :func:`first_distinct`: per row, the first ``k`` distinct values of an i.i.d. uniform
  sequence on ``[0, bound)``: a uniformly random ordered ``k``-subset (by symmetry: the
  sequence's law is invariant under any permutation of the values). It costs about ``k``
  draws for ``k`` well below ``bound``; above half of it, :func:`random_order` of the whole
  range is used instead (the same distribution);
- :func:`random_order`: a uniformly random permutation per row, by sorting distinct random keys;
- :func:`compositions`: uniformly random compositions of a total into positive parts (T5's
  ``random_spans_noise_mask`` draws every composition with equal probability): ``parts - 1``
  distinct cut points among the ``total - 1`` gaps;
- :func:`random_ids`: uniform random token ids that are not special (the random replacements
  of MLM and BART).
"""

from __future__ import annotations

import math

import numpy as np

from transforms.objectives.common import SpecialIds

__all__ = ["GOLDEN", "Randoms", "compositions", "first_distinct", "mix64", "random_ids", "random_order"]

GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_M1, _M2 = np.uint64(0xBF58476D1CE4E5B9), np.uint64(0x94D049BB133111EB)
_S30, _S27, _S31, _S11 = np.uint64(30), np.uint64(27), np.uint64(31), np.uint64(11)
_TO_UNIT = 1.0 / 9007199254740992.0  # 2**-53


def mix64(z: np.ndarray) -> np.ndarray:
    """SplitMix64's finalizer of a uint64 array, in place (returned for chaining)."""
    z ^= z >> _S30
    z *= _M1
    z ^= z >> _S27
    z *= _M2
    z ^= z >> _S31
    return z


_COUNTERS: dict[int, np.ndarray] = {}


def _counter_words(stream: int, count: int) -> np.ndarray:
    """``mix64(GOLDEN * (stream * 2**32 + i + 1))`` for ``i < count`` (read-only, cached per stream)."""
    table = _COUNTERS.get(stream)
    if table is None or table.size < count:
        size = max(count, 64 if table is None else 2 * table.size)
        values = np.arange(1, size + 1, dtype=np.uint64)
        values += np.uint64(stream << 32)
        values *= GOLDEN
        table = mix64(values)
        table.setflags(write=False)
        _COUNTERS[stream] = table
    return table[:count]


class Randoms:
    """The random words of a block's rows (see the module docstring).

    Args:
        keys: one uint64 row key per row.
    """

    __slots__ = ("keys",)

    def __init__(self, keys: np.ndarray):
        self.keys = np.asarray(keys, dtype=np.uint64).reshape(-1)

    def __len__(self) -> int:
        return int(self.keys.shape[0])

    def rows(self, index) -> Randoms:
        """The randoms of some rows (an index array, a slice or a boolean mask)."""
        return Randoms(self.keys[index])

    def with_extra(self, *values: int) -> Randoms:
        """Row keys mixed with more integers (e.g. the loader's epoch): new, independent streams."""
        keys = self.keys.copy()
        for position, value in enumerate(values, start=1):
            word = mix64(np.array([(int(value) * 0x9E3779B97F4A7C15 + position) & 0xFFFFFFFFFFFFFFFF],
                                  dtype=np.uint64))
            keys ^= word
            mix64(keys)
        return Randoms(keys)

    def words(self, stream: int, count: int) -> np.ndarray:
        """``(rows, count)`` uint64: the words of counters ``0 .. count - 1`` of ``stream``."""
        out = self.keys[:, None] + _counter_words(stream, count)[None, :]
        return mix64(out)

    def uniforms(self, stream: int, count: int) -> np.ndarray:
        """``(rows, count)`` float64 in [0, 1)."""
        words = self.words(stream, count)
        words >>= _S11
        out = words.astype(np.float64)
        out *= _TO_UNIT
        return out

    def integers(self, stream: int, count: int, bound) -> np.ndarray:
        """``(rows, count)`` int64 uniform on ``[0, bound)``; ``bound`` is a scalar or one per row (>= 1)."""
        values = self.uniforms(stream, count)
        values *= float(bound) if np.ndim(bound) == 0 else np.asarray(bound, dtype=np.float64).reshape(-1, 1)
        return values.astype(np.int64)


def _draws_needed(count: np.ndarray, bound: np.ndarray) -> int:
    """Draws that hold ``count`` distinct values of ``[0, bound)`` for nearly every row (only the
    cost depends on it: rows that fall short are drawn again, longer). With ``count <= bound / 2``
    each draw is new with probability at least ``(bound - count) / bound``, so the mean is at most
    ``count * bound / (bound - count)``; four standard deviations of the excess on top."""
    mean = count * bound / np.maximum(bound - count, 1)
    return int(np.max(mean + 4 * np.sqrt(mean - count + 1), initial=0.0)) + 4


def first_distinct(randoms: Randoms, stream: int, bound, count) -> tuple[np.ndarray, np.ndarray]:
    """Per row, a uniformly random ordered sample of ``count`` distinct values of ``[0, bound)``.

    Args:
        randoms: the rows' randoms.
        stream: the stream the draws come from (:func:`random_order` uses ``stream`` too, for rows
            that take more than half of their range).
        bound: range size per row (a scalar or one per row).
        count: sample size per row, ``0 <= count <= bound``.

    Returns:
        ``(values, offsets)``: the samples of every row end to end (int64, in drawing order) and the
        ``rows + 1`` int64 offsets of each row's sample.
    """
    rows = len(randoms)
    if np.ndim(bound) == 0 and np.ndim(count) == 0:  # one size for every row: scalar bookkeeping
        bound, count = int(bound), int(count)
        if not 0 <= count <= bound:
            raise ValueError("first_distinct: every count must be in [0, bound]")
        offsets = np.arange(rows + 1, dtype=np.int64) * count
        if not rows or not count:
            return np.zeros(0, dtype=np.int64), offsets
        if 2 * count > bound:
            return _by_order(randoms, stream, np.full(rows, bound), np.full(rows, count)), offsets
        mean = count * bound / max(bound - count, 1)
        draws = int(mean + 4 * math.sqrt(mean - count + 1)) + 4
        values = randoms.integers(stream, draws, bound)
        taken, enough = _first_of_each(values, count)
        if enough.all():
            return values[taken], offsets
        return _by_first_distinct(randoms, stream, np.full(rows, bound), np.full(rows, count)), offsets
    bound = np.broadcast_to(np.asarray(bound, dtype=np.int64), (rows,))
    count = np.broadcast_to(np.asarray(count, dtype=np.int64), (rows,))
    offsets = np.zeros(rows + 1, dtype=np.int64)
    np.cumsum(count, out=offsets[1:])
    if not rows:
        return np.zeros(0, dtype=np.int64), offsets
    if int(count.min()) < 0 or bool((count > bound).any()):
        raise ValueError("first_distinct: every count must be in [0, bound]")
    dense = 2 * count > bound
    if not dense.any():
        return _by_first_distinct(randoms, stream, bound, count), offsets
    if dense.all():
        return _by_order(randoms, stream, bound, count), offsets
    values = np.empty(int(offsets[-1]), dtype=np.int64)
    for chosen, sampler in ((np.flatnonzero(~dense), _by_first_distinct), (np.flatnonzero(dense), _by_order)):
        sample = sampler(randoms.rows(chosen), stream, bound[chosen], count[chosen])
        slots = np.repeat(offsets[chosen] - _exclusive_cumsum(count[chosen]), count[chosen])
        slots += np.arange(slots.size)
        values[slots] = sample
    return values, offsets


def _exclusive_cumsum(values: np.ndarray) -> np.ndarray:
    out = np.zeros(values.size, dtype=np.int64)
    np.cumsum(values[:-1], out=out[1:])
    return out


def _by_first_distinct(randoms: Randoms, stream: int, bound: np.ndarray, count: np.ndarray) -> np.ndarray:
    """The first ``count`` distinct draws of each row, rows end to end."""
    draws = _draws_needed(count, bound)
    values = randoms.integers(stream, draws, bound)
    taken, enough = _first_of_each(values, count)
    if enough.all():
        return values[taken]
    # rows that fell short draw longer (the same sequence, more of it)
    out = np.empty(int(count.sum()), dtype=np.int64)
    first = _exclusive_cumsum(count)
    short = np.flatnonzero(~enough)
    done = np.flatnonzero(enough)
    out[(np.repeat(first[done] - _exclusive_cumsum(count[done]), count[done]) + np.arange(int(count[done].sum())))
        ] = values[enough][taken[enough]]
    longer = _by_first_distinct_longer(randoms.rows(short), stream, bound[short], count[short], 2 * draws)
    out[np.repeat(first[short] - _exclusive_cumsum(count[short]), count[short]) + np.arange(longer.size)] = longer
    return out


def _by_first_distinct_longer(randoms: Randoms, stream: int, bound: np.ndarray, count: np.ndarray,
                              draws: int) -> np.ndarray:
    while True:
        values = randoms.integers(stream, draws, bound)
        taken, enough = _first_of_each(values, count)
        if enough.all():
            return values[taken]
        draws *= 2


def _first_of_each(values: np.ndarray, count: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Flags of the first ``count[r]`` distinct values of each row of ``values`` (first draws
    only), and whether each row has that many."""
    rows, draws = values.shape
    # Sort each row by (value, position): the first of each run of equal values is that value's
    # first draw. Flag first draws by position, then keep the first ``count`` of them.
    order = values * draws
    order += np.arange(draws)
    order.sort(axis=1)
    by_value = order // draws
    first = np.empty(order.shape, dtype=bool)
    first[:, 0] = True
    np.not_equal(by_value[:, 1:], by_value[:, :-1], out=first[:, 1:])
    order -= by_value * draws  # the positions, in value order
    flags = np.zeros(values.shape, dtype=bool)
    flags[np.arange(rows)[:, None], order] = first
    rank = flags.cumsum(axis=1, dtype=np.int32)
    if np.ndim(count) == 0:
        return flags & (rank <= count), rank[:, -1] >= count
    return flags & (rank <= count[:, None]), rank[:, -1] >= count


def random_order(randoms: Randoms, stream: int, size: int) -> np.ndarray:
    """``(rows, size)`` int64: a uniformly random permutation of ``range(size)`` per row.

    Sort keys are the stream's words with the low bits replaced by the position, so no two
    keys tie (ties among the top bits, about one row in 2**40, go by position).
    """
    if size <= 1:
        return np.zeros((len(randoms), size), dtype=np.int64)
    bits = max(1, (size - 1).bit_length())
    keys = randoms.words(stream, size)
    keys >>= np.uint64(bits)
    keys <<= np.uint64(bits)
    keys |= np.arange(size, dtype=np.uint64)
    keys.sort(axis=1)
    keys &= np.uint64((1 << bits) - 1)
    return keys.astype(np.int64)


def _by_order(randoms: Randoms, stream: int, bound: np.ndarray, count: np.ndarray) -> np.ndarray:
    """First ``count`` values of a random permutation of ``[0, bound)`` per row, rows end to end."""
    size = int(bound.max())
    order = random_order(randoms, stream, size)
    # A permutation of [0, size) without the values >= bound is a random permutation of [0, bound).
    valid = order < bound[:, None]
    take = valid & (valid.cumsum(axis=1) <= count[:, None])
    return order[take]


def compositions(randoms: Randoms, stream: int, total: int, parts: int) -> np.ndarray:
    """``(rows, parts)`` int64: a uniformly random composition of ``total`` into ``parts``
    positive parts per row (every composition equally likely), from ``parts - 1`` distinct cut
    points among the ``total - 1`` gaps (or the complement of that many, when they are most).

    Raises:
        ValueError: ``parts`` not in ``[1, total]``.
    """
    if not 1 <= parts <= total:
        raise ValueError(f"a composition of {total} into {parts} positive parts does not exist")
    rows = len(randoms)
    cuts_wanted = parts - 1
    if cuts_wanted == 0:
        return np.full((rows, 1), total, dtype=np.int64)
    gaps = total - 1
    complement = 2 * cuts_wanted > gaps
    drawn = gaps - cuts_wanted if complement else cuts_wanted
    values, _ = first_distinct(randoms, stream, gaps, drawn)
    if complement:  # the gaps not drawn
        chosen = np.ones((rows, gaps), dtype=bool)
        chosen[np.repeat(np.arange(rows), drawn), values] = False
        cuts = np.flatnonzero(chosen.reshape(-1)).reshape(rows, cuts_wanted) % gaps
    else:
        cuts = values.reshape(rows, cuts_wanted)
        cuts.sort(axis=1)
    bounds = np.empty((rows, parts + 1), dtype=np.int64)  # gap g cuts after token g
    bounds[:, 0] = 0
    bounds[:, 1:-1] = cuts + 1
    bounds[:, -1] = total
    return np.diff(bounds, axis=1)


def random_ids(randoms: Randoms, stream: int, counts: np.ndarray, special: SpecialIds) -> np.ndarray:
    """``counts[r]`` uniform random non-special ids for each row ``r``, rows end to end (int32).

    Raises:
        ValueError: every id of the vocabulary is special.
    """
    counts = np.asarray(counts, dtype=np.int64)
    most = int(counts.max(initial=0))
    if most == 0:
        return np.zeros(0, dtype=np.int32)
    n_free = special.non_special_ranks()[0]
    if n_free <= 0:
        raise ValueError(f"no non-special id in a vocabulary of {special.vocab_size} ids")
    rows = np.flatnonzero(counts)
    ranks = randoms.rows(rows).integers(stream, most, n_free)
    return special.ids_of_ranks(ranks[np.arange(most) < counts[rows, None]])
