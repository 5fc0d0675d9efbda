"""Per-example cost of each objective alone, and a digest of their outputs to prove changes exact.

Builds examples the way the pipeline's builder does (:class:`transforms.building.parallel.ChunkBuilder`):
blocks of :data:`BLOCK` rows, each row's noise keyed by its example key
(:func:`transforms.objectives.layout.example_digests`), one
``objective.build(Block, special)`` call per block. The chunks are real text: the bundled
sample corpus tokenized with the project's tokenizer (documents ended by EOS, packed end to
end), with the per-token features Tokenize computes (``word_starts``, ``space_starts``,
``sentence_starts``), cut at each objective's planned raw length for 512-token examples
(UL2 plans its denoiser per chunk key, as the packer does).

Modes:

- timing (default): microseconds per example for each objective, the key digests and the
  randomness included, and a ``copy`` baseline (digests plus laying the block out: the least
  any objective does). Rounds are interleaved and the best round of each objective counts;
  ``--clock cpu`` (the default) measures this process's CPU time, steadier than wall time on a
  shared machine. Only ratios of one run mean much. The process first allocates and frees a
  16 MB buffer, as every pipeline worker has done long before it builds examples (an encoder
  batch is that big): glibc's malloc then keeps freed blocks of that size instead of handing
  them back to the system, where a fresh process pays page faults for every new array of a
  few hundred KB (about five times the cost of numpy's arithmetic on it).
- ``--against CHECKOUT``: the same timings for this checkout and another one (e.g. the commit
  before a change, exported with ``git archive COMMIT | tar -x -C /tmp/before``), alternating
  rounds in fresh processes so both see the same load; prints before/after and the speed-up.
  A checkout from before the batch-first protocol is timed through its own fast
  path: ``example_rngs`` then ``build_many`` (``build_block`` for clm) on the same blocks.
- ``--check``: builds thousands of examples per parameter set (defaults, paper preset,
  decoder layout, whole-word masks, every BART noise, partial chunks, T5's descending
  sentinel ids, ...) and prints a blake2b digest of every column, dtype and counter (and of
  every error message) per set, plus a total. Run it on two checkouts and compare the
  digests to show that outputs are byte-identical.

    python -m benchmarks.bench_objectives --examples 5000
    python -m benchmarks.bench_objectives --examples 3000 --against /tmp/before
    python -m benchmarks.bench_objectives --check --check-examples 3000
"""

from __future__ import annotations

import argparse
import functools
import glob
import hashlib
import json
import os
import subprocess
import sys
import time
import zlib
from typing import Any

import numpy as np

from transforms.objectives.common import SpecialIds
from transforms.objectives.packing import Piece
from transforms.objectives.registry import make_objective

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SEED = 1234
#: Rows per block, as the pipeline's builder (transforms/building/parallel.py BLOCK_ROWS) makes them.
BLOCK = 512
MODES = ("[R]", "[S]", "[X]", "[NLU]", "[NLG]", "[S2S]")
FEATURES = ("word_starts", "space_starts", "sentence_starts")


@functools.lru_cache(maxsize=1)
def corpus() -> tuple[np.ndarray, dict[str, np.ndarray], int]:
    """The sample corpus as one stream of ids (documents ended by EOS), its features and the
    vocabulary size of the project's tokenizer."""
    from tokenizers import Tokenizer

    from transforms.objectives.packing import concat_documents
    from transforms.tokenizing.tokenize import TokenFeatures

    tokenizer = Tokenizer.from_file(os.path.join(ROOT, "data", "tokenizer.json"))
    features = TokenFeatures(tokenizer, {"word_starts", "sentence_starts"})
    # space_starts as Tokenize makes them for a byte-level BPE (computed here, so that a checkout
    # from before that feature can be timed on the same chunks): a table per id
    spaces = np.zeros(tokenizer.get_vocab_size(with_added_tokens=True), dtype=bool)
    for token, index in tokenizer.get_vocab(with_added_tokens=True).items():
        spaces[index] = token.startswith("\u0120")
    for index, added in tokenizer.get_added_tokens_decoder().items():
        spaces[index] = added.special
    texts = [json.loads(line)["text"] for path in sorted(glob.glob(os.path.join(ROOT, "data", "sample", "*.jsonl")))
             for line in open(path)]
    documents = []
    for text, encoding in zip(texts, tokenizer.encode_batch(texts, add_special_tokens=False)):
        ids = np.asarray(encoding.ids, dtype=np.int32)
        if ids.size:
            documents.append((ids, {**features.of(text, ids), "space_starts": spaces[ids]}))
    stream = concat_documents(documents, tokenizer.token_to_id("</s>") if tokenizer.token_to_id("</s>") else 0)
    return stream.tokens, stream.features, tokenizer.get_vocab_size(with_added_tokens=True)


