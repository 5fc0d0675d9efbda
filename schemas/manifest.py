"""The manifest of an lmshards dataset directory (``OUT/manifest.json``).

The manifest is written last: its presence marks a complete dataset. Everything in it
is a pure function of the inputs (as a multiset of documents), the config and the seed,
except the ``run`` block (``created_at``, the command line, the output path and the
concrete input files), which describes one particular run and is left out when two runs
are compared for determinism (:meth:`Manifest.deterministic_view`).
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from typing import Any

__all__ = ["MANIFEST_NAME", "MANIFEST_VERSION", "Manifest", "ShardFile", "ShardInfo", "shard_name"]

MANIFEST_NAME = "manifest.json"
#: 2: counter-based noise and one digest per example for shard, row order and noise (issue 20);
#: fairseq's BART words, BERT's MLM selection size. Shards of version 1 still read, but their
#: layout and noise follow the rules of the lmshards that wrote them.
MANIFEST_VERSION = 2
FORMAT_DIRS = {"arrow": "arrow", "webdataset": "wds"}
FORMAT_SUFFIXES = {"arrow": ".arrow", "webdataset": ".tar"}


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
            ValueError: not an lmshards manifest, a newer format version, or a missing block.
        """
        data = json.loads(text)
        if not isinstance(data, dict) or data.get("format") != "lmshards":
            raise ValueError("not an lmshards manifest (missing \"format\": \"lmshards\")")
        version = data.get("format_version")
        if not isinstance(version, int) or version > MANIFEST_VERSION:
            raise ValueError(
                f"unsupported manifest format_version {version!r}; this lmshards reads <= {MANIFEST_VERSION}"
            )
        required = ("objective", "config", "tokenizer", "schema", "counts", "splits")
        missing = [name for name in required if name not in data]
        if missing:
            raise ValueError(f"lmshards manifest is missing {missing}")
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
