"""Pinned digests of whole examples: the objectives' outputs must never change by accident.

Datasets already made must stay reproducible: for every objective and several parameter
sets (defaults, UL2's paper preset and decoder layout, whole-word masks, every BART noise,
partial chunks, T5's descending sentinel ids), 120 examples are built the way
``transforms/build.py`` builds them (``build`` with a ``LazyGenerator`` per example key,
then ``stats``), and a blake2b digest of every column, dtype and counter is compared with
the value the code produced when it was pinned. A speed-up that changes one draw, one
dtype or one counter fails here. Only public APIs are used, so the same test can be run
on an older checkout to re-derive the pins.
"""

from __future__ import annotations

import hashlib
import inspect
import zlib
from typing import Any

import numpy as np
import pytest

from transforms.objectives.common import LazyGenerator, SpecialIds
from transforms.objectives.layout import plan_rng
from transforms.objectives.registry import make_objective

SEED = 1234
VOCAB = 32000
MODES = ("[R]", "[S]", "[X]", "[NLU]", "[NLG]", "[S2S]")
EXAMPLES = 120


def special_ids(descending: bool) -> SpecialIds:
    """pad 0, eos 1, unk 2, bos 3, mask 4, cls 5, sep 6; 200 sentinels and 6 mode tokens after the vocabulary."""
    sentinels = tuple(VOCAB + 199 - k for k in range(200)) if descending else tuple(VOCAB + k for k in range(200))
    return SpecialIds(
        vocab_size=VOCAB + 206,
        pad=0,
        eos=1,
        bos=3,
        unk=2,
        mask=4,
        cls=5,
        sep=6,
        sentinels=sentinels,
        mode_tokens={token: VOCAB + 200 + i for i, token in enumerate(MODES)},
        all_special=frozenset(range(7)),
    )


def packed_chunk(length: int, rng: np.random.Generator) -> tuple[np.ndarray, dict[str, np.ndarray]]:
    """Documents of ~60 tokens ended by EOS, word starts on ~3/4 of the tokens, sentences every ~12."""
    tokens = rng.integers(7, VOCAB, size=length).astype(np.int32)
    word_starts = rng.random(length) < 0.75
    sentence_starts = rng.random(length) < 0.08
    doc_lengths, position = [], 0
    while position < length:
        doc = min(int(rng.geometric(1 / 60)), length - position)
        position += doc
        tokens[position - 1] = 1
        doc_lengths.append(doc)
    return tokens, {
        "word_starts": word_starts,
        "sentence_starts": sentence_starts,
        "doc_lengths": np.asarray(doc_lengths, dtype=np.int32),
    }


def _update(digest: Any, value: Any) -> None:
    if isinstance(value, np.ndarray):
        digest.update(f"nd:{value.dtype.str}:{value.shape}:".encode())
        digest.update(np.ascontiguousarray(value).tobytes())
    else:
        digest.update(f"{type(value).__name__}:{value!r}".encode())


def examples_digest(name: str, objective_name: str, params: dict[str, Any], partial: float, descending: bool) -> str:
    special = special_ids(descending)
    objective = make_objective(objective_name, dict(params))
    takes_special = len(inspect.signature(objective.stats).parameters) >= 2
    rng = np.random.default_rng(zlib.crc32(name.encode()))
    digest = hashlib.blake2b(digest_size=16)
    for index in range(EXAMPLES):
        chunk_key = f"train-{name}-c{index}"
        length, plan = objective.plan_chunk(plan_rng(SEED, chunk_key))
        if rng.random() < partial:
            length = int(rng.integers(1, length + 1))
        tokens, features = packed_chunk(length, rng)
        key = f"{chunk_key}-d0"
        try:
            example = objective.build(tokens, LazyGenerator(SEED, key), plan, special, features)
        except ValueError as error:
            _update(digest, f"error {error}")
            continue
        counters = objective.stats(example, special) if takes_special else objective.stats(example)
        example.pop("_stats", None)
        for column in sorted(example):
            digest.update(column.encode())
            _update(digest, example[column])
        for counter, value in sorted(counters.items()):
            digest.update(f"{counter}={type(value).__name__}:{value};".encode())
    return digest.hexdigest()


