"""Masked language modelling (BERT/RoBERTa): select a fixed share of the tokens, corrupt them.

Reference semantics (see shared/reference/bart_mlm_megatron.md section 2 and 3.4):

- Selection: exactly ``max(1, round(n * mlm_probability))`` of the ``n`` non-special
  positions of a chunk are selected, uniformly without replacement (BERT's
  ``create_pretraining_data.py`` and Megatron use exact counts; HF's
  ``DataCollatorForLanguageModeling`` draws a Bernoulli per token instead). Special tokens
  (``special.special_array()``: PAD, EOS, CLS, SEP, MASK, sentinels, ...) are never selected.
- Corruption of the selected positions: ``mask_ratio`` -> ``special.mask``, ``random_ratio``
  -> a uniform random *non-special* id (``special.non_special_ids()``), ``keep_ratio`` ->
  unchanged. ``labels`` hold the original id at selected positions and -100 elsewhere.
- Whole-word masking (``whole_word_mask=True``) follows HF ``DataCollatorForWholeWordMask``:
  words (from the tokenizer's pre-tokenizer word starts, so it works for BPE, Unigram and
  WordPiece alike) are visited in a random order and taken whole while the token budget
  allows; a word that would overflow the budget is skipped and the scan goes on, so the
  selection can fall short of the budget when only long words remain. The 80/10/10
  corruption is then decided per *token*, as in HF's legacy collator, Google BERT and
  Megatron (HF's 2025 offset-based variant disables random replacement under whole words).
- Framing (``frame=True``): ``[CLS] chunk [SEP]`` like the BERT template; the raw chunk is
  ``seq_len - 2`` tokens. A shorter chunk is right-padded with ``special.pad`` (label -100).

Deliberate differences from the references:

- Rounding: ``round`` is half-up on the product rounded to 9 decimals (Python's ``round``
  is banker's and float noise decides ties in the references).
- The 80/10/10 split is exact per example, not a Bernoulli per token: the selected count
  ``k`` is cut at ``floor(k * c + u)`` for the cumulative ratios ``c`` and one ``u ~ U[0, 1)``
  (systematic randomised rounding). Each count is within 1 of ``k * ratio``, the three
  sum to ``k`` and their expectations are exactly ``k * ratio``, so ratios are unbiased
  even though every example has the same ``k`` (plain rounding would bias them, e.g.
  k=77 -> 62/8/7).
- Random replacements never produce a special or added token (HF draws from the whole
  vocabulary). A random draw may equal the original token, as in every reference.
- Whole words never span a special token: a token right after a special token starts a
  new word (as in HF's offset-based whole-word masking).

Randomness is drawn only from the ``rng`` passed in, in a fixed order: the permutation of
candidates (tokens, or words with whole-word masking), then (whole words only) the
permutation of the selected tokens, then ``u``, then the random ids.

:meth:`MLM.build` hands exact integer counters to :meth:`MLM.stats` under the example key
:data:`STATS_KEY` (``"_stats"``); it is not a column, and writers (which take their columns
from the schema) leave it out. :mod:`transforms.objectives.bart` does the same.
"""

from __future__ import annotations

import bisect
import functools
import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from transforms.objectives.base import BuiltRows
from transforms.objectives.common import SpecialIds, generator_of, ids_out_of_range, padded_rows
from transforms.objectives.counters import add_counters
from transforms.objectives.packing import Piece

__all__ = [
    "IGNORE_INDEX",
    "MLM",
    "STATS_KEY",
    "MLMConfig",
    "draw_non_special",
    "draw_ranks",
    "exact_split",
    "ids_of_ranks",
    "mlm",
    "mlm_with_stats",
    "round_half_up",
]

IGNORE_INDEX = -100
# Key of the example dict under which build() hands its exact noise counters to stats().
# It is not a column: writers take their columns from the schema and must drop it.
STATS_KEY = "_stats"


def round_half_up(value: float) -> int:
    """Round to the nearest integer, ties up, after dropping float noise below 1e-9."""
    return math.floor(round(value, 9) + 0.5)


