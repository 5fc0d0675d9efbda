"""Documents and example batches handed between local worker processes through files, not the runner.

Why: with ``--direct_running_mode=multi_processing`` Beam's FnApiRunner sends a stage's
input to each SDK worker through a gRPC data stream whose buffer a timer thread flushes once
a second (``TimeBasedBufferingClosableOutputStream`` of ``apache_beam.runners.worker.data_plane``,
created with the runner's fixed ``DATA_BUFFER_TIME_LIMIT_MS``). The flush hands the buffer to
the send queue and then clears it, while the runner's main thread may still be writing the
next parts of the input into that buffer: whatever it wrote in between is cleared unsent.
The loss needs an input of several data blocks (a ``Flatten`` of PCollections made in other
stages, which FnApiRunner materializes) whose writing outlasts the flush period, so it grows
with the size of the input and the load of the machine (``benchmarks/beam_flush_race.py``
shows it with a plain Beam pipeline).

In lmshards such inputs are the documents (Tokenize's batches, materialized before
AssignGroups, which waits for the plan of the groups; and AssignGroups' blocks, as a pack group
reaches its worker as one element of up to hundreds of MB) and the writers' Flatten of example
batches: a 320 MB run with 2 workers on a machine at load 11 lost 1,109 of 53,068 documents
(the end-to-end check refused it) while its example batches already went through files. With
local workers each batch and block of documents and each example batch is therefore written,
once, by the worker that made it to a file of its process under a directory of the run
(:func:`spilled`), and only a reference crosses the runner: the ``(path, offset, length)`` of
its bytes. The reference reads as the tuple it stands for (iterating it, or reading one of its
fields, loads the value), so AssignGroups, Pack and the writers use it as they use the value
itself; re-encoding it (the runner's grouping does) copies only the reference. Nothing in the
output depends on it: the bytes loaded are the bytes pickled.

The directory is the run's (:class:`FileHandoff`), removed when the run ends.
"""

from __future__ import annotations

import os
import pickle
import shutil
import tempfile
import threading
import uuid

from schemas.errors import JobFailedError
from transforms.writing.output import TMP_DIR

__all__ = ["FileHandoff", "FileHandoffError", "SpilledValue", "spilled"]

_WRITERS: dict[str, tuple[int, list[int]]] = {}  # path (directory and pid) -> (fd, [next offset])
_READERS: dict[str, int] = {}  # path -> fd
_LOCK = threading.Lock()
_TYPES: dict[type, type] = {}


class FileHandoffError(JobFailedError):
    """A handed-over value could not be read back whole from its file."""


def _write(directory: str, data: bytes) -> tuple[str, int]:
    """Append ``data`` to this process's file under ``directory``; return ``(path, offset)``."""
    path = os.path.join(directory, f"{os.getpid()}.bin")
    with _LOCK:
        entry = _WRITERS.get(path)  # keyed by the pid too: a forked child opens its own file
        if entry is None:
            os.makedirs(directory, exist_ok=True)
            entry = _WRITERS[path] = (os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), [0])
        fd, offset = entry
        start = offset[0]
        offset[0] += len(data)
    view, at = memoryview(data), start
    while view:  # pwrite may write less than asked
        written = os.pwrite(fd, view, at)
        view, at = view[written:], at + written
    return path, start


def _read(path: str, offset: int, length: int) -> bytes:
    with _LOCK:
        fd = _READERS.get(path)
        if fd is None:
            try:
                fd = _READERS[path] = os.open(path, os.O_RDONLY)
            except OSError as exc:
                raise FileHandoffError(f"a batch handed over through {path} cannot be read ({exc.strerror})") from None
    data = os.pread(fd, length, offset)
    if len(data) != length:
        raise FileHandoffError(f"a batch handed over through {path} is cut short: {len(data):,} of {length:,} bytes "
                               f"at offset {offset:,}")
    return data


class SpilledValue:
    """A value written to a handoff file: iterating it, or reading a field of it (a NamedTuple's),
    loads it (the tuple it stands for, read once and kept while the reference
    lives); pickling it writes only its place again."""

    __slots__ = ("path", "offset", "length", "_value")

    def __init__(self, path: str, offset: int, length: int):
        self.path, self.offset, self.length = path, offset, length
        self._value = None

    def load(self) -> tuple:
        if self._value is None:
            self._value = pickle.loads(_read(self.path, self.offset, self.length))
        return self._value

    def __iter__(self):
        return iter(self.load())

    def __getattr__(self, name: str):
        if name.startswith("__"):  # protocol lookups (pickle, copy) never load the value
            raise AttributeError(name)
        return getattr(self.load(), name)

    def __reduce__(self):
        return SpilledValue, (self.path, self.offset, self.length)

    def __repr__(self) -> str:
        return f"SpilledValue({self.path!r}, {self.offset}, {self.length})"


def _reduce_to_file(self):
    # as the type it was handed over as (a NamedTuple stays one: its readers use its fields)
    data = pickle.dumps(tuple.__new__(type(self).__mro__[1], self), protocol=pickle.HIGHEST_PROTOCOL)
    path, offset = _write(self.handoff_directory, data)
    return SpilledValue, (path, offset, len(data))


def spilled(value: tuple, directory: str) -> tuple:
    """``value`` (a tuple) as an equal tuple whose pickling writes it to a file of this process
    under ``directory`` and stores only its place (a :class:`SpilledValue`)."""
    if not isinstance(value, tuple):
        raise TypeError(f"only tuples are handed over through files, not {type(value).__name__}")
    cls = type(value)
    spill_type = _TYPES.get(cls)
    if spill_type is None:
        spill_type = _TYPES[cls] = type(f"Spilled{cls.__name__.capitalize()}", (cls,),
                                        {"__reduce__": _reduce_to_file, "__module__": __name__})
    handed = tuple.__new__(spill_type, value)
    handed.handoff_directory = directory
    return handed


def spill_value(element: tuple, directory: str) -> tuple:
    """``(key, tuple)`` -> ``(key, spilled tuple)``: the key stays as it is, for the runner to group by."""
    key, value = element
    return key, spilled(value, directory)


class FileHandoff:
    """The run's handoff directory: under the output's ``.tmp/`` when the output is a local
    directory (the dataset's disk has room for its batches), else under the system's
    temporary directory. Created by the first worker that writes to it; :meth:`release`
    removes it."""

    def __init__(self, output: str | None):
        name = f"handoff-{uuid.uuid4().hex}"
        local = output is not None and "://" not in output
        self.directory = os.path.abspath(os.path.join(output, TMP_DIR, name) if local else
                                         os.path.join(tempfile.gettempdir(), f"lmshards-{name}"))

    def release(self) -> None:
        with _LOCK:
            for path in [p for p in _WRITERS if os.path.dirname(p) == self.directory]:
                os.close(_WRITERS.pop(path)[0])
            for path in [p for p in _READERS if os.path.dirname(p) == self.directory]:
                os.close(_READERS.pop(path))
        shutil.rmtree(self.directory, ignore_errors=True)
