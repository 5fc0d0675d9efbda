"""The values and defaults of ``lmshards`` flags that stages of the pipeline also use.

They live here, apart from the Beam stages that use them (:mod:`transforms.file_records`,
:mod:`transforms.pack`, :mod:`transforms.group`, :mod:`transforms.write`), so that the
command line can parse and check its own flags without importing Apache Beam: a mistyped
flag is answered at once, not after the seconds Beam's import takes. Standard library only.
"""

from __future__ import annotations

__all__ = ["DEFAULT_PACK_GROUP_TOKENS", "LAST_CHUNK_MODES", "REJECTED_PER_SHARD", "TEXT_MODES"]

#: How text files are cut into documents (``--text-mode``): one per line, per blank-line paragraph, per file.
TEXT_MODES = ("line", "paragraph", "file")
#: What happens to the last partial chunk of a split (``--last-chunk``).
LAST_CHUNK_MODES = ("drop", "pad")
#: Default ``--pack-group-tokens``: 2**27 (134 M) tokens. Pack + Build hold about one copy of a
#: group (measured per objective by benchmarks/bench_scale.py; README, "How large a corpus on
#: Dataflow"): under 1 GB of a worker process, which fits the 3.75 GB of an n1-standard vCPU's
#: SDK process, the worker's own share included, with room for a second bundle.
DEFAULT_PACK_GROUP_TOKENS = 1 << 27
#: Rejected records per file of ``OUT/rejected/`` at most (``--rejected-per-file``; about 700
#: bytes each while a file's records are sorted: some 180 MB of one worker).
REJECTED_PER_SHARD = 1 << 18
