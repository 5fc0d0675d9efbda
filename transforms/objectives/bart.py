"""BART denoising, after fairseq's ``DenoisingDataset`` with the BART-large recipe as defaults.

Reference: facebookresearch/fairseq ``fairseq/data/denoising_dataset.py`` and the BART-large
command of fairseq issue #1899 (``--mask 0.3 --mask-length span-poisson --poisson-lambda 3.5
--replace-length 1 --mask-random 0.1 --permute-sentences 1 --rotate 0 --insert 0``); see
shared/reference/bart_mlm_megatron.md section 1. ``targets`` is the original framed chunk
``<s> chunk </s>``; ``inputs`` is the same after these steps, in fairseq's order:

1. Sentence permutation (``permute_sentences`` = p): ``ceil(n * p)`` of the ``n`` sentences
   are re-ordered among themselves. Sentences start at ``sentence_starts`` (and at token 0).
2. Masking (``mask`` = share of *words*): budget ``ceil(#words * mask)``; span lengths in
   words ~ Poisson(``poisson_lambda``) (categorical cut where p_k < 1e-7), drawn until they
   cover the budget, the last one trimmed to fit; zero-length spans are set aside as
   insertions. Span starts are distinct word starts drawn uniformly; a span covers whole
   words and never runs through ``</s>``; spans may overlap. ``replace_length``: 1 = a span
   becomes one ``<mask>`` (text infilling), 0 = it is deleted, -1 = each of its tokens
   becomes ``<mask>``. ``mask_length`` "word"/"subword" use one-word/one-token spans. A
   span's mask is a random token with probability ``mask_random``. The zero-length spans
   then insert that many ``<mask>`` at uniform interior positions.
3. Token masking (``token_mask``) and token deletion (``token_delete``): the paper's other
   two noises as their own passes (not in fairseq, where one ``mask`` pass does either),
   each over ``ceil(#words * p)`` single words (single tokens when ``mask_length="subword"``)
   not yet noised, like fairseq's ``replace_length`` -1 (with ``mask_random``) and 0.
4. Random insertion (``insert``): ``ceil(len * insert)`` tokens at uniform interior positions.
5. Document rotation (probability ``rotate``): the interior is rotated by an offset in
   [1, len - 1]; ``<s>`` and ``</s>`` stay in place.

Words come from ``word_starts`` (the pre-tokenizer's word starts, where fairseq decodes
GPT-2 pieces); without it every token is a word, like fairseq's ``mask_length=subword``.
As in fairseq, a chunk that begins inside a word leaves that word piece unmaskable.

Deliberate differences from fairseq:

- Sentence boundaries come from the ``sentence_starts`` feature (a text rule of the
  pipeline), not from the GPT-2 id of "." (which is a no-op for other BPEs, fairseq #3803).
- Special tokens inside a chunk (e.g. EOS between packed documents) and tokens already
  noised by an earlier pass are never masked, and spans stop at them.
- Random tokens are uniform over non-special ids (fairseq: any id in [1, |V|), specials
  included). Each inserted token is random with probability ``mask_random`` (fairseq makes
  exactly ``ceil(n * mask_random)`` random, which turns the usual single zero-length-span
  insertion into a random token nearly always).
- Zero-length-span insertions are capped so that ``inputs`` never exceeds ``seq_len``
  (counted in ``inserts_dropped``); with ``insert > 0`` inputs can reach
  ``seq_len + ceil(seq_len * insert)`` (fairseq issue #2297). Budgets use ``ceil`` on the
  product rounded to 9 decimals (``ceil(10 * 0.3)`` is 3, not 4).
- Randomness comes only from the given ``rng`` (fairseq mixes torch's global RNG with
  ``hash(seed, epoch, index) % 1e6``), so examples are a pure function of the example key.

The pipeline builds full chunks in blocks (:func:`bart_many`, for the passes of the BART-large
recipe): each row draws from its own generator exactly as :func:`bart_with_stats` does, and
the array work runs once per block instead of once per example, which costs about a third
less per example.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from transforms.objectives.base import BuiltRows
from transforms.objectives.common import SpecialIds, generator_of, ids_out_of_range, index_range
from transforms.objectives.mlm import STATS_KEY, draw_non_special, draw_ranks, ids_of_ranks
from transforms.objectives.packing import Piece

__all__ = [
    "MASK_LENGTHS",
    "Bart",
    "BartConfig",
    "bart",
    "bart_many",
    "bart_with_stats",
    "many_supported",
    "poisson_span_cdf",
    "sentence_permutation",
]

MASK_LENGTHS = ("span-poisson", "word", "subword")


def _ceil(value: float) -> int:
    """``ceil(round(value, 9))``; Python's ``round`` to 9 digits moves a value by at most
    5e-10, so it can only change the ceiling within 1e-9 of an integer: skip it elsewhere."""
    ceiling = math.ceil(value)
    if ceiling == value or (ceiling - value > 1e-9 and value - (ceiling - 1) > 1e-9):
        return ceiling
    return math.ceil(round(value, 9))


@dataclass(frozen=True)
class BartConfig:
    """Parameters of BART denoising (fairseq names; BART-large values).

    Attributes:
        seq_len: length of ``targets`` for a full chunk (``<s>`` and ``</s>`` included).
        mask: share of words masked by the span/word masking pass.
        mask_random: probability that a mask (span or inserted token) is a random token.
        insert: random insertion, as a share of the current length.
        rotate: probability of document rotation.
        permute_sentences: share of sentences permuted.
        replace_length: -1 (mask every token), 0 (delete) or 1 (one mask per span).
        mask_length: ``span-poisson``, ``word`` or ``subword``.
        poisson_lambda: mean span length in words for ``span-poisson``.
        token_mask: share of words whose tokens all become masks (own pass, off by default).
        token_delete: share of words deleted (own pass, off by default).
    """

    seq_len: int = 512
    mask: float = 0.3
    mask_random: float = 0.1
    insert: float = 0.0
    rotate: float = 0.0
    permute_sentences: float = 1.0
    replace_length: int = 1
    mask_length: str = "span-poisson"
    poisson_lambda: float = 3.5
    token_mask: float = 0.0
    token_delete: float = 0.0

    def __post_init__(self) -> None:
        if not isinstance(self.seq_len, int) or self.seq_len < 3:
            raise ValueError(f"seq_len must be an int >= 3, got {self.seq_len!r}")
        for name in ("mask", "mask_random", "insert", "rotate", "permute_sentences", "token_mask", "token_delete"):
            value = getattr(self, name)
            if not 0.0 <= value <= 1.0:
                raise ValueError(f"{name} must be in [0, 1], got {value!r}")
        if self.replace_length not in (-1, 0, 1):
            raise ValueError(f"replace_length must be -1, 0 or 1, got {self.replace_length!r}")
        if self.mask_length not in MASK_LENGTHS:
            raise ValueError(f"mask_length must be one of {MASK_LENGTHS}, got {self.mask_length!r}")
        if self.mask_length == "subword" and self.replace_length == -1:
            raise ValueError("mask_length='subword' needs replace_length 0 or 1 (as fairseq), got -1")
        if self.mask_length == "span-poisson" and not 0.0 < self.poisson_lambda <= 64.0:
            raise ValueError(f"poisson_lambda must be in (0, 64], got {self.poisson_lambda!r}")

    @property
    def raw_length(self) -> int:
        """Raw chunk length the packer cuts: ``seq_len - 2`` (room for ``<s>`` and ``</s>``)."""
        return self.seq_len - 2

    @property
    def max_inputs_length(self) -> int:
        """Upper bound of ``len(inputs)``: ``seq_len`` plus the random insertions."""
        return self.seq_len + _ceil(self.seq_len * self.insert)


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


@dataclass
class _Noisy:
    """The source being noised, with per-token flags kept aligned through every pass."""

    ids: np.ndarray  # int32 token ids, <s> ... </s>
    word_start: np.ndarray  # bool: a word (or, without word starts, a token) starts here
    barrier: np.ndarray  # bool: framing, special or already-noised token: never masked, ends spans
    flags: bool = True  # False once no later pass reads the flags: they are no longer kept aligned

    def take(self, keep: np.ndarray) -> None:
        self.ids = self.ids[keep]
        if self.flags:
            self.word_start, self.barrier = self.word_start[keep], self.barrier[keep]


def _sentence_order(
    size: int, sentence_starts: np.ndarray | None, p: float, rng: np.random.Generator, counters: dict[str, int]
) -> np.ndarray | None:
    """Gather index that re-orders ``ceil(n * p)`` of the ``n`` sentences (fairseq
    ``permute_sentences``); None when there are fewer than two sentences (no draw)."""
    if sentence_starts is None or size == 0:
        counters["sentences"] = int(size > 0)  # the chunk is one sentence (none when empty)
        return None
    starts = sentence_starts.nonzero()[0]
    if not sentence_starts[0]:  # a sentence always starts at token 0
        starts = np.concatenate([np.zeros(1, dtype=starts.dtype), starts])
    n = starts.size
    counters["sentences"] = int(n)
    if n < 2:
        return None
    k = _ceil(n * p)
    chosen = rng.permutation(n)[:k]
    identity = index_range(n)
    ordering = identity.copy()
    ordering[chosen] = chosen[rng.permutation(k)]
    counters["permuted_sentences"] = int(np.count_nonzero(ordering != identity))
    return _gather_index(starts, ordering, size)


def sentence_permutation(
    size: int, sentence_starts: np.ndarray | None, permute_sentences: float, rng: np.random.Generator
) -> np.ndarray | None:
    """The gather index sentence permutation applies to a chunk of ``size`` tokens (None: it
    stays as it is), drawn from ``rng`` exactly as the first step of :func:`bart_with_stats`
    and :func:`bart_many` draw it. Inspection replays it to show how sentences moved."""
    if permute_sentences <= 0:
        return None
    flags = None if sentence_starts is None else np.asarray(sentence_starts, dtype=bool)
    return _sentence_order(size, flags, permute_sentences, generator_of(rng), {})


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
    index += index_range(total)
    return index


def _permute_sentences(
    tokens: np.ndarray,
    flags: list[np.ndarray],
    sentence_starts: np.ndarray | None,
    p: float,
    rng: np.random.Generator,
    counters: dict[str, int],
) -> tuple[np.ndarray, list[np.ndarray]]:
    """Re-order ``ceil(n * p)`` of the ``n`` sentences (fairseq ``permute_sentences``)."""
    index = _sentence_order(tokens.size, sentence_starts, p, rng, counters)
    if index is None:
        return tokens, flags
    return tokens[index], [f[index] for f in flags]


def _cover_budget(lengths: np.ndarray, budget: int, cdf: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """``lengths`` and as many more draws as cover ``budget``: fairseq draws ``budget`` lengths
    at a time until they suffice."""
    while np.add.reduce(lengths) < budget:
        lengths = np.concatenate([lengths, cdf.searchsorted(rng.random(budget), side="right")])
    return lengths


def _span_lengths(budget: int, config: BartConfig, rng: np.random.Generator) -> np.ndarray:
    """Span lengths in words covering exactly ``budget`` words (zero-length ones included)."""
    if config.mask_length != "span-poisson":
        return np.ones(budget, dtype=np.int64)
    cdf = poisson_span_cdf(config.poisson_lambda)
    lengths = _cover_budget(cdf.searchsorted(rng.random(budget), side="right"), budget, cdf, rng)
    cum = lengths.cumsum()
    last = int(cum.searchsorted(budget))  # first span reaching the budget
    lengths = lengths[: last + 1].copy()
    lengths[last] = budget - (cum[last - 1] if last else 0)
    return lengths


#: Positions up to which :func:`_span_ends` binary-searches; beyond, running counts cost less.
_SEARCH_LIMIT = 1 << 14


def _block_span_lengths(budgets: list[int], uniforms: list[np.ndarray], rngs: list[np.random.Generator],
                        config: BartConfig) -> list[np.ndarray]:
    """:func:`_span_lengths` of many rows, given each row's first draw ``rng.random(budget)``
    (``span-poisson``; no draw otherwise): the categorical lookup and the trimming run once
    for all rows; a row whose lengths fall short of its budget (rare) draws on as the
    one-row function does."""
    if config.mask_length != "span-poisson":
        return [np.ones(budget, dtype=np.int64) for budget in budgets]
    cdf = poisson_span_cdf(config.poisson_lambda)
    wanted = np.array(budgets, dtype=np.int64)  # each row's first draws number its budget
    lengths = cdf.searchsorted(np.concatenate(uniforms), side="right")
    firsts = _exclusive_cumsum(wanted)
    short = np.flatnonzero(np.add.reduceat(lengths, firsts) < wanted).tolist()
    if short:  # rows that need more draws: per row, as _span_lengths
        rows = np.split(lengths, firsts[1:])
        for index in short:
            rows[index] = _cover_budget(rows[index], budgets[index], cdf, rngs[index])
        lengths = np.concatenate(rows)
        firsts = _exclusive_cumsum(np.array([row.size for row in rows], dtype=np.int64))
    # Trim each row at its first span reaching the budget: with the running sum over all rows,
    # a row's spans reach ``sum before the row + budget`` first at that span.
    running = np.zeros(lengths.size + 1, dtype=np.int64)
    np.cumsum(lengths, out=running[1:])
    reached = running[firsts] + wanted
    last = running[1:].searchsorted(reached)
    lengths[last] = reached - running[last]
    return [lengths[first : end + 1] for first, end in zip(firsts.tolist(), last.tolist())]


def _span_ends(word_start: np.ndarray, barrier: np.ndarray, starts: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """End (exclusive) of each span of ``lengths`` words from ``starts``, stopped at the next barrier.

    fairseq walks token by token, counting word starts, with a huge count on ``</s>``; here
    the end is the ``length``-th word boundary after the start, or the first barrier if
    that comes sooner. The last position (``</s>``) must be a barrier.
    """
    boundary = np.logical_or(word_start, barrier)
    boundaries = boundary.nonzero()[0]
    barriers = np.asarray(barrier).nonzero()[0]
    if boundary.size <= _SEARCH_LIMIT:
        word_end = boundaries.searchsorted(starts)
        following = barriers.searchsorted(starts, side="right")
    else:  # a block of rows: ranks from running counts beat scattered binary searches in large arrays
        word_end = np.cumsum(boundary, dtype=np.int32)[starts].astype(np.int64)
        word_end -= 1  # each start's index among the boundaries (a start is a word start)
        following = np.cumsum(barrier, dtype=np.int32)[starts]  # barriers before it (a start is not one)
    word_end += lengths
    np.minimum(word_end, boundaries.size - 1, out=word_end)
    return np.minimum(boundaries[word_end], barriers[following])


def _mask_spans(
    src: _Noisy,
    lengths: np.ndarray,
    replace_length: int,
    config: BartConfig,
    special: SpecialIds,
    rng: np.random.Generator,
    counters: dict[str, int],
    pool: np.ndarray | None = None,
) -> None:
    """Mask, replace or delete ``lengths.size`` word spans (all > 0) at random word starts.

    ``pool``, when given, is ``flatnonzero(src.word_start & ~src.barrier)`` (the caller has it).
    """
    if pool is None:
        pool = np.greater(src.word_start, src.barrier).nonzero()[0]  # word_start & ~barrier
    m = lengths.size
    starts = rng.choice(pool, size=m, replace=False) if m else pool[:0]
    is_random = rng.random(m) < config.mask_random
    ends = _span_ends(src.word_start, src.barrier, starts, lengths)
    size = src.ids.size
    positions = index_range(size)
    # reach[i]: furthest end of the spans started at or before i; i is covered when reach[i] > i.
    reach = np.zeros(size, dtype=np.int64)
    reach[starts] = ends
    np.maximum.accumulate(reach, out=reach)
    covered = reach > positions
    counters["masked_words"] = counters.get("masked_words", 0) + int(np.count_nonzero(covered & src.word_start))
    counters["masked_tokens"] = counters.get("masked_tokens", 0) + int(np.count_nonzero(covered))
    if replace_length == 0:
        src.take(~covered)
        return
    keep = None
    if replace_length == 1:
        # A start inside another span's tail is deleted with it: overlapping spans merge into one mask.
        replaced, random_positions = starts, starts[is_random]
        keep = np.empty(size, dtype=bool)  # delete what a span covers after its first token
        keep[0] = True
        np.less_equal(reach[:-1], positions[1:], out=keep[1:])
    else:
        replaced = covered
        # Where spans overlap, fairseq's token-by-token walk lets the span that started
        # first write last, so its random flag decides the token: the earliest-started span
        # covering i is the first, in start order, whose end passes i.
        order = starts.argsort()
        furthest = np.maximum.accumulate(ends[order])
        covered_positions = covered.nonzero()[0]
        winner = furthest.searchsorted(covered_positions, side="right")
        random_positions = covered_positions[is_random[order][winner]]
    src.ids[replaced] = special.mask
    src.ids[random_positions] = draw_non_special(rng, special, random_positions.size)  # draws nothing for none
    if src.flags:
        src.barrier[replaced] = True
    if keep is None:  # nothing deleted
        counters["random_tokens"] += int(random_positions.size)
        return
    if random_positions.size:
        counters["random_tokens"] += int(np.count_nonzero(keep[random_positions]))
    src.take(keep)


def _insert_positions(rng: np.random.Generator, size: int, n: int) -> np.ndarray:
    """``n`` distinct interior positions (in ``[1, size - 2]``) of a row that grows to ``size``."""
    if n == 1 and type(rng) is np.random.Generator:
        # choice(m, size=1, replace=False) is one bounded draw, the same as integers(0, m)
        return np.array([int(rng.integers(0, size - 2)) + 1], dtype=np.int64)
    return rng.choice(size - 2, size=n, replace=False) + 1


def _insert(
    src: _Noisy, n: int, config: BartConfig, special: SpecialIds, rng: np.random.Generator, counters: dict[str, int]
) -> None:
    """Insert ``n`` masks (random tokens with probability ``mask_random``) at interior positions."""
    if n <= 0:
        return
    size = src.ids.size + n
    positions = _insert_positions(rng, size, n)
    is_random = rng.random(n) < config.mask_random
    old = np.empty(size, dtype=bool)
    old.fill(True)
    old[positions] = False
    ids = np.empty(size, dtype=np.int32)
    ids[old] = src.ids
    ids[positions] = special.mask
    random_count = int(np.count_nonzero(is_random))
    ids[positions[is_random]] = draw_non_special(rng, special, random_count)  # draws nothing for none
    src.ids = ids
    if src.flags:
        word_start, barrier = np.ones(size, dtype=bool), np.ones(size, dtype=bool)
        word_start[old], barrier[old] = src.word_start, src.barrier
        src.word_start, src.barrier = word_start, barrier
    counters["inserted"] += n
    counters["random_tokens"] += random_count


_COUNTERS = (
    "examples",
    "sentences",
    "permuted_sentences",
    "words",
    "mask_budget",
    "masked_spans",
    "zero_length_spans",
    "masked_words",
    "masked_tokens",
    "random_tokens",
    "inserted",
    "inserts_dropped",
    "rotated",
)


def _checked_tokens(
    tokens: np.ndarray,
    config: BartConfig,
    special: SpecialIds,
    word_starts: np.ndarray | None,
    sentence_starts: np.ndarray | None,
) -> np.ndarray:
    """The chunk (any integer dtype) after checking the special ids, its length, ids and features."""
    if special.bos is None or special.mask is None:
        raise ValueError(f"bart needs bos and mask ids, got bos={special.bos} mask={special.mask}")
    tokens = np.asarray(tokens)
    if tokens.ndim != 1 or tokens.dtype.kind not in "iu":
        raise ValueError(f"tokens must be a 1-D integer array, got shape {tokens.shape} dtype {tokens.dtype}")
    if tokens.size > config.raw_length:
        raise ValueError(f"chunk of {tokens.size} tokens exceeds the raw length {config.raw_length}")
    if tokens.size and ids_out_of_range(tokens, special.vocab_size):
        raise ValueError(f"token ids must be in [0, {special.vocab_size}), got [{tokens.min()}, {tokens.max()}]")
    for name, value in (("word_starts", word_starts), ("sentence_starts", sentence_starts)):
        if value is not None and np.shape(value) != tokens.shape:
            raise ValueError(f"{name} must have the shape of tokens {tokens.shape}, got {np.shape(value)}")
    return tokens


_HISTOGRAM_NAMES = tuple(f"span_len_hist_{k}" for k in range(129))


def _count_spans(counters: dict[str, int], lengths: np.ndarray) -> int:
    """Set the span counters of applied span lengths (in words, zero-length ones included):
    ``mask_budget`` (their sum), ``span_len_hist_<k>``, ``masked_spans`` and
    ``zero_length_spans``; return the number of zero-length spans."""
    histogram = np.bincount(lengths).tolist()
    for k, count in enumerate(histogram):
        if count:
            counters[_HISTOGRAM_NAMES[k] if k < len(_HISTOGRAM_NAMES) else f"span_len_hist_{k}"] = count
    zero = histogram[0] if histogram else 0
    counters["mask_budget"] = int(lengths.sum())
    counters["masked_spans"], counters["zero_length_spans"] = int(lengths.size - zero), zero
    return zero


def bart_with_stats(
    tokens: np.ndarray,
    rng: np.random.Generator,
    config: BartConfig,
    special: SpecialIds,
    word_starts: np.ndarray | None = None,
    sentence_starts: np.ndarray | None = None,
) -> tuple[dict[str, np.ndarray], dict[str, int]]:
    """:func:`bart` plus exact integer counters of the noise it drew.

    Counters: ``examples``, ``tokens`` and ``source_tokens`` (both len of targets, the
    framed chunk), ``input_tokens``, ``sentences``, ``permuted_sentences`` (sentences that
    moved), ``words`` (maskable words: word starts that are not special tokens),
    ``mask_budget``, ``masked_spans``, ``zero_length_spans``, ``span_len_hist_<k>`` (applied
    span lengths in words, after trimming the last one, zero-length spans as k=0),
    ``masked_words``/``masked_tokens`` (covered by the spans of every masking pass, overlaps
    counted once), ``mask_tokens`` (mask ids in ``inputs``), ``random_tokens``, ``inserted``,
    ``inserts_dropped``, ``deleted`` (tokens removed: targets - inputs + inserted), ``rotated``.
    """
    tokens = _checked_tokens(tokens, config, special, word_starts, sentence_starts)
    rng = generator_of(rng)
    size = tokens.size
    targets = np.empty(size + 2, dtype=np.int32)
    targets[0], targets[-1] = special.bos, special.eos
    targets[1:-1] = tokens
    counters = dict.fromkeys(_COUNTERS, 0)
    counters["examples"] = 1

    # The source being noised: ids framed by <s> ... </s>, and per token whether a word
    # starts there and whether it is a barrier (framing, special, later: already noised).
    whole_words = word_starts is not None and config.mask_length != "subword"
    index = None
    if config.permute_sentences > 0:
        sentence_flags = None if sentence_starts is None else np.asarray(sentence_starts, dtype=bool)
        index = _sentence_order(size, sentence_flags, config.permute_sentences, rng, counters)
    ids = targets.copy()
    if index is not None:
        targets[1:-1].take(index, out=ids[1:-1], mode="clip")  # in range: clip only skips the buffered check
    word_start = np.empty(size + 2, dtype=bool)
    word_start[0] = word_start[-1] = False
    if not whole_words:
        word_start[1:-1] = True
    elif index is None:
        word_start[1:-1] = word_starts
    else:
        word_start[1:-1] = np.asarray(word_starts, dtype=bool)[index]
    barrier = np.empty(size + 2, dtype=bool)
    barrier[0] = barrier[-1] = True
    special.special_flags().take(ids[1:-1], out=barrier[1:-1], mode="clip")  # ids are checked to be in range
    # Only the token masking/deletion passes read the flags after the span pass.
    flags = config.token_mask > 0 or config.token_delete > 0
    src = _Noisy(ids=ids, word_start=word_start, barrier=barrier, flags=flags)
    pool = np.greater(word_start, barrier).nonzero()[0]  # word starts that are not barriers
    words = pool.size
    counters["words"] = words

    if config.mask > 0 and words:
        budget = _ceil(words * config.mask)
        lengths = _span_lengths(budget, config, rng)
        zero = _count_spans(counters, lengths)
        nonzero = lengths[lengths > 0] if zero else lengths
        _mask_spans(src, nonzero, config.replace_length, config, special, rng, counters, pool)
        allowed = max(0, min(zero, config.seq_len - src.ids.size))
        counters["inserts_dropped"] = zero - allowed
        _insert(src, allowed, config, special, rng, counters)
        pool = None
    for share, replace_length in ((config.token_mask, -1), (config.token_delete, 0)):
        if share > 0 and words:
            if pool is None:
                pool = np.greater(src.word_start, src.barrier).nonzero()[0]
            count = min(pool.size, _ceil(words * share))
            _mask_spans(src, np.ones(count, dtype=np.int64), replace_length, config, special, rng, counters, pool)
            pool = None
    if config.insert > 0:
        _insert(src, _ceil(src.ids.size * config.insert), config, special, rng, counters)
    if config.rotate > 0 and rng.random() < config.rotate:
        size = src.ids.size
        offset = int(rng.integers(1, max(1, size - 1) + 1))
        src.ids = np.concatenate([src.ids[:1], src.ids[offset:-1], src.ids[1:offset], src.ids[-1:]])
        counters["rotated"] = 1

    inputs = src.ids
    counters["tokens"] = counters["source_tokens"] = int(targets.size)
    counters["input_tokens"] = int(inputs.size)
    counters["mask_tokens"] = int(np.count_nonzero(inputs == special.mask))
    counters["deleted"] = int(targets.size - inputs.size + counters["inserted"])
    return {"inputs": inputs, "targets": targets}, counters


def many_supported(config: BartConfig) -> bool:
    """Whether :func:`bart_many` covers ``config``: the BART-large recipe's passes (sentence
    permutation and span, word or subword masking with ``replace_length`` 1), none of the
    token masking, token deletion, random insertion or rotation passes."""
    return (config.replace_length == 1 and config.token_mask == 0 and config.token_delete == 0
            and config.insert == 0 and config.rotate == 0)


def _exclusive_cumsum(values: np.ndarray) -> np.ndarray:
    """``[0, v0, v0 + v1, ...]`` without the total: where each row's run starts in a flat array."""
    out = np.zeros(values.size, dtype=np.int64)
    np.cumsum(values[:-1], out=out[1:])
    return out


