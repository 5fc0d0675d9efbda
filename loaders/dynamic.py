"""Dynamic noise: an objective of :mod:`transforms.objectives` applied while loading.

A tokens dataset (the ``decoder`` family: ``clm`` chunks with ``input_ids`` and
``doc_lengths``) is turned into examples of any objective on the fly, like RoBERTa's
dynamic masking: each example's noise is counter-based, keyed by ``(seed, example key,
epoch)`` (:func:`transforms.objectives.layout.example_randoms`), so every epoch sees new
noise, and a sample gets the same noise whichever rank, worker or resume produced it. The
objective is used only through its protocol (:class:`transforms.objectives.base.Objective`),
as the pipeline uses it: ``plan`` gives the raw length (UL2 draws its denoiser first, from
the number :func:`~transforms.objectives.layout.plan_uniforms` gives the key and epoch), the
first ``raw_length`` real tokens of the stored chunk are cut (fewer when the chunk is shorter:
the objective pads a short chunk as it does for a split's last chunk), and ``build`` makes the
example as a block of one (:func:`~transforms.objectives.base.build_example`).

Objectives that need per-token features (BART's sentence and word starts, MLM with whole
word masking) cannot run on stored tokens, which keep no such features; they fail at
construction with a message that says so.
"""

from __future__ import annotations

import os
import warnings
from typing import Any

import numpy as np

from loaders.errors import UnsupportedSchemaError
from schemas.errors import ConfigError
from transforms.objectives.base import build_example
from transforms.objectives.common import SpecialIds
from transforms.objectives.layout import example_randoms, plan_uniforms
from transforms.objectives.registry import make_objective, objective_class

__all__ = ["DynamicObjective", "fit_length", "max_raw_length", "resolve_objective",
           "special_ids_from_tokenizer"]


def length_parameter(name: str) -> str | None:
    """The parameter that sizes objective ``name`` (its raw chunk length follows from it):
    the class's ``length_parameter``.

    Raises:
        ValueError: unknown objective.
    """
    return objective_class(name).length_parameter


def max_raw_length(objective: Any) -> int:
    """The longest raw chunk an objective cuts (UL2: over its denoisers)."""
    return max(int(length) for length in objective.raw_lengths)


def fit_length(name: str, params: dict[str, Any], chunk_length: int) -> int:
    """The largest value of ``name``'s length parameter whose raw chunks fit ``chunk_length`` tokens.

    E.g. 128-token chunks: mlm ``seq_len`` 128 (130 with ``frame``), span_corruption
    ``inputs_length`` 116 (128 raw tokens), ul2 (default mixture) ``inputs_length`` 67; 568-token
    chunks: span_corruption 512 (T5's 512 -> 568).

    Raises:
        ValueError: no valid value fits (chunks too short for the objective).
    """
    parameter = length_parameter(name)
    if parameter is None:
        raise ValueError(f"dynamic objective {name}: it declares no length parameter to fit to the stored chunks")

    def fits(value: int) -> bool:  # True up to the answer, False above it (invalid small values count as True)
        try:
            return max_raw_length(make_objective(name, {**params, parameter: value})) <= chunk_length
        except ValueError:
            return value < chunk_length // 2

    low, high = 1, chunk_length + 8  # framing adds at most a few tokens around a raw chunk
    while low < high:
        middle = (low + high + 1) // 2
        if fits(middle):
            low = middle
        else:
            high = middle - 1
    try:
        if max_raw_length(make_objective(name, {**params, parameter: low})) <= chunk_length:
            return low
    except ValueError:
        pass
    raise ValueError(f"dynamic objective {name}: the stored chunks of {chunk_length} tokens are too short for any "
                     f"{parameter} (with {params}); pass {parameter} explicitly")


def resolve_objective(objective: Any, params: dict[str, Any] | None = None, chunk_length: int | None = None) -> Any:
    """An objective object from a registry name (with ``params``) or an object as is.

    A named objective whose length parameter (``Objective.length_parameter``) is not in ``params``
    is sized to the stored chunks (``chunk_length`` tokens, :func:`fit_length`), not to its own
    default: a 128-token dataset gives 128-token mlm examples, not 512-token ones of which 384
    are padding.
    """
    if isinstance(objective, str):
        params = dict(params or {})
        parameter = length_parameter(objective)
        if chunk_length and parameter and parameter not in params:
            params[parameter] = fit_length(objective, params, chunk_length)
        return make_objective(objective, params)
    if params:
        raise ValueError("objective_params only apply when the objective is given by name")
    return objective


