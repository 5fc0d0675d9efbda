"""Integrations of the loader with training frameworks (each imports its framework lazily).

- :mod:`loaders.integrations.hf`: Hugging Face transformers ``Trainer``.
"""
