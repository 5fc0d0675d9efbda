"""A ``torch.utils.data.DataLoader`` that keeps a :class:`~loaders.streaming.stream.ResumableStream`'s state.

Workers read whole batches (a list of examples, or an
:class:`~loaders.collation.batch.ExampleBatch` for a collator that takes one) and collate them in the
worker, so the main process only receives ready tensors (pinned when ``pin_memory``), in
groups of consecutive batches (torch's own transfer: a shared-memory segment per tensor storage,
so a group's tensors are views of one storage per dtype). The loader
counts the batches it hands to the trainer, which makes ``state_dict()`` exact whatever
the number of workers or the prefetch depth: prefetched batches the trainer never saw
are read again after a resume, none is skipped.
"""

from __future__ import annotations

import traceback
import weakref
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import torch
from torch.utils.data import DataLoader, IterableDataset

from loaders.collation.batch import accepts_example_batch
from loaders.collation.collate import collator_for
from loaders.collation.collate_arrays import _GROUPED
from loaders.streaming.stream import ResumableStream

__all__ = ["ResumableDataLoader", "make_dataloader"]


class _Batches(IterableDataset):
    """The stream seen as an iterable of batches (lists of examples, or
    :class:`~loaders.collation.batch.ExampleBatch` objects for a collator that takes them)."""

    def __init__(self, stream: ResumableStream, columnar: bool = False):
        super().__init__()
        self.stream, self.columnar = stream, columnar

    def __iter__(self) -> Iterator[Sequence[dict[str, Any]]]:
        return self.stream.iter_batches(columnar=self.columnar)

    def __len__(self) -> int:
        """Samples of the next pass over all ranks: what HF ``Trainer`` reads as the length of a
        loader's dataset for its samples-per-second figures (the loader's own length is this
        rank's batches, :meth:`ResumableDataLoader.__len__`)."""
        stream = self.stream
        return stream.schedule().num_samples * stream.world_size


class _Groups(IterableDataset):
    """What the inner DataLoader iterates: groups of collated batches (one DataLoader item per group)."""

    def __init__(self, stream: ResumableStream, collate_fn: Callable, columnar: bool, group: int):
        super().__init__()
        self.stream, self.collate_fn, self.columnar, self.group = stream, collate_fn, columnar, group

    def __iter__(self) -> Iterator[list]:
        in_worker = torch.utils.data.get_worker_info() is not None
        for group in self.stream.iter_batch_groups(columnar=self.columnar, group=self.group):
            if not in_worker:
                yield [self.collate_fn(batch) for batch in group]
                continue
            token = _GROUPED.set(True)  # to_tensors copies nothing: the group is packed once below
            try:
                batches = [self.collate_fn(batch) for batch in group]
            finally:
                _GROUPED.reset(token)
            yield _one_storage_per_dtype(batches)


def _one_storage_per_dtype(batches: list) -> list:
    """``batches`` with every CPU tensor of every batch (a dict's values) made a view of one
    storage per dtype, as the group crosses from a worker to the main process.

    torch hands each storage over as a shared-memory segment of its own, and that fixed cost per
    segment, not the bytes, bounds a worker's batches per second at long context; one segment for
    the whole group instead of one (or three) per batch. The values and shapes are unchanged;
    other values (BlockMasks, ints) are left as they are.
    """
    by_dtype: dict[torch.dtype, list[tuple[int, str]]] = {}
    for index, batch in enumerate(batches):
        if not isinstance(batch, dict):
            return batches
        for name, value in batch.items():
            if isinstance(value, torch.Tensor) and value.device.type == "cpu" and not value.requires_grad \
                    and value.layout == torch.strided:
                by_dtype.setdefault(value.dtype, []).append((index, name))
    out = [dict(batch) for batch in batches]
    for dtype, places in by_dtype.items():
        if len(places) < 2:
            continue
        flat = torch.empty(sum(batches[i][n].numel() for i, n in places), dtype=dtype)
        offset = 0
        for index, name in places:
            value = batches[index][name]
            view = flat[offset: offset + value.numel()].view(value.shape)
            view.copy_(value)
            out[index][name] = view
            offset += value.numel()
    return out


def _identity(item: Any) -> Any:
    return item


