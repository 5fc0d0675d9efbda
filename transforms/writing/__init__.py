"""Writing: examples -> shards, rejected records -> files, then the manifest (``WriteShards``,
``WriteRejected``, ``WriteManifest``).

Holds the Beam stages (``write``, ``manifest``), the document accounting the manifest checks
(``accounting``), examples stored by column (``columns``), the byte-exact shard encoders
(``shard_format``, ``tar_format``, ``hashing_writer``), and the output directory with its lock
(``output``, ``process_info``).

May import: the standard library, Beam (``write``, ``manifest`` and ``output``; with Beam's gcp
extra, its GCS client for the lock), numpy, pyarrow, :mod:`schemas`, :mod:`transforms.objectives`,
:mod:`transforms.reading` (the input listing the manifest re-checks), :mod:`transforms.packing`
(the group plan it records) and the loose modules of :mod:`transforms`; never torch.
"""