@dataclass(frozen=True)
class MLMConfig:
    """Parameters of the MLM objective.

    Attributes:
        seq_len: length of ``input_ids`` and ``labels`` (framing included).
        mlm_probability: share of non-special tokens selected, in (0, 1).
        mask_ratio: share of selected tokens replaced by the mask id.
        random_ratio: share of selected tokens replaced by a random non-special id.
        keep_ratio: share of selected tokens left unchanged.
        whole_word_mask: select whole words (needs the ``word_starts`` feature).
        frame: wrap the chunk as ``[CLS] chunk [SEP]``.
    """

    seq_len: int = 512
    mlm_probability: float = 0.15
    mask_ratio: float = 0.8
    random_ratio: float = 0.1
    keep_ratio: float = 0.1
    whole_word_mask: bool = False
    frame: bool = False

    def __post_init__(self) -> None:
        min_len = 3 if self.frame else 1
        if not isinstance(self.seq_len, int) or self.seq_len < min_len:
            raise ValueError(f"seq_len must be an int >= {min_len} (frame={self.frame}), got {self.seq_len!r}")
        if not 0.0 < self.mlm_probability < 1.0:
            raise ValueError(f"mlm_probability must be in (0, 1), got {self.mlm_probability!r}")
        for name in ("mask_ratio", "random_ratio", "keep_ratio"):
            value = getattr(self, name)
            if not 0.0 <= value <= 1.0:
                raise ValueError(f"{name} must be in [0, 1], got {value!r}")
        total = self.mask_ratio + self.random_ratio + self.keep_ratio
        if abs(total - 1.0) > 1e-9:
            raise ValueError(
                f"mask_ratio + random_ratio + keep_ratio must be 1, got "
                f"{self.mask_ratio!r} + {self.random_ratio!r} + {self.keep_ratio!r} = {total!r}"
            )

    @property
    def raw_length(self) -> int:
        """Raw chunk length the packer cuts: ``seq_len`` minus the framing tokens."""
        return self.seq_len - 2 if self.frame else self.seq_len


def exact_split(count: int, ratios: tuple[float, ...], rng: np.random.Generator) -> np.ndarray:
    """Split ``count`` items into ``len(ratios)`` exact integer parts.

    Systematic randomised rounding: cut points ``floor(count * cumsum(ratios) + u)`` with a
    single ``u ~ U[0, 1)``. Every part is within 1 of ``count * ratio``, the parts sum to
    ``count`` and ``E[part] == count * ratio``.

    Args:
        count: number of items to split (>= 0).
        ratios: non-negative shares summing to 1.
        rng: generator; exactly one ``rng.random()`` is drawn.

    Returns:
        int64 array of the part sizes.
    """
    u = rng.random()
    cuts = np.floor(np.round(count * np.cumsum(ratios), 9) + u).astype(np.int64)
    cuts[-1] = count
    cuts = np.minimum(cuts, count)
    return np.diff(cuts, prepend=0)


_SCALAR_DRAWS = 4  # up to this many random ids, scalar draws (same stream) are cheaper


def _round9(value: float) -> float:
    # numpy's ``np.round(value, 9)`` on float64: multiply by 1e9, round half to even, divide.
    return float(round(value * 1e9)) / 1e9


@functools.lru_cache(maxsize=64)
def _cumulative_ratios(*ratios: float) -> tuple[float, ...]:
    """``np.cumsum(ratios)`` as Python floats (the same doubles)."""
    return tuple(np.cumsum(ratios).tolist())


def _split_counts(count: int, cumulative: tuple[float, ...], u: float) -> list[int]:
    """:func:`exact_split` after its draw, in plain floats: the same IEEE operations on the
    same doubles (``cumulative`` is ``np.cumsum(ratios)``), without numpy's per-call cost."""
    parts, previous = [], 0
    for index, share in enumerate(cumulative):
        cut = count if index == len(cumulative) - 1 else min(math.floor(_round9(count * share) + u), count)
        parts.append(cut - previous)
        previous = cut
    return parts