class _EpochSampler:
    """The loader's ``sampler`` as trainers see it: Lightning calls ``set_epoch`` on a loader's sampler
    at each epoch (never on an ``IterableDataset``'s loader itself), so this one forwards it to the
    stream. Iterated, it is torch's sampler of iterable datasets (``None`` forever)."""

    def __init__(self, loader: ResumableDataLoader, inner: Any):
        self._loader, self._inner = weakref.ref(loader), inner

    def set_epoch(self, epoch: int) -> None:
        loader = self._loader()
        if loader is not None:
            loader.set_epoch(epoch)

    def __iter__(self) -> Iterator[Any]:
        return iter(self._inner)


class ResumableDataLoader(DataLoader):
    """DataLoader over a :class:`ResumableStream` with ``set_epoch``/``state_dict``/``load_state_dict``.

    Build it with :func:`make_dataloader`. Its state is the dataset's state: after
    ``k`` batches of the current epoch it is ``(epoch, k * batch_size * world_size)``.
    A pass that yields the epoch's last batch moves to the next epoch (no ``set_epoch`` needed);
    a fresh ``iter()`` starts the current epoch from its beginning unless ``load_state_dict``
    was called since the last pass (then it resumes exactly there).

    Batches travel in groups of ``group_batches`` consecutive ones (one DataLoader item per
    group: fewer, larger hand-overs; worker ``w`` of ``K`` reads groups ``w, w+K, ...``),
    through torch's own transfer and pinning.
    """

    def __init__(self, dataset: ResumableStream, *, collate_fn: Callable | None, group_batches: int = 8,
                 **kwargs: Any):
        if not isinstance(group_batches, int) or group_batches < 1:
            raise ValueError(f"group_batches must be an int >= 1, got {group_batches!r}")
        self.stream = dataset
        # This loader counts what it hands out; workers read each pass's start from the dataset's
        # shared progress, so persistent workers (which keep their copy of the dataset) follow
        # set_epoch and load_state_dict.
        dataset._counted_by_loader = True
        collate_fn = collate_fn or _to_tensors
        columnar = accepts_example_batch(collate_fn)
        super().__init__(_Batches(dataset, columnar), batch_size=None, collate_fn=collate_fn, **kwargs)
        # no pinning without an accelerator (torch would warn about it at every pass)
        inner = dict(kwargs, pin_memory=bool(kwargs.get("pin_memory", False)) and torch.cuda.is_available())
        self._inner = DataLoader(_Groups(dataset, collate_fn, columnar, group_batches), batch_size=None,
                                 collate_fn=_identity, **inner)
        self.group_batches = group_batches

    @property
    def sampler(self) -> _EpochSampler:
        """A sampler with ``set_epoch`` (see :class:`_EpochSampler`): Lightning's epochs reach the stream,
        so a run with ``limit_train_batches`` reads each epoch's own first batches."""
        return self.__dict__["_epoch_sampler"]

    @sampler.setter
    def sampler(self, value: Any) -> None:  # DataLoader.__init__ sets it once
        self.__dict__["_epoch_sampler"] = _EpochSampler(self, value)

    def __len__(self) -> int:
        """Batches this rank reads in its next pass."""
        return self.stream.schedule().num_batches

    def set_epoch(self, epoch: int) -> None:
        """See :meth:`ResumableStream.set_epoch`."""
        self.stream.set_epoch(epoch)

    def state_dict(self) -> dict[str, Any]:
        """See :meth:`ResumableStream.state_dict`."""
        return self.stream.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """See :meth:`ResumableStream.load_state_dict`."""
        self.stream.load_state_dict(state)

    def __iter__(self) -> Iterator[Any]:
        stream = self.stream
        _, start = stream._begin_pass()  # a fresh pass restarts its epoch unless a state was loaded
        schedule = stream.schedule(start)
        items = iter(self._inner)
        last = schedule.num_batches - 1
        if last < 0:
            stream._finish_epoch()
        pending: list[Any] = []
        full = schedule.batch_size  # every batch but the last is full
        for index in range(schedule.num_batches):
            if not pending:
                try:
                    pending = list(next(items))
                except StopIteration:
                    raise RuntimeError(
                        f"the loader ended after {index} of {schedule.num_batches} batches") from None
                except BaseException as exc:
                    if self._inner.num_workers > 0:
                        # A worker's error, re-raised by torch's iterator: its traceback's frames hold
                        # that iterator in a reference cycle, which only the cyclic collector would
                        # free, its queues finalized first, so that each worker then waits out its 5 s
                        # poll before it exits. Cleared frames (torch's and the workers' hand-over; in
                        # one process the frames are the user's, kept for a debugger) and no
                        # reference here: the workers stop at once.
                        traceback.clear_frames(exc.__traceback__)
                        del items
                        shrunk = _shrunk_file_behind(exc, stream)
                        if shrunk is not None:
                            raise shrunk from exc
                    raise
                pending.reverse()
            batch = pending.pop()
            if index < last:
                stream._advance(full)
            else:  # the epoch is consumed once its last batch is handed out
                stream._finish_epoch()
            yield batch


