"""Tests of transforms/objectives/bart.py: fairseq's words, a per-example oracle that walks spans
token by token as fairseq's ``add_whole_word_mask`` does, properties and statistics."""

from __future__ import annotations

import itertools
import math
from collections import Counter

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from objective_oracles import assert_fits, ks_bound, ks_statistic, poisson_pmf

from schemas.examples import example_schema
from transforms.objectives import bart_passes
from transforms.objectives.bart import Bart, BartConfig, poisson_span_cdf, span_lengths
from transforms.objectives.base import Block, build_example
from transforms.objectives.common import SpecialIds
from transforms.objectives.layout import example_digests, example_randoms
from transforms.objectives.randoms import first_distinct, random_ids

# ids 0..3 special (<s>, <pad>, </s>, <mask>), 4..59 ordinary
SPECIAL = SpecialIds(vocab_size=60, pad=1, eos=2, bos=0, mask=3)


def _ceil(value: float) -> int:
    return math.ceil(round(value, 9))


def _walk_end(word_start: list[bool], barrier: list[bool], start: int, length: int) -> int:
    """fairseq's loop: walk right from a start, counting word starts; a barrier ends the span."""
    position, remaining = start, length - 1
    while True:
        position += 1
        remaining -= 255 if barrier[position] else int(word_start[position])
        if remaining < 0:
            return position


def _spans(ids, word_start, barrier, starts, lengths, is_random, replace_length, values, mask):
    """fairseq's ``add_whole_word_mask`` after its draws, on lists: returns the kept ids, flags and
    the counters; random ids are used in the documented order (replace 1: random spans in drawing
    order; -1: covered positions in order whose earliest-started covering span is random)."""
    size = len(ids)
    ends = [_walk_end(word_start, barrier, s, n) for s, n in zip(starts, lengths)]
    covered = [False] * size
    winner = [None] * size  # the earliest-started span covering each position
    for span in sorted(range(len(starts)), key=lambda i: starts[i]):
        for position in range(starts[span], ends[span]):
            covered[position] = True
            if winner[position] is None:
                winner[position] = span
    counters = {"masked_words": sum(c and w for c, w in zip(covered, word_start)), "masked_tokens": sum(covered)}
    keep = [True] * size
    ids, barrier = list(ids), list(barrier)
    values = list(values)
    if replace_length == 0:
        keep = [not c for c in covered]
        counters["random_tokens"] = 0
    elif replace_length == 1:
        for s in starts:
            ids[s] = mask
            barrier[s] = True
        for span, s in enumerate(starts):
            if is_random[span]:
                ids[s] = values.pop(0)
        for s, e in zip(starts, ends):
            for position in range(s + 1, e):
                keep[position] = False
        counters["random_tokens"] = sum(1 for span, s in enumerate(starts) if is_random[span] and keep[s])
    else:
        random = 0
        for position in range(size):
            if covered[position]:
                ids[position] = mask
                barrier[position] = True
                if is_random[winner[position]]:
                    ids[position] = values.pop(0)
                    random += 1
        counters["random_tokens"] = random
    pick = [i for i in range(size) if keep[i]]
    return [ids[i] for i in pick], [word_start[i] for i in pick], [barrier[i] for i in pick], counters


def _insert(ids, word_start, barrier, randoms, streams, count, mask_random, special):
    if not count:
        return ids, word_start, barrier, 0
    grown = len(ids) + count
    positions = (first_distinct(randoms, streams[0], grown - 2, count)[0] + 1).tolist()
    flags = (randoms.uniforms(streams[1], count)[0] < mask_random).tolist()
    values = random_ids(randoms, streams[2], np.array([sum(flags)]), special).tolist()
    inserted = {}
    for position, flag in zip(positions, flags):
        inserted[position] = values.pop(0) if flag else special.mask
    old = iter(zip(ids, word_start, barrier))
    out = [(inserted[i], True, True) if i in inserted else next(old) for i in range(grown)]
    return [o[0] for o in out], [o[1] for o in out], [o[2] for o in out], sum(flags)


