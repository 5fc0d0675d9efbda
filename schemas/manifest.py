"""The manifest of an lmshards dataset directory (``OUT/manifest.json``).

The manifest is written last: its presence marks a complete dataset. Everything in it
is a pure function of the inputs (as a multiset of documents), the config and the seed,
except the ``run`` block (``created_at``, the command line, the output path and the
concrete input files), which describes one particular run and is left out when two runs
are compared for determinism (:meth:`Manifest.deterministic_view`).
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import asdict, dataclass, field
from typing import Any

from schemas.errors import DatasetError, ShardIntegrityError

__all__ = ["LENGTH_PARAMETERS", "MANIFEST_NAME", "MANIFEST_VERSION", "MAX_EXAMPLE_TOKENS", "Manifest", "ShardFile",
           "ShardInfo", "min_row_bytes", "shard_name"]

MANIFEST_NAME = "manifest.json"
#: Version 2: pack groups sized in tokens (``--pack-group-tokens``, ``splits.*.pack_groups``),
#: chunk keys ``SPLIT-gNNNNN-cNNNNNN`` (version 1 packed in ``--num-buckets`` hash buckets);
#: counter-based noise and one digest per example for shard, row order and noise; fairseq's
#: BART words, BERT's MLM selection size. Shards of version 1 still read, but their layout and
#: noise follow the rules of the lmshards that wrote them.
#: Version 3: decoder rows with a prefix (prefix_lm, ul2's decoder layout) store
#: ``prefix_lengths`` (list<int32>, one per document segment beside ``doc_lengths``) instead of
#: one ``prefix_length``: prefix_lm splits every document segment of a chunk on its own, so that
#: packed documents stay apart. Version 2's ``prefix_length`` rows still read (one segment each).
MANIFEST_VERSION = 3
FORMAT_DIRS = {"arrow": "arrow", "webdataset": "wds"}
FORMAT_SUFFIXES = {"arrow": ".arrow", "webdataset": ".tar"}
#: Most tokens one example's length parameter may ask for: far beyond any model's context, and
#: below what an Arrow list offset (int32) and the objectives' length searches take.
MAX_EXAMPLE_TOKENS = 1 << 24
#: The objective parameters that are example lengths (checked against :data:`MAX_EXAMPLE_TOKENS`).
LENGTH_PARAMETERS = ("seq_len", "inputs_length", "targets_length")
#: Bytes of one tar header: every member of a WebDataset row has one (the key is in its name).
TAR_BLOCK = 512
_ITEM_BYTES = {"int8": 1, "uint8": 1, "int16": 2, "uint16": 2, "float16": 2, "halffloat": 2, "int32": 4, "uint32": 4,
               "float": 4, "float32": 4, "int64": 8, "uint64": 8, "double": 8, "float64": 8}
_FIXED_LIST = re.compile(r"fixed_size_list<[^:>]*: (\w+)>\[(\d+)\]")


def shard_name(split: str, fmt: str, index: int, count: int) -> str:
    """Relative path of a shard file, for example ``train/arrow/data-00000-of-00016.arrow``."""
    if fmt not in FORMAT_DIRS:
        raise ValueError(f"unknown shard format {fmt!r}; expected one of {sorted(FORMAT_DIRS)}")
    if not 0 <= index < count:
        raise ValueError(f"shard index {index} out of range for {count} shards")
    return f"{split}/{FORMAT_DIRS[fmt]}/data-{index:05d}-of-{count:05d}{FORMAT_SUFFIXES[fmt]}"


@dataclass(frozen=True)
class ShardFile:
    """One file of a shard in one format."""

    path: str
    bytes: int
    sha256: str


@dataclass(frozen=True)
class ShardInfo:
    """One shard: the same rows stored in one file per format."""

    split: str
    index: int
    rows: int
    tokens: int
    files: dict[str, ShardFile]

    def to_json(self) -> dict[str, Any]:
        return {
            "split": self.split,
            "index": self.index,
            "rows": self.rows,
            "tokens": self.tokens,
            "files": {fmt: asdict(f) for fmt, f in sorted(self.files.items())},
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> ShardInfo:
        return cls(
            split=data["split"],
            index=int(data["index"]),
            rows=int(data["rows"]),
            tokens=int(data["tokens"]),
            files={fmt: ShardFile(**f) for fmt, f in data["files"].items()},
        )


def min_row_bytes(columns: list[dict[str, str]], fmt: str) -> int:
    """The fewest bytes a row of these columns takes in a shard file of format ``fmt`` (0: unknown).

    A row count a manifest claims is only believed when the file's bytes can hold it, so that no
    reader sizes anything (an epoch order, a block permutation) by a number the file cannot back.
    Arrow (uncompressed IPC, as the writer makes it): a fixed-size list of ``w`` items takes
    ``w`` items per row, an integer its width, a string or list its offset; WebDataset: one tar
    header per member, one member per column but the key.
    """
    if fmt == "webdataset":
        return TAR_BLOCK * sum(1 for column in columns if column["name"] != "key")
    total = 0
    for column in columns:
        kind = column["type"]
        fixed = _FIXED_LIST.fullmatch(kind)
        if fixed:
            total += _ITEM_BYTES.get(fixed.group(1), 0) * int(fixed.group(2))
        elif kind.startswith(("large_list<", "large_string", "large_utf8")):
            total += 8
        elif kind.startswith(("list<", "string", "utf8")):
            total += 4
        else:
            total += _ITEM_BYTES.get(kind, 0)
    return total


def _refuse_constant(name: str) -> None:
    raise ShardIntegrityError(f"damaged manifest: the number {name} (a manifest holds finite numbers only)")


def _finite_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise ShardIntegrityError(f"damaged manifest: the number {text} is out of range (a manifest holds finite "
                                  "numbers only)")
    return value


def _fail(where: str, what: str) -> None:
    raise ShardIntegrityError(f"damaged manifest: {where} {what}")


def _check_structure(data: dict[str, Any]) -> None:
    """The types the readers rely on (a manifest is untrusted input: fail here, not deep in a reader)."""
    for name in ("objective", "config", "tokenizer", "schema", "counts", "splits"):
        if not isinstance(data[name], dict):
            _fail(name, "is not an object")
    if not isinstance(data.get("stats", {}), dict) or not isinstance(data.get("run", {}), dict):
        _fail("stats/run", "is not an object")
    columns = data["schema"].get("columns", [])
    if not isinstance(columns, list) or not all(
            isinstance(c, dict) and isinstance(c.get("name"), str) and isinstance(c.get("type"), str) for c in columns):
        _fail("schema.columns", "is not a list of {name, type} strings")
    formats = data["config"].get("formats", [])
    if not isinstance(formats, list) or not all(isinstance(f, str) for f in formats):
        _fail("config.formats", "is not a list of strings")
    for split, info in data["splits"].items():
        if not isinstance(info, dict) or not isinstance(info.get("shards"), list):
            _fail(f"splits.{split}", "has no list of shards")
        for number, shard in enumerate(info["shards"]):
            where = f"splits.{split}.shards[{number}]"
            if not isinstance(shard, dict) or not isinstance(shard.get("files"), dict):
                _fail(where, "has no files")
            if not isinstance(shard.get("split"), str):
                _fail(f"{where}.split", "is not a string")
            for key in ("index", "rows", "tokens"):
                value = shard.get(key)
                if not isinstance(value, int) or isinstance(value, bool) or value < 0:
                    _fail(f"{where}.{key}", f"is {value!r}, not an integer >= 0")
            for fmt, entry in shard["files"].items():
                if not isinstance(entry, dict) or set(entry) != {"path", "bytes", "sha256"}:
                    _fail(f"{where}.files.{fmt}", "is not {path, bytes, sha256}")
                if not isinstance(entry["path"], str) or not isinstance(entry["bytes"], int) or entry["bytes"] < 0:
                    _fail(f"{where}.files.{fmt}", "has a bad path or size")
                if not isinstance(entry["sha256"], str):
                    _fail(f"{where}.files.{fmt}.sha256", "is not a string")
    _check_consistency(data)


def _check_consistency(data: dict[str, Any]) -> None:
    """What every reader relies on beyond the types: each split lists its shards once each, in
    index order (a split without shards, or a shard listed twice, is no dataset the writer
    makes); split totals are the sums over their shards; each file's bytes can hold its rows
    (:func:`min_row_bytes`); example lengths are whole numbers a model can use."""
    params = data["objective"].get("params", {})
    if not isinstance(params, dict):
        _fail("objective.params", "is not an object")
    for name in LENGTH_PARAMETERS:
        value = params.get(name)
        if name in params and (not isinstance(value, int) or isinstance(value, bool)
                               or not 1 <= value <= MAX_EXAMPLE_TOKENS):
            _fail(f"objective.params.{name}",
                  f"is {value!r}, not a whole number of tokens in 1..{MAX_EXAMPLE_TOKENS:,}")
    columns = data["schema"].get("columns", [])
    row_bytes = {fmt: min_row_bytes(columns, fmt) for fmt in FORMAT_DIRS}
    paths: dict[str, str] = {}
    for split, info in data["splits"].items():
        shards = info["shards"]
        if not shards:
            _fail(f"splits.{split}", "lists no shards (a split the writer makes has at least one; this one holds no "
                  "examples)")
        for number, shard in enumerate(shards):
            where = f"splits.{split}.shards[{number}]"
            if shard["index"] != number or shard["split"] != split:
                _fail(where, f"is shard {shard['index']} of split {shard['split']!r}, not shard {number} of {split!r} "
                      "(each shard is listed once, in index order)")
            for fmt, entry in shard["files"].items():
                if entry["path"] in paths:
                    _fail(f"{where}.files.{fmt}", f"names {entry['path']}, which {paths[entry['path']]} names too")
                paths[entry["path"]] = f"{where}.files.{fmt}"
                need = row_bytes.get(fmt, 0)
                if need and shard["rows"] > entry["bytes"] // need:
                    _fail(f"{where}.rows", f"is {shard['rows']:,}: more than its {entry['bytes']:,}-byte {fmt} file "
                          f"can hold (a row takes at least {need:,} bytes)")
        for name, key in (("examples", "rows"), ("tokens", "tokens")):
            if name in info and info[name] != sum(shard[key] for shard in shards):
                _fail(f"splits.{split}.{name}", f"is {info[name]!r}, not the sum over its shards "
                      f"({sum(shard[key] for shard in shards):,})")


@dataclass
class Manifest:
    """In-memory model of ``manifest.json``.

    Attributes:
        objective: objective name and its parameters.
        config: every setting that shapes the bytes of the output (seed included).
        tokenizer: file name, sha256, vocab size and special ids.
        schema: the example schema (see :mod:`schemas.examples`).
        counts: document accounting (read, written, duplicates, rejected by reason).
        splits: per split: examples, tokens, dropped and padding tokens, shard list.
        stats: token, length and objective statistics.
        run: facts of this run only (created_at, argv, output, input files).
    """

    objective: dict[str, Any]
    config: dict[str, Any]
    tokenizer: dict[str, Any]
    schema: dict[str, Any]
    counts: dict[str, Any]
    splits: dict[str, Any]
    stats: dict[str, Any] = field(default_factory=dict)
    run: dict[str, Any] = field(default_factory=dict)
    format_version: int = MANIFEST_VERSION

    def shards(self, split: str) -> list[ShardInfo]:
        """The shards of ``split`` in index order."""
        if split not in self.splits:
            raise KeyError(f"split {split!r} not in dataset; it has {sorted(self.splits)}")
        return [ShardInfo.from_json(s) for s in self.splits[split]["shards"]]

    def to_json(self) -> dict[str, Any]:
        return {
            "format": "lmshards",
            "format_version": self.format_version,
            "objective": self.objective,
            "config": self.config,
            "tokenizer": self.tokenizer,
            "schema": self.schema,
            "counts": self.counts,
            "splits": self.splits,
            "stats": self.stats,
            "run": self.run,
        }

    def dumps(self) -> str:
        """Canonical JSON text (sorted keys, fixed indentation, trailing newline)."""
        return json.dumps(self.to_json(), indent=2, sort_keys=True) + "\n"

    def deterministic_view(self) -> dict[str, Any]:
        """The manifest without its ``run`` block: equal across runs of the same data."""
        data = self.to_json()
        data.pop("run")
        return data

    @classmethod
    def loads(cls, text: str) -> Manifest:
        """Parse manifest JSON text.

        Raises:
            ShardIntegrityError: not JSON, not an lmshards manifest, a missing or damaged block.
            DatasetError: a newer format version.
        """
        try:
            data = json.loads(text, parse_constant=_refuse_constant, parse_float=_finite_float)
        except json.JSONDecodeError as exc:
            raise ShardIntegrityError(str(exc)) from None
        if not isinstance(data, dict) or data.get("format") != "lmshards":
            raise ShardIntegrityError("not an lmshards manifest (missing \"format\": \"lmshards\")")
        version = data.get("format_version")
        if not isinstance(version, int) or version > MANIFEST_VERSION:
            raise DatasetError(
                f"unsupported manifest format_version {version!r}; this lmshards reads <= {MANIFEST_VERSION}"
            )
        required = ("objective", "config", "tokenizer", "schema", "counts", "splits")
        missing = [name for name in required if name not in data]
        if missing:
            raise ShardIntegrityError(f"lmshards manifest is missing {missing}")
        _check_structure(data)
        return cls(
            objective=data["objective"],
            config=data["config"],
            tokenizer=data["tokenizer"],
            schema=data["schema"],
            counts=data["counts"],
            splits=data["splits"],
            stats=data.get("stats", {}),
            run=data.get("run", {}),
            format_version=version,
        )
