"""The output directory of a run: its lock, what ``--overwrite`` may replace, and cleanup.

**The lock.** A run holds ``OUT/.lmshards.lock`` from before it changes anything in the
output until it ends. The file is JSON with the run's identity: ``run_id`` (random),
``host``, ``pid`` and ``started`` (UTC, ISO 8601). It is created exclusively (``O_EXCL``
locally; on ``gs://`` with the precondition ``ifGenerationMatch=0``, then read back), and
every file of the run is renamed into place only after :meth:`RunLock.check` found the
lock still naming this run, so two runs never mix their files: the second one is refused
before it changes anything. A lock whose process is gone (same host, no such pid, or a pid
that started after the lock was written) is *stale*: ``--overwrite`` removes it with a
warning; a live one, or one from another host, refuses the run.

On object stores the lock is best effort: Google Cloud Storage honours the precondition,
but a store (or an emulator) that ignores it lets two runs that start within the same
instant both believe they hold it; the read-back and the checks before each rename then
catch all but a near-simultaneous start.

**What --overwrite replaces.** Only an lmshards dataset or its debris: every file under
``OUT`` must be part of the layout lmshards writes (:data:`LAYOUT`: the manifest, the
tokenizer, shards and their ``datasets`` metadata, rejected records, the ``.tmp/`` of
unfinished writes, a lock). Anything else is refused with one line naming it, and nothing
is deleted. The manifest goes first, so a half-deleted directory never looks complete.
Deleting lists the objects and deletes them one by one, which works on every filesystem
(on ``gs://`` a "directory" is only a name prefix).

**Nothing is written or deleted through a link.** A local output may itself be a symbolic
link (the user chose that path), but anything *inside* it that is not a regular file or a
directory of the layout (a symbolic link such as ``train -> /elsewhere`` or ``.tmp ->
scratch``, a FIFO, a device, a directory lmshards never makes) is listed by
:func:`unexpected_entries`, and the output is refused before anything changes: through a
link the run would write shards, or delete files, outside the output. Deleting never
follows a link either (:func:`remove_output_files` unlinks regular files only, below no
link), so a link that appears while a run goes on costs nothing outside the output.
"""

from __future__ import annotations

import datetime
import json
import logging
import os
import re
import socket
import stat
import uuid
from dataclasses import asdict, dataclass

from apache_beam.io.filesystems import FileSystems

from schemas.errors import ConfigError, JobFailedError
from transforms.writing.process_info import process_start

__all__ = ["LAYOUT", "LAYOUT_DIRS", "LOCK_NAME", "TMP_DIR", "LockLostError", "OutputLockedError", "RunLock",
           "acquire_lock", "delete_tree", "foreign_files", "list_output", "process_start", "remove_output_files",
           "unexpected_entries"]

_LOG = logging.getLogger("lmshards")

LOCK_NAME = ".lmshards.lock"
TMP_DIR = ".tmp"
_SPLIT = r"[A-Za-z0-9][A-Za-z0-9_.-]*"
#: The files lmshards writes under a dataset directory (relative paths with "/").
LAYOUT = re.compile(
    "|".join([
        r"manifest\.json",
        r"tokenizer\.json",
        r"dataset_dict\.json",
        re.escape(LOCK_NAME),
        re.escape(TMP_DIR) + r"/.+",
        r"rejected/[^/]+\.jsonl",
        rf"{_SPLIT}/(state|dataset_info)\.json",
        rf"{_SPLIT}/arrow/(data-\d{{5}}-of-\d{{5}}\.arrow|state\.json|dataset_info\.json)",
        rf"{_SPLIT}/wds/data-\d{{5}}-of-\d{{5}}\.tar",
    ])
)
#: The directories lmshards makes under a dataset directory (relative paths with "/").
LAYOUT_DIRS = re.compile("|".join([re.escape(TMP_DIR) + r"(/.+)?", "rejected", _SPLIT, rf"{_SPLIT}/(arrow|wds)"]))


class OutputLockedError(ConfigError):
    """Another run (live, or on another host) holds the output's lock. The message is one line."""


class LockLostError(JobFailedError):
    """The output's lock no longer names this run: it must not rename anything into place."""


def _join(root: str, relative: str) -> str:
    return FileSystems.join(root, *relative.split("/"))


def _is_local(path: str) -> bool:
    return FileSystems.get_scheme(path) in (None, "file")


def _local(path: str) -> str:
    return path[len("file://") :] if path.startswith("file://") else path