def oracle(tokens: np.ndarray, space_starts, sentence_starts, randoms, config: BartConfig, special: SpecialIds):
    """BART's noise of one chunk, by hand, from the documented draws of its row."""
    tokens, length = tokens.tolist(), len(tokens)
    words_flags = [True] * length if space_starts is None or config.mask_length == "subword" else list(space_starts)
    sentence = [False] * length if sentence_starts is None else list(sentence_starts)
    counters = Counter(examples=1)
    starts = [i for i in range(length) if i == 0 or sentence[i]]
    counters["sentences"] = len(starts)
    if config.permute_sentences > 0 and len(starts) >= 2:
        n = len(starts)
        order = first_distinct(randoms, bart_passes.SENTENCE_STREAM, n, n)[0].tolist()
        if config.permute_sentences >= 1:
            ordering = order
        else:
            k = _ceil(n * config.permute_sentences)
            chosen = order[:k]
            shuffled = first_distinct(randoms, bart_passes.CHOSEN_SENTENCE_STREAM, k, k)[0].tolist()
            ordering = list(range(n))
            for i in range(k):
                ordering[chosen[i]] = chosen[shuffled[i]]
        counters["permuted_sentences"] = sum(ordering[j] != j for j in range(n))
        bounds = [*starts, length]
        pieces = [list(range(bounds[s], bounds[s + 1])) for s in ordering]
        index = [i for piece in pieces for i in piece]
        tokens, words_flags = [tokens[i] for i in index], [words_flags[i] for i in index]
    specials = set(special.special_array().tolist())
    ids = [special.bos, *tokens, special.eos]
    barrier = [True, *(t in specials for t in tokens), True]
    word_start = [False, *words_flags, False]
    for i in range(2, length + 1):  # the token after an in-chunk special token starts a word
        word_start[i] = word_start[i] or barrier[i - 1]
    pool = [i for i in range(len(ids)) if word_start[i] and not barrier[i]]
    words = len(pool)
    counters["words"] = words
    if config.mask > 0 and words:
        budget = _ceil(words * config.mask)
        lengths = span_lengths(randoms, np.array([budget]), config)[0].tolist()
        counters["mask_budget"] = sum(lengths)
        zero = lengths.count(0)
        lengths = [n for n in lengths if n]
        chosen = first_distinct(randoms, bart_passes.START_STREAM, words, len(lengths))[0].tolist()
        span_starts = [pool[i] for i in chosen]
        is_random = (randoms.uniforms(bart_passes.SPAN_RANDOM_STREAM, max(len(lengths), 1))[0]
                     < config.mask_random).tolist()[: len(lengths)] if config.mask_random > 0 else [False] * len(
            lengths)
        need = 0
        if config.replace_length == 1:
            need = sum(is_random)
        elif config.replace_length == -1:
            need = sum(_walk_end(word_start, barrier, s, n) - s
                       for s, n, r in zip(span_starts, lengths, is_random) if r)
        values = random_ids(randoms, bart_passes.SPAN_IDS_STREAM, np.array([need]), special).tolist()
        ids, word_start, barrier, found = _spans(ids, word_start, barrier, span_starts, lengths, is_random,
                                                 config.replace_length, values, special.mask)
        counters.update(found)
        allowed = max(0, min(zero, config.seq_len - len(ids)))
        counters["inserts_dropped"] += zero - allowed
        ids, word_start, barrier, random = _insert(ids, word_start, barrier, randoms, (
            bart_passes.ZERO_INSERT_STREAM, bart_passes.ZERO_RANDOM_STREAM, bart_passes.ZERO_IDS_STREAM), allowed,
            config.mask_random, special)
        counters["inserted"] += allowed
        counters["random_tokens"] += random
    for share, replace_length, streams in ((config.token_mask, -1, bart_passes.TOKEN_MASK_STREAMS),
                                           (config.token_delete, 0, bart_passes.TOKEN_DELETE_STREAMS)):
        if share > 0 and words:
            pool = [i for i in range(len(ids)) if word_start[i] and not barrier[i]]
            wanted = min(len(pool), _ceil(words * share))
            chosen = first_distinct(randoms, streams[0], len(pool), wanted)[0].tolist()
            span_starts = [pool[i] for i in chosen]
            is_random = (randoms.uniforms(streams[1], max(wanted, 1))[0] < config.mask_random).tolist()[:wanted] if (
                config.mask_random > 0) else [False] * wanted
            need = sum(_walk_end(word_start, barrier, s, 1) - s for s, r in zip(span_starts, is_random) if r) if (
                replace_length == -1) else 0
            values = random_ids(randoms, streams[2], np.array([need]), special).tolist()
            ids, word_start, barrier, found = _spans(ids, word_start, barrier, span_starts, [1] * wanted, is_random,
                                                     replace_length, values, special.mask)
            counters.update(found)
    if config.insert > 0:
        count = _ceil(len(ids) * config.insert)
        ids, word_start, barrier, random = _insert(ids, word_start, barrier, randoms, (
            bart_passes.INSERT_STREAM, bart_passes.INSERT_RANDOM_STREAM, bart_passes.INSERT_IDS_STREAM), count,
            config.mask_random, special)
        counters["inserted"] += count
        counters["random_tokens"] += random
    if config.rotate > 0:
        u = randoms.uniforms(bart_passes.ROTATE_STREAM, 2)[0]
        if u[0] < config.rotate:
            counters["rotated"] = 1
            offset = 1 + int(u[1] * max(1, len(ids) - 1))
            ids = ids[:1] + ids[offset:-1] + ids[1:offset] + ids[-1:]
    return ids, counters


