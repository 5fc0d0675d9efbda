"""UL2 mixture of denoisers (pure numpy).

Reference: the UL2 paper's appendix ``ul2_objective`` (arXiv 2205.05131; reproduced in
google-research/t5x#939): span denoisers are T5 span corruption
(:mod:`transforms.objectives.span_corruption`) with their own (mu, r), the S denoiser is
T5's ``prefix_lm`` (split ~ U[1, L-1]), a mode token is prepended to the inputs, and
the decoder-only layout concatenates inputs and targets as SeqIO's
``PrefixLMFeatureConverter`` does.

Lengths (``I`` = ``inputs_length``, mode token and EOS included in every budget):

- Span denoiser: raw chunk ``T`` = :func:`~transforms.objectives.span_corruption.fit_raw_length`
  at ``I - 1``; inputs ``[mode] c0 <X0> ... </s>`` are exactly ``I`` for a full chunk
  (e.g. R(3, .15) at 512: 567 raw tokens, 114 targets; X(3, .5): 765 raw, 127 spans).
- S denoiser: raw chunk ``I - 1`` tokens; suffix length ~ U[1, min(T - 1, targets_length - 1)],
  i.e. prefix ~ U[1, T - 1] as T5 when no targets budget is set; inputs
  ``[mode] prefix </s>`` (at most ``I``), targets ``suffix </s>``.
- Decoder layout: ``input_ids = inputs + targets``, ``prefix_length = len(inputs)``,
  ``doc_lengths = [len(inputs) + len(targets)]``, padded with ``special.pad`` to ``seq_len``
  = the longest full example over the mixture (positions past ``sum(doc_lengths)`` are
  padding).

Deliberate differences from the appendix code: the mode token is one added special id
and is budgeted inside ``I`` (the appendix prepends text pieces after sizing, so the
final trim cuts the tail); the denoiser is drawn per chunk from the chunk's own
generator before the chunk is cut (no positional ``ds.shard`` round-robin, no stream
drift at epoch end); the default mixture (R .5, S .25, X .25) is our users' choice, the
``paper`` preset samples the seven denoisers uniformly.
"""

from __future__ import annotations

import collections
import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from transforms.objectives.base import BuiltRows
from transforms.objectives.common import SpecialIds, index_range
from transforms.objectives.counters import add_counters_times
from transforms.objectives.packing import Piece
from transforms.objectives.span_corruption import (
    SPAN_LENGTH_HISTOGRAM_CAP,
    SpanCorruptionConfig,
    add_block_span_histograms,
    corrupt_spans,
    span_counters,
    special_span_histogram,
)

__all__ = [
    "DECODER_LAYOUT",
    "ENCODER_DECODER_LAYOUT",
    "PRESETS",
    "UL2",
    "Denoiser",
    "DenoiserLengths",
    "UL2Config",
    "apply_denoiser",
    "denoiser_lengths",
    "parse_mixture",
]

ENCODER_DECODER_LAYOUT = "encoder_decoder"
DECODER_LAYOUT = "decoder"
_LAYOUTS = (ENCODER_DECODER_LAYOUT, DECODER_LAYOUT)
_KINDS = ("span", "prefix")
_DENOISER_KEYS = frozenset({"name", "mode_token", "kind", "mean_noise_span_length", "noise_density", "weight"})


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


