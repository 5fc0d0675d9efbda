"""Pinned digests of whole examples: the objectives' outputs must never change by accident.

Datasets already made must stay reproducible: for every objective and several parameter
sets (defaults, UL2's paper preset and decoder layout, whole-word masks, every BART noise,
partial chunks, T5's descending sentinel ids), 120 examples are built the way the pipeline's
builder (:class:`transforms.building.parallel.ChunkBuilder`) builds them: planned from their chunk keys,
in blocks (of 37 rows here), each row's noise keyed by its example key. A blake2b digest of
every row's columns and dtypes and of the summed counters is compared with the value the code
produced when it was pinned; building all rows as one block must give the same digest. A
speed-up that changes one draw, one dtype or one counter fails here. Only public APIs are
used, so the same test can be run on an older checkout of the same protocol to re-derive the pins.
"""

from __future__ import annotations

import hashlib
import zlib
from typing import Any

import numpy as np
import pytest

from transforms.objectives.base import Block
from transforms.objectives.common import SpecialIds
from transforms.objectives.counters import add_counters
from transforms.objectives.layout import example_digests, plan_uniforms
from transforms.objectives.packing import Piece
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
        "space_starts": word_starts & (rng.random(length) < 0.6),
        "sentence_starts": sentence_starts,
        "doc_lengths": np.asarray(doc_lengths, dtype=np.int32),
    }


def _update(digest: Any, value: Any) -> None:
    if isinstance(value, np.ndarray):
        digest.update(f"nd:{value.dtype.str}:{value.shape}:".encode())
        digest.update(np.ascontiguousarray(value).tobytes())
    else:
        digest.update(f"{type(value).__name__}:{value!r}".encode())


def examples_digest(name: str, objective_name: str, params: dict[str, Any], partial: float, descending: bool,
                    block_rows: int = 37) -> str:
    special = special_ids(descending)
    objective = make_objective(objective_name, dict(params))
    rng = np.random.default_rng(zlib.crc32(name.encode()))
    chunk_keys = [f"train-{name}-c{index}" for index in range(EXAMPLES)]
    lengths, plans = objective.plan(plan_uniforms(SEED, chunk_keys))
    pieces = []
    for length in lengths.tolist():
        if rng.random() < partial:
            length = int(rng.integers(1, length + 1))
        tokens, features = packed_chunk(length, rng)
        pieces.append(Piece(tokens, features.pop("doc_lengths"), features))
    keys = [f"{key}-d0" for key in chunk_keys]
    digest = hashlib.blake2b(digest_size=16)
    counters: dict[str, int] = {}
    for start in range(0, EXAMPLES, block_rows):
        rows = slice(start, start + block_rows)
        block = Block.of_rows(pieces[rows], plans[rows], example_digests(SEED, keys[rows]).randoms)
        try:
            built = objective.build(block, special)
        except ValueError as error:
            _update(digest, f"error {error}")
            continue
        add_counters(counters, built.counters)
        for row in range(block.count):
            for column, (values, offsets) in sorted(built.arrays.items()):
                digest.update(column.encode())
                _update(digest, values[offsets[row]: offsets[row + 1]])
            for column, values in sorted({**built.scalars, **built.strings}.items()):
                digest.update(column.encode())
                _update(digest, values[row])
    for counter, value in sorted(counters.items()):
        digest.update(f"{counter}={type(value).__name__}:{value};".encode())
    return digest.hexdigest()


# name: (objective, params, share of partial chunks, T5's descending sentinel ids, pinned digest)
CASES: dict[str, tuple[str, dict[str, Any], float, bool, str]] = {
    "clm": ("clm", {"seq_len": 128}, 0.1, False, "5b9afeecde6c2559c3cd6c23d5a9ae82"),
    "prefix_lm": ("prefix_lm", {"seq_len": 128}, 0.3, False, "68cc0d7d41f5816d88d8f4a7d0b61fba"),
    "mlm": ("mlm", {"seq_len": 128}, 0.2, False, "f8979f5ba190c61b369e6ec8e91fed49"),
    "mlm_wwm": ("mlm", {"seq_len": 128, "whole_word_mask": True}, 0.2, False, "cd799bc0f0e718f32053d4dcf048679d"),
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
        "47442b1c3950fefbc8286d9468f2ff49",
    ),
    "mlm_capped": ("mlm", {"seq_len": 128, "max_predictions": 12, "frame": True}, 0.2, False,
                   "809eac20fde0d1d2c3ffa7f44c7b1291"),
    "span": ("span_corruption", {"inputs_length": 128}, 0.2, False, "43fc73dd935058948bf92df7d961822d"),
    "span_t5_ids": (
        "span_corruption",
        {"inputs_length": 128, "noise_density": 0.5, "mean_noise_span_length": 2.0},
        0.2,
        True,
        "d680d9c63e09f6ea8c4f6ff1671be565",
    ),
    "bart": ("bart", {"seq_len": 128}, 0.2, False, "9a5b43c190aed181d6ad28d501c22658"),
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
        "bc8e9374cb3cb67d9b5bdbe4a5d11f05",
    ),
    "bart_word_rl-1": (
        "bart",
        {"seq_len": 96, "mask_length": "word", "replace_length": -1, "mask_random": 0.5},
        0.2,
        False,
        "d854bbb838fb0b56db1f909b2ae1de1f",
    ),
    "bart_span_rl-1": (
        "bart",
        {"seq_len": 96, "replace_length": -1, "poisson_lambda": 6.0, "mask": 0.5, "mask_random": 0.5},
        0.2,
        False,
        "1112b068d2e82ef8588e7a15ece3764b",
    ),
    "bart_subword_rl0": (
        "bart",
        {"seq_len": 96, "mask_length": "subword", "replace_length": 0, "insert": 0.2},
        0.2,
        False,
        "0edf1f9591cebff988816077a3f9a0fb",
    ),
    "ul2": ("ul2", {"inputs_length": 128}, 0.2, False, "6548a1ad9e787895a4a1c712816ec998"),
    "ul2_paper_decoder": (
        "ul2",
        {"inputs_length": 96, "mixture": "paper", "layout": "decoder"},
        0.2,
        True,
        "12c4c531b84876e2ce634b6447941dcd",
    ),
    "ul2_targets": ("ul2", {"inputs_length": 96, "targets_length": 96}, 0.2, False, "b8fb4df1d57b3c18c72b19725c1c9cdf"),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_examples_match_pinned_digest(name):
    objective_name, params, partial, descending, pinned = CASES[name]
    found = examples_digest(name, objective_name, params, partial, descending)
    assert found == examples_digest(name, objective_name, params, partial, descending, block_rows=EXAMPLES)
    assert found == pinned


if __name__ == "__main__":  # print the digests (to pin them on a checkout whose outputs are the reference)
    for case_name, (objective_name, params, partial, descending, _) in CASES.items():
        print(f"{case_name:<20}{examples_digest(case_name, objective_name, params, partial, descending)}")
