"""Integrations of the loader with training frameworks (each imports its framework lazily).

- :mod:`loaders.integrations.hf`: Hugging Face transformers ``Trainer``.

May import: everything in :mod:`loaders`, :mod:`schemas`, :mod:`transforms.objectives`, torch,
and its framework only inside the functions that use it; never Beam.
"""