def draw_non_special(rng: np.random.Generator, special: SpecialIds, size: int) -> np.ndarray:
    """Draw ``size`` ids uniformly from ``special.non_special_ids()`` without building it.

    The j-th non-special id is ``j + #{special ids <= it}``, found by a binary search over
    the sorted special ids shifted by their rank, so the cost does not grow with the vocabulary.

    Raises:
        ValueError: every id of the vocabulary is special.
    """
    n_free = special.non_special_ranks()[0]
    if n_free <= 0:
        raise ValueError(f"no non-special id in a vocabulary of {special.vocab_size} ids")
    if size == 0:  # drawing no ids leaves the generator untouched: skip the call
        return np.empty(0, dtype=np.int32)
    ranks = draw_ranks(rng, n_free, size)
    if type(ranks) is list:
        bounds = special.non_special_rank_list()
        return np.array([rank + bisect.bisect_right(bounds, rank) for rank in ranks], dtype=np.int32)
    return ids_of_ranks(special, ranks)


def draw_ranks(rng: np.random.Generator, n_free: int, size: int) -> list[int] | np.ndarray:
    """The ranks (in ``[0, n_free)``) behind :func:`draw_non_special`'s ids: a list for a few, an
    int64 array for more; nothing is drawn for ``size`` 0. Callers that draw for many examples
    map all ranks to ids at once (:func:`ids_of_ranks`)."""
    if size <= _SCALAR_DRAWS and n_free <= 0xFFFFFFFF and type(rng) is np.random.Generator:
        # A vector of bounded ints is drawn one 32-bit value after another, exactly as that
        # many scalar draws are; for a few ids the scalar calls cost less than one vector call.
        return [int(rng.integers(0, n_free)) for _ in range(size)]
    return rng.integers(0, n_free, size=size)


def ids_of_ranks(special: SpecialIds, ranks: np.ndarray) -> np.ndarray:
    """The non-special ids of ``ranks`` (int32): what :func:`draw_non_special` returns for them."""
    ranks = np.asarray(ranks, dtype=np.int64)
    return (ranks + special.non_special_ranks()[1].searchsorted(ranks, side="right")).astype(np.int32)


def _check_tokens(tokens: np.ndarray, special: SpecialIds, limit: int) -> np.ndarray:
    """The chunk after checking it (any integer dtype: its ids are in range, so casts are exact)."""
    tokens = np.asarray(tokens)
    if tokens.ndim != 1 or tokens.dtype.kind not in "iu":
        raise ValueError(f"tokens must be a 1-D integer array, got shape {tokens.shape} dtype {tokens.dtype}")
    if tokens.size > limit:
        raise ValueError(f"chunk of {tokens.size} tokens exceeds the raw length {limit}")
    if tokens.size and ids_out_of_range(tokens, special.vocab_size):
        raise ValueError(f"token ids must be in [0, {special.vocab_size}), got [{tokens.min()}, {tokens.max()}]")
    return tokens


def _check_flags(flags: np.ndarray | None, tokens: np.ndarray, name: str) -> np.ndarray | None:
    if flags is None:
        return None
    flags = np.asarray(flags)
    if flags.shape != tokens.shape:
        raise ValueError(f"{name} must have the shape of tokens {tokens.shape}, got {flags.shape}")
    return flags.astype(bool, copy=False)  # only read