@dataclass(frozen=True)
class Denoiser:
    """One denoiser of a UL2 mixture.

    Attributes:
        name: unique label recorded per example, e.g. ``"R(mu=3,r=0.15)"``.
        mode_token: token prepended to the inputs, e.g. ``"[R]"``.
        kind: ``"span"`` (T5 span corruption) or ``"prefix"`` (S denoiser, prefix-LM).
        mean_noise_span_length: mean span length (span kind only).
        noise_density: noise fraction (span kind only).
        weight: relative sampling weight (> 0; the mixture normalises).
    """

    name: str
    mode_token: str
    kind: str = "span"
    mean_noise_span_length: float | None = None
    noise_density: float | None = None
    weight: float = 1.0

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name:
            raise ValueError(f"denoiser name must be a non-empty string, got {self.name!r}")
        if not isinstance(self.mode_token, str) or not self.mode_token:
            raise ValueError(f"denoiser {self.name!r}: mode_token must be a non-empty string, got {self.mode_token!r}")
        if self.kind not in _KINDS:
            raise ValueError(f"denoiser {self.name!r}: kind must be one of {_KINDS}, got {self.kind!r}")
        if not _is_number(self.weight) or self.weight <= 0:
            raise ValueError(f"denoiser {self.name!r}: weight must be a finite number > 0, got {self.weight!r}")
        if self.kind == "prefix":
            for field_name in ("mean_noise_span_length", "noise_density"):
                value = getattr(self, field_name)
                if value is not None:
                    raise ValueError(
                        f"denoiser {self.name!r}: {field_name} is not used by kind 'prefix', got {value!r}"
                    )
            return
        mu, r = self.mean_noise_span_length, self.noise_density
        if not _is_number(mu) or mu < 1:
            raise ValueError(f"denoiser {self.name!r}: mean_noise_span_length must be a number >= 1, got {mu!r}")
        if not _is_number(r) or not 0 < r < 1:
            raise ValueError(f"denoiser {self.name!r}: noise_density must be a number in (0, 1), got {r!r}")

    @classmethod
    def from_dict(cls, spec: Mapping[str, Any]) -> Denoiser:
        """Build a denoiser from a dict (e.g. parsed from a config file).

        ``kind`` defaults to ``"span"``, ``weight`` to 1, and ``name`` to the mode token
        without brackets plus the span parameters, e.g. ``"X(mu=64,r=0.5)"``.

        Raises:
            ValueError: unknown keys, a missing ``mode_token`` or invalid values.
        """
        if not isinstance(spec, Mapping):
            raise ValueError(f"a denoiser must be a dict, got {spec!r}")
        unknown = sorted(set(spec) - _DENOISER_KEYS)
        if unknown:
            raise ValueError(f"unknown denoiser keys {unknown}; expected some of {sorted(_DENOISER_KEYS)}")
        if "mode_token" not in spec:
            raise ValueError(f"denoiser {dict(spec)!r} needs a mode_token")
        values = dict(spec)
        values.setdefault("kind", "span")
        if "name" not in values:
            label = str(values["mode_token"]).strip("[]") or str(values["mode_token"])
            if values["kind"] == "span":
                mu, r = values.get("mean_noise_span_length"), values.get("noise_density")
                label = f"{label}(mu={mu:g},r={r:g})" if _is_number(mu) and _is_number(r) else label
            values["name"] = label
        return cls(**values)

    def to_dict(self) -> dict[str, Any]:
        """JSON-able form accepted by :meth:`from_dict`."""
        return asdict(self)


def _span(letter: str, token: str, mu: float, r: float, weight: float) -> Denoiser:
    return Denoiser(f"{letter}(mu={mu:g},r={r:g})", token, "span", float(mu), r, weight)


PRESETS: dict[str, tuple[Denoiser, ...]] = {
    # Our users' mixture (DESIGN.md section 4): R .5, S .25, X .25, split equally inside each.
    "default": (
        _span("R", "[R]", 3, 0.15, 0.25),
        _span("R", "[R]", 8, 0.15, 0.25),
        Denoiser("S", "[S]", "prefix", weight=0.25),
        _span("X", "[X]", 3, 0.5, 0.0625),
        _span("X", "[X]", 8, 0.5, 0.0625),
        _span("X", "[X]", 64, 0.15, 0.0625),
        _span("X", "[X]", 64, 0.5, 0.0625),
    ),
    # The paper appendix's seven tasks, sampled uniformly (rates=None).
    "paper": (
        _span("R", "[NLU]", 3, 0.15, 1.0),
        _span("R", "[NLU]", 8, 0.15, 1.0),
        _span("X", "[NLG]", 3, 0.5, 1.0),
        _span("X", "[NLG]", 8, 0.5, 1.0),
        _span("X", "[NLG]", 64, 0.15, 1.0),
        _span("X", "[NLG]", 64, 0.5, 1.0),
        Denoiser("S", "[S2S]", "prefix", weight=1.0),
    ),
}