def bart_many(
    tokens: np.ndarray,
    rngs: Sequence[np.random.Generator],
    config: BartConfig,
    special: SpecialIds,
    word_starts: np.ndarray | None,
    sentence_starts: np.ndarray,
) -> tuple[np.ndarray, np.ndarray, np.ndarray, dict[str, int]]:
    """:func:`bart_with_stats` of many chunks of one length at once (the pipeline's fast path).

    Row ``i`` is exactly ``bart_with_stats(tokens[i], rngs[i], ...)``, and the counters are the
    sum of the rows' counters. Every row draws from its own generator in the order
    :func:`bart_with_stats` does (sentence permutations, span lengths, span starts, their
    random flags and ids, then the zero-length-span insertions), so each example stays a
    pure function of its key; the array work between the draws runs on the whole block:
    rows are laid end to end and positions are global, which works because every row ends
    with ``</s>``, a barrier that no span passes.

    Args:
        tokens: ``(n, size)`` integer chunks, ``1 <= size <= config.raw_length``.
        rngs: each row's generator (``example_rng`` or a ``LazyGenerator`` of it).
        config: a configuration :func:`many_supported` accepts.
        special: special ids; ``bos``, ``eos`` and ``mask`` are used.
        word_starts: ``(n, size)`` bool, or None (every token is a word).
        sentence_starts: ``(n, size)`` bool.

    Returns:
        ``(inputs, offsets, targets, counters)``: the rows' ``inputs`` end to end (int32) with
        their ``n + 1`` int64 offsets, the ``(n, size + 2)`` int32 targets, and the counters.

    Raises:
        ValueError: an unsupported configuration, a missing special id, ids out of range, or
            arrays of the wrong shape.
    """
    if not many_supported(config):
        raise ValueError(f"bart_many covers replace_length 1 without the token, insert and rotate passes, got {config}")
    if special.bos is None or special.mask is None:
        raise ValueError(f"bart needs bos and mask ids, got bos={special.bos} mask={special.mask}")
    tokens = np.asarray(tokens)
    if tokens.ndim != 2 or tokens.dtype.kind not in "iu" or not 1 <= tokens.shape[1] <= config.raw_length:
        raise ValueError(f"tokens must be an (n, size) integer array with 1 <= size <= {config.raw_length}, "
                         f"got shape {tokens.shape} dtype {tokens.dtype}")
    count, size = tokens.shape
    if len(rngs) != count:
        raise ValueError(f"{count} chunks need {count} generators, got {len(rngs)}")
    if tokens.size and ids_out_of_range(tokens, special.vocab_size):
        raise ValueError(f"token ids must be in [0, {special.vocab_size}), got [{tokens.min()}, {tokens.max()}]")
    for name, value in (("word_starts", word_starts), ("sentence_starts", sentence_starts)):
        if (value is not None or name == "sentence_starts") and np.shape(value) != tokens.shape:
            raise ValueError(f"{name} must have the shape of tokens {tokens.shape}, got {np.shape(value)}")
    framed = size + 2
    targets = np.empty((count, framed), dtype=np.int32)
    targets[:, 0], targets[:, -1] = special.bos, special.eos
    targets[:, 1:-1] = tokens
    counters = dict.fromkeys(_COUNTERS, 0)
    counters["examples"] = count
    flags = special.special_flags()
    whole_words = word_starts is not None and config.mask_length != "subword"
    word_flags = np.asarray(word_starts, dtype=bool) if whole_words else None
    # Maskable words per row (a permutation moves tokens with their flags: the count stays).
    maskable = ~flags[tokens]
    if word_flags is not None:
        maskable &= word_flags
    words = np.count_nonzero(maskable, axis=1)
    counters["words"] = int(words.sum())
    masking = config.mask > 0
    generators = [generator_of(rng) for rng in rngs]

    # Sentences: a sentence always starts at token 0; every row's first start is its own start.
    sentence_flags = np.array(sentence_starts, dtype=bool)
    sentence_flags[:, 0] = True
    sentences = np.count_nonzero(sentence_flags, axis=1)
    permute = config.permute_sentences > 0
    moves: list[tuple[int, np.ndarray, np.ndarray]] = []  # (row, chosen sentences, what they become)
    span_rows: list[tuple[int, np.ndarray, int]] = []  # (row, span lengths, zero-length spans)
    starts_of: list[np.ndarray] = []  # per masked row: chosen word indices (into the row's pool)
    random_of: list[np.ndarray] = []  # per masked row: which of its spans become random tokens
    ranks_of: list = []  # per row with random spans: the ranks of its random ids (mapped to ids at once)
    n_free = special.non_special_ranks()[0]
    # First every row's sentence permutation and span-length uniforms, then the span lengths of
    # all rows at once, then every row's span starts, random flags and ids: each row's draws
    # stay in the order bart_with_stats makes them.
    masked_rows, budgets, uniforms = [], [], []
    sentence_counts, word_counts = sentences.tolist(), words.tolist()
    poisson = config.mask_length == "span-poisson"
    for row, rng in enumerate(generators):
        if permute:
            n = sentence_counts[row]
            if n >= 2:
                k = _ceil(n * config.permute_sentences)
                chosen = rng.permutation(n)[:k]
                moves.append((row, chosen, chosen[rng.permutation(k)]))
        if masking and word_counts[row]:
            budget = _ceil(word_counts[row] * config.mask)
            masked_rows.append(row)
            budgets.append(budget)
            if poisson:
                uniforms.append(rng.random(budget))
    if masked_rows:
        rows_lengths = _block_span_lengths(budgets, uniforms, [generators[row] for row in masked_rows], config)
        for row, lengths in zip(masked_rows, rows_lengths):
            nonzero = int(np.count_nonzero(lengths))
            span_rows.append((row, lengths, lengths.size - nonzero))
            rng = generators[row]
            starts = rng.choice(word_counts[row], size=nonzero, replace=False) if nonzero else lengths[:0]
            is_random = rng.random(nonzero) < config.mask_random
            starts_of.append(starts)
            random_of.append(is_random)
            random_count = int(np.count_nonzero(is_random))
            if random_count:
                ranks_of.append(draw_ranks(rng, n_free, random_count))

    ids = targets.copy()
    word_start = np.zeros((count, framed), dtype=bool)
    if word_flags is None:
        word_start[:, 1:-1] = True
    else:
        word_start[:, 1:-1] = word_flags
    if permute:
        counters["sentences"] = int(sentences.sum())
        if moves:
            starts = np.flatnonzero(sentence_flags)  # positions in the rows laid end to end
            first = _exclusive_cumsum(sentences)
            ordering = np.arange(starts.size)
            rows = np.array([row for row, _, _ in moves])
            chosen_counts = [chosen.size for _, chosen, _ in moves]
            base = np.repeat(first[rows], chosen_counts)
            ordering[np.concatenate([chosen for _, chosen, _ in moves]) + base] = (
                np.concatenate([moved for _, _, moved in moves]) + base)
            counters["permuted_sentences"] = int(np.count_nonzero(ordering != index_range(starts.size)))
            # Each row's sentences fill exactly its tokens, so a row's last sentence ends where
            # the next row's first starts: the rows are one sequence of sentences.
            index = _gather_index(starts, ordering, count * size)
            ids[:, 1:-1] = tokens.reshape(-1)[index].reshape(count, size)
            if word_flags is not None:
                word_start[:, 1:-1] = word_flags.reshape(-1)[index].reshape(count, size)
    barrier = np.ones((count, framed), dtype=bool)
    barrier[:, 1:-1] = flags[ids[:, 1:-1]]

    inputs, offsets = ids.reshape(-1), np.arange(count + 1, dtype=np.int64) * framed
    if span_rows:
        all_lengths = np.concatenate([lengths for _, lengths, _ in span_rows])
        zero = _count_spans(counters, all_lengths)
        # Span starts as global positions: row r's pool is its maskable word starts in order.
        pool = np.flatnonzero(np.greater(word_start, barrier))
        masked = np.array([row for row, _, _ in span_rows])
        span_counts = [starts.size for starts in starts_of]
        pool_first = _exclusive_cumsum(words)
        starts = pool[np.concatenate(starts_of) + np.repeat(pool_first[masked], span_counts)]
        lengths = all_lengths[all_lengths > 0] if zero else all_lengths
        ends = _span_ends(word_start.reshape(-1), barrier.reshape(-1), starts, lengths)
        positions = index_range(count * framed).reshape(count, framed)
        reach = np.zeros(count * framed, dtype=np.int64)
        reach[starts] = ends
        reach = reach.reshape(count, framed)
        np.maximum.accumulate(reach, axis=1, out=reach)
        covered = reach > positions
        counters["masked_words"] = int(np.count_nonzero(covered & word_start))
        counters["masked_tokens"] = int(np.count_nonzero(covered))
        keep = np.empty((count, framed), dtype=bool)
        keep[:, 0] = True
        np.less_equal(reach[:, :-1], positions[:, 1:], out=keep[:, 1:])
        keep = keep.reshape(-1)
        inputs[starts] = special.mask
        random_positions = starts[np.concatenate(random_of)]
        if ranks_of:
            inputs[random_positions] = ids_of_ranks(special, np.concatenate(ranks_of))
        counters["random_tokens"] = int(np.count_nonzero(keep[random_positions]))
        inputs = inputs[keep]
        sizes = np.count_nonzero(keep.reshape(count, framed), axis=1)
        # Zero-length spans become inserted masks, as many as fit in seq_len.
        inserted_at, inserted_random, added = [], [], np.zeros(count, dtype=np.int64)
        ranks_of = []
        for row, _, zero_spans in span_rows:
            if not zero_spans:
                continue
            allowed = max(0, min(zero_spans, config.seq_len - int(sizes[row])))
            counters["inserts_dropped"] += zero_spans - allowed
            if allowed <= 0:
                continue
            rng = generators[row]
            at = _insert_positions(rng, int(sizes[row]) + allowed, allowed)
            is_random = rng.random(allowed) < config.mask_random
            random_count = int(np.count_nonzero(is_random))
            if random_count:
                ranks_of.append(draw_ranks(rng, n_free, random_count))
            inserted_at.append((row, at))
            inserted_random.append(is_random)
            added[row] = allowed
        offsets = np.zeros(count + 1, dtype=np.int64)
        np.cumsum(sizes + added, out=offsets[1:])
        if inserted_at:
            at = np.concatenate([positions for _, positions in inserted_at])
            at += np.repeat(offsets[[row for row, _ in inserted_at]], [p.size for _, p in inserted_at])
            old = np.ones(int(offsets[-1]), dtype=bool)
            old[at] = False
            grown = np.empty(int(offsets[-1]), dtype=np.int32)
            grown[old] = inputs
            grown[at] = special.mask
            if ranks_of:
                random_ids = ids_of_ranks(special, np.concatenate(ranks_of))
                grown[at[np.concatenate(inserted_random)]] = random_ids
                counters["random_tokens"] += int(random_ids.size)
            counters["inserted"] = int(at.size)
            inputs = grown
    counters["tokens"] = counters["source_tokens"] = count * framed
    counters["input_tokens"] = int(inputs.size)
    counters["mask_tokens"] = int(np.count_nonzero(inputs == special.mask))
    counters["deleted"] = count * framed - int(inputs.size) + counters["inserted"]
    return inputs, offsets, targets, counters


