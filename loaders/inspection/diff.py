"""``lmshards diff A B``: two datasets' summaries side by side, the differences marked.

Both summaries come from the manifests and the tokenizer files (no shard is read, so remote
datasets cost small downloads): configuration, objective and its parameters (a list of named
entries, a mixture, keyed by name), tokenizer (its own sentinels and objective tokens beside
those the objective uses, as the report gives them), document accounting, per split the counts, shard bytes per
format, document lengths and the objective's statistics (the manifest's summary of its
exact counters), and last the facts of the run (command line, time, version, inputs,
encoder), which differ between any two runs and so are reported apart: by docs/design.md's
determinism contract the same inputs, config and seed give equal rows everywhere else.

A row is ``(section, key, a, b, status)`` with status ``same``, ``changed``, ``only_a`` or
``only_b``; values are JSON scalars (lists as JSON text).
"""

from __future__ import annotations

import json
import shlex
from dataclasses import dataclass
from typing import Any

from loaders.inspection.source import InspectedDataset, tokenizer_specials
from loaders.inspection.table import manifest_objective_summary

__all__ = ["DiffRow", "RUN_SECTION", "dataset_summary", "diff_datasets", "format_diff"]

RUN_SECTION = "run"
_SPLIT_FIELDS = ("examples", "tokens", "num_shards", "documents", "duplicates", "padding_tokens", "dropped_tokens",
                 "document_tokens")
_MISSING = object()


@dataclass(frozen=True)
class DiffRow:
    """One summary entry of both datasets."""

    section: str
    key: str
    a: Any
    b: Any
    status: str

    def to_json(self) -> dict[str, Any]:
        return {"section": self.section, "key": self.key, "a": self.a, "b": self.b, "status": self.status}


def _flatten(value: Any, prefix: str, out: dict[str, Any]) -> None:
    if isinstance(value, dict):
        for key in value:
            _flatten(value[key], f"{prefix}.{key}" if prefix else str(key), out)
    elif isinstance(value, list) and value and all(isinstance(v, dict) and "name" in v for v in value):
        for item in value:  # a list of named entries (a mixture): one row per entry, by name
            _flatten({k: v for k, v in item.items() if k != "name"}, f"{prefix}[{item['name']}]", out)
    elif isinstance(value, (list, tuple)):
        out[prefix] = json.dumps(value, sort_keys=True, ensure_ascii=False, default=str)
    elif value is None or isinstance(value, (bool, int, float, str)):
        out[prefix] = value
    else:
        out[prefix] = str(value)