@st.composite
def blocks(draw):
    seq_len = draw(st.integers(3, 80))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    replace_length = draw(st.sampled_from([-1, 0, 1]))
    mask_length = draw(st.sampled_from(["span-poisson", "word"] + (["subword"] if replace_length != -1 else [])))
    probability = st.sampled_from([0.0, 0.1, 0.3, 0.5, 1.0])
    config = BartConfig(seq_len=seq_len, mask=draw(probability), mask_random=draw(probability),
                        insert=draw(probability), rotate=draw(probability), permute_sentences=draw(probability),
                        replace_length=replace_length, mask_length=mask_length,
                        poisson_lambda=draw(st.sampled_from([0.5, 3.0, 3.5, 10.0])), token_mask=draw(probability),
                        token_delete=draw(probability))
    rows = []
    eos_share = draw(st.sampled_from([0.0, 0.05, 0.3]))
    for _ in range(draw(st.integers(1, 8))):
        length = int(rng.integers(1, seq_len - 1))
        tokens = rng.integers(4, 60, size=length).astype(np.int32)
        tokens[rng.random(length) < eos_share] = 2  # EOS between packed documents
        rows.append((tokens, rng.random(length) < 0.5, rng.random(length) < 0.2))
    return rows, config, draw(st.booleans())


@settings(max_examples=400)
@given(blocks(), st.integers(0, 1000))
def test_every_row_of_a_block_is_the_oracles_example(case, seed):
    rows, config, with_features = case
    keys = [f"k{i}" for i in range(len(rows))]
    randoms = example_digests(seed, keys).randoms
    lengths = np.array([len(tokens) for tokens, _, _ in rows])
    features = {}
    if with_features:
        features = {"space_starts": np.concatenate([w for _, w, _ in rows]),
                    "sentence_starts": np.concatenate([s for _, _, s in rows])}
    block = Block(np.concatenate([t for t, _, _ in rows]).astype(np.int32), np.concatenate([[0], np.cumsum(lengths)]),
                  lengths.astype(np.int32), np.arange(len(rows) + 1), features, np.zeros(len(rows), np.int64), randoms)
    built = Bart(config).build(block, SPECIAL)
    inputs, offsets = built.arrays["inputs"]
    targets, target_offsets = built.arrays["targets"]
    summed: Counter = Counter()
    for row, (tokens, space_starts, sentence_starts) in enumerate(rows):
        want, counters = oracle(tokens, space_starts if with_features else None,
                                sentence_starts if with_features else None, randoms.rows([row]), config, SPECIAL)
        assert inputs[offsets[row]: offsets[row + 1]].tolist() == want
        assert targets[target_offsets[row]: target_offsets[row + 1]].tolist() == [0, *tokens.tolist(), 2]
        summed.update(counters)
    for name in ("examples", "sentences", "permuted_sentences", "words", "mask_budget", "masked_words",
                 "masked_tokens", "random_tokens", "inserted", "inserts_dropped", "rotated"):
        assert built.counters[name] == summed[name], name
    assert built.counters["input_tokens"] == inputs.size == offsets[-1]
    assert built.counters["mask_tokens"] == int((inputs == SPECIAL.mask).sum())
    assert built.counters["deleted"] == targets.size - inputs.size + built.counters["inserted"]
    assert all(isinstance(v, int) for v in built.counters.values())


