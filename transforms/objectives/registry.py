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


def make_objective(name: str, params: dict[str, Any]):
    """Build an objective from its name and parameters.

    Raises:
        ValueError: unknown objective or parameter, or an invalid value.
    """
    allowed = objective_parameters(name)
    unknown = sorted(set(params) - set(allowed))
    if unknown:
        raise ValueError(f"objective {name}: unknown parameter(s) {unknown}; it takes {allowed}")
    config_class, objective_class = OBJECTIVES[name]
    try:
        config = config_class(**params)
    except TypeError as exc:
        raise ValueError(f"objective {name}: {exc}") from exc
    return objective_class(config)