@dataclass(frozen=True)
class RunLock:
    """The identity of the run that holds an output directory (see the module docstring)."""

    output: str
    run_id: str
    host: str
    pid: int
    started: str

    @classmethod
    def new(cls, output: str) -> RunLock:
        now = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
        return cls(output, uuid.uuid4().hex, socket.gethostname(), os.getpid(), now)

    @property
    def path(self) -> str:
        return _join(self.output, LOCK_NAME)

    def to_bytes(self) -> bytes:
        data = asdict(self)
        data.pop("output")
        return (json.dumps(data, sort_keys=True) + "\n").encode("utf-8")

    def describe(self) -> str:
        return f"pid {self.pid} on {self.host}, started {self.started}"

    def check(self) -> None:
        """Raise :class:`LockLostError` unless the lock file still names this run."""
        held = read_lock(self.output)
        if held is None or held.run_id != self.run_id:
            who = "no lock" if held is None else f"the lock of another run ({held.describe()})"
            raise LockLostError(f"--output {self.output}: {LOCK_NAME} now holds {who}; this run stops without "
                                "renaming its files into place")

    def stale(self) -> bool:
        """Whether the process that wrote the lock is gone (only decidable on this host)."""
        if self.host != socket.gethostname() or self.pid <= 0:
            return False
        try:
            os.kill(self.pid, 0)
        except ProcessLookupError:
            return True
        except PermissionError:
            pass  # alive, another user's
        started = process_start(self.pid)
        try:
            locked = datetime.datetime.fromisoformat(self.started).timestamp()
        except ValueError:
            return False
        return started is not None and started > locked + 2  # the pid was reused by a newer process

    def release(self) -> None:
        """Remove the lock file if it still names this run."""
        held = read_lock(self.output)
        if held is not None and held.run_id == self.run_id:
            try:
                FileSystems.delete([self.path])
            except Exception:  # noqa: BLE001 - gone already
                pass



def read_lock(output: str) -> RunLock | None:
    """The lock of ``output`` (None if there is none; an unreadable one names an unknown run)."""
    path = _join(output, LOCK_NAME)
    try:
        with FileSystems.open(path) as handle:
            raw = handle.read(1 << 16)
    except Exception:  # noqa: BLE001 - no lock
        return None
    try:
        data = json.loads(raw.decode("utf-8"))
        return RunLock(output, str(data["run_id"]), str(data["host"]), int(data["pid"]), str(data["started"]))
    except (ValueError, KeyError, TypeError, AttributeError):
        return RunLock(output, "unreadable", "unknown host", -1, "unknown")