def test_span_ends_match_fairseqs_walk():
    rng = np.random.default_rng(4)
    for _ in range(200):
        size = int(rng.integers(3, 60))
        word_start = rng.random(size) < 0.6
        barrier = rng.random(size) < 0.1
        barrier[[0, -1]] = True
        pool, barriers = np.flatnonzero(word_start & ~barrier), np.flatnonzero(barrier)
        words = bart_passes._Words(pool, np.array([pool.size]), barriers, pool.searchsorted(barriers))
        lengths = rng.integers(1, 12, size=pool.size)
        ends, before = bart_passes._span_ends(words, np.arange(pool.size), lengths)
        walked = [_walk_end(word_start.tolist(), barrier.tolist(), s, n) for s, n in zip(pool.tolist(), lengths)]
        assert ends.tolist() == walked and before.tolist() == pool.searchsorted(ends).tolist()


def test_span_lengths_are_fairseqs_draws_until_the_budget():
    """Draw Poisson lengths until they cover the budget, trim the last: the row's stream, in order."""
    config = BartConfig()
    randoms = example_digests(0, [f"r{i}" for i in range(300)]).randoms
    budgets = np.random.default_rng(1).integers(0, 200, size=300)
    values, offsets = span_lengths(randoms, budgets, config)
    cdf = poisson_span_cdf(3.5)
    for row, budget in enumerate(budgets.tolist()):
        draws = cdf.searchsorted(randoms.rows([row]).uniforms(bart_passes.LENGTH_STREAM, 400)[0], side="right")
        lengths, total = [], 0
        for length in draws.tolist():
            if total >= budget:
                break
            lengths.append(min(length, budget - total))
            total += length
        assert values[offsets[row]: offsets[row + 1]].tolist() == lengths and sum(lengths) == budget


def test_the_repro_masks_fairseqs_seven_words():
    """On GPT-2-style pieces of the repro the budget is over fairseq's 7 words: ceil(7 * .3) = 3."""
    from tokenizers import Tokenizer

    from tests.lmshards_testing import TOKENIZER
    from transforms.tokenizing.tokenize import TokenFeatures

    tokenizer = Tokenizer.from_file(TOKENIZER)
    text = "The cat sat.\nIt was (very) happy, wasn't it?"
    ids = np.asarray(tokenizer.encode(text, add_special_tokens=False).ids, dtype=np.int32)
    features = TokenFeatures(tokenizer, {"space_starts", "sentence_starts"}).of(text, ids)
    special = SpecialIds(vocab_size=tokenizer.get_vocab_size(), pad=0, eos=2, bos=1, mask=4,
                         all_special=frozenset(range(5)))
    _, counters = build_example(Bart(BartConfig(seq_len=64)), ids, special, example_randoms(0, ["repro"]),
                                features=features)
    assert counters["words"] == 7 and counters["mask_budget"] == 3 and counters["sentences"] == 2


def test_document_starts_after_an_eos_start_words_but_the_chunks_first_token_does_not():
    tokens = np.array([10, 11, 2, 12, 13], dtype=np.int32)  # ..., EOS, the next document
    space_starts = np.array([0, 1, 1, 0, 1], dtype=bool)
    _, counters = build_example(Bart(BartConfig(seq_len=16, mask=0.0, permute_sentences=0.0)), tokens, SPECIAL,
                                example_randoms(0, ["d"]), features={"space_starts": space_starts,
                                                                     "sentence_starts": np.zeros(5, bool)})
    assert counters["words"] == 3  # 11, 12 (after the EOS) and 13; not 10 (after <s>), never the EOS


