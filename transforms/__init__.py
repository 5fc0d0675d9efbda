"""Beam transforms of the lmshards pipeline.

This package file imports nothing heavy on purpose: the loader imports
``transforms.objectives`` (pure numpy), which runs this file first, and a training job
does not install Apache Beam (docs/design.md section 1).
"""
