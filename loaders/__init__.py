"""Readers of lmshards datasets. Never imports Apache Beam (docs/design.md section 1).

- :mod:`loaders.access.reader`: a minimal numpy reader (shard order, no torch).
- :class:`ShardedDataset` (:mod:`loaders.dataset`): torch ``IterableDataset`` over a split,
  exact global shuffle, rank/worker split, exact and elastic resume, dynamic noise.
- :class:`MixtureDataset` (:mod:`loaders.mixture`): weighted mixtures of datasets.
- :func:`make_dataloader` (:mod:`loaders.streaming.dataloader`): the resumable DataLoader.
- Collators (:mod:`loaders.collation.collate`; HF transformers' conventions: unshifted labels, packed
  documents kept apart by restarting positions (clm) or 4-D masks from :mod:`loaders.collation.masks`
  (prefix-LM)), columnar batches (:mod:`loaders.collation.batch`), the epoch
  order (:mod:`loaders.streaming.order`), the split and state (:mod:`loaders.streaming.state`), progress shared
  with DataLoader workers (:mod:`loaders.streaming.progress`).
- :mod:`loaders.integrations.hf`: HF ``Trainer`` under DDP (transformers imported lazily); the
  plain ``Trainer`` is refused.

torch is optional: ``import loaders`` and the numpy modules work without it; the
torch-backed names below are imported on first use.

The modules beside the subpackages (``dataset``, ``mixture``, ``dynamic``, ``errors``) may import
:mod:`loaders.access`, :mod:`loaders.collation`, :mod:`loaders.streaming`, :mod:`schemas`,
:mod:`transforms.objectives`, numpy, torch and tokenizers; never :mod:`loaders.inspection` or
:mod:`loaders.integrations`, never Beam.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from loaders.access.reader import DatasetReader, iter_examples, open_dataset
from loaders.collation.batch import ExampleBatch, Ragged
from loaders.collation.collate import StackCollator, collator_for
from loaders.collation.collate_decoder import CausalCollator, PrefixLMCollator
from loaders.collation.collate_encoder import MLMCollator, Seq2SeqCollator
from loaders.errors import ShardIntegrityError, UnsupportedSchemaError
from loaders.streaming.order import EpochOrder
from loaders.streaming.state import LoaderState, RankSchedule
from transforms.objectives.common import IGNORE_INDEX

if TYPE_CHECKING:
    from loaders.dataset import ShardedDataset
    from loaders.mixture import MixtureDataset
    from loaders.streaming.dataloader import ResumableDataLoader, make_dataloader

__all__ = [
    "IGNORE_INDEX",
    "CausalCollator",
    "DatasetReader",
    "EpochOrder",
    "ExampleBatch",
    "LoaderState",
    "MLMCollator",
    "MixtureDataset",
    "PrefixLMCollator",
    "Ragged",
    "RankSchedule",
    "ResumableDataLoader",
    "Seq2SeqCollator",
    "ShardIntegrityError",
    "ShardedDataset",
    "StackCollator",
    "UnsupportedSchemaError",
    "collator_for",
    "iter_examples",
    "make_dataloader",
    "open_dataset",
]

_TORCH_NAMES = {
    "ShardedDataset": "loaders.dataset",
    "MixtureDataset": "loaders.mixture",
    "ResumableDataLoader": "loaders.streaming.dataloader",
    "make_dataloader": "loaders.streaming.dataloader",
}


def __getattr__(name: str) -> Any:
    module = _TORCH_NAMES.get(name)
    if module is None:
        raise AttributeError(f"module 'loaders' has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value
