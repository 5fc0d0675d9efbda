"""Grouping and packing: tokenized documents -> pack groups -> chunks (``PlanGroups``,
``AssignGroups``, ``Pack``).

Holds the pack groups (``group``) and the Beam stage that packs a group's documents, drops
exact duplicates and re-packs the remainders (``pack``; the packing itself is
:mod:`transforms.objectives.packing`, shared with the loader).

May import: the standard library, Beam, numpy, :mod:`transforms.objectives` and the loose
modules of :mod:`transforms`; never torch.
"""