def bart(
    tokens: np.ndarray,
    rng: np.random.Generator,
    config: BartConfig,
    special: SpecialIds,
    word_starts: np.ndarray | None = None,
    sentence_starts: np.ndarray | None = None,
) -> dict[str, np.ndarray]:
    """Build one BART denoising example from a raw chunk.

    Args:
        tokens: raw chunk of at most ``config.raw_length`` ids.
        rng: the example's generator (``example_rng``).
        config: objective parameters.
        special: special ids; ``bos``, ``eos`` and ``mask`` are used.
        word_starts: bool per token, True where a word starts; None: every token is a word.
        sentence_starts: bool per token, True where a sentence starts; None: one sentence.

    Returns:
        ``{"inputs": int32[<= config.max_inputs_length], "targets": int32[len(tokens) + 2]}``;
        both start with ``<s>`` and end with ``</s>``.

    Raises:
        ValueError: a missing special id, a chunk that does not fit, misaligned features.
    """
    return bart_with_stats(tokens, rng, config, special, word_starts, sentence_starts)[0]


class Bart:
    """The BART objective for the pipeline and the loader (:class:`~transforms.objectives.base.Objective`).

    Both columns are variable-length ``list<int32>``: ``inputs`` because noise changes its
    length, ``targets`` because a final or unpacked (``--packing none``) chunk is shorter
    than ``seq_len`` and targets are never padded (fairseq scores every target token).

    Args:
        config: objective parameters.
    """

    name = "bart"
    family = "seq2seq"
    features = frozenset({"word_starts", "sentence_starts"})
    required_specials = frozenset({"bos", "eos", "mask", "pad"})

    def __init__(self, config: BartConfig | None = None) -> None:
        self.config = config or BartConfig()
        self._many = many_supported(self.config)

    def plan_chunk(self, rng: np.random.Generator) -> tuple[int, int]:
        """Every chunk has ``config.raw_length`` tokens; no randomness is drawn."""
        return self.config.raw_length, 0

    def build(
        self,
        tokens: np.ndarray,
        rng: np.random.Generator,
        plan: int,
        special: SpecialIds,
        features: dict[str, np.ndarray],
    ) -> dict[str, Any]:
        """One example (see :func:`bart`) plus its counters under :data:`STATS_KEY`."""
        example, counters = bart_with_stats(
            tokens, rng, self.config, special, features.get("word_starts"), features.get("sentence_starts")
        )
        return {**example, STATS_KEY: counters}

    def builds_many(self, piece: Piece, plan: int) -> bool:
        """Whether :meth:`build_many` takes this chunk: a full chunk with both features, under
        a configuration :func:`many_supported` covers."""
        return (self._many and piece.tokens.shape[0] == self.config.raw_length
                and piece.features.keys() == self.features)

    def build_many(
        self,
        pieces: Sequence[Piece],
        plans: Sequence[int],
        rngs: Sequence[np.random.Generator],
        special: SpecialIds,
    ) -> BuiltRows:
        """:meth:`build` and :meth:`stats` of many chunks :meth:`builds_many` takes (see :func:`bart_many`).

        Returns:
            The examples' array columns (name -> ``(flat int32 values, int64 row offsets)``), no
            scalar or string columns, and the sum of their counters.
        """
        tokens = np.stack([piece.tokens for piece in pieces])
        words = np.stack([piece.features["word_starts"] for piece in pieces])
        sentences = np.stack([piece.features["sentence_starts"] for piece in pieces])
        inputs, offsets, targets, counters = bart_many(tokens, rngs, self.config, special, words, sentences)
        count, framed = targets.shape
        columns = {"inputs": (inputs, offsets),
                   "targets": (targets.reshape(-1), np.arange(count + 1, dtype=np.int64) * framed)}
        return columns, {}, {}, counters

    def stats(self, example: dict[str, Any]) -> dict[str, int]:
        """Exact counters carried by :meth:`build`; lengths only for an example without them."""
        if STATS_KEY in example:
            return dict(example[STATS_KEY])
        source_tokens = int(np.size(example["targets"]))
        return {
            "examples": 1,
            "tokens": source_tokens,
            "source_tokens": source_tokens,
            "input_tokens": int(np.size(example["inputs"])),
        }

    def schema_kwargs(self) -> dict[str, Any]:
        """Variable-length ``inputs`` and ``targets``."""
        return {"inputs_length": None, "targets_length": None}

    def max_sentinels(self) -> int:
        """BART uses no sentinels."""
        return 0

    def params(self) -> dict[str, Any]:
        """The configuration, for the manifest."""
        return {"objective": self.name, **asdict(self.config)}