def parse_mixture(spec: str | Sequence[Denoiser | Mapping[str, Any]]) -> tuple[Denoiser, ...]:
    """A mixture from a preset name or a list of denoisers / dicts.

    Raises:
        ValueError: unknown preset, empty list, bad entries or duplicate names.
    """
    if isinstance(spec, str):
        if spec not in PRESETS:
            raise ValueError(f"unknown UL2 mixture preset {spec!r}; expected one of {sorted(PRESETS)} or a list")
        return PRESETS[spec]
    if isinstance(spec, Mapping) or not isinstance(spec, Sequence) or not spec:
        raise ValueError(f"mixture must be a preset name or a non-empty list of denoisers, got {spec!r}")
    mixture = tuple(item if isinstance(item, Denoiser) else Denoiser.from_dict(item) for item in spec)
    names = [denoiser.name for denoiser in mixture]
    duplicates = sorted({name for name in names if names.count(name) > 1})
    if duplicates:
        raise ValueError(f"denoiser names must be unique, got duplicates {duplicates}")
    return mixture


@dataclass(frozen=True)
class DenoiserLengths:
    """Lengths of one denoiser under a :class:`UL2Config` (mode token and EOS included).

    Attributes:
        raw_length: raw tokens of a full chunk.
        max_inputs: longest inputs.
        max_targets: longest targets.
        max_total: longest ``inputs + targets`` (the decoder layout's row).
        max_spans: most sentinels one example uses (0 for the S denoiser).
        max_suffix: longest S suffix (0 for span denoisers).
    """

    raw_length: int
    max_inputs: int
    max_targets: int
    max_total: int
    max_spans: int
    max_suffix: int = 0


def denoiser_lengths(denoiser: Denoiser, inputs_length: int, targets_length: int | None) -> DenoiserLengths:
    """Raw chunk length and budgets of ``denoiser`` (see the module docstring)."""
    if denoiser.kind == "prefix":
        raw_length = inputs_length - 1
        max_suffix = raw_length - 1 if targets_length is None else min(raw_length - 1, targets_length - 1)
        # mode + prefix + EOS + suffix + EOS: the total is raw + 3 whatever the split.
        return DenoiserLengths(raw_length, raw_length + 1, max_suffix + 1, raw_length + 3, 0, max_suffix)
    config = SpanCorruptionConfig(inputs_length - 1, denoiser.noise_density, denoiser.mean_noise_span_length)
    # Span-corrupted lengths only grow with the chunk length, so a full chunk is the longest.
    inputs, targets, spans = config.full_lengths()
    return DenoiserLengths(config.raw_length, inputs + 1, targets, inputs + 1 + targets, spans)


@dataclass(frozen=True)
class UL2Config:
    """Parameters of the UL2 objective.

    Attributes:
        inputs_length: inputs budget, mode token and EOS included.
        targets_length: targets budget; None lets each denoiser use its natural length
            (the S suffix then spans up to the whole chunk). When set, every span
            denoiser must fit it and the S suffix is capped to it.
        mixture: preset name (``"default"``, ``"paper"``) or a list of :class:`Denoiser`
            or dicts; stored as a tuple of :class:`Denoiser`.
        layout: ``"encoder_decoder"`` (``inputs``/``targets``) or ``"decoder"``
            (``input_ids`` + ``prefix_length``).
    """

    inputs_length: int = 512
    targets_length: int | None = None
    mixture: Any = "default"
    layout: str = ENCODER_DECODER_LAYOUT

    def __post_init__(self) -> None:
        if not isinstance(self.inputs_length, int) or isinstance(self.inputs_length, bool) or self.inputs_length < 4:
            raise ValueError(f"inputs_length must be an int >= 4, got {self.inputs_length!r}")
        if self.targets_length is not None and (
            not isinstance(self.targets_length, int) or isinstance(self.targets_length, bool) or self.targets_length < 2
        ):
            raise ValueError(f"targets_length must be None or an int >= 2, got {self.targets_length!r}")
        if self.layout not in _LAYOUTS:
            raise ValueError(f"layout must be one of {_LAYOUTS}, got {self.layout!r}")
        object.__setattr__(self, "mixture", parse_mixture(self.mixture))
        if self.targets_length is not None:
            for denoiser in self.mixture:
                needed = denoiser_lengths(denoiser, self.inputs_length, None).max_targets
                if denoiser.kind == "span" and needed > self.targets_length:
                    raise ValueError(
                        f"targets_length {self.targets_length} is too small for denoiser {denoiser.name!r}, "
                        f"which needs {needed} at inputs_length {self.inputs_length}"
                    )