def test_poisson_span_distribution():
    cdf = poisson_span_cdf(3.5)
    pmf = np.diff(cdf, prepend=0.0)
    assert cdf.size == 19 and cdf[-1] == pytest.approx(1.0)  # k = 0..18; p_18 < 1e-7 is the last kept
    assert (pmf * np.arange(cdf.size)).sum() == pytest.approx(3.5, abs=1e-5)
    assert pmf[0] == pytest.approx(math.exp(-3.5), rel=1e-6)


def _bart_large_block(count: int, seed: int = 0):
    """``count`` BART-large rows of 510 tokens, a word start on half of them, 20 sentences."""
    data = np.random.default_rng(2)
    special = SpecialIds(vocab_size=50265, pad=1, eos=2, bos=0, unk=3, mask=50264)
    tokens = data.integers(4, 50000, size=count * 510).astype(np.int32)
    features = {"space_starts": data.random(tokens.size) < 0.5, "sentence_starts": data.random(tokens.size) < 0.04}
    keys = [f"ex{i}" for i in range(count)]
    block = Block(tokens, np.arange(count + 1) * 510, np.full(count, 510, np.int32), np.arange(count + 1), features,
                  np.zeros(count, np.int64), example_digests(seed, keys).randoms)
    return block, special


def test_statistics_of_bart_large_noise():
    """4,000 BART-large rows: the budget is 30% of the words (ceil); span lengths follow fairseq's
    Poisson(3.5) categorical (chi-square and KS on each row's first three spans, which can never
    reach its budget of 64 or more words: the spans after them are conditioned on not having reached it,
    the one that does is size-biased); zero-length spans are e^-3.5 of them; 10% of the masks are
    random tokens; every sentence order is permuted."""
    block, special = _bart_large_block(4000)
    config = BartConfig()
    budgets = np.ceil(np.round(
        np.add.reduceat(block.features["space_starts"], block.offsets[:-1]) * 0.3, 9)).astype(np.int64)
    assert budgets.min() > 3 * 18  # the categorical stops at 18
    lengths, offsets = span_lengths(block.randoms, budgets, config)
    first_three = (np.arange(lengths.size) - np.repeat(offsets[:-1], np.diff(offsets))) < 3
    untrimmed = lengths[first_three]
    cdf = poisson_span_cdf(3.5)
    pmf = np.diff(cdf, prepend=0.0)
    assert_fits(np.bincount(untrimmed, minlength=cdf.size), pmf, "span lengths in words")
    assert ks_statistic(untrimmed, cdf) < ks_bound(untrimmed.size)
    assert np.abs(pmf[:12] - poisson_pmf(3.5, 12)).max() < 1e-6  # the categorical is Poisson up to its cut
    counters = Bart(config).build(block, special).counters
    words, spans = counters["words"], counters["masked_spans"] + counters["zero_length_spans"]
    assert 0.3 <= counters["mask_budget"] / words <= 0.3 + 4000 / words
    assert counters["masked_words"] < counters["mask_budget"]  # overlaps and spans cut at </s> cover fewer
    assert abs(np.count_nonzero(untrimmed == 0) / untrimmed.size - math.exp(-3.5)) < 4 * math.sqrt(
        0.03 / untrimmed.size)
    assert abs(counters["zero_length_spans"] / spans - math.exp(-3.5)) < 0.005
    masks = counters["mask_tokens"] + counters["random_tokens"]
    assert abs(counters["random_tokens"] / masks - 0.1) < 4 * math.sqrt(0.09 / masks)
    assert counters["inserts_dropped"] == 0 and counters["permuted_sentences"] > 0.9 * counters["sentences"]


