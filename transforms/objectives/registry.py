"""Objective names -> their :class:`transforms.objectives.base.Objective` classes.

Every objective is registered here with one line (:func:`register_objective`); the command
line (flags and help), the manifest summary, the loader and the inspection tools find it by
name through this registry. A class knows its config dataclass, so parameters coming from
flags or a ``--config`` file are validated the same way (unknown parameters are errors that
name them). An objective of another package registers itself the same way, best when its
module is imported, before the pipeline or the inspection tools look it up; the pipeline's
workers unpickle it by reference, so its module must be importable where they run (an
installed package, as for any Beam DoFn).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from types import MappingProxyType
from typing import Any

from transforms.objectives.bart import Bart
from transforms.objectives.base import Objective
from transforms.objectives.clm import CLM
from transforms.objectives.flags import ObjectiveFlag, config_flags
from transforms.objectives.flags import objective_flags as _merged_flags
from transforms.objectives.mlm import MLM
from transforms.objectives.prefix_lm import PrefixLM
from transforms.objectives.span_corruption import SpanCorruption
from transforms.objectives.summary import Counters, Params, common_summary
from transforms.objectives.ul2 import UL2

__all__ = ["OBJECTIVES", "decoder_start_role", "make_objective", "objective_class", "objective_flags",
           "objective_from_params", "objective_parameters", "register_objective", "summarize_objective", "summarizer",
           "unregister_objective"]

_REGISTERED: dict[str, type[Objective]] = {}
#: name -> objective class, in registration order (read-only; see :func:`register_objective`)
OBJECTIVES: Mapping[str, type[Objective]] = MappingProxyType(_REGISTERED)


def register_objective(cls: type[Objective]) -> type[Objective]:
    """Add an objective class under its ``name`` (usable as a class decorator); returns it.

    Raises:
        TypeError: not an :class:`Objective` subclass, no config dataclass, a name taken, or
            flags that clash with a registered objective's.
    """
    if not (isinstance(cls, type) and issubclass(cls, Objective)):
        raise TypeError(f"{cls!r} is not a subclass of transforms.objectives.base.Objective")
    name = getattr(cls, "name", None)
    if not isinstance(name, str) or not name.isidentifier():
        raise TypeError(f"{cls.__name__}.name must be an identifier (the --objective value), got {name!r}")
    if name in _REGISTERED:
        raise TypeError(f"objective {name} is registered already ({_REGISTERED[name].__qualname__})")
    if not dataclasses.is_dataclass(getattr(cls, "config_class", None)):
        raise TypeError(f"{cls.__name__}.config_class must be the objective's config dataclass")
    config_flags(cls.config_class, name)  # a flag without a usable type fails here
    _merged_flags([*((n, c.config_class) for n, c in _REGISTERED.items()), (name, cls.config_class)])
    _REGISTERED[name] = cls
    return cls


def unregister_objective(name: str) -> None:
    """Remove a registered objective (a test's own, once it is done)."""
    del _REGISTERED[name]


register_objective(CLM)
register_objective(PrefixLM)
register_objective(MLM)
register_objective(SpanCorruption)
register_objective(Bart)
register_objective(UL2)


def objective_class(name: str) -> type[Objective]:
    """The class registered as ``name``.

    Raises:
        ValueError: unknown objective (naming the registered ones).
    """
    if name not in _REGISTERED:
        raise ValueError(f"--objective {name}: unknown objective; choose one of {', '.join(sorted(_REGISTERED))}")
    return _REGISTERED[name]


def decoder_start_role(name: str | None) -> str:
    """The special role a seq2seq decoder of objective ``name`` starts with (``pad`` if unknown)."""
    cls = _REGISTERED.get(name or "")
    return cls.decoder_start if cls else "pad"


def objective_flags() -> list[ObjectiveFlag]:
    """The objective flags of ``lmshards materialize``, from every registered objective's config fields."""
    return _merged_flags((name, cls.config_class) for name, cls in _REGISTERED.items())


def objective_parameters(name: str) -> list[str]:
    """Parameter names an objective accepts."""
    return [f.name for f in dataclasses.fields(objective_class(name).config_class)]


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
    cls = objective_class(name)
    params = _typed(cls.config_class, params)
    try:
        config = cls.config_class(**params)
    except TypeError as exc:
        raise ValueError(f"objective {name}: {exc}") from exc
    return cls(config)


def objective_from_params(name: str, params: Mapping[str, Any]) -> Objective:
    """The objective a manifest records (``objective.name`` and its ``params()``), rebuilt from
    the config fields its class reads back from them (:meth:`Objective.config_from_params`).

    Raises:
        ValueError: unknown objective, or parameters it refuses.
    """
    return make_objective(name, objective_class(name).config_from_params(dict(params)))


def summarizer(name: str) -> Callable[[Counters, Params | None], dict[str, Any]]:
    """The summary function of objective ``name``: its class's ``summarize``
    (:class:`transforms.objectives.base.Objective`; for the built-in ones the functions of
    :mod:`transforms.objectives.summary`).

    An objective not registered here (a dataset written with another objective set) gets the
    common part: examples, chunk and padding tokens.
    """
    objective = OBJECTIVES.get(name)
    return objective.summarize if objective else _common_only


def _common_only(counters: Counters, params: Params | None = None) -> dict[str, Any]:
    return common_summary(counters)


def summarize_objective(name: str, counters: Counters, params: Params | None = None) -> dict[str, Any]:
    """The summary of objective ``name``'s summed counters (:func:`summarizer`)."""
    return summarizer(name)(counters, params)
