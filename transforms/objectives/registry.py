"""Objective names -> their :class:`transforms.objectives.base.Objective` classes.

Every objective is registered here with one line (:func:`register_objective`); the command
line (flags and help), the manifest summary, the loader and the inspection tools find it by
name through this registry. A class knows its config dataclass, so parameters coming from
flags or a ``--config`` file are validated the same way (unknown parameters are errors that
name them).

An objective of another package (a plugin) is declared in that package's metadata under the
entry-point group ``lmshards.objectives`` (:data:`ENTRY_POINT_GROUP`), the entry point named
as the objective and pointing at its class (``fim = "lmshards_fim.objective:FIM"``). The
registry loads those entry points on the first lookup of any kind (:data:`OBJECTIVES`,
:func:`objective_class`, :func:`objective_flags`, ...), once per process, after the built-in
objectives, so the command line, the loader and the inspection tools all see the same set; a
plugin that cannot be imported, is not an ``Objective`` subclass or takes a name already
taken is a :class:`schemas.errors.ConfigError` of one line naming its distribution and entry
point. Beam's workers unpickle an objective by reference to its class, so the plugin's package
must be installed where they run too (docs/design.md section 4).
"""

from __future__ import annotations

import dataclasses
import importlib.metadata
import threading
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any

from transforms.objectives.bart import Bart
from transforms.objectives.base import Objective, TokenNeeds
from transforms.objectives.clm import CLM
from transforms.objectives.flags import ObjectiveFlag, annotation_name, config_flags
from transforms.objectives.flags import objective_flags as _merged_flags
from transforms.objectives.mlm import MLM
from transforms.objectives.prefix_lm import PrefixLM
from transforms.objectives.span_corruption import SpanCorruption
from transforms.objectives.summary import Counters, Params, common_summary
from transforms.objectives.ul2 import UL2

__all__ = ["ENTRY_POINT_GROUP", "OBJECTIVES", "decoder_start_role", "load_entry_points", "make_objective",
           "objective_class", "objective_flags", "objective_from_params", "objective_parameters",
           "register_objective", "summarize_objective", "summarizer", "tokens_needed", "unregister_objective"]

#: The entry-point group in which a package declares its objectives (``name = "module:Class"``).
ENTRY_POINT_GROUP = "lmshards.objectives"

_REGISTERED: dict[str, type[Objective]] = {}
#: name -> where a plugin's objective came from (its distribution and entry point), for messages
_PLUGIN_ORIGINS: dict[str, str] = {}
#: "unloaded", "loading" (a plugin's module may look objectives up as it is imported) or "loaded"
_entry_points_state = "unloaded"
_entry_points_lock = threading.RLock()


class _Registered(Mapping):
    """The registered objectives, read-only; every read first loads the installed plugins
    (:func:`_load_installed_entry_points`), so that no lookup path can miss them."""

    def __getitem__(self, name: str) -> type[Objective]:
        _load_installed_entry_points()
        return _REGISTERED[name]

    def __iter__(self) -> Iterator[str]:
        _load_installed_entry_points()
        return iter(list(_REGISTERED))

    def __len__(self) -> int:
        _load_installed_entry_points()
        return len(_REGISTERED)

    def __repr__(self) -> str:
        return f"OBJECTIVES({', '.join(self)})"


#: name -> objective class, in registration order: the built-in ones, then the installed plugins
#: (read-only; see :func:`register_objective` and :data:`ENTRY_POINT_GROUP`)
OBJECTIVES: Mapping[str, type[Objective]] = _Registered()


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
    _PLUGIN_ORIGINS.pop(name, None)


def _config_error(message: str) -> Exception:
    # The objectives import numpy and the standard library only (docs/design.md section 1), and
    # the schemas package imports pyarrow: its error class is imported where a plugin is refused.
    from schemas.errors import ConfigError

    return ConfigError(message)