# name: (objective, params, share of partial chunks, T5's descending sentinel ids, pinned digest)
CASES: dict[str, tuple[str, dict[str, Any], float, bool, str]] = {
    "clm": ("clm", {"seq_len": 128}, 0.1, False, "653f29e2dae34191d1bf72401e02296c"),
    "prefix_lm": ("prefix_lm", {"seq_len": 128}, 0.3, False, "9c9beb91ecf7010df88df91905494db7"),
    "mlm": ("mlm", {"seq_len": 128}, 0.2, False, "e8e252293035df9abfb51bbc6d9d2fd3"),
    "mlm_wwm": ("mlm", {"seq_len": 128, "whole_word_mask": True}, 0.2, False, "db934c6ea488d0bfb4e08c79e7c00dbe"),
    "mlm_frame": (
        "mlm",
        {
            "seq_len": 96,
            "whole_word_mask": True,
            "frame": True,
            "mask_ratio": 0.5,
            "random_ratio": 0.3,
            "keep_ratio": 0.2,
        },
        0.3,
        False,
        "0d492ef1cf4a873a07e7f4de9502cc0c",
    ),
    "span": ("span_corruption", {"inputs_length": 128}, 0.2, False, "c7a70d841aa81e4e84ac670849fa7cb4"),
    "span_t5_ids": (
        "span_corruption",
        {"inputs_length": 128, "noise_density": 0.5, "mean_noise_span_length": 2.0},
        0.2,
        True,
        "13bce7f3dbec143131df00cd9b415bae",
    ),
    "bart": ("bart", {"seq_len": 128}, 0.2, False, "4b4710ca598eb778aed930546d4ad6b2"),
    "bart_all_noises": (
        "bart",
        {
            "seq_len": 96,
            "insert": 0.1,
            "rotate": 0.5,
            "token_mask": 0.1,
            "token_delete": 0.1,
            "permute_sentences": 0.5,
            "mask_random": 0.3,
        },
        0.2,
        False,
        "1316fa7a93514832211b673f755b1fe5",
    ),
    "bart_word_rl-1": (
        "bart",
        {"seq_len": 96, "mask_length": "word", "replace_length": -1, "mask_random": 0.5},
        0.2,
        False,
        "0a01129eaca05e9721fa32a603935159",
    ),
    "bart_span_rl-1": (
        "bart",
        {"seq_len": 96, "replace_length": -1, "poisson_lambda": 6.0, "mask": 0.5, "mask_random": 0.5},
        0.2,
        False,
        "cb54bd14f03b6d84b1472f7dc0438a64",
    ),
    "bart_subword_rl0": (
        "bart",
        {"seq_len": 96, "mask_length": "subword", "replace_length": 0, "insert": 0.2},
        0.2,
        False,
        "22acdd40a6a0045ff46c22427f187303",
    ),
    "ul2": ("ul2", {"inputs_length": 128}, 0.2, False, "c4e0378e6c14cf7dd963cdfa694d3102"),
    "ul2_paper_decoder": (
        "ul2",
        {"inputs_length": 96, "mixture": "paper", "layout": "decoder"},
        0.2,
        True,
        "c4d601116a6c9fb8b19589783ed18a4e",
    ),
    "ul2_targets": ("ul2", {"inputs_length": 96, "targets_length": 96}, 0.2, False, "9e626b04cb979400e04209de7bd376ed"),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_examples_match_pinned_digest(name):
    objective_name, params, partial, descending, pinned = CASES[name]
    assert examples_digest(name, objective_name, params, partial, descending) == pinned


if __name__ == "__main__":  # print the digests (to pin them on a checkout whose outputs are the reference)
    for case_name, (objective_name, params, partial, descending, _) in CASES.items():
        print(f"{case_name:<20}{examples_digest(case_name, objective_name, params, partial, descending)}")
