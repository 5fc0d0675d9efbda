"""Per-example cost of each objective, and a digest of their outputs to prove changes exact.

Builds examples the way ``transforms/build.py`` does (``objective.build(tokens,
LazyGenerator(seed, key), plan, special, features)`` then ``objective.stats(example[,
special])``) from realistic packed chunks: random ids of a 32k vocabulary with special ids
excluded, an EOS after every document, word starts on ~3/4 of the tokens, a sentence start
every ~25 tokens, chunk lengths as each objective plans them (UL2 draws its denoiser from
the chunk's plan generator, as the packer does).

Three modes:

- timing (default): microseconds per example of build + stats for each objective, with
  two baselines measured in the same run: ``copy`` (a copy of the chunk and one generator
  seeded per example, the least any objective does) and ``clm`` (the objective that does
  almost no work). Rounds are interleaved and the best round of each objective counts;
  ``--clock cpu`` (the default) measures this process's CPU time, steadier than wall time
  on a shared machine. Only ratios of one run mean much.
- ``--against CHECKOUT``: the same timings for this checkout and another one (e.g. the
  last commit: ``git worktree add /tmp/head HEAD``), alternating rounds in fresh processes
  so both see the same load; prints before/after and the speed-up.
- ``--check``: builds thousands of examples per parameter set (defaults, paper preset,
  decoder layout, whole-word masks, every BART noise, partial chunks, T5's descending
  sentinel ids, ...) and prints a blake2b digest of every column, dtype and counter (and
  of every error message) per set, plus a total. Run it on two checkouts and compare the
  digests to show that outputs are byte-identical.

    python -m benchmarks.bench_objectives --examples 5000
    python -m benchmarks.bench_objectives --examples 2000 --against /tmp/head
    python -m benchmarks.bench_objectives --check --check-examples 3000
"""

from __future__ import annotations

import argparse
import hashlib
import inspect
import json
import os
import subprocess
import sys
import time
import zlib
from collections.abc import Callable
from typing import Any

import numpy as np

from transforms.objectives.common import LazyGenerator, SpecialIds
from transforms.objectives.layout import plan_rng
from transforms.objectives.registry import make_objective

SEED = 1234
VOCAB = 32000
PAD, EOS, UNK, BOS, MASK, CLS, SEP = 0, 1, 2, 3, 4, 5, 6
FIRST_ORDINARY = 7
MODES = ("[R]", "[S]", "[X]", "[NLU]", "[NLG]", "[S2S]")


def special_ids(descending_sentinels: bool = False, num_sentinels: int = 200) -> SpecialIds:
    """Special ids of a 32k vocabulary plus added sentinels and UL2 mode tokens."""
    if descending_sentinels:  # T5's layout: <extra_id_0> is the last id of the vocabulary
        sentinels = tuple(VOCAB + num_sentinels - 1 - k for k in range(num_sentinels))
    else:  # added tokens, in order
        sentinels = tuple(VOCAB + k for k in range(num_sentinels))
    modes = {token: VOCAB + num_sentinels + i for i, token in enumerate(MODES)}
    return SpecialIds(
        vocab_size=VOCAB + num_sentinels + len(MODES),
        pad=PAD,
        eos=EOS,
        bos=BOS,
        unk=UNK,
        mask=MASK,
        cls=CLS,
        sep=SEP,
        sentinels=sentinels,
        mode_tokens=modes,
        all_special=frozenset({PAD, EOS, UNK, BOS, MASK, CLS, SEP}),
    )


def make_chunk(length: int, rng: np.random.Generator) -> tuple[np.ndarray, dict[str, np.ndarray]]:
    """A packed chunk of ``length`` ids: documents of ~300 tokens each ended by EOS, plus features."""
    tokens = rng.integers(FIRST_ORDINARY, VOCAB, size=length).astype(np.int32)
    word_starts = rng.random(length) < 0.75
    sentence_starts = rng.random(length) < 0.04
    doc_lengths = []
    position = 0
    while position < length:
        doc = min(int(rng.geometric(1 / 300)), length - position)
        position += doc
        tokens[position - 1] = EOS
        if position < length:
            word_starts[position] = sentence_starts[position] = True
        doc_lengths.append(doc)
    if length:
        word_starts[0] = sentence_starts[0] = True
    features = {
        "word_starts": word_starts,
        "sentence_starts": sentence_starts,
        "doc_lengths": np.asarray(doc_lengths, dtype=np.int32),
    }
    return tokens, features


