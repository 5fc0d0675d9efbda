"""Errors the loader raises about data it cannot use (every message names the file or column);
part of lmshards' one error hierarchy (:mod:`schemas.errors`)."""

from __future__ import annotations

from schemas.errors import ShardIntegrityError, UnsupportedSchemaError

__all__ = ["ShardIntegrityError", "UnsupportedSchemaError"]
