"""Compressed inputs: streamed decompression with a bounded window, and checksum verification.

Both formats are decompressed a bounded piece at a time, whatever the compression ratio,
so a decompression bomb costs time, never memory:

- **gzip** through :class:`gzip.GzipFile`, whose reads are bounded (``zlib``'s
  ``max_length``). Each member ends in a CRC-32 and the length of its data, checked when
  the member ends.
- **zstd** through :class:`ZstdFrames`: the frame and block headers are parsed here (RFC
  8878), and the decompressor gets a few whole blocks per call; a block never holds more
  than 128 KiB of output, so neither does a call. A frame written with a content checksum
  (``zstd`` does so by default) is verified by libzstd when it ends; a frame without one
  cannot be verified and is counted in :attr:`ZstdFrames.unverified_frames`. Skippable
  frames are skipped.

A compressed file's records must not count before its checksums verified, yet gzip and
zstd check only at the end of a member or frame. :func:`verify_archive` therefore
decompresses the whole file once (a verification pass) before any of its records is used.
A small file (:data:`transforms.reading.file_records.VERIFY_FIRST_BYTES`) is verified first and its
decompressed bytes, at most :data:`KEEP_BYTES`, are kept for reading, so it is decompressed
once. A larger one is verified by a thread of its own while it is read (decompression releases
the GIL, so the two share the cores), its records held until the verification ends; the cost
is the second decompression, on another core (``benchmarks/bench_read.py`` measures it).
"""

from __future__ import annotations

import contextlib
import gzip
import io
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from apache_beam.io.filesystem import CompressionTypes
from apache_beam.io.filesystems import FileSystems

__all__ = ["KEEP_BYTES", "ArchiveCheck", "ZstdFrames", "compression_of", "open_decompressed", "verify_archive"]

#: A verified file of at most this many decompressed bytes is kept for reading (not decompressed again).
KEEP_BYTES = 16 << 20
#: Decompressed bytes per read of the verification pass.
_READ = 1 << 20

_ZSTD_MAGIC = 0xFD2FB528
_SKIPPABLE_LOW, _SKIPPABLE_HIGH = 0x184D2A50, 0x184D2A5F
_BLOCK_MAX = 128 << 10
#: Blocks given to the zstd decompressor per call (each holds at most 128 KiB of output).
_BLOCKS_PER_CALL = 16
_RAW_READ = 1 << 16


def compression_of(path: str) -> str | None:
    """``gzip``, ``zstd`` or None, from the file name."""
    lower = path.lower()
    for suffix, kind in ((".gz", "gzip"), (".gzip", "gzip"), (".zst", "zstd"), (".zstd", "zstd")):
        if lower.endswith(suffix):
            return kind
    return None