def _block(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def _specials(ds: InspectedDataset, tokenizer: dict[str, Any]) -> dict[str, Any]:
    """The manifest's ``num_sentinels`` and ``mode_tokens`` (the objective's own tokens: what the
    objective uses, 0 and {} for an objective without such tokens) taken out of ``tokenizer`` and
    put beside what the tokenizer itself holds, as the report shows them, so that
    ``num_sentinels 0`` never reads as a tokenizer without sentinels."""
    own_sentinels, own_modes = tokenizer_specials(ds)
    used_sentinels = tokenizer.pop("num_sentinels", 0)
    used_modes = tokenizer.pop("mode_tokens", None)
    used_modes = used_modes if isinstance(used_modes, dict) else {}
    out: dict[str, Any] = {"sentinels in the tokenizer": own_sentinels,
                           "sentinels used by the objective": used_sentinels}
    if own_modes or used_modes:
        out["objective tokens in the tokenizer"] = " ".join(own_modes) or "none"
        out["objective tokens used by the objective"] = " ".join(f"{k}={v}" for k, v in used_modes.items()) or "none"
    return out


def dataset_summary(ds: InspectedDataset) -> dict[str, dict[str, Any]]:
    """Section name -> flat ``{key: value}`` of one dataset (see the module docstring)."""
    m = ds.manifest
    objective = _block(m.objective)
    tokenizer = dict(_block(m.tokenizer))
    added = tokenizer.pop("added_tokens", None)
    if isinstance(added, list):
        tokenizer["added_tokens"] = len(added)
    tokenizer.update(_specials(ds, tokenizer))
    sections: dict[str, dict[str, Any]] = {}
    for name, value in (("config", _block(m.config)),
                        ("objective", {"name": objective.get("name"), "family": objective.get("family"),
                                       "params": _block(objective.get("params"))}),
                        ("tokenizer", tokenizer),
                        ("counts", {k: v for k, v in _block(m.counts).items() if k != "rejected_files"})):
        sections[name] = {}
        _flatten(value, "", sections[name])
    for split, info in _block(m.splits).items():
        info = _block(info)
        entry: dict[str, Any] = {k: info.get(k) for k in _SPLIT_FIELDS if k in info}
        sizes: dict[str, int] = {}
        for shard in info.get("shards", []) if isinstance(info.get("shards"), list) else []:
            for fmt, file in _block(_block(shard).get("files")).items():
                size = _block(file).get("bytes")
                sizes[fmt] = sizes.get(fmt, 0) + (size if isinstance(size, int) else 0)
        entry["bytes"] = sizes
        stats = _block(_block(m.stats).get(split))
        lengths = _block(stats.get("document_lengths"))
        entry["document_lengths"] = {k: lengths[k] for k in ("count", "mean", "min", "max") if k in lengths}
        try:
            entry["objective"] = manifest_objective_summary(ds, split) or {}
        except (KeyError, TypeError, ValueError, AttributeError):
            entry["objective"] = {"counters": stats.get("objective")}
        sections[f"split {split}"] = {}
        _flatten(entry, "", sections[f"split {split}"])
    run = _block(m.run)
    facts: dict[str, Any] = {}
    if isinstance(run.get("argv"), list):
        facts["command"] = "lmshards materialize " + shlex.join(str(a) for a in run["argv"])
    for key in ("created_at", "lmshards_version", "output", "tokenizer_source", "wall_seconds"):
        if key in run:
            facts[key] = run[key]
    files = [f for f in run.get("input_files", []) if isinstance(f, dict)] if isinstance(run.get("input_files"),
                                                                                         list) else []
    facts["input_files"] = len(files)
    facts["input_bytes"] = sum(f.get("bytes", 0) for f in files if isinstance(f.get("bytes"), int))
    encoder = _block(run.get("encoder"))
    for key in ("backend", "requested", "fastokens_version", "tokenizers_version"):
        if key in encoder:
            facts[f"encoder.{key}"] = encoder[key]
    sections[RUN_SECTION] = facts
    return sections


def diff_datasets(a: InspectedDataset, b: InspectedDataset) -> list[DiffRow]:
    """Every summary entry of either dataset, A's order first, in sections."""
    left, right = dataset_summary(a), dataset_summary(b)
    order = list(left) + [s for s in right if s not in left]
    order = [s for s in order if s != RUN_SECTION] + [RUN_SECTION]  # the run's facts last
    rows = []
    for section in order:
        one, two = left.get(section, {}), right.get(section, {})
        for key in list(one) + [k for k in two if k not in one]:
            x, y = one.get(key, _MISSING), two.get(key, _MISSING)
            status = "only_b" if x is _MISSING else "only_a" if y is _MISSING else "same" if x == y else "changed"
            rows.append(DiffRow(section, key, None if x is _MISSING else x, None if y is _MISSING else y, status))
    return rows


def _cell(value: Any, width: int) -> str:
    text = "-" if value is None else json.dumps(value) if isinstance(value, bool) else (
        f"{value:,}" if isinstance(value, int) else str(value))
    return text if len(text) <= width else text[: width - 3] + "..."


_MARKS = {"same": " ", "changed": "!", "only_a": "-", "only_b": "+"}


def format_diff(rows: list[DiffRow], a_name: str, b_name: str, *, only_differences: bool = False,
                width: int = 44, color: bool = False) -> str:
    """The side-by-side text: a mark per row (``!`` changed, ``-`` only in A, ``+`` only in B),
    then the key and both values; a count of the differences at the end."""
    shown = [r for r in rows if r.status != "same" or not only_differences]
    key_width = min(max((len(r.key) for r in shown), default=10) + 2, 56)
    out = [f"A: {a_name}", f"B: {b_name}", "",
           f"  {'':<{key_width}}{'A':<{width}}  B"]
    section = None
    for row in shown:
        if row.section != section:
            section = row.section
            out.append(section + (" (differs between any two runs)" if section == RUN_SECTION else ""))
        line = (f"{_MARKS[row.status]} {_cell(row.key, key_width - 2):<{key_width}}{_cell(row.a, width):<{width}}  "
                f"{_cell(row.b, width)}")
        if color and row.status != "same":
            line = f"\x1b[{'33' if row.status == 'changed' else '36'}m{line}\x1b[0m"
        out.append(line)
    data = [r for r in rows if r.status != "same" and r.section != RUN_SECTION]
    facts = [r for r in rows if r.status != "same" and r.section == RUN_SECTION]
    out += ["", f"{len(data)} difference(s) in config, objective, tokenizer, counts and splits; "
            f"{len(facts)} in the run's facts"]
    return "\n".join(out) + "\n"
