"""The objective flags of ``lmshards materialize``, generated from the config fields (transforms/objectives/flags.py).

The built-in objectives' table is pinned: it is what users type and read in ``--help``, and it
must stay what the hand-written table before it said (same flags, parameters, types,
objectives and defaults; floats now show as written in the config, ``3.0`` for ``3``).
"""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from transforms.objectives.flags import flag, objective_flags
from transforms.objectives.registry import OBJECTIVES

_LM = ("clm", "prefix_lm", "mlm", "bart")
BUILT_IN = [
    ("--seq-len", "seq_len", int, _LM, "tokens per example (clm/prefix_lm 1024, mlm/bart 512)"),
    ("--mlm-probability", "mlm_probability", float, ("mlm",), "share of tokens selected (0.15)"),
    ("--mask-ratio", "mask_ratio", float, ("mlm",), "selected tokens replaced by the mask token (0.8)"),
    ("--random-ratio", "random_ratio", float, ("mlm",), "selected tokens replaced by a random token (0.1)"),
    ("--keep-ratio", "keep_ratio", float, ("mlm",), "selected tokens left unchanged (0.1)"),
    ("--whole-word-mask", "whole_word_mask", bool, ("mlm",), "select whole words (pre-tokenizer words)"),
    ("--frame", "frame", bool, ("mlm",), "frame each example with CLS ... SEP"),
    ("--max-predictions", "max_predictions", int, ("mlm",),
     "cap on selected tokens per example (BERT's max_predictions_per_seq; default: no cap)"),
    ("--inputs-length", "inputs_length", int, ("span_corruption", "ul2"), "encoder input tokens (512)"),
    ("--noise-density", "noise_density", float, ("span_corruption",), "share of noised tokens (0.15)"),
    ("--mean-noise-span-length", "mean_noise_span_length", float, ("span_corruption",), "mean span length (3.0)"),
    ("--bart-mask", "mask", float, ("bart",), "share of words masked by text infilling (0.3)"),
    ("--bart-mask-random", "mask_random", float, ("bart",), "share of masks that are random tokens (0.1)"),
    ("--bart-insert", "insert", float, ("bart",), "random insertion rate (0.0)"),
    ("--bart-rotate", "rotate", float, ("bart",), "document rotation probability (0.0)"),
    ("--bart-permute-sentences", "permute_sentences", float, ("bart",), "share of sentences permuted (1.0)"),
    ("--bart-replace-length", "replace_length", int, ("bart",), "-1 keep length, 0 delete, 1 one mask (1)"),
    ("--bart-mask-length", "mask_length", str, ("bart",), "span-poisson, word or subword (span-poisson)"),
    ("--bart-poisson-lambda", "poisson_lambda", float, ("bart",), "mean span length (3.5)"),
    ("--bart-token-mask", "token_mask", float, ("bart",), "token masking rate (0.0)"),
    ("--bart-token-delete", "token_delete", float, ("bart",), "token deletion rate (0.0)"),
    ("--targets-length", "targets_length", int, ("ul2",), "ul2 targets budget (default: what the mixture needs)"),
    ("--ul2-preset", "mixture", str, ("ul2",), "denoiser mixture: default or paper (custom: --config)"),
    ("--layout", "layout", str, ("ul2",), "encoder_decoder or decoder"),
]


#: The objectives the pinned table covers (another objective adds flags of its own, or shares one).
PINNED = frozenset(name for row in BUILT_IN for name in row[3])


def test_the_built_in_flags_are_the_command_line_users_know():
    built_in = [name for name in OBJECTIVES if name in PINNED]  # in registration order, as the CLI merges them
    assert sorted(built_in) == sorted(PINNED)
    assert [tuple(f) for f in objective_flags((name, OBJECTIVES[name].config_class) for name in built_in)] == BUILT_IN


def test_the_command_line_has_every_pinned_flag_whatever_else_is_registered():
    from transforms.objectives.registry import objective_flags as registered_flags

    flags = {f.flag: f for f in registered_flags()}
    for name, field, kind, objectives, _ in BUILT_IN:
        assert (flags[name].dest, flags[name].kind) == (field, kind), name
        assert [o for o in flags[name].objectives if o in PINNED] == list(objectives), name


def test_flags_merge_by_name_listing_each_objective_s_default():
    @dataclass(frozen=True)
    class A:
        length: int = flag(8, "tokens")
        rate: float | None = flag(None, "a rate", shown_default="default: none")
        hidden: int = 3  # a --config parameter only

    @dataclass(frozen=True)
    class B:
        length: int = flag(16, "tokens")

    @dataclass(frozen=True)
    class C:
        length: int = flag(8, "tokens")

    assert [tuple(f) for f in objective_flags([("a", A), ("b", B), ("c", C)])] == [
        ("--length", "length", int, ("a", "b", "c"), "tokens (a/c 8, b 16)"),
        ("--rate", "rate", float, ("a",), "a rate (default: none)"),
    ]
    assert [f.help for f in objective_flags([("a", A), ("c", C)])][0] == "tokens (8)"


def test_a_flag_two_objectives_read_differently_or_without_a_type_is_refused():
    @dataclass(frozen=True)
    class A:
        length: int = flag(8, "tokens")

    @dataclass(frozen=True)
    class B:
        length: float = flag(8.0, "tokens")

    @dataclass(frozen=True)
    class Untyped:
        spec: object = flag(None, "anything")

    with pytest.raises(TypeError, match=r"objective b: flag --length sets length \(float, 'tokens'\); another "
                                        r"objective declares it as length \(int, 'tokens'\)"):
        objective_flags([("a", A), ("b", B)])
    with pytest.raises(TypeError, match="flag of field spec .* needs kind=int/float/bool/str"):
        objective_flags([("u", Untyped)])