def _flat(rows: list[np.ndarray], lengths: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Rows end to end (int32) and their ``len(rows) + 1`` int64 offsets."""
    offsets = np.zeros(len(rows) + 1, dtype=np.int64)
    np.cumsum(lengths, out=offsets[1:])
    return (np.concatenate(rows) if rows else np.zeros(0, np.int32)), offsets


def _mode_id(denoiser: Denoiser, special: SpecialIds) -> int:
    if denoiser.mode_token not in special.mode_tokens:
        raise ValueError(
            f"UL2 denoiser {denoiser.name!r} needs mode token {denoiser.mode_token!r} in the tokenizer; "
            f"known mode tokens: {sorted(special.mode_tokens)}"
        )
    return special.mode_tokens[denoiser.mode_token]


def _apply(
    tokens: np.ndarray,
    rng: np.random.Generator,
    denoiser: Denoiser,
    lengths: DenoiserLengths,
    mode: int,
    special: SpecialIds,
) -> tuple[np.ndarray, np.ndarray]:
    """:func:`apply_denoiser` for a checked 1-D chunk and a resolved mode id."""
    if denoiser.kind == "span":
        inputs, targets = corrupt_spans(
            tokens, rng, denoiser.noise_density, denoiser.mean_noise_span_length, special, lead=1
        )
        inputs[0] = mode
        return inputs, targets
    length = tokens.shape[0]
    suffix_length = int(rng.integers(1, min(length - 1, lengths.max_suffix) + 1)) if length >= 2 else 0
    split = length - suffix_length
    eos = special.eos
    inputs = np.empty(split + 2, dtype=np.int32)
    inputs[0] = mode
    inputs[1:-1] = tokens[:split]
    inputs[-1] = eos
    targets = np.empty(suffix_length + 1, dtype=np.int32)
    targets[:-1] = tokens[split:]
    targets[-1] = eos
    return inputs, targets


def _checked_chunk(tokens: np.ndarray, denoiser: Denoiser, lengths: DenoiserLengths) -> np.ndarray:
    tokens = np.asarray(tokens)
    if tokens.ndim != 1 or tokens.shape[0] > lengths.raw_length:
        raise ValueError(
            f"denoiser {denoiser.name!r} takes a 1-D chunk of at most {lengths.raw_length} tokens, "
            f"got shape {tokens.shape}"
        )
    return tokens


def apply_denoiser(
    tokens: np.ndarray,
    rng: np.random.Generator,
    denoiser: Denoiser,
    lengths: DenoiserLengths,
    special: SpecialIds,
) -> tuple[np.ndarray, np.ndarray]:
    """Encoder-decoder ``(inputs, targets)`` of one denoiser, mode token first in the inputs.

    Raises:
        ValueError: too many tokens, a missing mode token or too few sentinels.
    """
    tokens = _checked_chunk(tokens, denoiser, lengths)
    return _apply(tokens, rng, denoiser, lengths, _mode_id(denoiser, special), special)


class UL2:
    """UL2 as an :class:`~transforms.objectives.base.Objective`.

    ``plan_chunk`` draws the denoiser index (the plan) from the mixture weights and asks
    for that denoiser's raw length; ``build`` applies it and records its name in the
    ``denoiser`` column.

    Args:
        config: objective parameters (defaults: 512 inputs, default mixture, encoder-decoder).
    """

    name = "ul2"
    features: frozenset[str] = frozenset()
    required_specials: frozenset[str] = frozenset({"eos", "pad", "sentinels", "mode_tokens"})

    def __init__(self, config: UL2Config | None = None) -> None:
        self.config = config if config is not None else UL2Config()
        self.denoisers: tuple[Denoiser, ...] = self.config.mixture
        self.lengths = tuple(
            denoiser_lengths(d, self.config.inputs_length, self.config.targets_length) for d in self.denoisers
        )
        self.family = "decoder" if self.config.layout == DECODER_LAYOUT else "seq2seq"
        self.seq_len = max(lengths.max_total for lengths in self.lengths)
        self.targets_length = max(lengths.max_targets for lengths in self.lengths)
        weights = np.array([d.weight for d in self.denoisers], dtype=np.float64)
        self._cumulative = np.cumsum(weights / weights.sum())
        self._raw_lengths = np.array([lengths.raw_length for lengths in self.lengths], dtype=np.int64)
        self._index = {d.name: i for i, d in enumerate(self.denoisers)}
        self._histogram_names = tuple(
            tuple(f"denoiser/{d.name}/span_len_hist_{k}" for k in range(SPAN_LENGTH_HISTOGRAM_CAP + 1))
            for d in self.denoisers
        )
        self._counter_cache: dict[tuple[int, int, int], dict[str, int]] = {}

    @property
    def mode_tokens(self) -> tuple[str, ...]:
        """Distinct mode tokens of the mixture, to add to the tokenizer as special tokens."""
        return tuple(dict.fromkeys(d.mode_token for d in self.denoisers))

    def plan_chunk(self, rng: np.random.Generator) -> tuple[int, int]:
        """Draw a denoiser index by weight; return ``(its raw length, index)``."""
        lengths, plans = self.plan_uniforms(np.array([rng.random()]))
        return int(lengths[0]), int(plans[0])

    def plan_uniforms(self, uniforms: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """:meth:`plan_chunk` for many chunks at once, given each one's draw ``rng.random()``:
        ``(raw lengths, denoiser indices)``."""
        plans = np.minimum(np.searchsorted(self._cumulative, uniforms, side="right"), len(self.denoisers) - 1)
        return self._raw_lengths[plans], plans

    def build(
        self,
        tokens: np.ndarray,
        rng: np.random.Generator,
        plan: int,
        special: SpecialIds,
        features: dict[str, np.ndarray],
    ) -> dict[str, Any]:
        """Apply denoiser ``plan`` to ``tokens`` in the configured layout.

        Raises:
            ValueError: unknown plan, too many tokens, missing mode token or sentinels.
        """
        inputs, targets = self._denoised(tokens, rng, plan, special)
        denoiser = self.denoisers[plan]
        if self.config.layout == ENCODER_DECODER_LAYOUT:
            return {"inputs": inputs, "targets": targets, "denoiser": denoiser.name}
        prefix_length = inputs.shape[0]
        total = prefix_length + targets.shape[0]
        input_ids = np.empty(self.seq_len, dtype=np.int32)
        input_ids[:prefix_length] = inputs
        input_ids[prefix_length:total] = targets
        input_ids[total:] = special.pad
        return {
            "input_ids": input_ids,
            "prefix_length": prefix_length,
            "doc_lengths": np.array([total], dtype=np.int32),
            "denoiser": denoiser.name,
        }

    def build_many(
        self,
        pieces: Sequence[Piece],
        plans: Sequence[int],
        rngs: Sequence[np.random.Generator],
        special: SpecialIds,
    ) -> BuiltRows:
        """:meth:`build` and :meth:`stats` (with ``special``) of many chunks at once (the
        pipeline's fast path): each row is :meth:`build` of its chunk, plan and generator;
        the columns are laid out and the counters summed once for the block.

        Returns:
            The examples' array columns (name -> ``(flat int32 values, int64 row offsets)``),
            scalar columns (``prefix_length`` of the decoder layout), the ``denoiser`` column,
            and the sum of the rows' counters.

        Raises:
            ValueError: as :meth:`build`.
        """
        modes: dict[int, int] = {}
        inputs_of, targets_of = [], []
        for piece, plan, rng in zip(pieces, plans, rngs, strict=True):
            inputs, targets = self._denoised(piece.tokens, rng, plan, special, modes)
            inputs_of.append(inputs)
            targets_of.append(targets)
        count = len(inputs_of)
        inputs_lengths = np.fromiter(map(len, inputs_of), dtype=np.int64, count=count)
        targets_lengths = np.fromiter(map(len, targets_of), dtype=np.int64, count=count)
        counters: dict[str, int] = {}
        for (plan, inputs_tokens, targets_tokens), times in collections.Counter(
                zip(plans, inputs_lengths.tolist(), targets_lengths.tolist())).items():
            add_counters_times(counters, self._length_counters(plan, inputs_tokens, targets_tokens), times)
        self._add_span_histograms(counters, plans, targets_of, special)
        strings = {"denoiser": [self.denoisers[plan].name for plan in plans]}
        if self.config.layout == ENCODER_DECODER_LAYOUT:
            arrays = {"inputs": _flat(inputs_of, inputs_lengths), "targets": _flat(targets_of, targets_lengths)}
            return arrays, {}, strings, counters
        totals = inputs_lengths + targets_lengths
        if count:
            counters["padding_tokens"] = count * self.seq_len - int(totals.sum())
        rows = np.full((count, self.seq_len), special.pad, dtype=np.int32)
        rows[index_range(self.seq_len) < totals[:, None]] = np.concatenate(
            [part for pair in zip(inputs_of, targets_of) for part in pair]) if count else 0
        arrays = {
            "input_ids": (rows.reshape(-1), np.arange(count + 1, dtype=np.int64) * self.seq_len),
            "doc_lengths": (totals.astype(np.int32), np.arange(count + 1, dtype=np.int64)),
        }
        return arrays, {"prefix_length": inputs_lengths.astype(np.int32)}, strings, counters

    def _denoised(self, tokens: np.ndarray, rng: np.random.Generator, plan: int, special: SpecialIds,
                  modes: dict[int, int] | None = None) -> tuple[np.ndarray, np.ndarray]:
        """``(inputs, targets)`` of denoiser ``plan`` on ``tokens``; ``modes`` (plan -> mode id),
        when given, keeps each mode id once looked up.

        Raises:
            ValueError: unknown plan, too many tokens, missing mode token or sentinels.
        """
        if not 0 <= plan < len(self.denoisers):
            raise ValueError(f"UL2 plan must be a denoiser index in [0, {len(self.denoisers)}), got {plan!r}")
        denoiser, lengths = self.denoisers[plan], self.lengths[plan]
        tokens = _checked_chunk(tokens, denoiser, lengths)
        mode = modes.get(plan) if modes is not None else None
        if mode is None:
            mode = _mode_id(denoiser, special)
            if modes is not None:
                modes[plan] = mode
        return _apply(tokens, rng, denoiser, lengths, mode, special)

    def _add_span_histograms(self, counters: dict[str, int], plans: Sequence[int], targets_of: list[np.ndarray],
                             special: SpecialIds) -> None:
        """Add the ``denoiser/<name>/span_len_hist_<k>`` counters :meth:`stats` gives each span
        example, for many examples: per denoiser, from its rows' targets at once."""
        by_plan: dict[int, list[np.ndarray]] = {}
        for plan, targets in zip(plans, targets_of):
            if self.denoisers[plan].kind == "span":
                by_plan.setdefault(plan, []).append(targets)
        for plan, rows in sorted(by_plan.items()):
            add_block_span_histograms(counters, self._histogram_names[plan], rows, special)

    def _length_counters(self, index: int, inputs_tokens: int, targets_tokens: int) -> dict[str, int]:
        """Every counter of :meth:`stats` but the histogram, for an example of these lengths.

        They depend only on the denoiser and the two lengths, which repeat from example to
        example: cached (a ValueError, for lengths the denoiser cannot make, is not).
        """
        key = (index, inputs_tokens, targets_tokens)
        cached = self._counter_cache.get(key)
        if cached is not None:
            return cached
        denoiser, lengths = self.denoisers[index], self.lengths[index]
        if denoiser.kind == "span":
            counts = span_counters(
                inputs_tokens - 1,
                targets_tokens,
                denoiser.noise_density,
                denoiser.mean_noise_span_length,
                lengths.raw_length,
            )
        else:
            noise = targets_tokens - 1
            counts = {"raw_tokens": inputs_tokens - 2 + noise, "noise_tokens": noise, "noise_spans": int(noise > 0)}
        counts["examples"] = 1
        counts["inputs_tokens"] = inputs_tokens
        counts["targets_tokens"] = targets_tokens
        counters = dict(counts)
        counters.update({f"denoiser/{denoiser.name}/{key}": value for key, value in counts.items()})
        if len(self._counter_cache) >= 1 << 16:
            self._counter_cache.clear()
        self._counter_cache[key] = counters
        return counters

    def stats(self, example: dict[str, Any], special: SpecialIds | None = None) -> dict[str, int]:
        """Counters overall and per denoiser (``denoiser/<name>/<counter>``).

        Counters: examples, raw_tokens, noise_tokens (span noise, or the S suffix),
        noise_spans, inputs_tokens, targets_tokens; all recomputed from the example's
        lengths and its ``denoiser`` name. The decoder layout adds ``padding_tokens``.
        Passing ``special`` adds, for span denoisers, the ``denoiser/<name>/span_len_hist_<k>``
        histogram (it needs the sentinel ids).
        """
        index = self._index[example["denoiser"]]
        decoder = self.config.layout == DECODER_LAYOUT
        if decoder:
            inputs_tokens = int(example["prefix_length"])
            doc_lengths = example["doc_lengths"]
            total = doc_lengths.sum() if isinstance(doc_lengths, np.ndarray) else np.sum(doc_lengths)
            targets_tokens = int(total) - inputs_tokens
        else:
            inputs_tokens, targets_tokens = len(example["inputs"]), len(example["targets"])
        counters = dict(self._length_counters(index, inputs_tokens, targets_tokens))
        if special is not None and self.denoisers[index].kind == "span":
            if decoder:
                targets = np.asarray(example["input_ids"])[inputs_tokens : inputs_tokens + targets_tokens]
            else:
                targets = np.asarray(example["targets"])
            names = self._histogram_names[index]
            for length, count in enumerate(special_span_histogram(targets, special)):
                if count:
                    counters[names[length]] = count
        if decoder:  # rows are padded to seq_len here, not by the writer
            counters["padding_tokens"] = self.seq_len - inputs_tokens - targets_tokens
        return counters

    def schema_kwargs(self) -> dict[str, Any]:
        """Variable-length seq2seq columns, or fixed ``seq_len`` decoder rows; plus ``denoiser``."""
        if self.config.layout == DECODER_LAYOUT:
            return {"seq_len": self.seq_len, "prefix_length": True, "denoiser": True}
        return {"inputs_length": None, "targets_length": None, "denoiser": True}

    def max_sentinels(self) -> int:
        """Most sentinels any denoiser uses (127 for the default mixture at 512 inputs)."""
        return max(lengths.max_spans for lengths in self.lengths)

    def params(self) -> dict[str, Any]:
        """Configuration and derived lengths for the manifest."""
        params: dict[str, Any] = {
            "reference": "UL2 appendix ul2_objective (arXiv 2205.05131) over t5 span_corruption/prefix_lm",
            "layout": self.config.layout,
            "inputs_length": self.config.inputs_length,
            "targets_length": self.targets_length,
            "targets_budget": self.config.targets_length,
            "mixture": [
                {**d.to_dict(), **asdict(lengths)} for d, lengths in zip(self.denoisers, self.lengths, strict=True)
            ],
        }
        if self.config.layout == DECODER_LAYOUT:
            params["seq_len"] = self.seq_len
        return params
