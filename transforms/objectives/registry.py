"""Objective names -> objects implementing :class:`transforms.objectives.base.Objective`.

Each entry knows its config dataclass, so parameters coming from flags or a ``--config``
file are validated the same way (unknown parameters are errors that name them).
"""

from __future__ import annotations

import dataclasses
from typing import Any

from transforms.objectives.bart import Bart, BartConfig
from transforms.objectives.clm import CLM, CLMConfig
from transforms.objectives.mlm import MLM, MLMConfig
from transforms.objectives.prefix_lm import PrefixLM, PrefixLMConfig
from transforms.objectives.span_corruption import SpanCorruption, SpanCorruptionConfig
from transforms.objectives.ul2 import UL2, UL2Config

__all__ = ["OBJECTIVES", "make_objective", "objective_parameters"]

#: name -> (config dataclass, objective class taking the config)
OBJECTIVES: dict[str, tuple[type, type]] = {
    "clm": (CLMConfig, CLM),
    "prefix_lm": (PrefixLMConfig, PrefixLM),
    "mlm": (MLMConfig, MLM),
    "span_corruption": (SpanCorruptionConfig, SpanCorruption),
    "bart": (BartConfig, Bart),
    "ul2": (UL2Config, UL2),
}


def objective_parameters(name: str) -> list[str]:
    """Parameter names an objective accepts."""
    if name not in OBJECTIVES:
        raise ValueError(f"--objective {name}: unknown objective; choose one of {', '.join(sorted(OBJECTIVES))}")
    return [f.name for f in dataclasses.fields(OBJECTIVES[name][0])]


_SCALAR_TYPES = {"int": int, "float": float, "bool": bool, "str": str}


def _typed(config_class: type, params: dict[str, Any]) -> dict[str, Any]:
    """``params`` checked against the config's scalar field types; ints given for floats become floats.

    Values from a config file are not parsed by argparse: without this check ``"no"`` would
    turn a bool on and ``"0.3"`` would fail with a message that names no parameter. The
    int -> float conversion makes ``mean_noise_span_length: 3`` record the same as ``3.0``.
    """
    out = dict(params)
    for field in dataclasses.fields(config_class):
        if field.name not in params or params[field.name] is None and "None" in str(field.type):
            continue
        expected = _SCALAR_TYPES.get(str(field.type).replace(" | None", ""))
        value = params[field.name]
        if expected is None:
            continue
        if expected is float and isinstance(value, int) and not isinstance(value, bool):
            out[field.name] = float(value)
        elif not isinstance(value, expected) or (expected is not bool and isinstance(value, bool)):
            raise ValueError(f"{field.name} must be {expected.__name__}, got {value!r}")
    return out


def make_objective(name: str, params: dict[str, Any]):
    """Build an objective from its name and parameters.

    Raises:
        ValueError: unknown objective or parameter, a value of the wrong type, or an invalid value.
    """
    allowed = objective_parameters(name)
    unknown = sorted(set(params) - set(allowed))
    if unknown:
        raise ValueError(f"objective {name}: unknown parameter(s) {unknown}; it takes {allowed}")
    config_class, objective_class = OBJECTIVES[name]
    params = _typed(config_class, params)
    try:
        config = config_class(**params)
    except TypeError as exc:
        raise ValueError(f"objective {name}: {exc}") from exc
    return objective_class(config)
