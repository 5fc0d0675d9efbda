"""The values and defaults of ``lmshards`` flags that stages of the pipeline also use.

They live here, apart from the Beam stages that use them (:mod:`transforms.reading.file_records`,
:mod:`transforms.packing.pack`, :mod:`transforms.packing.group`, :mod:`transforms.writing.write`), so that the
command line can parse and check its own flags without importing Apache Beam: a mistyped
flag is answered at once, not after the seconds Beam's import takes. Standard library only.
"""

from __future__ import annotations

__all__ = ["DEFAULT_PACK_GROUP_TOKENS", "LAST_CHUNK_MODES", "REJECTED_PER_SHARD", "TEXT_MODES"]

#: How text files are cut into documents (``--text-mode``): one per line, per blank-line paragraph, per file.
TEXT_MODES = ("line", "paragraph", "file")
#: What happens to the last partial chunk of a split (``--last-chunk``).
LAST_CHUNK_MODES = ("drop", "pad")
#: Default ``--pack-group-tokens``: 2**25 (33.5 M) tokens. Pack + Build hold about one copy of a
#: group (measured per objective by benchmarks/bench_scale.py; docs/guide.md, "How large a corpus
#: on Dataflow"): about 0.1 GB (clm) to 0.16 GB (bart) on top of the worker itself. Small enough
#: that a worker's peak hardly grows once a corpus passes one group (about 110 MB of English text)
#: and that a few hundred MB already make several groups for the workers to share; large enough
#: that the one stage keyed by split, which re-packs every group's remainder, stays small up to
#: tens of TB. The default was 2**27 before (a manifest records the value a dataset was made with:
#: pass it to reproduce one).
DEFAULT_PACK_GROUP_TOKENS = 1 << 25
#: Rejected records per file of ``OUT/rejected/`` at most (``--rejected-per-file``; about 700
#: bytes each while a file's records are sorted: some 180 MB of one worker).
REJECTED_PER_SHARD = 1 << 18