def special_ids(descending_sentinels: bool = False, num_sentinels: int = 200) -> SpecialIds:
    """The project tokenizer's specials (pad 0 ... as resolved by the pipeline) plus sentinels
    and UL2 mode tokens added after its vocabulary."""
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(os.path.join(ROOT, "data", "tokenizer.json"))
    vocab = tokenizer.get_vocab_size(with_added_tokens=True)
    specials = {index for index, added in tokenizer.get_added_tokens_decoder().items() if added.special}
    role = {name: tokenizer.token_to_id(token) for name, token in
            (("pad", "<pad>"), ("eos", "</s>"), ("bos", "<s>"), ("unk", "<unk>"), ("mask", "<mask>"))}
    if descending_sentinels:  # T5's layout: <extra_id_0> is the last id
        sentinels = tuple(vocab + num_sentinels - 1 - k for k in range(num_sentinels))
    else:
        sentinels = tuple(vocab + k for k in range(num_sentinels))
    modes = {token: vocab + num_sentinels + i for i, token in enumerate(MODES)}
    return SpecialIds(vocab_size=vocab + num_sentinels + len(MODES), pad=role["pad"], eos=role["eos"],
                      bos=role["bos"], unk=role["unk"], mask=role["mask"], cls=role["bos"], sep=role["eos"],
                      sentinels=sentinels, mode_tokens=modes, all_special=frozenset(specials))


def _legacy(objective) -> bool:
    """Whether ``objective`` is from a checkout before the batch-first protocol."""
    return hasattr(objective, "plan_chunk")


class Workload:
    """Chunks, keys and plans for one objective, planned as the packer plans them.

    Chunks are consecutive windows of the corpus stream; ``partial`` of them are cut short.
    """

    def __init__(self, objective, count: int, partial: float, seed: int) -> None:
        tokens, features, _ = corpus()
        rng = np.random.default_rng(seed)
        chunk_keys = [f"train-b{seed:05d}-c{index:06d}" for index in range(count)]
        if _legacy(objective):
            from transforms.objectives.layout import plan_rng

            plans = [objective.plan_chunk(plan_rng(SEED, key)) for key in chunk_keys]
        else:
            from transforms.objectives.layout import plan_uniforms

            lengths, plan_ids = objective.plan(plan_uniforms(SEED, chunk_keys))
            plans = list(zip(lengths.tolist(), plan_ids.tolist()))
        self.items = []
        start = 0
        # the old bart took the pre-tokenizer's words, as the pipeline then fed it
        names = sorted(objective.features)
        for key, (length, plan) in zip(chunk_keys, plans):
            if partial and rng.random() < partial:
                length = int(rng.integers(1, length + 1))
            if start + length > tokens.shape[0]:
                start = 0
            window = slice(start, start + length)
            piece = Piece(tokens[window], np.array([length], dtype=np.int32),
                          {name: features[name][window] for name in names})
            self.items.append((f"{key}-d0", int(plan), piece))
            start += length
        self.blocks = [self.items[i: i + BLOCK] for i in range(0, len(self.items), BLOCK)]


def build_blocks(objective, special: SpecialIds, workload: Workload, sink=None) -> None:
    """Every block of the workload through the objective, as the pipeline's builder does."""
    if _legacy(objective):
        _build_blocks_legacy(objective, special, workload)
        return
    from transforms.objectives.base import Block
    from transforms.objectives.layout import example_digests

    for items in workload.blocks:
        keys = [key for key, _, _ in items]
        digests = example_digests(SEED, keys)
        block = Block.of_rows([piece for _, _, piece in items], [plan for _, plan, _ in items], digests.randoms)
        if objective is None:  # the copy baseline
            continue
        if sink is None:
            objective.build(block, special)
            continue
        try:
            built = objective.build(block, special)
        except ValueError as error:  # hashed too: errors must stay the same
            sink(keys, None, str(error))
            continue
        sink(keys, built, None)