def test_span_starts_are_uniform_over_the_word_starts():
    """One-token words, one-word spans that each become a mask in place: the masked positions are
    the span starts, uniform over the 60 positions of every row."""
    count = 4000
    tokens = np.random.default_rng(3).integers(4, 60, size=count * 60).astype(np.int32)
    block = Block(tokens, np.arange(count + 1) * 60, np.full(count, 60, np.int32), np.arange(count + 1), {},
                  np.zeros(count, np.int64), example_digests(4, [f"w{i}" for i in range(count)]).randoms)
    config = BartConfig(seq_len=62, mask_length="word", replace_length=-1, mask_random=0.0, permute_sentences=0.0)
    built = Bart(config).build(block, SPECIAL)
    inputs = built.arrays["inputs"][0].reshape(count, 62)[:, 1:-1]
    assert ((inputs == SPECIAL.mask).sum(axis=1) == 18).all()  # ceil(60 * .3) words
    assert_fits((inputs == SPECIAL.mask).sum(axis=0), [1 / 60] * 60, "span starts by position")


def test_sentence_orders_are_uniform():
    count = 12_000
    tokens = np.tile(np.arange(10, 16, dtype=np.int32), count)
    sentence_starts = np.tile(np.array([1, 0, 1, 0, 1, 0], dtype=bool), count)  # 3 sentences of 2
    block = Block(tokens, np.arange(count + 1) * 6, np.full(count, 6, np.int32), np.arange(count + 1),
                  {"space_starts": np.ones(tokens.size, bool), "sentence_starts": sentence_starts},
                  np.zeros(count, np.int64), example_digests(1, [f"s{i}" for i in range(count)]).randoms)
    built = Bart(BartConfig(seq_len=8, mask=0.0)).build(block, SPECIAL)
    rows = built.arrays["inputs"][0].reshape(count, 8)[:, 1:-1:2]  # the first token of each sentence
    seen = Counter(map(tuple, ((rows - 10) // 2).tolist()))
    outcomes = list(itertools.permutations(range(3)))
    assert set(seen) == set(outcomes)
    assert_fits([seen[o] for o in outcomes], [1 / 6] * 6, "orders of 3 sentences")


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"mask": 1.5}, "mask"),
        ({"mask_random": -0.1}, "mask_random"),
        ({"rotate": 2.0}, "rotate"),
        ({"permute_sentences": -1.0}, "permute_sentences"),
        ({"replace_length": 2}, "replace_length"),
        ({"mask_length": "span"}, "mask_length"),
        ({"mask_length": "subword", "replace_length": -1}, "subword"),
        ({"poisson_lambda": 0.0}, "poisson_lambda"),
        ({"seq_len": 2}, "seq_len"),
        ({"token_delete": 1.1}, "token_delete"),
    ],
)
def test_config_validation(kwargs, field):
    with pytest.raises(ValueError, match=field):
        BartConfig(**kwargs)


def test_bad_input():
    randoms = example_randoms(0, ["k"])
    config = Bart(BartConfig(seq_len=8))
    with pytest.raises(ValueError, match="1 to 6 tokens"):
        build_example(config, np.arange(4, 12), SPECIAL, randoms)
    with pytest.raises(ValueError, match="space_starts"):
        build_example(config, np.arange(4, 8), SPECIAL, randoms, features={"space_starts": np.ones(3, bool)})
    with pytest.raises(ValueError, match="bos"):
        build_example(config, np.arange(4, 8), SpecialIds(vocab_size=50, pad=1, eos=2, mask=3), randoms)
    with pytest.raises(ValueError, match=r"token ids must be in \[0, 60\)"):
        build_example(config, np.array([4, 70]), SPECIAL, randoms)


def test_objective_class():
    objective = Bart(BartConfig(seq_len=14))
    assert (objective.name, objective.family) == ("bart", "seq2seq")
    assert objective.features == {"space_starts", "sentence_starts"}
    assert objective.required_specials == {"bos", "eos", "mask", "pad"}
    assert objective.fixed_raw_length == 12
    schema = example_schema(objective.family, **objective.schema_kwargs())
    assert schema.fixed_length("inputs") is None and schema.fixed_length("targets") is None
    assert objective.max_sentinels() == 0 and objective.params()["poisson_lambda"] == 3.5