def special_ids_from_tokenizer(tokenizer_path: str, manifest_tokenizer: dict[str, Any], objective: Any) -> SpecialIds:
    """The :class:`SpecialIds` an objective needs, from a dataset's ``tokenizer.json``.

    Roles (pad, eos, ...) come from the manifest; sentinels (``<extra_id_k>``) and the
    objective's own tokens (``Objective.token_needs``: UL2's mode tokens, a plugin's) are looked
    up in the tokenizer; ``all_special`` holds every added special token.

    Raises:
        ConfigError: a role, sentinel or own token the objective needs is missing (a ``ValueError``).
    """
    from tokenizers import Tokenizer

    if not os.path.isfile(tokenizer_path):
        raise FileNotFoundError(f"{tokenizer_path}: the dataset's tokenizer is missing; pass special= explicitly")
    tokenizer = Tokenizer.from_file(tokenizer_path)
    roles = dict(manifest_tokenizer.get("special_ids", {}))
    needed = set(objective.required_specials)
    missing = sorted(needed - set(roles))
    if missing:
        raise ConfigError(f"objective {objective.name} needs special tokens {missing}; the tokenizer has {roles}")
    needs = objective.token_needs()
    num_sentinels = int(needs.sentinels)
    sentinels = [tokenizer.token_to_id(f"<extra_id_{k}>") for k in range(num_sentinels)]
    if None in sentinels:
        have = sentinels.index(None)
        raise ConfigError(
            f"objective {objective.name} needs {num_sentinels} sentinels <extra_id_0..{num_sentinels - 1}>, "
            f"the dataset's tokenizer has {have}; materialize with --add-special-tokens or pass special="
        )
    modes = {token: tokenizer.token_to_id(token) for token in needs.tokens}
    missing_modes = sorted(t for t, i in modes.items() if i is None)
    if missing_modes:
        raise ConfigError(f"objective {objective.name} needs the tokens {missing_modes} as single ids; "
                          "the tokenizer lacks them")
    all_special = {tokenizer.token_to_id(t.content) for t in tokenizer.get_added_tokens_decoder().values() if t.special}
    all_special.discard(None)
    return SpecialIds(
        vocab_size=int(manifest_tokenizer.get("vocab_size") or tokenizer.get_vocab_size(with_added_tokens=True)),
        pad=roles.get("pad", roles.get("eos", -1)),  # as the pipeline resolves them: -1 marks a missing role
        eos=roles.get("eos", -1),
        bos=roles.get("bos"),
        unk=roles.get("unk"),
        mask=roles.get("mask"),
        cls=roles.get("cls"),
        sep=roles.get("sep"),
        sentinels=tuple(int(i) for i in sentinels),
        mode_tokens={t: int(i) for t, i in modes.items()},
        all_special=frozenset(int(i) for i in all_special),
    )


class DynamicObjective:
    """Applies an objective to stored token chunks, seeded per (seed, key, epoch).

    Args:
        objective: object implementing the Objective protocol.
        special: special token ids.
        seed: noise seed.
        family: example family of the stored dataset (must be ``decoder``).
        seq_len: stored chunk length (a warning is given when the objective wants more).

    Raises:
        UnsupportedSchemaError: the stored data are not token chunks, or the objective needs features.
    """

    def __init__(self, objective: Any, special: SpecialIds, seed: int, *, family: str, seq_len: int | None):
        if family != "decoder":
            raise UnsupportedSchemaError(
                f"dynamic objective {objective.name}: needs a tokens dataset (decoder family, e.g. clm), got {family!r}"
            )
        needs = set(objective.features) - {"doc_lengths"}
        if needs:
            raise UnsupportedSchemaError(
                f"dynamic objective {objective.name} needs per-token features {sorted(needs)}, which a tokens dataset "
                "does not store; materialize it with this objective instead (or disable those options)"
            )
        self.objective, self.special, self.seed = objective, special, seed
        raw = max(objective.raw_lengths)
        if seq_len is not None and raw > seq_len:
            warnings.warn(
                f"dynamic objective {objective.name} asks for {raw}-token chunks, the dataset stores {seq_len}; "
                "examples are built from shorter chunks (padded by the objective)",
                stacklevel=3,
            )

    def __call__(self, example: dict[str, Any], epoch: int) -> dict[str, Any]:
        key = example["key"]
        raw_lengths, plans = self.objective.plan(plan_uniforms(self.seed, [f"{key}-e{epoch}"]))
        raw_length, plan = int(raw_lengths[0]), int(plans[0])
        tokens = np.asarray(example["input_ids"])
        doc_lengths = example.get("doc_lengths")
        real = int(np.sum(doc_lengths)) if doc_lengths is not None else len(tokens)
        length = min(raw_length, real)
        cut = None
        if doc_lengths is not None:
            ends = np.minimum(np.cumsum(doc_lengths), length)
            cut = np.diff(ends, prepend=0)
            cut = cut[cut > 0].astype(np.int32)
        out, _ = build_example(self.objective, tokens[:length], self.special, example_randoms(self.seed, [key], epoch),
                               plan=plan, doc_lengths=cut)
        out["key"] = key
        return out
