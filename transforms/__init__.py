"""Beam transforms of the lmshards pipeline, one subpackage per stage of the data flow
(docs/design.md section 2):

- :mod:`transforms.reading`: ReadCorpus, raw files -> text records and rejected entries;
- :mod:`transforms.tokenizing`: Tokenize, texts -> tokenized documents keyed for packing;
- :mod:`transforms.packing`: PlanGroups / AssignGroups and Pack, documents -> chunks;
- :mod:`transforms.building`: BuildExamples, chunks -> examples of the objective;
- :mod:`transforms.writing`: WriteShards, WriteRejected and WriteManifest;
- :mod:`transforms.objectives`: the objectives, pure numpy, shared with the loader.

The modules beside them are what several stages share: ``elements`` (what flows between the
stages), ``handoff``, ``free_memory``, ``progress`` and ``flag_values``; they may import
:mod:`transforms.objectives`, :mod:`schemas` and :mod:`transforms.writing.columns` (the examples
stored by column that a ``ShardPiece`` carries from building to writing), numpy and tqdm. A
stage's subpackage may import those, :mod:`transforms.objectives`, :mod:`schemas` and the stages
before it, never a later stage, :mod:`transforms.writing.columns` apart (each subpackage's
docstring names what it uses; tests/test_layering.py checks it).

This package file imports nothing heavy on purpose: the loader imports
``transforms.objectives`` (pure numpy), which runs this file first, and a training job
does not install Apache Beam (docs/design.md section 1).
"""
