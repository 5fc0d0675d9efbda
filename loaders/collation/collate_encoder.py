"""Bidirectional-encoder batches: masked LM and encoder-decoder (:mod:`loaders.collation.collate`).

:class:`MLMCollator` (mlm) and :class:`Seq2SeqCollator` (span_corruption, bart, ul2
encoder-decoder) attend over whole rows: their masks are 2-D padding masks, and the
decoder's causal mask is the model's own. The conventions they follow are those of
:mod:`loaders.collation.collate`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from loaders.collation.collate_arrays import (
    batch_length,
    collated_length,
    column_rows,
    content_lengths,
    fit_rows,
    require_columns,
    row_widths,
    to_tensors,
)
from transforms.objectives.common import IGNORE_INDEX

__all__ = ["MLMCollator", "Seq2SeqCollator"]


class MLMCollator:
    """Masked-LM batches from ``input_ids`` + ``labels`` (bidirectional attention).

    Outputs: ``input_ids``, ``attention_mask`` (``(B, L)``, 0 on padding), ``labels`` (as stored,
    ``-100`` on padding) and, when asked, ``position_ids`` (encoders such as RoBERTa number
    positions their own way, so by default the model does).

    Args:
        pad_id: padding id: padded and stored padding positions get no attention.
        pad_to_multiple_of: round the batch length up.
        trim_padding: cut the columns that are padding in every row (default True).
        return_position_ids: add ``position_ids`` ``0 .. L-1``.
    """

    def __init__(self, pad_id: int, *, pad_to_multiple_of: int | None = None, trim_padding: bool = True,
                 return_position_ids: bool = False):
        self.pad_id, self.pad_to_multiple_of = pad_id, pad_to_multiple_of
        self.trim_padding, self.return_position_ids = trim_padding, return_position_ids

    accepts_example_batch = True

    def __call__(self, examples: Sequence[dict[str, Any]]) -> dict[str, Any]:
        name = type(self).__name__
        require_columns(name, examples, ["input_ids", "labels"])
        rows = column_rows(examples, "input_ids")
        length = collated_length(self, rows, content_lengths(rows, self.pad_id))
        input_ids = fit_rows(rows, length, self.pad_id, name)
        labels = fit_rows(column_rows(examples, "labels"), length, IGNORE_INDEX, "labels")
        attention = (input_ids != self.pad_id).astype(np.int64)
        out = {"input_ids": input_ids, "attention_mask": attention,
               "labels": np.where(attention == 1, labels, IGNORE_INDEX)}
        if self.return_position_ids:
            out["position_ids"] = np.broadcast_to(np.arange(length), input_ids.shape).copy()
        return to_tensors(out)


class Seq2SeqCollator:
    """Encoder-decoder batches from ``inputs`` + ``targets``.

    Outputs: ``input_ids``, ``attention_mask``, ``labels`` (``-100`` on padding),
    ``decoder_input_ids`` (``labels`` shifted right behind ``decoder_start_id``, padding as
    ``pad_id``: HF's ``shift_tokens_right``), ``decoder_attention_mask`` and, when asked,
    ``position_ids`` of the encoder (T5 and BART take none).

    Args:
        pad_id: padding id (also ends padded targets in ``decoder_input_ids``).
        decoder_start_id: first decoder input (None: ``pad_id``, T5's convention; BART uses eos).
        inputs_length, targets_length: pad to these fixed lengths (error when longer).
        pad_to_multiple_of: round variable batch lengths up.
        trim_padding: cut trailing padding (pad ids) shared by every row (default True).
        return_position_ids: add the encoder's ``position_ids``.
    """

    def __init__(self, pad_id: int, *, decoder_start_id: int | None = None, inputs_length: int | None = None,
                 targets_length: int | None = None, pad_to_multiple_of: int | None = None,
                 trim_padding: bool = True, return_position_ids: bool = False):
        self.pad_id = pad_id
        self.decoder_start_id = pad_id if decoder_start_id is None else decoder_start_id
        self.inputs_length, self.targets_length = inputs_length, targets_length
        self.pad_to_multiple_of, self.trim_padding = pad_to_multiple_of, trim_padding
        self.return_position_ids = return_position_ids

    accepts_example_batch = True

    def _fit(self, rows: np.ndarray | list[np.ndarray], fixed: int | None, what: str) -> np.ndarray:
        basis = content_lengths(rows, self.pad_id).tolist() if self.trim_padding else row_widths(rows)
        length = batch_length(basis, self.pad_to_multiple_of, fixed, what)
        return fit_rows(rows, length, self.pad_id, what)

    def __call__(self, examples: Sequence[dict[str, Any]]) -> dict[str, Any]:
        require_columns(type(self).__name__, examples, ["inputs", "targets"])
        input_ids = self._fit(column_rows(examples, "inputs"), self.inputs_length, "inputs")
        target_ids = self._fit(column_rows(examples, "targets"), self.targets_length, "targets")
        real_targets = target_ids != self.pad_id
        decoder_input_ids = np.empty_like(target_ids)
        decoder_input_ids[:, 0] = self.decoder_start_id
        decoder_input_ids[:, 1:] = target_ids[:, :-1]
        out = {
            "input_ids": input_ids,
            "attention_mask": (input_ids != self.pad_id).astype(np.int64),
            "labels": np.where(real_targets, target_ids, IGNORE_INDEX),
            "decoder_input_ids": decoder_input_ids,
            "decoder_attention_mask": np.concatenate(
                [np.ones((len(target_ids), 1), dtype=np.int64), real_targets[:, :-1].astype(np.int64)], axis=1),
        }
        if self.return_position_ids:
            out["position_ids"] = np.broadcast_to(np.arange(input_ids.shape[1]), input_ids.shape).copy()
        return to_tensors(out)