class Workload:
    """Chunks and keys for one objective, planned as the packer plans them."""

    def __init__(self, objective, count: int, pool: int, partial: float, seed: int) -> None:
        rng = np.random.default_rng(seed)
        self.items = []
        cache: dict[int, list[tuple[np.ndarray, dict[str, np.ndarray]]]] = {}
        for index in range(count):
            chunk_key = f"train-b{seed}-c{index}"
            length, plan = objective.plan_chunk(plan_rng(SEED, chunk_key))
            if partial and rng.random() < partial:
                length = int(rng.integers(1, length + 1))
            chunks = cache.setdefault(length, [])
            if len(chunks) < pool:
                chunks.append(make_chunk(length, rng))
            tokens, features = chunks[index % len(chunks)]
            self.items.append((f"{chunk_key}-d0", plan, tokens, features))


def build_all(
    objective, special: SpecialIds, workload: Workload, sink: Callable[[dict[str, Any], dict[str, int]], None] | None
):
    """build + stats of every item, as transforms/build.py does; examples go to ``sink``."""
    takes_special = len(inspect.signature(objective.stats).parameters) >= 2
    build, stats = objective.build, objective.stats
    for key, plan, tokens, features in workload.items:
        if sink is None:
            example = build(tokens, LazyGenerator(SEED, key), plan, special, features)
        else:
            try:
                example = build(tokens, LazyGenerator(SEED, key), plan, special, features)
            except ValueError as error:  # hashed too: errors must stay the same
                sink({"error": str(error), "key": key}, {})
                continue
        counters = stats(example, special) if takes_special else stats(example)
        if sink is not None:
            example.pop("_stats", None)
            example["key"] = key
            sink(example, counters)


class CopyObjective:
    """Baseline: a copy of the chunk and a generator seeded per example (one draw)."""

    def plan_chunk(self, rng):
        return 568, 0

    def build(self, tokens, rng, plan, special, features):
        return {"inputs": tokens.copy(), "draw": int(rng.integers(0, 2))}

    def stats(self, example):
        return {"examples": 1}


BENCH_OBJECTIVES: dict[str, tuple[str, dict[str, Any]]] = {
    "clm": ("clm", {"seq_len": 1024}),
    "prefix_lm": ("prefix_lm", {"seq_len": 1024}),
    "mlm": ("mlm", {"seq_len": 512}),
    "mlm_wwm": ("mlm", {"seq_len": 512, "whole_word_mask": True}),
    "span_corruption": ("span_corruption", {"inputs_length": 512}),
    "bart": ("bart", {"seq_len": 512}),
    "ul2": ("ul2", {"inputs_length": 512}),
    "ul2_decoder": ("ul2", {"inputs_length": 512, "layout": "decoder"}),
}


CLOCKS = {"cpu": time.process_time, "wall": time.perf_counter}


def measure(names: list[str], examples: int, rounds: int, clock: str) -> dict[str, float]:
    """Best microseconds per example (build + stats) of ``copy`` and each named objective."""
    special = special_ids(num_sentinels=128)
    objectives = {"copy": CopyObjective()}
    for name in names:
        objective_name, params = BENCH_OBJECTIVES[name]
        objectives[name] = make_objective(objective_name, dict(params))
    workloads = {name: Workload(obj, examples, 64, 0.0, 7) for name, obj in objectives.items()}
    timer = CLOCKS[clock]
    best = dict.fromkeys(objectives, float("inf"))
    for _ in range(rounds):
        for name, objective in objectives.items():
            start = timer()
            build_all(objective, special, workloads[name], None)
            best[name] = min(best[name], (timer() - start) / examples * 1e6)
    return best