def _build_blocks_legacy(objective, special: SpecialIds, workload: Workload) -> None:
    """The old builder's fast paths, in its block sizes: ``build_block`` for clm (BLOCK_CHUNKS
    chunks), ``build_many`` for the others (MANY_ROWS rows, its generators seeded together)."""
    from transforms.building.parallel import BLOCK_CHUNKS, MANY_ROWS
    from transforms.objectives.common import example_rngs

    items = [item for block in workload.blocks for item in block]
    size = BLOCK_CHUNKS if hasattr(objective, "build_block") else MANY_ROWS
    for start in range(0, len(items), size):
        part = items[start: start + size]
        if hasattr(objective, "build_block"):
            tokens = np.stack([piece.tokens for _, _, piece in part])
            objective.build_block(tokens, [piece.doc_lengths for _, _, piece in part])
            continue
        objective.build_many([piece for _, _, piece in part], [plan for _, plan, _ in part],
                             example_rngs(SEED, [key for key, _, _ in part]), special)


BENCH_OBJECTIVES: dict[str, tuple[str, dict[str, Any]]] = {
    "clm": ("clm", {"seq_len": 512}),
    "prefix_lm": ("prefix_lm", {"seq_len": 512}),
    "mlm": ("mlm", {"seq_len": 512}),
    "mlm_wwm": ("mlm", {"seq_len": 512, "whole_word_mask": True}),
    "span_corruption": ("span_corruption", {"inputs_length": 512}),
    "bart": ("bart", {"seq_len": 512}),
    "ul2": ("ul2", {"inputs_length": 512}),
    "ul2_decoder": ("ul2", {"inputs_length": 512, "layout": "decoder"}),
}

CLOCKS = {"cpu": time.process_time, "wall": time.perf_counter}


def warm_allocator() -> None:
    """Allocate, touch and free 16 MB (see the module docstring: malloc's thresholds adapt)."""
    buffer = np.ones(16 << 20, dtype=np.uint8)
    buffer[::4096] = 2
    del buffer


def measure(names: list[str], examples: int, rounds: int, clock: str) -> dict[str, float]:
    """Best microseconds per example of ``copy`` and each named objective."""
    warm_allocator()
    special = special_ids(num_sentinels=128)
    objectives: dict[str, Any] = {}
    for name in names:
        objective_name, params = BENCH_OBJECTIVES[name]
        objectives[name] = make_objective(objective_name, dict(params))
    workloads = {name: Workload(obj, examples, 0.0, 7) for name, obj in objectives.items()}
    if not _legacy(objectives[names[0]]):
        objectives = {"copy": None, **objectives}
        workloads["copy"] = workloads[names[0]]
    timer = CLOCKS[clock]
    best = dict.fromkeys(objectives, float("inf"))
    for _ in range(rounds):
        for name, objective in objectives.items():
            start = timer()
            build_blocks(objective, special, workloads[name])
            best[name] = min(best[name], (timer() - start) / examples * 1e6)
    return best


def print_table(best: dict[str, float]) -> None:
    print(f"{'objective':<18}{'us/example':>12}{'x copy':>9}{'x clm':>8}")
    for name, micros in best.items():
        versus_clm = f"{micros / best['clm']:8.2f}" if "clm" in best else ""
        versus_copy = f"{micros / best['copy']:9.2f}" if "copy" in best else ""
        print(f"{name:<18}{micros:12.1f}{versus_copy}{versus_clm}")


def compare(other: str, names: list[str], examples: int, rounds: int, clock: str) -> None:
    """This checkout against ``other``, alternating one round each in fresh processes so that
    both see the same load; best round each."""
    script = os.path.abspath(__file__)
    best: dict[str, dict[str, float]] = {"before": {}, "after": {}}
    for _ in range(rounds):
        for side, root in (("before", other), ("after", ROOT)):
            command = [sys.executable, script, "--json", "--rounds", "1", "--clock", clock]
            command += ["--examples", str(examples), "--objectives", ",".join(names)]
            env = {**os.environ, "PYTHONPATH": os.path.abspath(root)}
            result = json.loads(subprocess.run(command, env=env, cwd=ROOT, check=True, capture_output=True).stdout)
            for name, micros in result.items():
                best[side][name] = min(best[side].get(name, float("inf")), micros)
    before, after = best["before"], best["after"]
    print(f"us per 512-token example ({clock} time), best of {rounds} alternating rounds; before = {other}")
    print(f"{'objective':<18}{'before':>9}{'after':>9}{'speed-up':>10}")
    for name in names:
        print(f"{name:<18}{before[name]:9.1f}{after[name]:9.1f}{before[name] / after[name]:10.2f}")
    if "copy" in after:
        print(f"{'copy (after)':<18}{'':>9}{after['copy']:9.1f}")