def load_entry_points(entry_points: Iterable[importlib.metadata.EntryPoint]) -> list[str]:
    """Register the objective classes ``entry_points`` name (group :data:`ENTRY_POINT_GROUP`), in
    the order of their names; returns the names registered now. An entry point whose class is
    registered already under its name is skipped, so loading twice changes nothing.

    Raises:
        ConfigError: an entry point that cannot be loaded, is not an ``Objective`` subclass, is
            not named as its objective, takes a name another objective has, or declares flags
            that clash with a registered objective's (one line naming its distribution).
    """
    loaded = []
    for entry_point in sorted(entry_points, key=lambda e: (e.name, e.value)):
        dist = entry_point.dist.name if entry_point.dist is not None else "an unknown distribution"
        origin = f"entry point {entry_point.name} = {entry_point.value} of {dist}"
        where = f"objective plugin {origin} (group {ENTRY_POINT_GROUP})"
        try:
            cls = entry_point.load()
        except Exception as exc:  # noqa: BLE001 - whatever a plugin's import raises, in one line
            first = (str(exc).strip().splitlines() or [""])[0]
            raise _config_error(f"{where}: cannot be imported: {type(exc).__name__}: {first}") from exc
        if not (isinstance(cls, type) and issubclass(cls, Objective)):
            raise _config_error(f"{where}: {cls!r} is not a subclass of transforms.objectives.base.Objective")
        name = getattr(cls, "name", None)
        if name != entry_point.name:
            raise _config_error(f"{where}: the class names its objective {name!r}; the entry point must be named as "
                                "the objective (the --objective value)")
        if _REGISTERED.get(name) is cls:
            continue
        if name in _REGISTERED:
            holder = _PLUGIN_ORIGINS.get(name, f"lmshards' own {_REGISTERED[name].__qualname__}")
            raise _config_error(f"{where}: objective {name} is registered already (by {holder}); uninstall one of "
                                "the two")
        try:
            register_objective(cls)
        except TypeError as exc:
            raise _config_error(f"{where}: {exc}") from exc
        _PLUGIN_ORIGINS[name] = origin
        loaded.append(name)
    return loaded


def _load_installed_entry_points() -> None:
    """Load the installed packages' objectives (:data:`ENTRY_POINT_GROUP`) once per process. A
    plugin that fails leaves the state unloaded, so every later lookup fails the same way
    instead of going on without it; those it registered before stay (loading skips them).
    Another thread's lookup waits for the loading; a lookup made by a plugin's own module as it
    is imported (this thread, loading) sees what is registered so far."""
    global _entry_points_state
    if _entry_points_state == "loaded":
        return
    with _entry_points_lock:
        if _entry_points_state != "unloaded":
            return
        _entry_points_state = "loading"
        try:
            load_entry_points(importlib.metadata.entry_points(group=ENTRY_POINT_GROUP))
        except BaseException:
            _entry_points_state = "unloaded"
            raise
        _entry_points_state = "loaded"


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
    if name not in OBJECTIVES:
        raise ValueError(f"--objective {name}: unknown objective; choose one of {', '.join(sorted(OBJECTIVES))} "
                         f"(an objective of another package is found once that package is installed)")
    return OBJECTIVES[name]


def decoder_start_role(name: str | None) -> str:
    """The special role a seq2seq decoder of objective ``name`` starts with (``pad`` if unknown)."""
    cls = OBJECTIVES.get(name or "")
    return cls.decoder_start if cls else "pad"


def objective_flags() -> list[ObjectiveFlag]:
    """The objective flags of ``lmshards materialize``, from every registered objective's config fields."""
    return _merged_flags((name, cls.config_class) for name, cls in OBJECTIVES.items())


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
        written = annotation_name(field.type)
        if field.name not in params or params[field.name] is None and "None" in written:
            continue
        expected = _SCALAR_TYPES.get(written.replace(" | None", ""))
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


def tokens_needed() -> TokenNeeds:
    """The tokens every registered objective may need, together: the most sentinels any of them
    uses and their own tokens in registration order, each objective's under every configuration
    picked by name (:meth:`~transforms.objectives.base.Objective.preset_token_needs`, UL2's two
    mixtures included). What ``lmshards train-tokenizer`` makes, and the tokens the inspection
    tools look for in a dataset's tokenizer."""
    sentinels, tokens = 0, []
    for cls in OBJECTIVES.values():
        needs = cls.preset_token_needs()
        sentinels = max(sentinels, int(needs.sentinels))
        tokens += needs.tokens
    return TokenNeeds(sentinels, tuple(dict.fromkeys(tokens)))
