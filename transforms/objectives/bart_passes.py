"""The array work of BART's noise passes (:mod:`transforms.objectives.bart`), over a block's
rows laid end to end: span lengths, word pools, span merging, deletion and insertion, sentence
permutation, framing.

Internals of :class:`~transforms.objectives.bart.Bart` (the names stay private to the two
modules), apart from :func:`poisson_span_cdf`, :func:`span_lengths` and
:func:`sentence_permutation`, which inspection and the tests use. Every row ends with ``</s>``,
a barrier no span passes, so positions can be global and every pass is array work over the
block, with no Python loop per row. The random streams of every draw are listed here, in one
place, so that no two draws share one.
"""

from __future__ import annotations

import functools
import math
from typing import TYPE_CHECKING, NamedTuple

import numpy as np

from transforms.objectives.common import SpecialIds, index_range
from transforms.objectives.randoms import Randoms, first_distinct, random_ids

if TYPE_CHECKING:
    from transforms.objectives.bart import BartConfig

__all__ = ["poisson_span_cdf", "sentence_permutation", "span_lengths"]

# Streams of the row keys (transforms/objectives/randoms.py), one per kind of draw.
SENTENCE_STREAM, CHOSEN_SENTENCE_STREAM = 1, 2
LENGTH_STREAM, START_STREAM, SPAN_RANDOM_STREAM, SPAN_IDS_STREAM = 3, 4, 5, 6
ZERO_INSERT_STREAM, ZERO_RANDOM_STREAM, ZERO_IDS_STREAM = 7, 8, 9
TOKEN_MASK_STREAMS, TOKEN_DELETE_STREAMS = (10, 11, 12), (13, 14, 15)  # starts, random flags, ids
INSERT_STREAM, INSERT_RANDOM_STREAM, INSERT_IDS_STREAM = 16, 17, 18
ROTATE_STREAM = 19

def _ceil_all(values: np.ndarray) -> np.ndarray:
    """``ceil(round(value, 9))`` of each value (int64)."""
    return np.ceil(np.round(np.asarray(values, dtype=np.float64), 9)).astype(np.int64)


def _ceil(value: float) -> int:
    """``ceil(round(value, 9))``; Python's ``round`` to 9 digits moves a value by at most
    5e-10, so it can only change the ceiling within 1e-9 of an integer: skip it elsewhere."""
    ceiling = math.ceil(value)
    if ceiling == value or (ceiling - value > 1e-9 and value - (ceiling - 1) > 1e-9):
        return ceiling
    return math.ceil(round(value, 9))

@functools.lru_cache(maxsize=16)
def poisson_span_cdf(poisson_lambda: float) -> np.ndarray:
    """CDF of fairseq's span-length categorical: Poisson pmf for k = 0, 1, ... up to and
    including the first k with p_k < 1e-7 (at most 128 values), renormalised."""
    pmf = []
    term = math.exp(-poisson_lambda)
    for k in range(128):
        pmf.append(term)
        if term < 1e-7:
            break
        term *= poisson_lambda / (k + 1)
    cdf = np.cumsum(pmf) / sum(pmf)
    cdf.setflags(write=False)
    return cdf


class _Words(NamedTuple):
    """Where spans may start and where they must stop, for one masking pass.

    Attributes:
        pool: positions of the maskable word starts (a word start that is no barrier), ascending.
        per_row: how many each row has.
        barriers: positions of the barriers, ascending (every row ends with one: ``</s>``).
        before: for each barrier, how many pool positions come before it.
    """

    pool: np.ndarray
    per_row: np.ndarray
    barriers: np.ndarray
    before: np.ndarray


