"""The output directory of a run: checked before any work, locked, cleaned after a failure.

:func:`check_output` changes nothing: an output that is a file, a non-empty directory, or with
``--overwrite`` one that holds anything but an lmshards dataset or its debris, fails in one
line. :func:`prepare_output` runs only once every other check has passed: it takes the
output's lock (:mod:`transforms.output`) and, with ``--overwrite``, deletes the old dataset.
A run that fails afterwards removes what it wrote (:func:`clean_failed_run`), except
``rejected/`` when too many records were rejected (the message points there).
"""

from __future__ import annotations

import os

from apache_beam.io.filesystems import FileSystems

from pipelines.options import (
    MaterializeOptions,
)
from schemas.manifest import FORMAT_DIRS
from transforms.output import (
    LOCK_NAME,
    LockLostError,
    OutputLockedError,
    RunLock,
    acquire_lock,
    foreign_files,
    list_output,
    read_lock,
    remove_output_files,
)
from transforms.write import TMP_DIR, join_path

__all__ = ["check_output", "clean_failed_run", "prepare_output"]


def _output_is_empty(output: str) -> bool:
    return not list_output(output)


def _is_file(output: str) -> bool:
    scheme = FileSystems.get_scheme(output)
    if scheme in (None, "file"):
        local = output[len("file://"):] if output.startswith("file://") else output
        return os.path.lexists(local) and not os.path.isdir(local)
    try:
        return any(m.path == output for m in FileSystems.match([output])[0].metadata_list)
    except Exception:  # noqa: BLE001 - nothing there
        return False


def check_output(options: MaterializeOptions, own: RunLock | None = None) -> list[str]:
    """Check, changing nothing, that the run may write to ``--output``; return the files there.

    ``own``: the lock this run holds (not another run's).

    Raises:
        ValueError: the output is a file; it is not empty (without ``--overwrite``); with
            ``--overwrite``, it holds a file that is not part of an lmshards dataset.
        OutputLockedError: a live run holds its lock.
    """
    output = options.output
    if _is_file(output):
        raise ValueError(f"--output {output}: is a file, not a directory")
    existing = list_output(output)
    held = read_lock(output) if LOCK_NAME in existing else None
    if held is not None and (own is None or held.run_id != own.run_id) and not held.stale():
        raise OutputLockedError(f"--output {output}: another run is writing there ({held.describe()}; {LOCK_NAME}); "
                                f"wait for it, or delete {LOCK_NAME} if no such run exists")
    if [r for r in existing if own is None or r != LOCK_NAME] and not options.overwrite:
        raise ValueError(f"--output {output}: directory is not empty (pass --overwrite to replace it)")
    foreign = foreign_files(existing)
    if foreign:
        more = f" and {len(foreign) - 1} more" if len(foreign) > 1 else ""
        raise ValueError(f"--output {output}: --overwrite replaces only an lmshards dataset or its debris, and "
                         f"{foreign[0]}{more} is not part of one; move it away or choose another --output")
    return existing


def prepare_output(options: MaterializeOptions, splits: list[str], lock: RunLock | None = None) -> RunLock:
    """Check the output (:func:`check_output`), take its lock, delete the old dataset (with
    ``--overwrite``) and create the directory layout; return the lock.

    Raises:
        ValueError: as :func:`check_output`, or an output that cannot be written.
        OutputLockedError: another run holds (or just took) the lock.
    """
    output = options.output
    check_output(options)
    try:
        lock = acquire_lock(output, lock)
    except OSError as exc:
        raise ValueError(f"--output {output}: cannot write there ({exc.strerror or exc})") from exc
    try:
        existing = [r for r in check_output(options, lock) if r != LOCK_NAME]  # again: no other run can start now
        remove_output_files(output, existing)
        dirs = [output, join_path(output, TMP_DIR), join_path(output, "rejected")]
        dirs += [join_path(output, f"{split}/{FORMAT_DIRS[fmt]}") for split in splits for fmt in options.formats]
        for path in dirs:
            if not FileSystems.exists(path):
                FileSystems.mkdirs(path)
    except OSError as exc:
        lock.release()
        raise ValueError(f"--output {output}: cannot write there ({exc.strerror or exc})") from exc
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