# name -> (objective, params, partial share, descending sentinels)
CHECK_SETS: dict[str, tuple[str, dict[str, Any], float, bool]] = {
    "clm": ("clm", {"seq_len": 256}, 0.1, False),
    "prefix_lm": ("prefix_lm", {"seq_len": 256}, 0.2, False),
    "mlm": ("mlm", {"seq_len": 256}, 0.1, False),
    "mlm_wwm": ("mlm", {"seq_len": 256, "whole_word_mask": True}, 0.1, False),
    "mlm_frame_wwm": ("mlm", {"seq_len": 128, "whole_word_mask": True, "frame": True}, 0.2, False),
    "mlm_ratios": (
        "mlm",
        {"seq_len": 200, "mlm_probability": 0.3, "mask_ratio": 0.5, "random_ratio": 0.3, "keep_ratio": 0.2,
         "max_predictions": 40},
        0.2,
        False,
    ),
    "span": ("span_corruption", {"inputs_length": 512}, 0.05, False),
    "span_t5_ids": ("span_corruption", {"inputs_length": 512}, 0.05, True),
    "span_r50": ("span_corruption", {"inputs_length": 128, "noise_density": 0.5, "mean_noise_span_length": 3.0},
                 0.2, False),
    "span_mu8_small": ("span_corruption", {"inputs_length": 16, "mean_noise_span_length": 8.0}, 0.3, True),
    "span_tiny": ("span_corruption", {"inputs_length": 3, "noise_density": 0.4}, 0.5, False),
    "bart": ("bart", {"seq_len": 256}, 0.1, False),
    "bart_all_noises": (
        "bart",
        {"seq_len": 200, "insert": 0.1, "rotate": 0.5, "token_mask": 0.1, "token_delete": 0.1,
         "permute_sentences": 0.5},
        0.2,
        False,
    ),
    "bart_word_rl-1": ("bart", {"seq_len": 128, "mask_length": "word", "replace_length": -1}, 0.2, False),
    "bart_subword_rl0": ("bart", {"seq_len": 128, "mask_length": "subword", "replace_length": 0}, 0.2, False),
    "bart_span_rl-1": ("bart", {"seq_len": 128, "replace_length": -1, "poisson_lambda": 6.0, "mask": 0.5}, 0.2, False),
    "bart_rl0_lambda1": ("bart", {"seq_len": 96, "replace_length": 0, "poisson_lambda": 1.0, "mask_random": 0.5},
                         0.2, False),
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
    for name, (objective_name, params, partial, descending) in CHECK_SETS.items():
        if names and name not in names:
            continue
        special = special_ids(descending_sentinels=descending)
        objective = make_objective(objective_name, dict(params))
        workload = Workload(objective, examples, partial, zlib.crc32(name.encode()))
        h = hashlib.blake2b(digest_size=16)

        def sink(keys, built, error, h=h) -> None:
            h.update("\0".join(keys).encode())
            if error is not None:
                h.update(f"error {error}".encode())
                return
            for group in (built.arrays, built.scalars, built.strings):
                for column in sorted(group):
                    h.update(column.encode())
                    value = group[column]
                    for part in (value if isinstance(value, tuple) else (value,)):
                        _hash_value(h, part if isinstance(part, np.ndarray) else np.asarray(part))
            for counter, value in sorted(built.counters.items()):
                h.update(f"{counter}={type(value).__name__}:{value};".encode())

        start = time.perf_counter()
        build_blocks(objective, special, workload, sink)
        elapsed = time.perf_counter() - start
        print(f"{name:<20}{h.hexdigest()}  ({examples} examples, {elapsed / examples * 1e6:.0f} us each)")
        total.update(h.digest())
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