class ZstdFrames(io.RawIOBase):
    """Concatenated zstd frames -> bytes, at most a few blocks (128 KiB each) decompressed at once.

    Raises (from ``read``): ``EOFError`` when the input ends inside a frame, ``OSError`` for
    bytes that are not a zstd frame or a corrupt block header (as ``gzip`` and ``bz2`` for data
    that is not theirs), ``zstandard.ZstdError`` for corrupt data or a content checksum that
    does not match.
    """

    def __init__(self, raw: Any):
        super().__init__()
        import zstandard

        self._raw = raw
        self._decompressor = zstandard.ZstdDecompressor()
        self._buffer = bytearray()
        self._raw_done = False
        self._frame: Any = None  # decompressor of the frame being read
        self._checksum = False
        self._pending = memoryview(b"")
        self.frames = 0
        self.unverified_frames = 0

    def readable(self) -> bool:
        return True

    def _fill(self, size: int) -> bool:
        """Make the buffer hold at least ``size`` bytes; False if the input ends first."""
        while len(self._buffer) < size and not self._raw_done:
            data = self._raw.read(max(_RAW_READ, size - len(self._buffer)))
            if not data:
                self._raw_done = True
            else:
                self._buffer += data
        return len(self._buffer) >= size

    def _take(self, size: int) -> bytes:
        data = bytes(self._buffer[:size])
        del self._buffer[:size]
        return data

    def _start_frame(self) -> bool:
        """Parse the next frame header and start its decompressor; False at the end of the input."""
        while True:
            if not self._fill(4):
                if self._buffer:
                    raise EOFError("zstd stream ended inside a frame header")
                return False
            magic = int.from_bytes(self._buffer[:4], "little")
            if _SKIPPABLE_LOW <= magic <= _SKIPPABLE_HIGH:
                if not self._fill(8):
                    raise EOFError("zstd stream ended inside a skippable frame")
                size = int.from_bytes(self._buffer[4:8], "little")
                del self._buffer[:8]
                while size:
                    if not self._fill(1):
                        raise EOFError("zstd stream ended inside a skippable frame")
                    step = min(size, len(self._buffer))
                    del self._buffer[:step]
                    size -= step
                continue
            if magic != _ZSTD_MAGIC:
                raise OSError(f"not a zstd frame (magic number {magic:#010x})")
            if not self._fill(5):
                raise EOFError("zstd stream ended inside a frame header")
            descriptor = self._buffer[4]
            single_segment = (descriptor >> 5) & 1
            content_size_bytes = (1 if single_segment else 0, 2, 4, 8)[descriptor >> 6]
            header = 5 + (0 if single_segment else 1) + (0, 1, 2, 4)[descriptor & 3] + content_size_bytes
            if not self._fill(header):
                raise EOFError("zstd stream ended inside a frame header")
            self._frame = self._decompressor.decompressobj()
            self._checksum = bool((descriptor >> 2) & 1)
            self.frames += 1
            if not self._checksum:
                self.unverified_frames += 1
            self._frame.decompress(self._take(header))  # a header alone yields no output
            return True

    def _decompress_blocks(self) -> bytes:
        """Output of the next few blocks of the current frame (the frame ends after its last)."""
        chunks = []
        size = 0
        last = False
        for _ in range(_BLOCKS_PER_CALL):
            if not self._fill(size + 3):
                raise EOFError("zstd stream ended inside a frame")
            header = int.from_bytes(self._buffer[size : size + 3], "little")
            kind, block_size = (header >> 1) & 3, header >> 3
            if kind == 3 or block_size > _BLOCK_MAX:
                raise OSError("corrupt zstd block header")
            size += 3 + (1 if kind == 1 else block_size)
            if header & 1:
                last = True
                size += 4 if self._checksum else 0
                break
            if size >= _BLOCK_MAX:
                break
        if not self._fill(size):
            raise EOFError("zstd stream ended inside a frame")
        chunks.append(self._frame.decompress(self._take(size)))
        if last:
            if not self._frame.eof:
                raise OSError("corrupt zstd frame (its last block does not end it)")
            self._frame = None
        return b"".join(chunks)

    def readinto(self, buffer) -> int:
        while not self._pending:
            if self._frame is None and not self._start_frame():
                return 0
            self._pending = memoryview(self._decompress_blocks())
        count = min(len(buffer), len(self._pending))
        buffer[:count] = self._pending[:count]
        self._pending = self._pending[count:]
        return count


@contextlib.contextmanager
def open_decompressed(path: str, kind: str | None = None) -> Iterator[Any]:
    """A binary stream of the file's decompressed bytes (``kind``: from the name when None).

    Yields the raw file for an uncompressed one. A :class:`ZstdFrames` stream is wrapped
    in a buffer; its frame counts are on the stream's ``frames`` attribute.
    """
    kind = compression_of(path) if kind is None else kind
    # Closing a GzipFile does not close the file object it wraps, so both are managed here.
    with FileSystems.open(path, compression_type=CompressionTypes.UNCOMPRESSED) as raw:
        if kind == "gzip":
            with gzip.GzipFile(fileobj=raw, mode="rb") as stream:
                yield stream
        elif kind == "zstd":
            frames = ZstdFrames(raw)
            with io.BufferedReader(frames, buffer_size=_READ) as stream:
                stream.frames = frames  # type: ignore[attr-defined]
                yield stream
        else:
            yield raw


@dataclass(frozen=True)
class ArchiveCheck:
    """What the verification pass of a compressed file found.

    Attributes:
        error: why the file cannot be used (``"BadGzipFile: CRC check failed ..."``), or None.
        unverified: frames without a checksum (zstd), so the file's bytes are not verified.
        size: decompressed bytes (up to the fault when there is one).
        data: the decompressed bytes when verified and at most :data:`KEEP_BYTES`, else None.
    """

    error: str | None
    unverified: int
    size: int
    data: bytes | None


def verify_archive(path: str, kind: str, keep: bool = True) -> ArchiveCheck:
    """Decompress ``path`` once, checking every checksum, with memory bounded by the window
    (``keep``: the bytes of a file of at most :data:`KEEP_BYTES` are kept, else none)."""
    kept: list[bytes] | None = [] if keep else None
    size = 0
    unverified = 0
    try:
        with open_decompressed(path, kind) as stream:
            while block := stream.read(_READ):
                size += len(block)
                if kept is not None:
                    kept.append(block)
                    if size > KEEP_BYTES:
                        kept = None
            if kind == "zstd":
                unverified = stream.frames.unverified_frames
    except Exception as exc:  # zlib.error, gzip.BadGzipFile, EOFError, zstandard.ZstdError, OSError
        return ArchiveCheck(f"{type(exc).__name__}: {exc}", unverified, size, None)
    return ArchiveCheck(None, unverified, size, b"".join(kept) if kept is not None else None)
