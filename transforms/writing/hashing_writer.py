"""HashingWriter: a pass-through binary writer that counts the bytes and hashes them (sha256),
optionally on a helper thread (no Beam, no pyarrow).

Every shard and rejected-record file is written through one, so the manifest's byte counts and
digests are those of the bytes handed to the sink, whatever the sink (a local file, a GCS
upload, a non-seekable stream).
"""

from __future__ import annotations

import collections
import hashlib
import io
from concurrent.futures import ThreadPoolExecutor
from typing import BinaryIO

__all__ = ["BACKGROUND_BLOCK", "BACKGROUND_BLOCKS", "HashingWriter"]

#: Default block size (bytes) and queue depth (blocks) of a background HashingWriter.
BACKGROUND_BLOCK = 1 << 22
BACKGROUND_BLOCKS = 4


class HashingWriter(io.RawIOBase):
    """Pass-through writer that counts bytes and computes their sha256.

    With ``background=True`` the bytes are gathered into blocks of ``block_bytes`` bytes that
    one helper thread writes to ``raw`` and hashes, in order, while the caller goes on
    producing the next block (``hashlib`` and file writes release the GIL, so on a machine with
    a spare core that work is free); at most ``max_pending`` blocks wait. :meth:`finish` (also
    called by :attr:`sha256`) waits for them and re-raises an error of the helper thread. The
    bytes written and their digest do not depend on ``background``, ``block_bytes`` or
    ``max_pending``.

    Args:
        raw: the sink.
        background: write and hash on a helper thread.
        block_bytes: bytes gathered per block handed to the helper (default
            :data:`BACKGROUND_BLOCK`); a ``bytes`` write of at least a quarter of it is handed
            over as it is.
        max_pending: blocks waiting for the helper at most (default :data:`BACKGROUND_BLOCKS`).
    """

    def __init__(self, raw: BinaryIO, *, background: bool = False, block_bytes: int = BACKGROUND_BLOCK,
                 max_pending: int = BACKGROUND_BLOCKS):
        super().__init__()
        if block_bytes < 1 or max_pending < 1:
            raise ValueError(f"block_bytes and max_pending must be >= 1, got {block_bytes} and {max_pending}")
        self._raw = raw
        self._sha256 = hashlib.sha256()
        self.bytes = 0
        self._background = background
        self._block_bytes, self._max_pending = block_bytes, max_pending
        self._block = bytearray()
        self._pending: collections.deque = collections.deque()
        self._pool: ThreadPoolExecutor | None = None

    def writable(self) -> bool:
        return True

    def _write_and_hash(self, data) -> None:
        self._raw.write(data)
        self._sha256.update(data)

    def _submit(self, data: bytes | bytearray) -> None:
        if self._pool is None:
            self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="lmshards-hash")
        while len(self._pending) >= self._max_pending:
            self._pending.popleft().result()
        self._pending.append(self._pool.submit(self._write_and_hash, data))

    def write(self, data) -> int:
        view = memoryview(data).cast("B")
        size = len(view)
        self.bytes += size
        if not self._background:
            self._write_and_hash(view)
            return size
        if type(data) is bytes and size >= self._block_bytes // 4:  # immutable: handed over as it is
            if self._block:
                block, self._block = self._block, bytearray()
                self._submit(block)
            self._submit(data)
            return size
        # Copied: the caller (pyarrow, for one) may reuse its buffer once write returns.
        self._block += view
        if len(self._block) >= self._block_bytes:
            block, self._block = self._block, bytearray()  # handed over, never touched again here
            self._submit(block)
        return size

    def finish(self) -> None:
        """Write and hash everything written so far; re-raise an error of the helper thread."""
        if self._block:
            block, self._block = self._block, bytearray()
            self._submit(block)
        try:
            while self._pending:
                self._pending.popleft().result()
        finally:
            self.stop()

    def stop(self) -> None:
        """Wait for the helper thread and end it (errors are left to :meth:`finish`)."""
        if self._pool is not None:
            self._pool.shutdown(wait=True)
            self._pool = None
        self._pending.clear()

    @property
    def sha256(self):
        """The running ``hashlib.sha256`` of all bytes written (after :meth:`finish`)."""
        self.finish()
        return self._sha256

    def tell(self) -> int:
        return self.bytes

    def flush(self) -> None:
        if not self._background:
            self._raw.flush()