def print_table(best: dict[str, float]) -> None:
    print(f"{'objective':<18}{'us/example':>12}{'x copy':>9}{'x clm':>8}")
    for name, micros in best.items():
        versus_clm = f"{micros / best['clm']:8.2f}" if "clm" in best else ""
        print(f"{name:<18}{micros:12.1f}{micros / best['copy']:9.2f}{versus_clm}")


def compare(other: str, names: list[str], examples: int, rounds: int, clock: str) -> None:
    """This checkout against ``other`` (e.g. ``git worktree add /tmp/head HEAD``), alternating
    one round each in fresh processes so that both see the same load; best round each."""
    script = os.path.abspath(__file__)
    here = os.path.dirname(os.path.dirname(script))
    best: dict[str, dict[str, float]] = {"before": {}, "after": {}}
    for _ in range(rounds):
        for side, root in (("before", other), ("after", here)):
            command = [sys.executable, script, "--json", "--rounds", "1", "--clock", clock]
            command += ["--examples", str(examples), "--objectives", ",".join(names)]
            env = {**os.environ, "PYTHONPATH": os.path.abspath(root)}
            result = json.loads(subprocess.run(command, env=env, cwd=root, check=True, capture_output=True).stdout)
            for name, micros in result.items():
                best[side][name] = min(best[side].get(name, float("inf")), micros)
    before, after = best["before"], best["after"]
    print(f"us/example ({clock} time), best of {rounds} alternating rounds; before = {other}")
    print(f"{'objective':<18}{'before':>9}{'after':>9}{'speed-up':>10}{'before x copy':>15}{'after x copy':>14}")
    for name in after:
        print(
            f"{name:<18}{before[name]:9.1f}{after[name]:9.1f}{before[name] / after[name]:10.2f}"
            f"{before[name] / before['copy']:15.2f}{after[name] / after['copy']:14.2f}"
        )


# name -> (objective, params, partial share, descending sentinels)
CHECK_SETS: dict[str, tuple[str, dict[str, Any], float, bool]] = {
    "clm": ("clm", {"seq_len": 256}, 0.1, False),
    "prefix_lm": ("prefix_lm", {"seq_len": 256}, 0.2, False),
    "mlm": ("mlm", {"seq_len": 256}, 0.1, False),
    "mlm_wwm": ("mlm", {"seq_len": 256, "whole_word_mask": True}, 0.1, False),
    "mlm_frame_wwm": ("mlm", {"seq_len": 128, "whole_word_mask": True, "frame": True}, 0.2, False),
    "mlm_ratios": (
        "mlm",
        {"seq_len": 200, "mlm_probability": 0.3, "mask_ratio": 0.5, "random_ratio": 0.3, "keep_ratio": 0.2},
        0.2,
        False,
    ),
    "span": ("span_corruption", {"inputs_length": 512}, 0.05, False),
    "span_t5_ids": ("span_corruption", {"inputs_length": 512}, 0.05, True),
    "span_r50": (
        "span_corruption",
        {"inputs_length": 128, "noise_density": 0.5, "mean_noise_span_length": 3.0},
        0.2,
        False,
    ),
    "span_mu8_small": ("span_corruption", {"inputs_length": 16, "mean_noise_span_length": 8.0}, 0.3, True),
    "span_tiny": ("span_corruption", {"inputs_length": 3, "noise_density": 0.4}, 0.5, False),
    "bart": ("bart", {"seq_len": 256}, 0.1, False),
    "bart_all_noises": (
        "bart",
        {
            "seq_len": 200,
            "insert": 0.1,
            "rotate": 0.5,
            "token_mask": 0.1,
            "token_delete": 0.1,
            "permute_sentences": 0.5,
        },
        0.2,
        False,
    ),
    "bart_word_rl-1": ("bart", {"seq_len": 128, "mask_length": "word", "replace_length": -1}, 0.2, False),
    "bart_subword_rl0": ("bart", {"seq_len": 128, "mask_length": "subword", "replace_length": 0}, 0.2, False),
    "bart_span_rl-1": ("bart", {"seq_len": 128, "replace_length": -1, "poisson_lambda": 6.0, "mask": 0.5}, 0.2, False),
    "bart_rl0_lambda1": (
        "bart",
        {"seq_len": 96, "replace_length": 0, "poisson_lambda": 1.0, "mask_random": 0.5},
        0.2,
        False,
    ),
    "bart_mask1": ("bart", {"seq_len": 64, "mask": 1.0, "insert": 0.3, "rotate": 1.0}, 0.3, False),
    "ul2": ("ul2", {"inputs_length": 512}, 0.05, False),
    "ul2_t5_ids": ("ul2", {"inputs_length": 512}, 0.05, True),
    "ul2_decoder": ("ul2", {"inputs_length": 256, "layout": "decoder"}, 0.1, False),
    "ul2_paper": ("ul2", {"inputs_length": 256, "mixture": "paper"}, 0.1, False),
    "ul2_paper_decoder": ("ul2", {"inputs_length": 128, "mixture": "paper", "layout": "decoder"}, 0.2, True),
    "ul2_targets": ("ul2", {"inputs_length": 128, "targets_length": 128}, 0.2, False),
    "ul2_small": ("ul2", {"inputs_length": 8}, 0.3, False),
}


