"""Arrow schemas, WebDataset field names and the manifest model of an lmshards dataset.

Writers (``transforms``) and readers (``loaders``) both take field names and types from
here, so the two sides cannot drift. This package imports nothing of ours.
"""

from schemas.examples import (
    DECODER_FAMILY,
    ENCODER_FAMILY,
    FAMILIES,
    SEQ2SEQ_FAMILY,
    ExampleSchema,
    example_schema,
)
from schemas.manifest import MANIFEST_NAME, MANIFEST_VERSION, Manifest, ShardFile, ShardInfo, shard_name

__all__ = [
    "DECODER_FAMILY",
    "ENCODER_FAMILY",
    "FAMILIES",
    "MANIFEST_NAME",
    "MANIFEST_VERSION",
    "SEQ2SEQ_FAMILY",
    "ExampleSchema",
    "Manifest",
    "ShardFile",
    "ShardInfo",
    "example_schema",
    "shard_name",
]
