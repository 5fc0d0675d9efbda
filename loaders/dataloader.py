"""A ``torch.utils.data.DataLoader`` that keeps a :class:`~loaders.stream.ResumableStream`'s state.

Workers read whole batches (a list of examples each) and collate them in the worker, so
the main process only receives ready tensors (pinned when ``pin_memory``). The loader
counts the batches it hands to the trainer, which makes ``state_dict()`` exact whatever
the number of workers or the prefetch depth: prefetched batches the trainer never saw
are read again after a resume, none is skipped.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch.utils.data import DataLoader, IterableDataset

from loaders.stream import ResumableStream

__all__ = ["ResumableDataLoader", "make_dataloader"]


class _Batches(IterableDataset):
    """The stream seen as an iterable of batches (lists of examples)."""

    def __init__(self, stream: ResumableStream):
        super().__init__()
        self.stream = stream

    def __iter__(self) -> Iterator[list[dict[str, Any]]]:
        return self.stream.iter_batches()

    def __len__(self) -> int:
        return self.stream.schedule().num_batches


class ResumableDataLoader(DataLoader):
    """DataLoader over a :class:`ResumableStream` with ``set_epoch``/``state_dict``/``load_state_dict``.

    Build it with :func:`make_dataloader`. Its state is the dataset's state: after
    ``k`` batches of the current epoch it is ``(epoch, k * batch_size * world_size)``.
    """

    def __init__(self, dataset: ResumableStream, *, collate_fn: Callable | None, **kwargs: Any):
        self.stream = dataset
        dataset._counted_by_loader = True
        # Workers read the resume point from shared memory at each pass, so persistent
        # workers (which keep their copy of the dataset) follow set_epoch and load_state_dict.
        dataset._shared = torch.zeros(2, dtype=torch.int64).share_memory_()
        super().__init__(_Batches(dataset), batch_size=None, collate_fn=collate_fn or _to_tensors, **kwargs)

    @property
    def batch_size_per_rank(self) -> int:
        return self.stream.batch_size

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
        schedule = stream.schedule()
        stream._shared.copy_(torch.tensor([stream.epoch, stream.samples_consumed], dtype=torch.int64))
        batches = super().__iter__()
        last = schedule.num_batches - 1
        if last < 0:
            stream._finish_epoch()
        for index in range(schedule.num_batches):
            try:
                batch = next(batches)
            except StopIteration:
                raise RuntimeError(f"the loader ended after {index} of {schedule.num_batches} batches") from None
            if index < last:
                stream._advance(schedule.batch_length(index))
            else:  # the epoch is consumed once its last batch is handed out
                stream._finish_epoch()
            yield batch


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
    **collator_kwargs: Any,
) -> ResumableDataLoader:
    """A resumable DataLoader yielding collated batches of ``dataset.batch_size`` examples.

    Args:
        dataset: a :class:`~loaders.dataset.ShardedDataset` or :class:`~loaders.mixture.MixtureDataset`.
        collate_fn: ``"auto"`` picks the collator for the dataset's family
            (:func:`loaders.collate.collator_for`, ``collator_kwargs`` passed on); a callable is
            used as is; None converts examples to tensors without batching them.
        num_workers: DataLoader worker processes (0 reads in the main process).
        pin_memory: pin batches for fast host-to-GPU copies (None: when CUDA is available).
        prefetch_factor: batches each worker prepares ahead (None: torch's default).
        persistent_workers: keep workers alive across epochs.
        multiprocessing_context: passed to the DataLoader.
        timeout: passed to the DataLoader.

    Raises:
        ValueError: bad arguments.
    """
    if not isinstance(dataset, ResumableStream):
        raise ValueError(f"make_dataloader needs a ShardedDataset or MixtureDataset, got {type(dataset).__name__}")
    if collate_fn == "auto":
        from loaders.collate import collator_for

        collate_fn = collator_for(dataset, **collator_kwargs)
    elif collator_kwargs:
        raise ValueError(f"collator options {sorted(collator_kwargs)} need collate_fn='auto'")
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
    return ResumableDataLoader(dataset, collate_fn=collate_fn, **kwargs)
