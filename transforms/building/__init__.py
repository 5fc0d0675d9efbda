"""Building: chunks -> examples of the objective, in columnar blocks (``BuildExamples``).

Holds the Beam stage (``build``) and its work without Beam (``parallel``: chunks -> encoded
shard pieces and summed counters).

May import: the standard library, Beam (``build`` only), numpy, :mod:`transforms.objectives`,
:mod:`schemas`, :mod:`transforms.writing.columns` (the columns the examples are built into, which
the writers encode) and the loose modules of :mod:`transforms`; never torch.
"""
