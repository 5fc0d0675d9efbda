"""Helpers shared by the tests (a uniquely named module, so no conftest.py can shadow it)."""

from __future__ import annotations

import bisect
import contextlib
import hashlib
import io
import os
import pathlib
import signal
import subprocess
import sys

import numpy as np

ROOT = pathlib.Path(__file__).resolve().parent.parent
SAMPLE_GLOB = str(ROOT / "data" / "sample" / "*.jsonl")
TOKENIZER = str(ROOT / "data" / "tokenizer.json")


def materialize(output, *args: str):
    """Run the pipeline in-process on ``output`` with ``args``; return the manifest."""
    from pipelines.materialize import run

    return run(["--output", str(output), *args])


def default_sigint() -> None:
    """A child process's ``preexec_fn``: SIGINT back to its default disposition. pytest-xdist's
    workers ignore SIGINT, a child inherits that, and Python then never raises
    KeyboardInterrupt; a test that interrupts a run as Ctrl-C does needs what a terminal gives."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def lmshards_command(*argv: str) -> subprocess.CompletedProcess:
    """``lmshards argv`` run in this process (``pipelines.cli.main``): its exit status and what
    it printed, as ``subprocess.run(..., capture_output=True, text=True)`` would give them. The
    same code a process runs, without a fresh interpreter's imports; the tests of what only a
    real process shows (file descriptor 2, the log's warnings, signals, a terminal, imports)
    start one.
    """
    from pipelines.cli import main

    out, err = io.StringIO(), io.StringIO()
    interrupt = signal.getsignal(signal.SIGINT)  # a command leaves a SIGINT handler for the interpreter's exit
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                code = main(list(argv))
            except SystemExit as exc:  # argparse's usage errors, --help
                code = exc.code if isinstance(exc.code, int) else 1
    finally:
        signal.signal(signal.SIGINT, interrupt)
    return subprocess.CompletedProcess(["lmshards", *argv], code, out.getvalue(), err.getvalue())


def materialize_command(*argv: str) -> subprocess.CompletedProcess:
    """``lmshards materialize argv`` in this process (:func:`lmshards_command`)."""
    return lmshards_command("materialize", *argv)


def file_digests(root) -> dict[str, str]:
    """sha256 of every file under ``root`` except manifest.json, by relative path."""
    out = {}
    for dirpath, _, names in os.walk(root):
        for name in names:
            path = os.path.join(dirpath, name)
            rel = os.path.relpath(path, root)
            if rel == "manifest.json":
                continue
            with open(path, "rb") as handle:
                out[rel] = hashlib.sha256(handle.read()).hexdigest()
    return out


def tokenized_documents(outputs) -> list:
    """Tokenize's main outputs among ``outputs`` (a DoFn's, windowed or not; tagged ones are
    skipped) as ``(split, Document)`` pairs, in the order it emitted them."""
    from apache_beam.pvalue import TaggedOutput

    from transforms.elements import DocumentBatch

    documents = []
    for output in outputs:
        if isinstance(output, TaggedOutput):
            continue
        split, encoded = getattr(output, "value", output)  # finish_bundle's are windowed
        batch = DocumentBatch.decode(encoded)
        documents.extend((split, batch.document(index)) for index in range(batch.count))
    return documents


def encode_documents(texts, tokenizer_path) -> list[np.ndarray]:
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(tokenizer_path)
    return [np.asarray(e.ids, dtype=np.int32) for e in tok.encode_batch(texts, add_special_tokens=False)]


_BLOCKER = """
import sys
BLOCKED = set(sys.argv[1].split(","))
class Block:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in BLOCKED:
            raise ImportError("blocked import of " + name)
sys.meta_path.insert(0, Block())
"""


def run_with_blocked_imports(code: str, blocked: str, *args: str) -> subprocess.CompletedProcess:
    """Run ``code`` in a fresh interpreter where the top-level packages in ``blocked``
    (comma-separated) cannot be imported; ``sys.argv[2:]`` holds ``args``."""
    return subprocess.run([sys.executable, "-c", _BLOCKER + code, blocked, *args], capture_output=True, text=True,
                          cwd=ROOT)


def write_file(path: pathlib.Path, data: bytes) -> str:
    """Write ``data`` to ``path``; its path as a string."""
    path.write_bytes(data)
    return str(path)


def read_file_records(path: str, **kwargs) -> list:
    """Everything ``transforms.reading.read.iter_file_records`` yields for ``path``."""
    from transforms.reading.read import iter_file_records

    return list(iter_file_records(path, **kwargs))


def record_texts(items: list) -> list:
    """``(position, text)`` of the records among ``items``."""
    return [(r[1], r[2]) for r in items if isinstance(r, tuple)]


def rejection_reasons(items: list) -> list:
    """``(position, reason)`` of the rejected entries among ``items``."""
    return [(r["position"], r["reason"]) for r in items if isinstance(r, dict)]


# --- shards from example dicts (the pipeline writes columns; tests and fixtures write rows) ---


def write_arrow(handle, examples, schema, *, batch_rows: int | None = None) -> None:
    """Write ``examples`` (dicts of column -> value) as one Arrow IPC stream, as a shard's
    writer writes their columns."""
    from transforms.writing.shard_format import ARROW_BATCH_ROWS, ExampleColumns, write_arrow_columns

    write_arrow_columns(handle, ExampleColumns.from_examples(examples, schema),
                        batch_rows=ARROW_BATCH_ROWS if batch_rows is None else batch_rows)


def write_tar(handle, examples, schema) -> None:
    """Write ``examples`` (dicts of column -> value) as a WebDataset tar stream, as a shard's
    writer writes their columns."""
    from transforms.writing.shard_format import ExampleColumns, write_tar_columns

    write_tar_columns(handle, ExampleColumns.from_examples(examples, schema))


def group_of(split_plan: dict, bucket: int) -> int:
    """The group of one (sub-)bucket in a split's plan of pack groups (``plan_groups``): the
    scalar oracle of ``transforms.packing.group.groups_of``."""
    starts = split_plan["starts"]
    return bucket if starts is None else bisect.bisect_right(starts, bucket) - 1
