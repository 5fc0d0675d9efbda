"""Objective names -> objects implementing :class:`transforms.objectives.base.Objective`.

Each entry knows its config dataclass, so parameters coming from flags or a ``--config``
file are validated the same way (unknown parameters are errors that name them).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

from transforms.objectives.clm import CLM, CLMConfig

__all__ = ["OBJECTIVES", "make_objective", "objective_parameters"]


def _clm(params: dict[str, Any]):
    return CLM(CLMConfig(**params))


#: name -> (config dataclass, factory taking validated params)
OBJECTIVES: dict[str, tuple[type, Callable[[dict[str, Any]], Any]]] = {
    "clm": (CLMConfig, _clm),
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
    try:
        return OBJECTIVES[name][1](dict(params))
    except TypeError as exc:
        raise ValueError(f"objective {name}: {exc}") from exc
