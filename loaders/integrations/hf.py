"""Hugging Face ``Trainer`` integration: train from an lmshards dataset under DDP without losing data.

Use :class:`LMShardsTrainer` (or mix :class:`LMShardsTrainerMixin` into your own ``Trainer``
subclass) and pass a :class:`~loaders.dataset.ShardedDataset` or
:class:`~loaders.mixture.MixtureDataset` as ``train_dataset`` (and ``eval_dataset``), built with
``batch_size = per_device_train_batch_size``. transformers is imported only when the trainer
class is first used, so this module imports without it.

What the plain ``Trainer`` would do with such a dataset, and what the mixin does instead:

- ``Trainer`` hands its DataLoader to accelerate's ``prepare``, which re-shards an
  ``IterableDataset`` across DDP ranks: dispatching, every rank trains on rank 0's stream;
  without dispatching each rank keeps every other batch of its own, already disjoint, stream
  (half the data is never seen). Here the training loader is
  :func:`~loaders.streaming.dataloader.make_dataloader`'s, used as is: each rank's dataset reads its
  own disjoint slice (rank and world size from torch.distributed or ``RANK``/``WORLD_SIZE``;
  checked against the Trainer's), and ``Trainer`` moves its batches to the device.
- ``remove_unused_columns`` wraps the collator to drop the columns ``model.forward`` does not
  name, which strips ``doc_lengths`` (document masks silently off). Here the collator sees
  every stored column and its batches hold only tensors the model takes.
- On resume ``Trainer`` fast-forwards by re-reading batches (``skip_first_batches``), which
  cannot work for this loader. Here the loader's exact state is written into every
  checkpoint (:data:`LOADER_STATE_NAME`, once per node) and loaded on resume, and the
  Trainer's skipping is turned off (``ignore_data_skip``). Resuming is exact, also with
  another number of DataLoader workers or ranks with the same global batch size; with
  ``gradient_accumulation_steps`` that does not divide the batches of an epoch, the resumed
  epoch's last partial accumulation is merged into the next step (a warning says so).
- Data collator: ``data_collator=None`` picks the dataset's collator
  (:func:`~loaders.collation.collate.collator_for`) with ``loader_kwargs`` as its options, for the
  model: 4-D masks in its dtype, and as a BlockMask under flex attention.
- ``Trainer`` counts an iterable dataset's samples by ``len(dataloader.dataset)``, which for
  this loader is its batches; here it is the epoch's samples over all ranks, so
  ``train_samples_per_second`` is samples, not steps.

The plain ``Trainer`` is refused when it first asks an lmshards dataset for its length (in
its ``__init__``) or iterates it: one line naming :class:`LMShardsTrainer`
(:func:`loaders.streaming.stream.refuse_plain_trainer`).
"""

from __future__ import annotations

import json
import logging
import os
import warnings
from typing import Any

from loaders.streaming.dataloader import make_dataloader
from loaders.streaming.stream import ResumableStream
from schemas.errors import ConfigError, ShardIntegrityError
from transforms.objectives.registry import decoder_start_role

__all__ = [  # noqa: F822 (LMShardsTrainer: lazy)
    "LOADER_STATE_NAME", "LMShardsTrainer", "LMShardsTrainerMixin", "model_config_kwargs"]

#: File of a checkpoint directory holding the training loader's state.
LOADER_STATE_NAME = "lmshards_loader_state.json"
logger = logging.getLogger(__name__)
_LOADER_OPTIONS = ("group_batches", "multiprocessing_context", "timeout")


