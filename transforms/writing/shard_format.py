"""Byte-exact encoders of one shard: Arrow IPC stream and WebDataset tar (no Beam).

The one place to import the shard encoders from (the pipeline's writer, tests, benchmarks):
the Arrow encoder lives here; the tar encoder in :mod:`transforms.writing.tar_format`, the column
store both read in :mod:`transforms.writing.columns`, and the hashing sink in
:mod:`transforms.writing.hashing_writer`.

Both encoders write to any binary, possibly non-seekable handle (a local file, a GCS upload)
and are deterministic: fixed record-batch size, uncompressed Arrow buffers, tar members with
mtime 0, uid/gid 0, empty owner names, mode 0644, and sorted names (examples in the given
order, fields in name order inside an example).
"""

from __future__ import annotations

from typing import BinaryIO

import pyarrow as pa

from transforms.writing.columns import ARROW_BATCH_ROWS, ExampleColumns, MergedColumns
from transforms.writing.hashing_writer import HashingWriter
from transforms.writing.tar_format import npy_bytes, write_tar_columns

__all__ = [
    "ARROW_BATCH_ROWS",
    "ExampleColumns",
    "HashingWriter",
    "MergedColumns",
    "npy_bytes",
    "write_arrow_columns",
    "write_tar_columns",
]


def write_arrow_columns(handle: BinaryIO, columns: ExampleColumns | MergedColumns, *,
                        batch_rows: int = ARROW_BATCH_ROWS) -> int:
    """Write the rows of ``columns`` as one Arrow IPC stream (uncompressed, record batches of
    ``batch_rows`` rows, the last one shorter); return the number of rows written.

    Shards use the default: their bytes depend on ``batch_rows``.
    """
    if batch_rows < 1:
        raise ValueError(f"batch_rows must be >= 1, got {batch_rows}")
    options = pa.ipc.IpcWriteOptions(compression=None)
    rows = 0
    with pa.ipc.new_stream(handle, columns.schema.schema, options=options) as writer:
        for batch in columns.record_batches(batch_rows):
            writer.write_batch(batch)
            rows += batch.num_rows
    return rows