def _select_whole_words(
    candidates: np.ndarray, word_starts: np.ndarray, budget: int, rng: np.random.Generator
) -> np.ndarray:
    """Positions of whole words taken greedily in random order without overflowing ``budget``."""
    starts = word_starts[candidates]  # a new array
    starts[0] = True
    gaps = candidates[1:] - candidates[:-1]
    starts[1:] |= gaps != 1  # a special token in between ends the word
    word_of = starts.cumsum()
    word_of -= 1
    word_len = np.bincount(word_of)
    order = rng.permutation(word_len.size)
    lengths = word_len[order]
    taken = np.zeros(word_len.size, dtype=bool)
    # the longest prefix of the order that fits (lengths are >= 1, so the sums increase)
    cumulative = lengths.cumsum()
    prefix = int(cumulative.searchsorted(budget, side="right"))
    taken[order[:prefix]] = True
    room = budget - (int(cumulative[prefix - 1]) if prefix else 0)
    rest_order, rest_len = order[prefix:], lengths[prefix:]
    while room > 0:  # HF skips a word that would overflow and keeps scanning
        fitting = rest_len <= room
        first = int(fitting.argmax()) if fitting.size else 0
        if fitting.size == 0 or not fitting[first]:
            break
        taken[rest_order[first]] = True
        room -= int(rest_len[first])
        rest_order, rest_len = rest_order[first + 1 :], rest_len[first + 1 :]
    return candidates[taken[word_of]]


def mlm_with_stats(
    tokens: np.ndarray,
    rng: np.random.Generator,
    config: MLMConfig,
    special: SpecialIds,
    word_starts: np.ndarray | None = None,
) -> tuple[dict[str, np.ndarray], dict[str, int]]:
    """:func:`mlm` plus the exact integer counters of the noise it drew.

    Returns:
        ``(example, counters)``; counters are ``examples``, ``tokens`` (non-pad positions,
        framing included), ``padding_tokens``, ``maskable_tokens`` (non-special positions, the
        candidates of selection), ``selected``, ``masked``, ``random`` and ``kept``.
    """
    if special.mask is None:
        raise ValueError("mlm needs a mask token id (special.mask is None)")
    tokens = _check_tokens(tokens, special, config.raw_length)
    word_starts = _check_flags(word_starts, tokens, "word_starts")
    if config.whole_word_mask and word_starts is None:
        raise ValueError("whole_word_mask=True needs the word_starts feature")
    # Special positions: a lookup per id (ids are checked to be in the vocabulary); the
    # framing ids are special by definition (they are in special.special_array()).
    if config.frame:
        if special.cls is None or special.sep is None:
            raise ValueError(f"frame=True needs cls and sep ids, got cls={special.cls} sep={special.sep}")
        is_special = np.empty(tokens.size + 2, dtype=bool)
        is_special[0] = is_special[-1] = True
        special.special_flags().take(tokens, out=is_special[1:-1], mode="clip")  # ids are checked to be in range
        tokens = np.concatenate([[special.cls], tokens, [special.sep]]).astype(np.int32)
        if word_starts is not None:
            word_starts = np.concatenate([[False], word_starts, [False]])
    else:
        is_special = special.special_flags().take(tokens, mode="clip")  # ids are checked to be in range
    rng = generator_of(rng)

    candidates = np.logical_not(is_special, out=is_special).nonzero()[0]
    n = candidates.size
    budget = min(n, max(1, round_half_up(n * config.mlm_probability))) if n else 0
    if config.whole_word_mask and n:
        selected = _select_whole_words(candidates, word_starts, budget, rng)
        selected = selected[rng.permutation(selected.size)]
    else:
        selected = candidates[rng.permutation(n)[:budget]]

    # exact_split(selected.size, ratios, rng), computed in floats after its one draw
    cumulative = _cumulative_ratios(config.mask_ratio, config.random_ratio, config.keep_ratio)
    n_mask, n_random, n_keep = _split_counts(selected.size, cumulative, rng.random())
    size = tokens.size
    input_ids = np.empty(config.seq_len, dtype=np.int32)
    input_ids[:size] = tokens
    input_ids[size:] = special.pad
    labels = np.empty(config.seq_len, dtype=np.int32)
    labels.fill(IGNORE_INDEX)
    labels[selected] = tokens[selected]
    input_ids[selected[:n_mask]] = special.mask
    input_ids[selected[n_mask : n_mask + n_random]] = draw_non_special(rng, special, n_random)
    counters = {
        "examples": 1,
        "tokens": int(size),
        "padding_tokens": int(config.seq_len - size),
        "maskable_tokens": int(n),
        "selected": int(selected.size),
        "masked": n_mask,
        "random": n_random,
        "kept": n_keep,
    }
    return {"input_ids": input_ids, "labels": labels}, counters