def _span_ends(words: _Words, index: np.ndarray, lengths: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """End (exclusive) of each span of ``lengths`` words from the pool's ``index``-th word start,
    stopped at the next barrier, and how many pool positions come before that end.

    fairseq walks token by token, counting word starts, with a huge count on ``</s>``. Here: the
    span ends at the ``length``-th maskable word start after its own, unless a barrier comes
    first; as no barrier lies between the two in that case, that word start is
    ``pool[index + length]``.
    """
    following = words.barriers.searchsorted(words.pool[index], side="right")  # the next barrier
    limit = words.before[following]  # the pool positions before it
    reach = index + lengths
    inside = reach < limit
    ends = words.barriers[following]
    ends[inside] = words.pool[reach[inside]]
    return ends, np.minimum(reach, limit)


def _gather_index(starts: np.ndarray, ordering: np.ndarray, total: int) -> np.ndarray:
    """Gather index that lays out the sentences starting at ``starts`` (ascending, the first at
    0, together filling ``[0, total)``) in the order ``ordering``."""
    lengths = np.empty_like(starts)
    lengths[:-1] = starts[1:]
    lengths[-1] = total
    lengths -= starts
    lengths = lengths[ordering]
    moved_starts = starts[ordering]
    # token t of the new order comes from start(sentence) + (t - new offset(sentence))
    offsets = lengths.cumsum()
    offsets -= lengths
    moved_starts -= offsets
    index = moved_starts.repeat(lengths)
    index += np.arange(total)
    return index


def span_lengths(randoms: Randoms, budgets: np.ndarray, config: BartConfig) -> tuple[np.ndarray, np.ndarray]:
    """Span lengths in words of each row, zero-length ones included, covering exactly its budget.

    ``span-poisson``: the row's draws ``j = 0, 1, ...`` of :data:`LENGTH_STREAM` through the
    categorical of :func:`poisson_span_cdf`, up to the first that reaches the budget, trimmed to
    it (fairseq's ``add_whole_word_mask``); ``word`` and ``subword``: ``budget`` spans of 1.

    Returns:
        ``(lengths, offsets)``: the rows' lengths end to end (int64) and ``rows + 1`` offsets.
    """
    budgets = np.asarray(budgets, dtype=np.int64)
    rows = budgets.shape[0]
    offsets = np.zeros(rows + 1, dtype=np.int64)
    if config.mask_length != "span-poisson":
        np.cumsum(budgets, out=offsets[1:])
        return np.ones(int(offsets[-1]), dtype=np.int64), offsets
    cdf = poisson_span_cdf(config.poisson_lambda)
    mean = float(np.dot(np.arange(cdf.size), np.diff(cdf, prepend=0.0)))
    most = int(budgets.max(initial=0))
    draws = int(most / mean + 4 * math.sqrt(most / mean + 1) * max(1.0, math.sqrt(config.poisson_lambda) / mean)) + 4
    counts = np.zeros(rows, dtype=np.int64)
    parts: list[tuple[np.ndarray, np.ndarray]] = []  # (rows, their lengths row by row)
    pending = np.flatnonzero(budgets > 0)
    while pending.size:
        lengths = cdf.searchsorted(randoms.rows(pending).uniforms(LENGTH_STREAM, draws), side="right")
        running = np.cumsum(lengths, axis=1)
        wanted = budgets[pending, None]
        reached = running >= wanted
        enough = reached[:, -1]
        done = pending[enough]
        if done.size:
            last = reached[enough].argmax(axis=1)
            kept = np.arange(draws) <= last[:, None]
            trimmed = lengths[enough]
            index = np.arange(done.size)
            trimmed[index, last] = wanted[enough, 0] - (running[enough][index, last] - trimmed[index, last])
            counts[done] = last + 1
            parts.append((done, trimmed[kept]))
        pending = pending[~enough]
        draws *= 2
    np.cumsum(counts, out=offsets[1:])
    values = np.empty(int(offsets[-1]), dtype=np.int64)
    for done, part in parts:
        slots = np.repeat(offsets[done] - _exclusive(counts[done]), counts[done]) + np.arange(part.shape[0])
        values[slots] = part
    return values, offsets


class _Source:
    """The rows being noised, end to end, with per-token flags kept aligned through the passes.

    Attributes:
        ids: int32 token ids, each row ``<s> ... </s>``.
        word_start: a word (or, without words, a token) starts here.
        barrier: framing, special or already-noised token: never masked, ends spans.
        offsets: ``rows + 1`` int64 offsets of the rows.
        flags: whether a later pass reads ``word_start`` and ``barrier`` (else they go stale).
    """

    def __init__(self, ids: np.ndarray, word_start: np.ndarray, barrier: np.ndarray, offsets: np.ndarray,
                 flags: bool):
        self.ids, self.word_start, self.barrier, self.offsets, self.flags = ids, word_start, barrier, offsets, flags

    @property
    def count(self) -> int:
        return int(self.offsets.shape[0] - 1)

    @property
    def sizes(self) -> np.ndarray:
        return np.diff(self.offsets)

    def rows_of(self, positions: np.ndarray) -> np.ndarray:
        """The row of each position (int64)."""
        return self.offsets.searchsorted(positions, side="right") - 1

    def words(self) -> _Words:
        """The maskable word starts and the barriers, as they are now."""
        pool = np.flatnonzero(self.word_start > self.barrier)  # word_start & ~barrier
        barriers = np.flatnonzero(self.barrier)
        return _Words(pool, np.diff(pool.searchsorted(self.offsets)), barriers, pool.searchsorted(barriers))

    def delete(self, starts: np.ndarray, ends: np.ndarray) -> None:
        """Delete the tokens of the ranges ``[starts[i], ends[i])`` (ascending, disjoint, each
        inside one row; empty ranges allowed)."""
        wanted = ends > starts
        starts, ends = starts[wanted], ends[wanted]
        if not starts.shape[0]:
            return
        lengths = ends - starts
        deleted = np.repeat(starts - _exclusive(lengths), lengths)
        deleted += index_range(deleted.shape[0])
        keep = np.ones(self.ids.shape[0], dtype=bool)
        keep[deleted] = False
        removed = np.bincount(self.rows_of(starts), weights=lengths, minlength=self.count)
        self.ids = self.ids[keep]
        if self.flags:
            self.word_start, self.barrier = self.word_start[keep], self.barrier[keep]
        sizes = self.sizes - removed.astype(np.int64)
        self.offsets = np.zeros(self.count + 1, dtype=np.int64)
        np.cumsum(sizes, out=self.offsets[1:])

    def insert(self, counts: np.ndarray, local: np.ndarray, values: np.ndarray) -> None:
        """Insert ``counts[r]`` tokens into row ``r`` at positions ``local`` (ascending positions of
        the grown row, rows in order) holding ``values``; they are barriers and word starts."""
        offsets = np.zeros(self.count + 1, dtype=np.int64)
        np.cumsum(self.sizes + counts, out=offsets[1:])
        at = local + np.repeat(offsets[:-1], counts)
        old = np.ones(int(offsets[-1]), dtype=bool)
        old[at] = False
        names = ("ids", "word_start", "barrier") if self.flags else ("ids",)
        for name, fill in zip(names, (values, True, True)):
            current = getattr(self, name)
            out = np.empty(old.shape[0], dtype=current.dtype)
            out[old] = current
            out[at] = fill
            setattr(self, name, out)
        self.offsets = offsets


def _starts_in_pool(randoms: Randoms, stream: int, words: _Words, wanted: np.ndarray) -> np.ndarray:
    """``wanted[r]`` distinct maskable word starts of each row in a uniformly random order
    (fairseq's ``randperm`` of the word starts), rows end to end, as indices into the pool."""
    chosen, _ = first_distinct(randoms, stream, words.per_row, wanted)
    return chosen + np.repeat(_exclusive(words.per_row), wanted)


def _noise_spans(source: _Source, words: _Words, index: np.ndarray, lengths: np.ndarray,
                 is_random: np.ndarray, replace_length: int, random_values: tuple[np.ndarray, np.ndarray],
                 mask: int) -> dict[str, int]:
    """Mask, replace or delete word spans of ``lengths`` (all > 0) from the word starts
    ``words.pool[index]`` (rows in order), as fairseq's ``add_whole_word_mask`` does after its draws.

    ``random_values`` = ``(values, offsets)``: each row's random ids, used in order by the
    row's random positions (replace 1: the random spans' starts in drawing order; -1: the
    positions, in order, whose earliest-started covering span is random).

    Returns the counters ``masked_words``, ``masked_tokens`` and ``random_tokens``.
    """
    # Overlapping spans merge: in start order, a span that starts before the furthest end so far
    # joins the current run. Runs never cross rows (a row's spans end at its </s> at the latest).
    starts = words.pool[index]
    order = index.argsort(kind="stable")
    sorted_index = index[order]
    sorted_starts = words.pool[sorted_index]
    furthest, furthest_index = _span_ends(words, sorted_index, lengths[order])
    np.maximum.accumulate(furthest, out=furthest)
    np.maximum.accumulate(furthest_index, out=furthest_index)
    opens = np.ones(order.shape[0], dtype=bool)
    np.greater_equal(sorted_starts[1:], furthest[:-1], out=opens[1:])
    run_starts = sorted_starts[opens]
    last = np.r_[np.flatnonzero(opens)[1:] - 1, order.shape[0] - 1] if order.size else order
    run_ends = furthest[last]
    # Covered positions are never barriers: the covered word starts are the pool's, counted by index.
    counters = {"masked_words": int((furthest_index[last] - sorted_index[opens]).sum()),
                "masked_tokens": int((run_ends - run_starts).sum()), "random_tokens": 0}
    if replace_length == 0:
        source.delete(run_starts, run_ends)
        return counters
    if replace_length == 1:
        # Each run becomes one mask, at its first span's start: the starts inside a run go with it.
        replaced, random_positions = starts, starts[is_random]
        counters["random_tokens"] = int(np.count_nonzero(is_random[order][opens]))
    else:
        # Every covered token becomes a mask. Where spans overlap, fairseq's token-by-token walk
        # lets the span that started first write last, so its random flag decides the token: the
        # earliest-started span covering i is the first, in start order, whose end passes i.
        run_lengths = run_ends - run_starts
        replaced = np.repeat(run_starts - _exclusive(run_lengths), run_lengths) + index_range(int(run_lengths.sum()))
        winner = furthest.searchsorted(replaced, side="right")
        random_positions = replaced[is_random[order][winner]]
        counters["random_tokens"] = int(random_positions.shape[0])
    source.ids[replaced] = mask
    if random_positions.shape[0]:  # positions come grouped by row, rows in order
        rows = source.rows_of(random_positions)
        first = np.searchsorted(rows, rows)  # first random position of each one's row
        values, value_offsets = random_values
        source.ids[random_positions] = values[value_offsets[rows] + np.arange(rows.shape[0]) - first]
    if source.flags:
        source.barrier[replaced] = True
    if replace_length == 1:
        source.delete(run_starts + 1, run_ends)
    return counters


def _insert(source: _Source, randoms: Randoms, counts: np.ndarray, streams: tuple[int, int, int],
            mask_random: float, special: SpecialIds) -> tuple[int, int]:
    """Insert ``counts[r]`` masks into row ``r`` at distinct uniform interior positions, each a
    random id with probability ``mask_random``; return ``(inserted, random)``."""
    total = int(counts.sum())
    if not total:
        return 0, 0
    position_stream, random_stream, ids_stream = streams
    rows = np.flatnonzero(counts)
    sub = randoms.rows(rows)
    local, _ = first_distinct(sub, position_stream, source.sizes[rows] + counts[rows] - 2, counts[rows])
    local += 1  # interior: never before <s> or after </s>
    most = int(counts.max())
    flags = sub.uniforms(random_stream, most) < mask_random
    flags = flags[np.arange(most) < counts[rows, None]]
    values = np.full(total, special.mask, dtype=np.int32)
    row_of = np.repeat(rows, counts[rows])
    if flags.any():
        values[flags] = random_ids(randoms, ids_stream, np.bincount(row_of[flags], minlength=source.count), special)
    order = np.lexsort((local, row_of))  # positions ascending within each row; values follow them
    source.insert(counts, local[order], values[order])
    return total, int(np.count_nonzero(flags))


def _framed(values: np.ndarray, lengths: np.ndarray, first, last, dtype) -> tuple[np.ndarray, np.ndarray]:
    """Rows of ``values`` (end to end, ``lengths`` each) framed by ``first`` and ``last``, end to
    end, and the framed rows' offsets."""
    count = lengths.shape[0]
    offsets = np.zeros(count + 1, dtype=np.int64)
    np.cumsum(lengths + 2, out=offsets[1:])
    out = np.empty(int(offsets[-1]), dtype=dtype)
    if count and (lengths == lengths[0]).all():  # one length: a 2-D view
        rows = out.reshape(count, -1)
        rows[:, 0], rows[:, -1] = first, last
        rows[:, 1:-1] = values.reshape(count, -1)
        return out, offsets
    out[offsets[:-1]], out[offsets[1:] - 1] = first, last
    out[index_range(values.shape[0]) + np.repeat(2 * np.arange(count) + 1, lengths)] = values
    return out, offsets

def _sentence_ordering(randoms: Randoms, sentences: np.ndarray, permute_sentences: float) -> np.ndarray:
    """Gather order of all the rows' sentences (end to end): ``ceil(n * p)`` of each row's
    ``n`` chosen by a random order and re-ordered by another (p = 1: one random order)."""
    base = np.repeat(_exclusive(sentences), sentences)
    order, _ = first_distinct(randoms, SENTENCE_STREAM, sentences, sentences)  # a permutation per row
    if permute_sentences >= 1:
        return order + base
    chosen_count = _ceil_all(sentences * permute_sentences)
    rank = np.arange(order.shape[0]) - base
    chosen = rank < np.repeat(chosen_count, sentences)  # the first ceil(n * p) of the order
    shuffled, _ = first_distinct(randoms, CHOSEN_SENTENCE_STREAM, chosen_count, chosen_count)
    ordering = np.arange(order.shape[0])
    picked = order[chosen] + base[chosen]
    ordering[picked] = picked[shuffled + np.repeat(_exclusive(chosen_count), chosen_count)]
    return ordering


def sentence_permutation(size: int, sentence_starts: np.ndarray | None, permute_sentences: float,
                         randoms: Randoms) -> np.ndarray | None:
    """The gather index sentence permutation applies to one chunk of ``size`` tokens (None: it
    stays as it is), drawn as :meth:`Bart.build` draws it for the row of ``randoms`` (one row:
    :func:`transforms.objectives.layout.example_randoms`). Inspection replays it to show how
    sentences moved."""
    if permute_sentences <= 0 or size == 0:
        return None
    flags = np.zeros(size, dtype=bool) if sentence_starts is None else np.asarray(sentence_starts, dtype=bool).copy()
    flags[0] = True
    starts = np.flatnonzero(flags)
    if starts.shape[0] < 2:
        return None
    ordering = _sentence_ordering(randoms, np.array([starts.shape[0]]), permute_sentences)
    return _gather_index(starts, ordering, size)


def _exclusive(values: np.ndarray) -> np.ndarray:
    out = np.zeros(values.shape[0], dtype=np.int64)
    np.cumsum(values[:-1], out=out[1:])
    return out
