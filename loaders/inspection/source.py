"""A dataset opened for inspection: manifest, tokenizer, special ids, the objective rebuilt
from the manifest, and examples read shard by shard only as far as asked.

Storage is reached through :func:`dataset_files` alone: the loader's own file layer
(:class:`loaders.access.files.DatasetLocation`: a local directory read in place, a URL such as
``gs://`` or ``s3://`` downloaded into its local cache on first use). The manifest, the shards
and the tokenizer are read through the same doors as the loader's
(:meth:`~loaders.access.files.DatasetLocation.read_manifest`,
:meth:`~loaders.access.files.DatasetLocation.open_shard`,
:meth:`~loaders.access.files.DatasetLocation.tokenizer_file`, and the shard openers
:class:`~loaders.access.arrow_shard.ArrowShard` and :func:`~loaders.access.tar_shard.iter_tar_shard`), so every
check the loader makes applies here too.

Rows inside a shard are stored sorted by a seeded digest of their key (the writer's global
shuffle), so the first rows of each shard are a uniform random sample of the split:
:meth:`InspectedDataset.sample` reads ``ceil(n / shards)`` leading rows of every shard
instead of scanning everything. :meth:`InspectedDataset.find` recomputes the shard of a
key with the writer's hash (``transforms/writing/write.py``) and reads that shard only.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from loaders.access.files import DatasetLocation
from loaders.access.reader import read_arrow_shard, read_tar_shard
from loaders.errors import ShardIntegrityError
from loaders.inspection.anatomy import ObjectiveView
from schemas.errors import ConfigError
from schemas.manifest import MANIFEST_NAME, Manifest, ShardInfo
from transforms.objectives.common import SpecialIds
from transforms.objectives.layout import row_order_key, shard_of
from transforms.objectives.registry import objective_from_params, tokens_needed

__all__ = [
    "InspectedDataset",
    "Located",
    "dataset_files",
    "objective_from_manifest",
    "open_inspected",
    "order_digest",
    "shard_of_key",
    "special_ids_from_tokenizer",
    "tokenizer_specials",
]


def shard_of_key(seed: int, key: str, num_shards: int) -> int:
    """Shard index the writer assigns to example ``key`` in a split of ``num_shards`` shards."""
    return shard_of(seed, key, num_shards)


def order_digest(seed: int, key: str) -> bytes:
    """The digest rows of a shard are sorted by."""
    return row_order_key(seed, key)


def dataset_files(root: str) -> DatasetLocation:
    """The storage of the dataset at ``root``: the loader's :class:`~loaders.access.files.DatasetLocation`
    (a local directory read in place, a URL through the loader's cache), so that inspection reads
    the manifest, the shards and the tokenizer exactly as the loader does.

    Its ``local_file(relative)`` raises :class:`FileNotFoundError` for a missing file.
    """
    return DatasetLocation(root)


def objective_from_manifest(objective: dict[str, Any]) -> Any:
    """The objective object that made the dataset, rebuilt from the manifest's ``objective`` block.

    The manifest records ``params()`` (configuration plus derived lengths); the objective's class
    reads its configuration back from them (:meth:`Objective.config_from_params`).
    """
    return objective_from_params(objective["name"], objective.get("params", {}))


def special_ids_from_tokenizer(tokenizer: Any, manifest_tokenizer: dict[str, Any]) -> SpecialIds:
    """Special ids as the pipeline resolved them: roles from the manifest, every consecutive
    ``<extra_id_k>`` and the mode tokens from the tokenizer, ``all_special`` = added special tokens."""
    roles = dict(manifest_tokenizer.get("special_ids", {}))
    sentinels = []
    while (token_id := tokenizer.token_to_id(f"<extra_id_{len(sentinels)}>")) is not None:
        sentinels.append(int(token_id))
    modes = {str(t): int(i) for t, i in manifest_tokenizer.get("mode_tokens", {}).items()}
    added = tokenizer.get_added_tokens_decoder().values()
    all_special = {tokenizer.token_to_id(t.content) for t in added if t.special} - {None}
    eos = roles.get("eos", -1)
    return SpecialIds(
        vocab_size=int(manifest_tokenizer.get("vocab_size") or tokenizer.get_vocab_size(with_added_tokens=True)),
        pad=roles.get("pad", eos),
        eos=eos,
        bos=roles.get("bos"),
        unk=roles.get("unk"),
        mask=roles.get("mask"),
        cls=roles.get("cls"),
        sep=roles.get("sep"),
        sentinels=tuple(sentinels),
        mode_tokens=modes,
        all_special=frozenset(int(i) for i in all_special),
    )


@dataclass(frozen=True)
class Located:
    """An example with where it was read from."""

    split: str
    shard: int
    row: int
    example: dict[str, Any]


class InspectedDataset:
    """A dataset directory (local path or URL) opened for inspection.

    Args:
        path: the dataset directory.

    Raises:
        FileNotFoundError: no manifest (missing or incomplete dataset).
        ValueError: the manifest is not an lmshards manifest.
    """

    def __init__(self, path: str):
        self.path = str(path)
        self.files = dataset_files(self.path)
        self.manifest: Manifest = self.files.read_manifest()
        try:
            self.seed = int(self.manifest.config.get("seed", 0))
        except (TypeError, ValueError):
            raise ShardIntegrityError(f"{self.path}/{MANIFEST_NAME}: config.seed is "
                                      f"{self.manifest.config.get('seed')!r}, not an integer") from None
        #: check each shard's size and sha256 (once per process) and the tokenizer's sha256 before reading
        #: them (validate turns this off: it checks every file itself and reports what it finds)
        self.verify_reads = True
        self._objective: Any = None
        self._tokenizer: Any = None
        self._special: SpecialIds | None = None

    @property
    def splits(self) -> list[str]:
        return list(self.manifest.splits)

    @property
    def formats(self) -> list[str]:
        return list(self.manifest.config.get("formats", []))

    @property
    def default_format(self) -> str:
        return "arrow" if "arrow" in self.formats else self.formats[0]

    @property
    def objective(self) -> Any:
        if self._objective is None:
            try:
                self._objective = objective_from_manifest(self.manifest.objective)
            except ConfigError:  # an installed objective plugin that cannot be loaded: not the dataset's fault
                raise
            except (ValueError, KeyError, TypeError, AttributeError) as exc:
                raise ShardIntegrityError(f"{self.path}/{MANIFEST_NAME}: its objective block cannot be rebuilt "
                                          f"({type(exc).__name__}: {exc})") from None
        return self._objective

    @property
    def tokenizer(self) -> Any:
        """The dataset's own ``tokenizer.json`` (the one written with its added tokens)."""
        if self._tokenizer is None:
            from tokenizers import Tokenizer

            name = self.manifest.tokenizer.get("file", "tokenizer.json")
            path = self.files.tokenizer_file(self.manifest, verify="once" if self.verify_reads else "never")
            try:
                self._tokenizer = Tokenizer.from_file(path)
            except Exception as exc:  # noqa: BLE001 - the tokenizers library raises plain Exception
                raise ShardIntegrityError(f"{name}: not a tokenizer the tokenizers library can load "
                                          f"({str(exc).splitlines()[0] if str(exc) else type(exc).__name__})") from None
        return self._tokenizer

    @property
    def special(self) -> SpecialIds:
        if self._special is None:
            try:
                self._special = special_ids_from_tokenizer(self.tokenizer, self.manifest.tokenizer)
            except (ValueError, TypeError, AttributeError) as exc:
                raise ShardIntegrityError(f"{self.path}/{MANIFEST_NAME}: its tokenizer block is damaged "
                                          f"({type(exc).__name__}: {exc})") from None
        return self._special

    @property
    def view(self) -> Any:
        """The :class:`~loaders.inspection.anatomy.ObjectiveView` examples are taken apart with."""
        config = self.manifest.config
        # documents joined without a separator (--document-separator none) end with no EOS to check
        packing = config.get("packing", "concat") if config.get("document_separator", "eos") == "eos" else "joined"
        return ObjectiveView(self.objective, self.special, packing, self.seed)

    def shards(self, split: str) -> list[ShardInfo]:
        return self.manifest.shards(split)

    def shard_path(self, split: str, index: int, fmt: str | None = None) -> str:
        """Local path of a shard file (downloaded first for a URL)."""
        fmt = fmt or self.default_format
        entry = self.shards(split)[index].files[fmt]
        if not self.verify_reads:  # validate: it checks (and reports) sizes and checksums itself
            return self.files.local_file(entry.path)
        lease = self.files.open_shard(entry, verify="once")
        lease.close()  # (a remote file is then read at once from the cache)
        return lease.path

    def iter_shard(self, split: str, index: int, fmt: str | None = None, limit: int | None = None) -> Iterator[dict]:
        """The first ``limit`` examples (all when None) of one shard, in stored order."""
        fmt = fmt or self.default_format
        read = read_arrow_shard if fmt == "arrow" else read_tar_shard
        shard = self.shards(split)[index]
        # Checked against the manifest as it is read: schema, dtypes, shapes, and the row count (an Arrow
        # shard's up front; a tar's at its end, so only when it is read whole).
        rows = shard.rows if fmt == "arrow" or limit is None else None
        return itertools.islice(read(self.shard_path(split, index, fmt), name=shard.files[fmt].path,
                                     columns=self.columns, rows=rows), limit)

    @property
    def columns(self) -> dict[str, str]:
        """The manifest's schema: ``{column: arrow type}``."""
        return {c["name"]: c["type"] for c in self.manifest.schema.get("columns", [])}

    def iter_split(self, split: str, fmt: str | None = None, per_shard: int | None = None) -> Iterator[Located]:
        """Examples of ``split`` shard by shard, at most ``per_shard`` of each."""
        for shard in self.shards(split):
            if shard.rows == 0:
                continue
            for row, example in enumerate(self.iter_shard(split, shard.index, fmt, per_shard)):
                yield Located(split, shard.index, row, example)

    def sample(self, split: str, limit: int | None, fmt: str | None = None) -> Iterator[Located]:
        """A uniform sample of about ``limit`` examples (the leading rows of every shard); all when None or 0."""
        shards = [s for s in self.shards(split) if s.rows]
        if not limit or not shards or limit >= sum(s.rows for s in shards):
            return self.iter_split(split, fmt)
        return itertools.islice(self.iter_split(split, fmt, per_shard=math.ceil(limit / len(shards))), limit)

    def head(self, split: str, n: int, fmt: str | None = None) -> list[Located]:
        """The first ``n`` stored examples of ``split`` (first shard first; reads no further)."""
        return list(itertools.islice(self.iter_split(split, fmt), n))

    def locate_key(self, key: str) -> list[tuple[str, int]]:
        """``(split, shard index)`` pairs the writer may have put ``key`` in (the split named by
        the key's prefix, or every split when none matches)."""
        splits = [s for s in self.splits if key.startswith(f"{s}-")] or self.splits
        return [(s, shard_of_key(self.seed, key, len(self.shards(s)))) for s in splits if self.shards(s)]

    def find(self, key: str, fmt: str | None = None) -> Located | None:
        """The example ``key``, reading only the shard that must hold it."""
        for split, index in self.locate_key(key):
            for row, example in enumerate(self.iter_shard(split, index, fmt)):
                if example["key"] == key:
                    return Located(split, index, row, example)
        return None


def open_inspected(path: str) -> InspectedDataset:
    """Open a dataset for inspection (see :class:`InspectedDataset`)."""
    return InspectedDataset(path)


def tokenizer_specials(ds: InspectedDataset) -> tuple[int | None, list[str]]:
    """``(sentinels, objective tokens)`` the dataset's tokenizer itself holds, whatever its
    objective uses (the manifest's ``num_sentinels`` and ``mode_tokens`` say that: 0 and none
    for clm on a T5-style tokenizer); the objective tokens are those of every registered
    objective (:func:`~transforms.objectives.registry.tokens_needed`: UL2's mode tokens, a
    plugin's own) that the tokenizer has. ``(None, [])`` when the tokenizer cannot be opened,
    which is reported where it is opened, so that a summary of the manifest still shows."""
    own = tokens_needed().tokens  # outside the try: a plugin that cannot be loaded is an error of its own
    try:
        return len(ds.special.sentinels), [t for t in own if ds.tokenizer.token_to_id(t) is not None]
    except Exception:  # noqa: BLE001 - a missing, damaged or foreign tokenizer file
        return None, []