def mlm(
    tokens: np.ndarray,
    rng: np.random.Generator,
    config: MLMConfig,
    special: SpecialIds,
    word_starts: np.ndarray | None = None,
) -> dict[str, np.ndarray]:
    """Build one MLM example from a raw chunk.

    Args:
        tokens: raw chunk, at most ``config.raw_length`` ids (shorter chunks are padded).
        rng: the example's generator (``example_rng``).
        config: objective parameters.
        special: special ids; ``mask`` and ``pad`` (plus ``cls``/``sep`` when framing) are required.
        word_starts: bool per token, True where a word starts; required for whole-word masking.

    Returns:
        ``{"input_ids": int32[seq_len], "labels": int32[seq_len]}``.

    Raises:
        ValueError: a missing special id or feature, or a chunk that does not fit.
    """
    return mlm_with_stats(tokens, rng, config, special, word_starts)[0]


class MLM:
    """The MLM objective for the pipeline and the loader (:class:`~transforms.objectives.base.Objective`).

    Args:
        config: objective parameters.
    """

    name = "mlm"
    family = "encoder"

    def __init__(self, config: MLMConfig | None = None) -> None:
        self.config = config or MLMConfig()
        self.features = frozenset({"word_starts"}) if self.config.whole_word_mask else frozenset()
        roles = {"mask", "pad"} | ({"cls", "sep"} if self.config.frame else set())
        self.required_specials = frozenset(roles)

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
        """One example (see :func:`mlm`) plus its counters under :data:`STATS_KEY`."""
        word_starts = features.get("word_starts") if self.config.whole_word_mask else None
        example, counters = mlm_with_stats(tokens, rng, self.config, special, word_starts=word_starts)
        return {**example, STATS_KEY: counters}

    def build_many(
        self,
        pieces: Sequence[Piece],
        plans: Sequence[int],
        rngs: Sequence[np.random.Generator],
        special: SpecialIds,
    ) -> BuiltRows:
        """:meth:`build` and :meth:`stats` of many chunks at once, rows padded to ``seq_len`` with
        ``special.pad`` as the pipeline's builder pads one example (``padding_tokens``)."""
        counters: dict[str, int] = {}
        input_ids, labels = [], []
        whole_words = self.config.whole_word_mask
        for piece, rng in zip(pieces, rngs, strict=True):
            word_starts = piece.features.get("word_starts") if whole_words else None
            example, row_counters = mlm_with_stats(piece.tokens, rng, self.config, special, word_starts=word_starts)
            add_counters(counters, row_counters)
            input_ids.append(example["input_ids"])
            labels.append(example["labels"])
        arrays, padding = {}, 0
        for name, rows in (("input_ids", input_ids), ("labels", labels)):
            flat, offsets, pads = padded_rows(rows, self.config.seq_len, special.pad)
            arrays[name] = (flat, offsets)
            padding += pads
        if padding:
            counters["padding_tokens"] = counters.get("padding_tokens", 0) + padding
        return arrays, {}, {}, counters

    def stats(self, example: dict[str, Any]) -> dict[str, int]:
        """Exact counters carried under :data:`STATS_KEY` by :meth:`build`.

        A random replacement that drew the original id still counts as ``random``. An
        example without the key (read back from disk) yields what it shows: ``examples``
        and ``selected``.
        """
        if STATS_KEY in example:
            return dict(example[STATS_KEY])
        return {"examples": 1, "selected": int((np.asarray(example["labels"]) != IGNORE_INDEX).sum())}

    def schema_kwargs(self) -> dict[str, Any]:
        """``input_ids`` and ``labels`` are ``fixed_size_list<int32>[seq_len]``."""
        return {"seq_len": self.config.seq_len}

    def max_sentinels(self) -> int:
        """MLM uses no sentinels."""
        return 0

    def params(self) -> dict[str, Any]:
        """The configuration, for the manifest."""
        return {"objective": self.name, **asdict(self.config)}
