"""Collation: lists of examples -> batches a model's ``forward`` takes, HF transformers'
conventions (unshifted labels with -100, packed documents kept apart).

Holds columnar batches (``batch``), their numpy building blocks (``collate_arrays``), the
decoder-only and encoder collators (``collate_decoder``, ``collate_encoder``), the choice of
collator by schema (``collate``) and the attention masks of packed rows (``masks``).

May import: the standard library, numpy, torch (only to wrap finished arrays and in the mask's
dtype), :mod:`transforms.objectives`, :mod:`loaders.errors`; never Beam.
"""
