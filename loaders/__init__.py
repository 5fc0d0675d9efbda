"""Readers of lmshards datasets. Never imports Apache Beam (DESIGN.md section 1)."""

from loaders.reader import DatasetReader, iter_examples, open_dataset

__all__ = ["DatasetReader", "iter_examples", "open_dataset"]
