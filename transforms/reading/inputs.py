"""The input files of a run: what the globs match, what they skip, and that nothing changes.

:func:`list_inputs` expands ``--input`` globs before the pipeline starts. Local globs are
expanded with Python's :mod:`glob` (a backslash in a name is a plain character, as on
POSIX), and every match is looked at: a regular file is an input; a directory, a broken
symbolic link, a symbolic-link loop or a special file (a FIFO would block the reader) is
*skipped*, and listed as such in the manifest and the summary, never dropped silently.
Remote globs (``gs://``, ...) go through Beam's ``FileSystems.match``; an object whose name
ends in ``/`` (a folder placeholder) is skipped the same way. A file name that is not valid
UTF-8 is a configuration error: it could not be written to the manifest or reported.

Each input's size and modification time are recorded; the reader checks them again before
and after reading the file (:func:`check_unchanged`), so a file truncated, appended to or
replaced while the run reads it fails the job (:class:`InputChangedError`) instead of
silently losing records: a run's inputs must not change under it.
"""

from __future__ import annotations

import errno
import glob
import os
import stat
from dataclasses import dataclass

from apache_beam.io.filesystems import FileSystems

from schemas.errors import ConfigError, JobFailedError

__all__ = ["InputChangedError", "InputFile", "InputListing", "SkippedInput", "check_all_unchanged",
           "check_unchanged", "list_inputs", "stat_input"]


class InputChangedError(JobFailedError):
    """An input file changed (or vanished) while the run read it. The message is one line naming it."""


@dataclass(frozen=True)
class InputFile:
    """One input file as listed before the run: path, bytes and modification time."""

    path: str
    size: int
    mtime: float


@dataclass(frozen=True)
class SkippedInput:
    """A glob match that is not a readable file, and why (``directory``, ``broken link``, ...)."""

    path: str
    reason: str

    def to_json(self) -> dict[str, str]:
        return {"path": self.path, "reason": self.reason}


@dataclass(frozen=True)
class InputListing:
    """Input files (sorted, without duplicates) and skipped matches of a run's globs."""

    files: list[InputFile]
    skipped: list[SkippedInput]


def _is_local(pattern: str) -> bool:
    scheme = pattern.split("://", 1)[0] if "://" in pattern else ""
    return scheme in ("", "file")


def _local_path(pattern: str) -> str:
    return pattern[len("file://") :] if pattern.startswith("file://") else pattern


def _classify_local(path: str) -> tuple[InputFile | None, str | None]:
    """``(input file, None)`` or ``(None, why it is skipped)``."""
    try:
        info = os.stat(path)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            return None, "symbolic link loop"
        if os.path.islink(path):
            return None, "broken symbolic link"
        return None, f"cannot be read ({exc.strerror or exc})"
    if stat.S_ISDIR(info.st_mode):
        return None, "directory"
    if not stat.S_ISREG(info.st_mode):
        return None, "not a regular file"
    return InputFile(path, info.st_size, info.st_mtime_ns / 1e9), None


def _check_name(pattern: str, path: str) -> None:
    try:
        path.encode("utf-8")
    except UnicodeEncodeError:
        shown = path.encode("utf-8", "surrogateescape").decode("utf-8", "replace")
        raise ConfigError(f"--input {pattern}: the file name {shown!r} is not valid UTF-8; rename it") from None


def _match(pattern: str) -> tuple[list[InputFile], list[SkippedInput]]:
    files: list[InputFile] = []
    skipped: list[SkippedInput] = []
    if _is_local(pattern):
        local = _local_path(pattern)
        has_magic = glob.has_magic(local)
        names = glob.glob(local, recursive=True) if has_magic else [local]
        for path in names:
            if not has_magic and not os.path.lexists(path):
                continue
            _check_name(pattern, path)
            found, reason = _classify_local(path)
            if found is not None:
                files.append(found)
            else:
                skipped.append(SkippedInput(path, reason or "skipped"))
        return files, skipped
    try:
        results = FileSystems.match([pattern])[0].metadata_list
    except Exception as exc:  # Beam raises BeamIOError for unreadable patterns
        raise ConfigError(f"--input {pattern}: cannot list files ({exc})") from exc
    for meta in results:
        _check_name(pattern, meta.path)
        if meta.path.endswith("/"):
            skipped.append(SkippedInput(meta.path, "directory"))
        else:
            files.append(InputFile(meta.path, int(meta.size_in_bytes), float(meta.last_updated_in_seconds or 0.0)))
    return files, skipped


def list_inputs(patterns: list[str], check_type=None) -> InputListing:
    """Expand input globs (see the module docstring).

    Args:
        check_type: called with each file's path; raises ``ConfigError`` for an unknown file type.

    Raises:
        ConfigError: no pattern, a pattern that matches no file (skipped matches are named), a
            file name that is not valid UTF-8, or (from ``check_type``) an unknown file type.
    """
    if not patterns:
        raise ConfigError("--input: at least one input glob is required")
    files: dict[str, InputFile] = {}
    skipped: dict[str, SkippedInput] = {}
    for pattern in patterns:
        matched, passed_over = _match(pattern)
        if not matched:
            why = "; ".join(f"{s.path} ({s.reason})" for s in passed_over[:3])
            raise ConfigError(f"--input {pattern}: matches no file" + (f" (skipped: {why})" if why else ""))
        for found in matched:
            if check_type is not None:
                check_type(found.path)
            files[found.path] = found
        for item in passed_over:
            skipped[item.path] = item
    return InputListing(sorted(files.values(), key=lambda f: f.path),
                        sorted((s for p, s in skipped.items() if p not in files), key=lambda s: s.path))


def stat_input(path: str) -> tuple[int, float] | None:
    """``(bytes, modification time)`` of an input now, as :func:`list_inputs` records them; None if gone."""
    if _is_local(path):
        try:
            info = os.stat(_local_path(path))
        except OSError:
            return None
        return info.st_size, info.st_mtime_ns / 1e9
    try:
        results = FileSystems.match([path])[0].metadata_list
    except Exception:  # noqa: BLE001 - a vanished object
        return None
    for meta in results:
        if meta.path == path:
            return int(meta.size_in_bytes), float(meta.last_updated_in_seconds or 0.0)
    return None


def check_unchanged(expected: InputFile, when: str) -> None:
    """Raise :class:`InputChangedError` if ``expected`` no longer has its size and modification time."""
    now = stat_input(expected.path)
    if now is None:
        raise InputChangedError(f"--input {expected.path}: the file vanished {when}; "
                                "a run's inputs must not change under it")
    size, mtime = now
    if size != expected.size or mtime != expected.mtime:
        change = f"{expected.size:,} -> {size:,} bytes" if size != expected.size else "modified (new mtime)"
        raise InputChangedError(f"--input {expected.path}: the file changed {when} ({change}); "
                                "a run's inputs must not change under it")


def check_all_unchanged(files: list[InputFile], when: str) -> None:
    """:func:`check_unchanged` for every file (remote ones a few at a time in parallel)."""
    from concurrent.futures import ThreadPoolExecutor

    if all(_is_local(f.path) for f in files):
        for item in files:
            check_unchanged(item, when)
        return
    with ThreadPoolExecutor(max_workers=16, thread_name_prefix="lmshards-stat") as pool:
        for future in [pool.submit(check_unchanged, item, when) for item in files]:
            future.result()
