"""Shard access: where a dataset's files are, whether they are intact, and reading their rows.

Holds the one way in to a dataset (``files``: the manifest and every file, fetched into the
size-bounded cache for a URL, ``cache``, ``prefetch``), the opener of each shard format
(``arrow_shard``, ``tar_shard``), the shards of a split read in batches (``shards``,
``segment_table``) and the minimal numpy reader (``reader``).

May import: the standard library, numpy, pyarrow, fsspec and gcsfs (optional), :mod:`schemas`,
:mod:`loaders.errors` and :mod:`loaders.collation`'s columnar batch; never torch, never Beam.
"""
