"""Tokenizing: text records -> tokenized documents keyed for packing (``Tokenize``).

Holds the Beam stage (``tokenize``), the encoder seam and its backends (``encoder``), the
plan's choice of backend and its parity probe (``encoder_choice``, ``encoder_probe``), long
documents in pieces (``long_text``), per-token features (``word_starts``, ``text_rules``) and
the tokenizer.json loader with the special ids the objectives need (``tokenizer_utils``).

May import: the standard library, Beam (``tokenize`` only), numpy, tokenizers, fastokens,
:mod:`transforms.reading` (records and the file a flag names), :mod:`transforms.objectives`,
:mod:`schemas` and the loose modules of :mod:`transforms`; never torch.
"""