def _hash_value(h, value: Any) -> None:
    if isinstance(value, np.ndarray):
        h.update(f"nd:{value.dtype.str}:{value.shape}:".encode())
        h.update(np.ascontiguousarray(value).tobytes())
    else:
        h.update(f"{type(value).__name__}:{value!r}".encode())


def check(names: list[str] | None, examples: int) -> None:
    total = hashlib.blake2b(digest_size=16)
    features_hash = hashlib.blake2b(digest_size=16)
    for name, (objective_name, params, partial, descending) in CHECK_SETS.items():
        if names and name not in names:
            continue
        special = special_ids(descending_sentinels=descending)
        objective = make_objective(objective_name, dict(params))
        workload = Workload(objective, examples, 1 << 30, partial, zlib.crc32(name.encode()))
        h = hashlib.blake2b(digest_size=16)

        def sink(example: dict[str, Any], counters: dict[str, int], h=h) -> None:
            for column in sorted(example):
                h.update(column.encode())
                _hash_value(h, example[column])
            for counter, value in sorted(counters.items()):
                h.update(f"{counter}={type(value).__name__}:{value};".encode())

        start = time.perf_counter()
        build_all(objective, special, workload, sink)
        elapsed = time.perf_counter() - start
        print(f"{name:<20}{h.hexdigest()}  ({examples} examples, {elapsed / examples * 1e6:.0f} us each)")
        total.update(h.digest())
    if not names:
        rng = np.random.default_rng(5)
        for _ in range(200):
            _, features = make_chunk(int(rng.integers(0, 600)), rng)
            for value in features.values():
                _hash_value(features_hash, value)
        print(f"{'(workload)':<20}{features_hash.hexdigest()}")
    print(f"{'TOTAL':<20}{total.hexdigest()}")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--examples", type=int, default=5000, help="examples per objective (timing)")
    parser.add_argument("--rounds", type=int, default=3, help="interleaved timing rounds; the best counts")
    parser.add_argument("--objectives", default=",".join(BENCH_OBJECTIVES), help="comma-separated, timing or check")
    parser.add_argument(
        "--clock", choices=sorted(CLOCKS), default="cpu", help="cpu: this process's CPU time (steadier when shared)"
    )
    parser.add_argument("--against", metavar="CHECKOUT", help="also time another checkout, alternating rounds")
    parser.add_argument("--json", action="store_true", help="print the timings as JSON")
    parser.add_argument("--check", action="store_true", help="print output digests instead of timings")
    parser.add_argument("--check-examples", type=int, default=3000, help="examples per parameter set (--check)")
    args = parser.parse_args(argv)
    names = args.objectives.split(",")
    if args.check:
        check(None if args.objectives == ",".join(BENCH_OBJECTIVES) else names, args.check_examples)
    elif args.against:
        compare(args.against, names, args.examples, args.rounds, args.clock)
    else:
        best = measure(names, args.examples, args.rounds, args.clock)
        if args.json:
            print(json.dumps(best))
        else:
            print_table(best)


if __name__ == "__main__":
    main()
