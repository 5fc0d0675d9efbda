"""Offline inspection of a dataset directory: what ``lmshards inspect``, ``show``, ``validate``
and ``report`` compute (numpy, pyarrow and tokenizers only; no Beam, no torch).

- :mod:`loaders.inspection.source`: open a dataset (manifest, tokenizer, special ids, the
  objective rebuilt from the manifest) and read examples shard by shard, only as far as
  asked; every file access goes through :func:`~loaders.inspection.source.dataset_files`.
- :mod:`loaders.inspection.anatomy`: one example taken apart (real lengths, padding,
  documents, prefixes, inputs and targets, then the objective's own parts) and the structural
  faults seen.
- :mod:`loaders.inspection.stats`: per-split statistics; :mod:`loaders.inspection.table` the
  ``inspect`` table / JSON.
- :mod:`loaders.inspection.segments`: an example as named lines of segments, its noise
  made explicit by the objective's hook; :mod:`loaders.inspection.decode` decodes a line's
  token runs to whole characters.
- :mod:`loaders.inspection.render`: those lines as plain text, ANSI colour or HTML (wrapped,
  real line breaks, a legend).
- :mod:`loaders.inspection.checks`: the per-example invariants and the replay of the objective.
- :mod:`loaders.inspection.validate`: checksums, schemas, invariants, cross-format and
  manifest reconciliation, as a list of problems.
- :mod:`loaders.inspection.report` (with :mod:`~loaders.inspection.report_sections`,
  :mod:`~loaders.inspection.figures`, :mod:`~loaders.inspection.corpus` and
  :mod:`~loaders.inspection.svg`): the self-contained HTML report with inline SVG plots.
- :mod:`loaders.inspection.diff`: two datasets' manifest summaries side by side.

Whatever depends on the objective comes from its inspection hooks (docs/design.md section 4,
:class:`transforms.objectives.base.InspectionContext`): this package names no objective.

May import: numpy, pyarrow, tokenizers, :mod:`schemas`, :mod:`transforms.objectives` (whose
hooks every view asks), the sentence rule of :mod:`transforms.tokenizing.text_rules` (a chunk's
sentence starts from its text, :meth:`~loaders.inspection.decode.RunDecoder.sentence_starts`),
:mod:`loaders.access` and :mod:`loaders.errors`; never torch, never Beam.
"""

from loaders.inspection.source import InspectedDataset, dataset_files, open_inspected

__all__ = ["InspectedDataset", "dataset_files", "open_inspected"]
