"""UL2's mixture of denoisers: :class:`Denoiser`, the presets, :func:`parse_mixture`, and the
lengths each denoiser gives under an inputs budget (:func:`denoiser_lengths`). The objective
itself, and the account of the lengths, are in :mod:`transforms.objectives.ul2`.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from transforms.objectives.span_corruption import SpanCorruptionConfig

__all__ = ["PRESETS", "Denoiser", "DenoiserLengths", "denoiser_lengths", "parse_mixture"]

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
    # Our users' mixture (docs/design.md section 4): R .5, S .25, X .25, split equally inside each.
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