class LMShardsTrainerMixin:
    """A ``transformers.Trainer`` mixin for lmshards datasets (see the module docstring).

    Args:
        loader_kwargs: options of :func:`~loaders.streaming.dataloader.make_dataloader` (``group_batches``,
            ``timeout``, ...) and of the automatic collator (``documents``, ``mask_dtype``,
            ``flash_attention_kwargs``, ...).
        *args, **kwargs: ``Trainer``'s.

    Raises:
        ValueError: a dataset built for another rank, world size or batch size than the Trainer's.
    """

    def __init__(self, *args: Any, loader_kwargs: dict[str, Any] | None = None, **kwargs: Any):
        positional = ("model", "args", "data_collator")
        given = dict(zip(positional, args, strict=False))
        self._lmshards_collator = kwargs.get("data_collator", given.get("data_collator"))
        self._lmshards_loader_kwargs = dict(loader_kwargs or {})
        self._lmshards_resume: str | None = None
        self._lmshards_train_loader = None
        super().__init__(*args, **kwargs)
        if isinstance(self.train_dataset, ResumableStream):
            self._check_dataset(self.train_dataset, self._train_batch_size, "train_dataset",
                                "per_device_train_batch_size")
            if not self.args.ignore_data_skip:
                logger.info("lmshards: resuming restores the loader's exact state; Trainer's batch skipping is off")
                self.args.ignore_data_skip = True
        for name, dataset in self._eval_streams():
            self._check_dataset(dataset, self.args.eval_batch_size, name, "per_device_eval_batch_size")
        self.add_callback(_state_callback(self))

    # -- datasets ----------------------------------------------------------------------------
    def _eval_streams(self) -> list[tuple[str, ResumableStream]]:
        eval_dataset = self.eval_dataset
        if isinstance(eval_dataset, dict):
            return [(f"eval_dataset[{k!r}]", v) for k, v in eval_dataset.items() if isinstance(v, ResumableStream)]
        return [("eval_dataset", eval_dataset)] if isinstance(eval_dataset, ResumableStream) else []

    def _check_dataset(self, dataset: ResumableStream, batch_size: int, name: str, option: str) -> None:
        rank, world = self.args.process_index, self.args.world_size
        if (dataset.rank, dataset.world_size) != (rank, world):
            raise ValueError(
                f"{name} was built for rank {dataset.rank} of {dataset.world_size}, but this Trainer process is rank "
                f"{rank} of {world}; build it inside the launched process (torchrun sets RANK and WORLD_SIZE) or "
                f"pass rank=args.process_index, world_size=args.world_size"
            )
        if dataset.batch_size != batch_size:
            raise ValueError(f"{name} has batch_size={dataset.batch_size}, the Trainer's {option} is {batch_size}: "
                             "build the dataset with the per-device batch size")

    def _lmshards_loader(self, dataset: ResumableStream):
        options = dict(self._lmshards_loader_kwargs)
        loader_options = {k: options.pop(k) for k in _LOADER_OPTIONS if k in options}
        args = self.args
        workers = args.dataloader_num_workers
        if workers > 0:
            loader_options["persistent_workers"] = args.dataloader_persistent_workers
            if args.dataloader_prefetch_factor is not None:
                loader_options["prefetch_factor"] = args.dataloader_prefetch_factor
        collator = self._lmshards_collator
        if collator is not None:
            if options:
                raise ValueError(f"collator options {sorted(options)} need data_collator=None (the automatic one)")
            return make_dataloader(dataset, collate_fn=collator, num_workers=workers,
                                   pin_memory=args.dataloader_pin_memory, **loader_options)
        # masks in the model's dtype (sdpa wants the query's) and a BlockMask under flex attention
        return make_dataloader(dataset, num_workers=workers, pin_memory=args.dataloader_pin_memory,
                               model=self.model, **loader_options, **options)

    def num_examples(self, dataloader) -> int:
        """Samples of an epoch over all ranks (``Trainer``'s samples-per-second figures divide by it);
        ``Trainer``'s own count for other loaders."""
        stream = getattr(dataloader, "stream", None)
        if isinstance(stream, ResumableStream):
            return stream.schedule(0).num_samples * stream.world_size
        return super().num_examples(dataloader)

    def get_train_dataloader(self):
        """The lmshards loader for an lmshards ``train_dataset`` (``Trainer``'s own otherwise)."""
        if not isinstance(self.train_dataset, ResumableStream):
            return super().get_train_dataloader()
        self._lmshards_train_loader = self._lmshards_loader(self.train_dataset)
        return self._lmshards_train_loader

    def get_eval_dataloader(self, eval_dataset=None):
        """The lmshards loader for an lmshards evaluation dataset (``Trainer``'s own otherwise).

        Each evaluation is a fresh pass over the whole split on every rank's own slice."""
        dataset = self.eval_dataset[eval_dataset] if isinstance(eval_dataset, str) else eval_dataset
        dataset = self.eval_dataset if dataset is None else dataset
        if not isinstance(dataset, ResumableStream):
            return super().get_eval_dataloader(eval_dataset)
        return self._lmshards_loader(dataset)

    def get_test_dataloader(self, test_dataset):
        """The lmshards loader for an lmshards ``predict`` dataset (``Trainer``'s own otherwise, which
        would strip ``doc_lengths`` and re-shard the stream)."""
        if not isinstance(test_dataset, ResumableStream):
            return super().get_test_dataloader(test_dataset)
        self._check_dataset(test_dataset, self.args.eval_batch_size, "test_dataset", "per_device_eval_batch_size")
        return self._lmshards_loader(test_dataset)

    # -- checkpoints ---------------------------------------------------------------------------
    def train(self, resume_from_checkpoint: str | bool | None = None, *args: Any, **kwargs: Any):
        """``Trainer.train``; with ``resume_from_checkpoint`` the loader resumes from the checkpoint's state."""
        path = resume_from_checkpoint
        if path is True:
            from transformers.trainer_utils import get_last_checkpoint

            path = get_last_checkpoint(self.args.output_dir)
        self._lmshards_resume = path if isinstance(path, str) else None
        return super().train(resume_from_checkpoint, *args, **kwargs)

    def _lmshards_save(self, state: Any) -> None:
        loader = self._lmshards_train_loader
        if loader is None or not self.args.should_save:
            return
        from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR

        folder = os.path.join(self.args.output_dir, f"{PREFIX_CHECKPOINT_DIR}-{state.global_step}")
        os.makedirs(folder, exist_ok=True)
        path = os.path.join(folder, LOADER_STATE_NAME)
        with open(path + ".tmp", "w", encoding="utf-8") as handle:
            json.dump(loader.state_dict(), handle, sort_keys=True)
        os.replace(path + ".tmp", path)

    def _lmshards_restore(self, state: Any) -> None:
        loader, checkpoint = self._lmshards_train_loader, self._lmshards_resume
        if loader is None or checkpoint is None:
            return
        path = os.path.join(checkpoint, LOADER_STATE_NAME)
        if not os.path.isfile(path):
            raise FileNotFoundError(
                f"{path}: the checkpoint has no lmshards loader state (saved by another trainer?); resuming without "
                "it would read the epoch's samples again or skip them"
            )
        with open(path, encoding="utf-8") as handle:
            saved = json.load(handle)
        batches = len(loader)  # the full epoch: the state is not loaded yet
        accumulation = self.args.gradient_accumulation_steps
        per_epoch = max(batches // accumulation + int(batches % accumulation > 0), 1)
        epoch = state.global_step // per_epoch
        if saved["epoch"] != epoch:
            raise ConfigError(
                f"{path} is at epoch {saved['epoch']} but the Trainer resumes epoch {epoch} (global step "
                f"{state.global_step}, {per_epoch} steps per epoch): the checkpoint was saved with other data or "
                "batch sizes"
            )
        loader.load_state_dict(saved)
        if saved["samples"] and batches % accumulation:
            warnings.warn(
                f"gradient_accumulation_steps={accumulation} does not divide the {batches} batches of an epoch: "
                "the resumed epoch's last partial accumulation is merged into the next step", stacklevel=2)
        self._lmshards_resume = None


def model_config_kwargs(dataset: ResumableStream) -> dict[str, int]:
    """The arguments of an HF model config that must match the dataset's tokenizer.

    ``vocab_size`` (with added special tokens), ``pad_token_id``, ``bos_token_id`` and
    ``eos_token_id`` where the tokenizer has them, and for encoder-decoder datasets
    ``decoder_start_token_id``: the objective's ``decoder_start`` role (eos for bart, fairseq's
    convention; pad otherwise, T5's), the id the collator starts ``decoder_input_ids`` with. E.g.
    ``BartConfig(d_model=256, ..., **model_config_kwargs(dataset))``.

    Raises:
        ShardIntegrityError: the manifest records no vocabulary size.
    """
    sources = getattr(dataset, "sources", None) or [dataset]  # a mixture: its sources share a tokenizer
    tokenizer = sources[0].manifest.tokenizer
    vocab_size = tokenizer.get("vocab_size")
    if not vocab_size:
        raise ShardIntegrityError("the dataset's manifest records no tokenizer vocab_size")
    special = dataset.special_ids
    out = {"vocab_size": int(vocab_size)}
    for role in ("pad", "bos", "eos"):
        if special.get(role) is not None:
            out[f"{role}_token_id"] = int(special[role])
    if dataset.family == "seq2seq":
        start = special.get(decoder_start_role(dataset.objective_name))
        if start is not None:
            out["decoder_start_token_id"] = int(start)
    return out


def _state_callback(trainer: LMShardsTrainerMixin):
    from transformers import TrainerCallback

    class LMShardsLoaderState(TrainerCallback):
        """Loads the loader's state when training resumes, writes it into every checkpoint."""

        def on_train_begin(self, args, state, control, **kwargs):
            trainer._lmshards_restore(state)

        def on_save(self, args, state, control, **kwargs):
            trainer._lmshards_save(state)

    return LMShardsLoaderState()


def __getattr__(name: str) -> Any:
    if name == "LMShardsTrainer":
        from transformers import Trainer

        cls = type("LMShardsTrainer", (LMShardsTrainerMixin, Trainer), {
            "__module__": __name__,
            "__doc__": "``transformers.Trainer`` with :class:`LMShardsTrainerMixin`: lmshards datasets train "
                       "exactly under DDP, and the loader's state goes into the checkpoints.",
        })
        globals()[name] = cls
        return cls
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


