"""``MixtureDataset``: a weighted mixture of datasets, deterministic and resumable.

The mixture is one infinite global sequence ``G = 0, 1, 2, ...``; epoch ``e`` is
``G in [e*L, (e+1)*L)`` with ``L = samples_per_epoch``. Which source sample ``G`` is
comes from closed forms, so any position can be located without replaying the stream
(and resuming needs no per-source counters in the state):

- **Quotas.** With cumulative weights ``c_i = w_0 + ... + w_i`` (exact fractions of the
  weights as written: 0.7 is 7/10), source ``i`` owns ``floor(c_i*G) - floor(c_(i-1)*G)`` of the first ``G``
  samples: within one sample of ``w_i * G`` at every ``G`` (Megatron's ``BlendedDataset``
  keeps the same bound with a greedy, sequential rule).
- **Windows.** Samples come in windows of ``M`` (>= ``2 / min(w)`` so that each quota is
  non-decreasing window to window). Window ``q`` holds each source's quota difference,
  in an order permuted by a generator seeded with ``(seed, q)``.
- **Source positions.** The ``k``-th sample taken from source ``i`` is position
  ``k mod N_i`` of that source's own epoch order for epoch ``k // N_i``: a source smaller
  than its share is re-read, reshuffled, and (in dynamic mode) re-noised each pass.

Sources are :class:`~loaders.dataset.ShardedDataset` objects over Arrow shards; only
their data, seed, shuffle and objective settings are used (rank, world size and batch
size are the mixture's). A mixture of 0.7 clm + 0.3 ul2 (decoder layout) collates with
:class:`~loaders.collation.collate_decoder.PrefixLMCollator`; families that no single collator handles fail
in :func:`~loaders.collation.collate.collator_for`.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections import OrderedDict
from collections.abc import Sequence
from fractions import Fraction
from typing import Any

import numpy as np

from loaders.dataset import ShardedDataset
from loaders.errors import UnsupportedSchemaError
from loaders.streaming.order import seeded_rng
from loaders.streaming.state import RankSchedule
from loaders.streaming.stream import ResumableStream

__all__ = ["MixtureDataset", "mixture_window"]

_TAG_MIXTURE = 0x4D4958  # "MIX"


def _quotas(cumulative: Sequence[Fraction], total: int) -> np.ndarray:
    """Samples of each source among the first ``total`` of the mixture."""
    ends = np.array([math.floor(c * total) for c in cumulative], dtype=np.int64)
    ends[-1] = total
    return np.diff(ends, prepend=0)


def mixture_window(cumulative: Sequence[Fraction], window: int, seed: int, index: int) -> tuple[np.ndarray, np.ndarray]:
    """``(source of each slot, index of that sample within its source)`` for window ``index``."""
    start = _quotas(cumulative, index * window)
    counts = _quotas(cumulative, (index + 1) * window) - start
    sources = seeded_rng(seed, _TAG_MIXTURE, index).permutation(np.repeat(np.arange(len(counts)), counts))
    order = np.argsort(sources, kind="stable")
    first_slot = np.cumsum(counts) - counts
    rank = np.empty(window, dtype=np.int64)
    rank[order] = np.arange(window) - first_slot[sources[order]]
    return sources, start[sources] + rank


class MixtureDataset(ResumableStream):
    """Weighted mixture of :class:`ShardedDataset` sources (see the module docstring).

    Args:
        sources: the datasets to mix (Arrow format).
        weights: positive weights, one per source (normalised).
        batch_size: per-rank batch size.
        samples_per_epoch: ``L`` (None: the sources' total size).
        seed: seed of the mixing order (each source keeps its own order seed).
        window: mixing window ``M`` (raised to ``ceil(2 / min weight)`` when smaller).
        rank, world_size, uneven, drop_last: as :class:`ShardedDataset`.

    Raises:
        ValueError: no sources, bad weights, or a source that is not an Arrow ShardedDataset.
    """

    kind = "MixtureDataset"

    def __init__(
        self,
        sources: Sequence[ShardedDataset],
        weights: Sequence[float],
        *,
        batch_size: int = 1,
        samples_per_epoch: int | None = None,
        seed: int = 0,
        window: int = 4096,
        rank: int | None = None,
        world_size: int | None = None,
        uneven: str = "wrap",
        drop_last: bool = False,
    ):
        super().__init__(batch_size=batch_size, seed=seed, rank=rank, world_size=world_size, uneven=uneven,
                         drop_last=drop_last)
        if not sources or len(sources) != len(weights):
            raise ValueError(f"need one weight per source, got {len(sources)} sources and {len(weights)} weights")
        for i, source in enumerate(sources):
            if not isinstance(source, ShardedDataset) or source.shards.fmt != "arrow":
                raise ValueError(f"mixture source {i} must be a ShardedDataset with fmt='arrow'")
            if source.epoch_size() == 0:
                raise ValueError(f"mixture source {i} ({source.location.path}) has no samples")
        if any(not (isinstance(w, (int, float)) and math.isfinite(w) and w > 0) for w in weights):
            raise ValueError(f"mixture weights must be finite and > 0, got {list(weights)}")
        self.sources = list(sources)
        exact = [Fraction(str(float(w))) for w in weights]  # 0.7 means 7/10, not the nearest double
        self.weights = [w / sum(exact) for w in exact]
        self._cumulative = list(np.cumsum(self.weights))
        self.window = max(int(window), math.ceil(2 / min(self.weights)))
        self.samples_per_epoch = samples_per_epoch or sum(s.epoch_size() for s in self.sources)
        if self.samples_per_epoch < 1:
            raise ValueError(f"samples_per_epoch must be >= 1, got {samples_per_epoch}")
        self._windows: OrderedDict[int, tuple[np.ndarray, np.ndarray]] = OrderedDict()

    # -- description -----------------------------------------------------------------------
    @property
    def family(self) -> str:
        families = {s.family for s in self.sources}
        if len(families) > 1 and families != {"decoder"}:
            raise UnsupportedSchemaError(f"mixture sources have example families {sorted(families)}; "
                                         "a batch needs one layout (mix decoder-only sources, or seq2seq ones)")
        return families.pop()

    @property
    def objective_name(self) -> str | None:
        names = {s.objective_name for s in self.sources}
        return names.pop() if len(names) == 1 else None

    @property
    def special_ids(self) -> dict[str, int]:
        return self.sources[0].special_ids

    def shrunk_file_error(self) -> Exception | None:
        return next((e for e in (s.shrunk_file_error() for s in self.sources) if e is not None), None)

    def example_columns(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys(c for s in self.sources for c in s.example_columns()))

    def epoch_size(self) -> int:
        return self.samples_per_epoch

    def fingerprint(self) -> str:
        data = {"sources": [s.fingerprint() for s in self.sources], "source_seeds": [s.seed for s in self.sources],
                "weights": [str(w) for w in self.weights], "window": self.window, "epoch": self.samples_per_epoch}
        return hashlib.blake2b(json.dumps(data, sort_keys=True).encode(), digest_size=16).hexdigest()

    # -- locating and reading --------------------------------------------------------------
    def _window(self, index: int) -> tuple[np.ndarray, np.ndarray]:
        found = self._windows.get(index)
        if found is None:
            found = mixture_window(self._cumulative, self.window, self.seed, index)
            self._windows[index] = found
            if len(self._windows) > 2:
                self._windows.popitem(last=False)
        return found

    def locate(self, epoch: int, positions: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """``(source, index within that source's infinite stream)`` of epoch positions."""
        mixture_index = epoch * self.samples_per_epoch + np.asarray(positions, dtype=np.int64)
        windows = mixture_index // self.window
        sources = np.empty_like(mixture_index)
        counts = np.empty_like(mixture_index)
        for window in np.unique(windows):
            here = windows == window
            slot_source, slot_count = self._window(int(window))
            slots = mixture_index[here] - int(window) * self.window
            sources[here], counts[here] = slot_source[slots], slot_count[slots]
        return sources, counts

    def start_iteration(self) -> None:
        for source in self.sources:
            source.start_iteration()

    def read(self, epoch: int, stream_indices: np.ndarray, schedule: RankSchedule, worker: int,
             num_workers: int) -> list[dict[str, Any]]:
        sources, counts = self.locate(epoch, schedule.positions(stream_indices))
        out: list[dict[str, Any] | None] = [None] * len(sources)
        for i in np.unique(sources).tolist():
            here = np.flatnonzero(sources == i)
            source = self.sources[i]
            size = source.epoch_size()
            passes, positions = np.divmod(counts[here], size)
            for source_epoch in np.unique(passes).tolist():
                chosen = passes == source_epoch
                shard_ids, rows = source.order(source_epoch).locate(positions[chosen])
                examples = source.transform(source.read_rows(shard_ids, rows), source_epoch)
                for slot, example in zip(here[chosen].tolist(), examples, strict=True):
                    out[slot] = example
        return out  # type: ignore[return-value]