def _shrunk_file_behind(exc: BaseException, stream: ResumableStream) -> Exception | None:
    """For torch's error that a DataLoader worker died (``DataLoader worker (pid ...) is killed by
    signal`` / ``exited unexpectedly``; a worker's own exception is re-raised as ``Caught ... in
    DataLoader worker``), the error naming a file of the stream that is now shorter on disk than
    its manifest says: a memory-mapped shard that shrank under a worker kills it with SIGBUS
    before it can say so. None for any other error, or when every file is whole."""
    if type(exc) is not RuntimeError or not str(exc).startswith("DataLoader worker"):
        return None
    try:
        return stream.shrunk_file_error()
    except Exception:  # noqa: BLE001 - the worker's death is reported as torch gave it
        return None


def _to_tensors(examples: list[dict[str, Any]]) -> list[dict[str, Any]]:
    from torch.utils.data import default_convert

    return default_convert(examples)


def make_dataloader(
    dataset: ResumableStream,
    *,
    collate_fn: Callable | str | None = "auto",
    num_workers: int = 2,
    pin_memory: bool | None = None,
    prefetch_factor: int | None = None,
    persistent_workers: bool = False,
    multiprocessing_context: Any = None,
    timeout: float = 0,
    group_batches: int = 8,
    model: Any = None,
    **collator_kwargs: Any,
) -> ResumableDataLoader:
    """A resumable DataLoader yielding collated batches of ``dataset.batch_size`` examples.

    Args:
        dataset: a :class:`~loaders.dataset.ShardedDataset` or :class:`~loaders.mixture.MixtureDataset`.
        collate_fn: ``"auto"`` picks the collator for the dataset's family
            (:func:`loaders.collation.collate.collator_for`, ``collator_kwargs`` passed on); a callable is
            used as is; None converts examples to tensors without batching them.
        num_workers: DataLoader worker processes (0 reads in the main process).
        pin_memory: pin batches for fast host-to-GPU copies (None: when CUDA is available).
        prefetch_factor: batches each worker prepares ahead (None: torch's default).
        persistent_workers: keep workers alive across epochs.
        multiprocessing_context: passed to the DataLoader.
        timeout: passed to the DataLoader.
        group_batches: consecutive batches handed over at once (one DataLoader item).
        model: the model the batches are for (``collate_fn="auto"``): decoder batches then
            carry 4-D masks in its dtype, as a BlockMask under flex attention.

    Raises:
        ValueError: bad arguments.
    """
    if not isinstance(dataset, ResumableStream):
        raise ValueError(f"make_dataloader needs a ShardedDataset or MixtureDataset, got {type(dataset).__name__}")
    if collate_fn == "auto":
        collate_fn = collator_for(dataset, model=model, **collator_kwargs)
    elif collator_kwargs or model is not None:
        options = sorted([*collator_kwargs, *(["model"] if model is not None else [])])
        raise ValueError(f"collator options {options} need collate_fn='auto'")
    if pin_memory is None:
        pin_memory = torch.cuda.is_available()
    kwargs: dict[str, Any] = {"num_workers": num_workers, "pin_memory": pin_memory, "timeout": timeout,
                              "multiprocessing_context": multiprocessing_context}
    if num_workers > 0:
        kwargs["persistent_workers"] = persistent_workers
        if prefetch_factor is not None:
            kwargs["prefetch_factor"] = prefetch_factor
    elif persistent_workers:
        raise ValueError("persistent_workers needs num_workers > 0")
    return ResumableDataLoader(dataset, collate_fn=collate_fn, group_batches=group_batches, **kwargs)
