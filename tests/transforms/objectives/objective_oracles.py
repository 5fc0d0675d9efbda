"""Test helpers: goodness-of-fit bounds, reference distributions and per-example oracles.

The oracles rebuild one example at a time with plain Python loops from the objectives'
documented semantics and the same counter-based numbers (the streams each module names), so
the block implementations are held to them row by row. The samplers they call are checked
against their own definitions in ``test_randoms.py``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from transforms.objectives.common import SpecialIds

#: The upper tail every goodness-of-fit test here uses: the tests are deterministic (fixed keys),
#: and a bound this far out fails only where a distribution is wrong, not by bad luck.
Z_TAIL = 4.0


def chi_square(observed: Sequence[float], expected: Sequence[float]) -> float:
    """Pearson's statistic; cells with expectation below 5 are pooled with their neighbour."""
    pooled_o, pooled_e, o_acc, e_acc = [], [], 0.0, 0.0
    for o, e in zip(observed, expected, strict=True):
        o_acc += o
        e_acc += e
        if e_acc >= 5:
            pooled_o.append(o_acc)
            pooled_e.append(e_acc)
            o_acc = e_acc = 0.0
    if e_acc and pooled_e:
        pooled_o[-1] += o_acc
        pooled_e[-1] += e_acc
    return sum((o - e) ** 2 / e for o, e in zip(pooled_o, pooled_e)), len(pooled_e) - 1


def chi_square_bound(df: int, z: float = Z_TAIL) -> float:
    """Wilson-Hilferty approximation of the chi-square quantile ``z`` standard deviations up."""
    df = max(df, 1)
    return df * (1 - 2 / (9 * df) + z * math.sqrt(2 / (9 * df))) ** 3


def assert_fits(observed: Sequence[float], probabilities: Sequence[float], what: str) -> None:
    """Counts ``observed`` fit the distribution ``probabilities`` (chi-square at :data:`Z_TAIL`)."""
    total = float(sum(observed))
    statistic, df = chi_square(observed, [p * total for p in probabilities])
    assert statistic < chi_square_bound(df), f"{what}: chi-square {statistic:.1f} on {df} df"


def ks_statistic(samples: np.ndarray, cdf: np.ndarray) -> float:
    """Kolmogorov-Smirnov distance between integer ``samples`` and a discrete CDF on 0, 1, ..."""
    counts = np.bincount(samples, minlength=cdf.size)[: cdf.size]
    empirical = np.cumsum(counts) / samples.size
    return float(np.abs(empirical - cdf).max())


def ks_bound(size: int, z: float = Z_TAIL) -> float:
    """Kolmogorov's bound ``sqrt(-ln(alpha / 2) / (2 n))`` with ``alpha`` of ``z`` sigmas."""
    alpha = math.erfc(z / math.sqrt(2))
    return math.sqrt(-math.log(alpha / 2) / (2 * size))


def composition_part_pmf(total: int, parts: int) -> np.ndarray:
    """P(a given part = k), k = 0..total, of a uniformly random composition of ``total`` into
    ``parts`` positive parts: ``C(total - k - 1, parts - 2) / C(total - 1, parts - 1)``."""
    out = np.zeros(total + 1)
    if parts == 1:
        out[total] = 1.0
        return out
    denominator = math.comb(total - 1, parts - 1)
    for k in range(1, total - parts + 2):
        out[k] = math.comb(total - k - 1, parts - 2) / denominator
    return out


def poisson_pmf(lam: float, size: int) -> np.ndarray:
    return np.array([math.exp(-lam) * lam**k / math.factorial(k) for k in range(size)])


def special_ids(vocab: int = 1000, sentinels: int = 200, descending: bool = False) -> SpecialIds:
    """pad 0, eos 1, unk 2, bos 3, mask 4, cls 5, sep 6; sentinels and UL2 mode tokens after ``vocab``."""
    ids = tuple(vocab + sentinels - 1 - k for k in range(sentinels)) if descending else tuple(
        vocab + k for k in range(sentinels))
    modes = {token: vocab + sentinels + i for i, token in enumerate(("[R]", "[S]", "[X]", "[NLU]", "[NLG]", "[S2S]"))}
    return SpecialIds(vocab_size=vocab + sentinels + len(modes), pad=0, eos=1, unk=2, bos=3, mask=4, cls=5, sep=6,
                      sentinels=ids, mode_tokens=modes, all_special=frozenset(range(7)))


def packed_chunk(length: int, rng: np.random.Generator, vocab: int = 1000, doc_mean: int = 60
                 ) -> tuple[np.ndarray, np.ndarray, dict[str, np.ndarray]]:
    """Random ids of ``[7, vocab)``, documents of about ``doc_mean`` tokens each ended by EOS (1),
    word starts on 3/4 of the tokens, sentence starts on 1/12: ``(tokens, doc_lengths, features)``."""
    tokens = rng.integers(7, vocab, size=length).astype(np.int32)
    doc_lengths, position = [], 0
    while position < length:
        doc = min(int(rng.geometric(1 / doc_mean)), length - position)
        position += doc
        tokens[position - 1] = 1
        doc_lengths.append(doc)
    starts = rng.random(length) < 0.75
    features = {"word_starts": starts, "space_starts": starts.copy(), "sentence_starts": rng.random(length) < 1 / 12}
    return tokens, np.asarray(doc_lengths, dtype=np.int32), features
