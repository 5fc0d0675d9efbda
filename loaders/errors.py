"""Errors the loader raises about data it cannot use (every message names the file or column)."""

from __future__ import annotations

__all__ = ["ShardIntegrityError", "UnsupportedSchemaError"]


class ShardIntegrityError(ValueError):
    """A shard does not match the manifest: size, sha256, schema or row count."""


class UnsupportedSchemaError(ValueError):
    """Examples whose columns a dataset mode or a collator cannot handle."""
