"""Collators: lists of examples -> dicts of torch tensors, one per model layout.

Batches follow Hugging Face transformers' conventions by default, so that ``model(**batch)``
of an HF model (and HF ``Trainer``) trains what the dataset holds:

- ``labels`` are **unshifted** (``labels[t] = input_ids[t]``, ``-100`` = no loss): HF causal
  models shift inside (position ``t - 1`` predicts ``labels[t]``). Megatron-style pre-shifted
  labels (``labels[t] = input_ids[t + 1]``, a model that does not shift) are an option
  (``shift_labels=True``).
- Packed documents are kept apart with ``model(**batch)`` alone, under eager, sdpa and flex
  attention, in train and eval mode. clm batches do it in O(L) by default, as HF's
  ``DataCollatorWithFlattening``: ``position_ids`` restart at each document, no
  ``attention_mask``, and ``use_cache=False`` (transformers derives the per-document mask from
  such positions only when it builds no cache). Each document's first label is ``-100`` (it
  would be predicted from the previous document). FlashAttention's varlen kwargs go out
  under HF's names (``cu_seq_lens_q``/``cu_seq_lens_k`` int32 tensors,
  ``max_length_q``/``max_length_k`` Python ints) only when asked for
  (``flash_attention_kwargs=True``).
- Masks positions cannot express (a bidirectional prefix, or clm's ``documents="mask"``) are
  4-D **additive float** masks ``(B, 1, L, L)`` (0 = attend, the dtype's most negative value =
  not), which eager and sdpa apply; never an all-masked row (:mod:`loaders.collation.masks`). Under
  flex attention (``attn_implementation="flex_attention"``, set from the model by
  ``model=``) they go out as a ``BlockMask``: transformers turns a tensor mask into a
  ``score_mod`` that torch's CPU flex compiler cannot run. Plain padding stays a 2-D
  ``attention_mask``.
- Only arguments a model's ``forward`` takes are in a batch (tensors, and ``use_cache`` or
  FlashAttention's lengths where the layout needs them); extras (``prefix_length``,
  ``position_ids`` of encoders) only when asked for.
- Padding is trimmed: a batch is as long as its longest real row (rounded up to
  ``pad_to_multiple_of``), not as the stored, padded width (UL2's decoder rows are padded to
  the longest denoiser's length).

Collators (:class:`CausalCollator` and :class:`PrefixLMCollator` live in
:mod:`loaders.collation.collate_decoder`, :class:`MLMCollator` and :class:`Seq2SeqCollator` in
:mod:`loaders.collation.collate_encoder`; :class:`StackCollator` and :func:`collator_for` here):

- :class:`CausalCollator` (clm): ``documents="position_ids"`` (default): positions
  restarting per document, no mask, ``use_cache=False``: O(B*L). ``"mask"``: the same
  per-document causal attention as an O(B*L^2) 4-D mask, for models that ignore
  ``position_ids``. ``"none"``: plain causal attention over the packed row (GPT-2/Megatron
  default; attention crosses documents), 2-D padding mask.
- :class:`PrefixLMCollator` (prefix_lm, ul2 decoder-only): each packed document a segment
  with its own prefix (``prefix_lengths``): bidirectional over it, causal after, no attention
  across segments, positions restarting per segment; loss on the suffixes only. Documents
  without a prefix (clm in a mixture) are causal within themselves.
- :class:`MLMCollator` (mlm): bidirectional; labels as stored, 2-D padding mask.
- :class:`Seq2SeqCollator` (span_corruption, bart, ul2 encoder-decoder): ``inputs`` ->
  ``input_ids``/``attention_mask``, ``targets`` -> ``labels``, ``decoder_input_ids`` = labels
  shifted right behind ``decoder_start_id`` (T5: pad; BART: eos), as HF's
  ``shift_tokens_right``, and ``decoder_attention_mask``.
- :class:`StackCollator`: the named columns as stored, stacked (no labels or masks), for
  trainers that build those on the device.

Every collator takes a list of example dicts or an :class:`~loaders.collation.batch.ExampleBatch`
(``accepts_example_batch = True``): from the latter it reads whole columns (one ``(B, L)``
array per fixed-length column) instead of one row at a time, with the same result.

Tensors are built in numpy and wrapped with ``torch.from_numpy``; inside a DataLoader
worker a batch's arrays are packed into one storage per dtype, which halves the cost of
handing the batch to the main process. torch is imported when a collator runs, so this
module imports without it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from loaders.collation.batch import ExampleBatch, Ragged
from loaders.collation.collate_arrays import require_columns, to_tensors
from loaders.collation.collate_decoder import CausalCollator, PrefixLMCollator
from loaders.collation.collate_encoder import MLMCollator, Seq2SeqCollator
from loaders.errors import UnsupportedSchemaError

__all__ = [
    "StackCollator",
    "collator_for",
    "model_mask_options",
]


class StackCollator:
    """The named columns as stored, stacked into tensors: no labels, masks or positions.

    For trainers that build those on the device (or need only the tokens). A fixed-length
    column becomes ``(B, L)`` in its stored dtype (``input_ids``: int32); an integer column
    ``(B,)`` int64; a variable-length one ``(B, longest)``, right-padded with ``pad_id``;
    a string column (``key``) a list.

    Args:
        columns: the columns to stack (default ``input_ids``).
        pad_id: padding of variable-length columns (needed only when rows differ in length).

    Raises:
        UnsupportedSchemaError: a column the examples do not have.
    """

    accepts_example_batch = True

    def __init__(self, columns: Sequence[str] = ("input_ids",), *, pad_id: int | None = None):
        if isinstance(columns, str) or not columns:
            raise ValueError(f"columns must be a non-empty list of names, got {columns!r}")
        self.columns, self.pad_id = tuple(columns), pad_id

    def __call__(self, examples: Sequence[dict[str, Any]]) -> dict[str, Any]:
        require_columns(type(self).__name__, examples, self.columns)
        out: dict[str, Any] = {}
        for name in self.columns:
            if isinstance(examples, ExampleBatch):
                column = examples.columns[name]
                values = column.rows() if isinstance(column, Ragged) else column
            else:
                values = [e[name] for e in examples]
            if isinstance(values, np.ndarray):
                out[name] = values.astype(np.int64) if values.ndim == 1 else values
            elif all(isinstance(v, np.ndarray) for v in values):
                out[name] = self._stack(name, values)
            elif all(isinstance(v, (int, np.integer)) for v in values):
                out[name] = np.array(values, dtype=np.int64)
            else:
                out[name] = list(values)
        return to_tensors(out)

    def _stack(self, name: str, rows: list[np.ndarray]) -> np.ndarray:
        length = max(len(row) for row in rows)
        dtype = rows[0].dtype
        if all(len(row) == length for row in rows):
            return np.stack(rows).astype(dtype, copy=False)
        if self.pad_id is None:
            raise ValueError(f"{type(self).__name__}: rows of {name} need padding but no pad_id was given")
        out = np.full((len(rows), length), self.pad_id, dtype=dtype)
        for i, row in enumerate(rows):
            out[i, : len(row)] = row
        return out


def collator_for(dataset: Any, *, model: Any = None, **kwargs: Any):
    """The collator for a dataset's examples (family and columns), with its pad id.

    ``decoder`` -> :class:`PrefixLMCollator` when examples carry ``prefix_lengths`` (or the
    older ``prefix_length``), else :class:`CausalCollator`; ``encoder`` -> :class:`MLMCollator`;
    ``seq2seq`` -> :class:`Seq2SeqCollator` (decoder start: the objective's ``decoder_start``
    role, eos for bart, else pad). ``kwargs`` go to it.

    Args:
        dataset: a :class:`~loaders.dataset.ShardedDataset` or :class:`~loaders.mixture.MixtureDataset`.
        model: the model the batches are for (optional): decoder collators then build their
            4-D masks in its dtype and, under flex attention, as a BlockMask
            (``mask_dtype``/``attn_implementation`` unless given).
        **kwargs: options of the collator.

    Raises:
        UnsupportedSchemaError: a family no collator handles (or a mixture of families).
    """
    family, columns = dataset.family, set(dataset.example_columns())
    special = dataset.special_ids
    pad = kwargs.pop("pad_id", special.get("pad"))
    if family == "decoder":
        if model is not None:
            for key, value in model_mask_options(model).items():
                kwargs.setdefault(key, value)
        if columns & {"prefix_lengths", "prefix_length"}:
            return PrefixLMCollator(pad, **kwargs)
        return CausalCollator(pad, **kwargs)
    if pad is None:
        raise UnsupportedSchemaError(f"{family} examples need a pad id; the dataset's tokenizer has none (pass pad_id)")
    if family == "encoder":
        return MLMCollator(pad, **kwargs)
    if family == "seq2seq":
        if "decoder_start_id" not in kwargs:
            # Imported here: the registry imports every objective, and ``import loaders`` imports this module.
            from transforms.objectives.registry import decoder_start_role

            role = decoder_start_role(dataset.objective_name)
            if role != "pad":  # the collator's own default
                kwargs["decoder_start_id"] = special.get(role)
        return Seq2SeqCollator(pad, **kwargs)
    raise UnsupportedSchemaError(f"no collator for example family {family!r} (columns {sorted(columns)})")


def model_mask_options(model: Any) -> dict[str, Any]:
    """Options of decoder collators for ``model`` (an HF model, or anything with ``dtype`` and
    ``config._attn_implementation``; what it lacks is left out).

    ``mask_dtype``: the model's floating dtype (sdpa wants the query's). ``attn_implementation``:
    the model's; under ``flex_attention`` also ``trim_padding=False``, so that every batch has the
    stored width: flex attention is compiled per batch length, and torch's CPU compiler fails
    (a C++ compile error) when a second length makes it recompile with dynamic shapes.
    """
    out: dict[str, Any] = {}
    dtype = getattr(model, "dtype", None)
    if dtype is not None and getattr(dtype, "is_floating_point", False):
        out["mask_dtype"] = dtype
    implementation = getattr(getattr(model, "config", None), "_attn_implementation", None)
    if isinstance(implementation, str):
        out["attn_implementation"] = implementation
        if implementation == "flex_attention":
            out["trim_padding"] = False
    return out