def _create_exclusive(lock: RunLock) -> bool:
    """Create the lock file unless one exists; True if this run made it."""
    data = lock.to_bytes()
    if _is_local(lock.output):
        try:
            fd = os.open(_local(lock.path), os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        except FileExistsError:
            return False
        try:
            os.write(fd, data)
            os.fsync(fd)
        finally:
            os.close(fd)
        return True
    if FileSystems.exists(lock.path):  # a store that ignores the precondition below still refuses most races
        return False
    if FileSystems.get_scheme(lock.output) == "gs":
        try:
            from apache_beam.io.gcp import gcsio
            from google.api_core import exceptions

            bucket, _, name = lock.path[len("gs://") :].partition("/")
            blob = gcsio.GcsIO().client.bucket(bucket).blob(name)
            blob.upload_from_string(data, if_generation_match=0)
        except exceptions.PreconditionFailed:
            return False
        except ImportError:
            with FileSystems.create(lock.path) as handle:
                handle.write(data)
    else:
        with FileSystems.create(lock.path) as handle:
            handle.write(data)
    held = read_lock(lock.output)  # read back: a store that ignores preconditions lets the last writer win
    return held is not None and held.run_id == lock.run_id


def acquire_lock(output: str, lock: RunLock | None = None) -> RunLock:
    """Take the output's lock (``lock``, or a new identity), removing a stale one (with a warning).

    Raises:
        OutputLockedError: a live run (or one on another host, or an unreadable lock) holds it.
        OSError: the output cannot be written.
    """
    if _is_local(output):
        os.makedirs(_local(output), exist_ok=True)
    lock = lock or RunLock.new(output)
    for _ in range(3):
        if _create_exclusive(lock):
            return lock
        held = read_lock(output)
        if held is None:
            continue  # released meanwhile
        if not held.stale():
            raise OutputLockedError(
                f"--output {output}: another run is writing there ({held.describe()}; {LOCK_NAME}); wait for it, "
                f"or delete {LOCK_NAME} if no such run exists")
        again = read_lock(output)
        if again is not None and again.run_id == held.run_id:
            _LOG.warning("removing the stale lock of a run that is gone (%s)", held.describe())
            FileSystems.delete([held.path])
    raise OutputLockedError(f"--output {output}: could not take {LOCK_NAME} (other runs keep taking it)")


def list_output(output: str) -> list[str]:
    """Relative paths (with "/") of every regular file under ``output``; [] when it does not exist.

    Locally, links inside ``output`` are not followed (:func:`unexpected_entries` names them)."""
    if _is_local(output):
        return sorted(relative for relative, kind in _walk_local(_local(output)) if kind == "file")
    try:
        metadata = FileSystems.match([_join(output, "**")])[0].metadata_list
    except Exception:  # noqa: BLE001 - nothing there
        return []
    prefix = output.rstrip("/") + "/"
    return sorted(m.path[len(prefix) :] for m in metadata if m.path.startswith(prefix))


def _walk_local(root: str):
    """``(relative path, kind)`` of everything under ``root`` (kind ``file``, ``directory``,
    ``symbolic link to TARGET``, ``special file``), without following a link below ``root``."""
    for directory, dirs, names in os.walk(root):
        dirs.sort()
        for name in [*dirs, *sorted(names)]:
            path = os.path.join(directory, name)
            relative = os.path.relpath(path, root).replace(os.sep, "/")
            try:
                info = os.lstat(path)
            except OSError:
                continue  # gone meanwhile
            if stat.S_ISLNK(info.st_mode):
                try:
                    target = os.readlink(path)
                except OSError:
                    target = "?"
                yield relative, f"symbolic link to {target}"
            elif stat.S_ISDIR(info.st_mode):
                yield relative, "directory"
            elif stat.S_ISREG(info.st_mode):
                yield relative, "file"
            else:
                yield relative, "special file"
        dirs[:] = [d for d in dirs if not os.path.islink(os.path.join(directory, d))]  # os.walk would not follow


def unexpected_entries(output: str) -> list[tuple[str, str]]:
    """``(relative path, what it is)`` of each entry of a local ``output`` that is neither a regular
    file nor a directory of the layout (:data:`LAYOUT_DIRS`): links, special files, foreign
    directories. [] for a remote output (an object store has none of these) or a missing one."""
    if not _is_local(output):
        return []
    return [(relative, kind) for relative, kind in _walk_local(_local(output))
            if kind != "file" and not (kind == "directory" and LAYOUT_DIRS.fullmatch(relative))]


def foreign_files(relatives: list[str]) -> list[str]:
    """The files that are not part of an lmshards dataset's layout (:data:`LAYOUT`)."""
    return [r for r in relatives if not LAYOUT.fullmatch(r)]


def remove_output_files(output: str, relatives: list[str], keep: tuple[str, ...] = (LOCK_NAME,)) -> None:
    """Delete these files of ``output`` (the manifest first), then the empty lmshards directories left.

    Locally only regular files are unlinked, and none below a link (see the module docstring)."""
    ordered = sorted((r for r in relatives if r not in keep), key=lambda r: (r != "manifest.json", r))
    if _is_local(output):
        root = _local(output)
        for relative in ordered:
            _unlink_local(root, relative)
        for directory, _, _ in sorted(os.walk(root), key=lambda entry: -len(entry[0])):
            if directory != root and LAYOUT_DIRS.fullmatch(os.path.relpath(directory, root).replace(os.sep, "/")):
                try:
                    os.rmdir(directory)  # only empty ones
                except OSError:
                    pass
        return
    for start in range(0, len(ordered), 100):
        paths = [_join(output, r) for r in ordered[start : start + 100]]
        try:
            FileSystems.delete(paths)
        except Exception:  # noqa: BLE001 - some already gone: delete the rest one by one
            for path in paths:
                try:
                    FileSystems.delete([path])
                except Exception:  # noqa: BLE001
                    pass


def _unlink_local(root: str, relative: str) -> None:
    """Unlink ``root/relative`` if it is a regular file and no directory between ``root`` and it
    is a link; anything else is left where it is."""
    path = root
    parts = relative.split("/")
    for part in parts[:-1]:
        path = os.path.join(path, part)
        if os.path.islink(path) or not os.path.isdir(path):
            return
    path = os.path.join(path, parts[-1])
    try:
        if stat.S_ISREG(os.lstat(path).st_mode):
            os.unlink(path)
    except OSError:
        pass  # gone already


def delete_tree(path: str) -> None:
    """Delete every file under ``path`` and, locally, the directory itself (missing: nothing
    happens; a local ``path`` that is a link: nothing happens, its target is not the run's)."""
    if _is_local(path) and os.path.islink(_local(path)):
        return
    remove_output_files(path, list_output(path), keep=())
    if _is_local(path):
        try:
            os.rmdir(_local(path))
        except OSError:
            pass
