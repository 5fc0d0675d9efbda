"""Offline inspection of a dataset directory: what ``lmshards inspect``, ``show``, ``validate``
and ``report`` compute (numpy, pyarrow and tokenizers only; no Beam, no torch).

- :mod:`loaders.inspection.source`: open a dataset (manifest, tokenizer, special ids, the
  objective rebuilt from the manifest) and read examples shard by shard, only as far as
  asked; every file access goes through :func:`~loaders.inspection.source.dataset_files`.
- :mod:`loaders.inspection.anatomy`: one example taken apart (real lengths, padding,
  noise spans, MLM replacements, prefix, documents, denoiser) and the structural faults seen.
- :mod:`loaders.inspection.stats`: per-split statistics and the ``inspect`` table / JSON.
- :mod:`loaders.inspection.render`: examples decoded with the corrupted parts visible
  (ANSI colour, plain text, HTML).
- :mod:`loaders.inspection.checks`: the per-example invariants and the replay of the objective.
- :mod:`loaders.inspection.validate`: checksums, schemas, invariants, cross-format and
  manifest reconciliation, as a list of problems.
- :mod:`loaders.inspection.report` and :mod:`loaders.inspection.svg`: the self-contained
  HTML report with inline SVG plots.
"""

from loaders.inspection.source import InspectedDataset, dataset_files, open_inspected

__all__ = ["InspectedDataset", "dataset_files", "open_inspected"]
