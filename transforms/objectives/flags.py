"""Objective parameters as command-line flags, declared where the parameter is: on its config field.

An objective's config dataclass marks each parameter that has a flag with :func:`flag`::

    seq_len: int = flag(1024, "tokens per example")
    mask: float = flag(0.3, "share of words masked by text infilling", name="--bart-mask")

``lmshards materialize`` builds its objective flags from the registered objectives
(:func:`objective_flags`), so a new objective's flags, their types and their help come with
its module and nothing else lists them. Fields without :func:`flag` are parameters of
``--config`` files only. Several objectives may share a flag (``--seq-len``) if they agree
on its parameter, type and description; the help then lists each objective's default
(``tokens per example (clm/prefix_lm 1024, mlm/bart 512)``), taken from the field itself so
that it cannot drift from the code.

Only the standard library is imported here (docs/design.md section 1).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from typing import Any, NamedTuple

__all__ = ["FLAG_METADATA", "FlagSpec", "ObjectiveFlag", "annotation_name", "config_flags", "flag", "objective_flags"]

#: Key of a field's ``metadata`` holding its :class:`FlagSpec`.
FLAG_METADATA = "lmshards.flag"
_FROM_FIELD = object()
_KINDS = {"int": int, "float": float, "bool": bool, "str": str}


@dataclasses.dataclass(frozen=True)
class FlagSpec:
    """How one config field appears on the command line.

    Attributes:
        help: what the parameter does, without its default.
        name: the flag (default ``--`` and the field name with dashes).
        shown_default: the default as the help shows it; None shows none (bool flags show
            none: ``--frame`` / ``--no-frame`` says it); unset, the field's default.
        kind: the argparse type; unset, the field's annotation (``int``, ``float``, ``bool``,
            ``str``, optionally ``| None``).
    """

    help: str
    name: str | None = None
    shown_default: Any = _FROM_FIELD
    kind: type | None = None


def flag(default: Any, help: str, *, name: str | None = None, shown_default: Any = _FROM_FIELD,
         kind: type | None = None) -> Any:
    """A dataclass field with ``default`` that ``lmshards materialize`` offers as a flag (see :class:`FlagSpec`)."""
    return dataclasses.field(default=default, metadata={FLAG_METADATA: FlagSpec(help, name, shown_default, kind)})


class ObjectiveFlag(NamedTuple):
    """One objective flag of ``lmshards materialize``.

    Attributes:
        flag: ``--seq-len``.
        dest: the config field it sets (``seq_len``).
        kind: int, float, bool or str.
        objectives: names of the objectives that take it, in registry order.
        help: the help text (defaults included; the objectives are appended by the parser).
    """

    flag: str
    dest: str
    kind: type
    objectives: tuple[str, ...]
    help: str


def annotation_name(annotation: Any) -> str:
    """A field's annotation as written (``int``, ``float | None``): a string in a module with
    ``from __future__ import annotations``, the type itself in one without (a plugin's, say)."""
    return annotation.__name__ if isinstance(annotation, type) else str(annotation)


def _kind(field: dataclasses.Field, spec: FlagSpec, owner: str) -> type:
    if spec.kind is not None:
        return spec.kind
    kind = _KINDS.get(annotation_name(field.type).replace(" | None", "").strip())
    if kind is None:
        raise TypeError(f"objective {owner}: flag of field {field.name} ({field.type}) needs kind=int/float/bool/str")
    return kind


def config_flags(config_class: type, owner: str) -> list[tuple[dataclasses.Field, FlagSpec, type]]:
    """The flagged fields of ``config_class`` (of objective ``owner``), in field order, with their types."""
    return [(f, f.metadata[FLAG_METADATA], _kind(f, f.metadata[FLAG_METADATA], owner))
            for f in dataclasses.fields(config_class) if FLAG_METADATA in f.metadata]


def _shown(field: dataclasses.Field, spec: FlagSpec, kind: type) -> str | None:
    if spec.shown_default is not _FROM_FIELD:
        return spec.shown_default
    if kind is bool or field.default is None or field.default is dataclasses.MISSING:
        return None
    return str(field.default)


def objective_flags(objectives: Iterable[tuple[str, type]]) -> list[ObjectiveFlag]:
    """The flags of ``(objective name, config class)`` pairs, merged by flag name in first-seen order.

    Raises:
        TypeError: two objectives give one flag different parameters, types or descriptions
            (a programming error in an objective module, caught at start-up).
    """
    merged: dict[str, dict[str, Any]] = {}
    for owner, config_class in objectives:
        for field, spec, kind in config_flags(config_class, owner):
            name = spec.name or "--" + field.name.replace("_", "-")
            entry = merged.setdefault(name, {"dest": field.name, "kind": kind, "help": spec.help, "defaults": []})
            if (entry["dest"], entry["kind"], entry["help"]) != (field.name, kind, spec.help):
                raise TypeError(f"objective {owner}: flag {name} sets {field.name} ({kind.__name__}, {spec.help!r}); "
                                f"another objective declares it as {entry['dest']} ({entry['kind'].__name__}, "
                                f"{entry['help']!r})")
            entry["defaults"].append((owner, _shown(field, spec, kind)))
    out = []
    for name, entry in merged.items():
        owners = tuple(owner for owner, _ in entry["defaults"])
        shown: dict[str, list[str]] = {}
        for owner, value in entry["defaults"]:
            if value is not None:
                shown.setdefault(value, []).append(owner)
        if len(shown) == 1 and len(next(iter(shown.values()))) == len(owners):
            help_text = f"{entry['help']} ({next(iter(shown))})"
        elif shown:
            help_text = f"{entry['help']} ({', '.join('/'.join(who) + ' ' + value for value, who in shown.items())})"
        else:
            help_text = entry["help"]
        out.append(ObjectiveFlag(name, entry["dest"], entry["kind"], owners, help_text))
    return out
