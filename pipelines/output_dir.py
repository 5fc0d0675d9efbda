"""The output directory of a run: checked before any work, locked, cleaned after a failure.

:func:`check_output` changes nothing: an output that is a file, a non-empty directory (an
empty subdirectory, a link or a FIFO count), one that holds a link or a special file anywhere
(the run would write or delete through it, outside the output), with ``--overwrite`` one that
holds anything but an lmshards dataset or its debris, or one that holds an input of the run
(``--overwrite`` would delete it before the run reads it), fails in one line.
:func:`prepare_output` runs only once every other check has passed: it takes the output's lock
(:mod:`transforms.writing.output`) and, with ``--overwrite``, deletes the old dataset.
A run that fails afterwards removes what it wrote (:func:`clean_failed_run`), except
``rejected/`` when too many records were rejected (the message points there).
"""

from __future__ import annotations

import os

from apache_beam.io.filesystems import FileSystems

from pipelines.options import (
    MaterializeOptions,
)
from schemas.errors import ConfigError
from schemas.manifest import FORMAT_DIRS
from schemas.names import shown_name
from transforms.writing.output import (
    LOCK_NAME,
    LockLostError,
    OutputLockedError,
    RunLock,
    acquire_lock,
    foreign_files,
    list_output,
    read_lock,
    remove_output_files,
    unexpected_entries,
)
from transforms.writing.write import TMP_DIR, join_path

__all__ = ["check_output", "clean_failed_run", "prepare_output"]


def _is_file(output: str) -> bool:
    scheme = FileSystems.get_scheme(output)
    if scheme in (None, "file"):
        local = output[len("file://"):] if output.startswith("file://") else output
        return os.path.lexists(local) and not os.path.isdir(local)
    try:
        return any(m.path == output for m in FileSystems.match([output])[0].metadata_list)
    except Exception:  # noqa: BLE001 - nothing there
        return False


def _strip_file(path: str) -> str:
    return path[len("file://"):] if path.startswith("file://") else path


def _inside(path: str, output: str) -> bool:
    """Whether ``path`` is ``output`` or under it (locally with links resolved: an input linked
    from elsewhere to a file of the output is in the output)."""
    local = FileSystems.get_scheme(path) in (None, "file") and FileSystems.get_scheme(output) in (None, "file")
    if local:
        path, output = os.path.realpath(_strip_file(path)), os.path.realpath(_strip_file(output))
        return path == output or path.startswith(output.rstrip(os.sep) + os.sep)
    return path.rstrip("/").startswith(output.rstrip("/") + "/")


def _top_level(output: str) -> list[str]:
    """Names in a local output directory ([] for a remote or missing one)."""
    if FileSystems.get_scheme(output) not in (None, "file"):
        return []
    try:
        return sorted(os.listdir(output[len("file://"):] if output.startswith("file://") else output))
    except OSError:
        return []


def check_output(options: MaterializeOptions, own: RunLock | None = None, inputs: list[str] = ()) -> list[str]:
    """Check, changing nothing, that the run may write to ``--output``; return the files there.

    ``own``: the lock this run holds (not another run's). ``inputs``: the run's input files.

    Raises:
        ConfigError: the output is a file; it holds a link or a special file; it is not empty
            (without ``--overwrite``); with ``--overwrite``, it holds a file that is not part of
            an lmshards dataset; an input is inside it.
        OutputLockedError: a live run holds its lock.
    """
    output = options.output
    if _is_file(output):
        raise ConfigError(f"--output {shown_name(output)}: is a file, not a directory")
    for path in inputs:
        if _inside(path, output):
            raise ConfigError(f"--input {shown_name(path)}: is inside --output {shown_name(output)}, which the run "
                              "replaces; move the input out of the output, or choose another --output")
    existing = list_output(output)
    held = read_lock(output) if LOCK_NAME in existing else None
    if held is not None and (own is None or held.run_id != own.run_id) and not held.stale():
        raise OutputLockedError(f"--output {output}: another run is writing there ({held.describe()}; {LOCK_NAME}); "
                                f"wait for it, or delete {LOCK_NAME} if no such run exists")
    odd = [(relative, kind) for relative, kind in unexpected_entries(output) if kind != "directory"]
    if odd:
        relative, kind = odd[0]
        more = f" and {len(odd) - 1} more" if len(odd) > 1 else ""
        raise ConfigError(f"--output {shown_name(output)}: {shown_name(relative)} is a {shown_name(kind)}{more}; "
                          "lmshards never writes or deletes through one inside its output: move it away or choose "
                          "another --output")
    others = [r for r in existing if own is None or r != LOCK_NAME]
    if (others or [n for n in _top_level(output) if own is None or n != LOCK_NAME]) and not options.overwrite:
        raise ConfigError(f"--output {shown_name(output)}: directory is not empty (pass --overwrite to replace it)")
    foreign = foreign_files(existing) + [f"{r}/" for r, _ in unexpected_entries(output)]
    if foreign:
        more = f" and {len(foreign) - 1} more" if len(foreign) > 1 else ""
        raise ConfigError(f"--output {shown_name(output)}: --overwrite replaces only an lmshards dataset or its "
                          f"debris, and {shown_name(foreign[0])}{more} is not part of one; move it away or choose "
                          "another --output")
    return existing


def prepare_output(options: MaterializeOptions, splits: list[str], lock: RunLock | None = None,
                   inputs: list[str] = ()) -> RunLock:
    """Check the output (:func:`check_output`), take its lock, delete the old dataset (with
    ``--overwrite``) and create the directory layout; return the lock.

    Raises:
        ConfigError: as :func:`check_output`, or an output that cannot be written.
        OutputLockedError: another run holds (or just took) the lock.
    """
    output = options.output
    check_output(options, inputs=inputs)
    try:
        lock = acquire_lock(output, lock)
    except OSError as exc:
        raise ConfigError(f"--output {output}: cannot write there ({exc.strerror or exc})") from exc
    try:
        existing = [r for r in check_output(options, lock, inputs) if r != LOCK_NAME]  # again: none can start now
        remove_output_files(output, existing)
        dirs = [output, join_path(output, TMP_DIR), join_path(output, "rejected")]
        dirs += [join_path(output, f"{split}/{FORMAT_DIRS[fmt]}") for split in splits for fmt in options.formats]
        for path in dirs:
            if not FileSystems.exists(path):
                FileSystems.mkdirs(path)
    except OSError as exc:
        lock.release()
        raise ConfigError(f"--output {output}: cannot write there ({exc.strerror or exc})") from exc
    except BaseException:
        lock.release()
        raise
    return lock


def clean_failed_run(output: str, lock: RunLock, keep_rejected: bool) -> None:
    """Remove what a failed run wrote (``rejected/`` too unless ``keep_rejected``), then its lock."""
    try:
        lock.check()
    except LockLostError:
        return  # the output is another run's now
    except Exception:  # noqa: BLE001 - the output cannot be read: nothing to clean
        return
    try:
        files = [r for r in list_output(output) if not (keep_rejected and r.startswith("rejected/"))]
        remove_output_files(output, files)
    except Exception:  # noqa: BLE001 - leave the rest for --overwrite
        pass
    lock.release()
    if FileSystems.get_scheme(output) in (None, "file"):
        try:
            os.rmdir(output[len("file://"):] if output.startswith("file://") else output)  # only if empty
        except OSError:
            pass
