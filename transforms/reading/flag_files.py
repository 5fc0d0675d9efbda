"""Reading a file that a command-line flag names (``--tokenizer``, ``--config``): what ``--input`` gets.

A flag's file is read whole, so it is held to what every input is held to
(:mod:`transforms.reading.inputs`): it must be a regular file (a FIFO would block the read for as long
as nothing writes to it; ``/dev/zero`` or ``/dev/urandom`` would never end), and it is read up
to a bound (:data:`MAX_TOKENIZER_BYTES`, :data:`MAX_CONFIG_BYTES`): a larger file, or a
compressed one that decompresses to more, is refused in one line instead of filling memory.
The local file is opened without blocking and checked again on its descriptor, so a file
swapped for a FIFO between the check and the open is refused too. Remote paths (``gs://``,
...) are objects, read through Beam's ``FileSystems`` with the same bound.

Every failure is a :class:`schemas.errors.ConfigError` whose message is one line naming the flag and the path.
"""

from __future__ import annotations

import os
import stat

from schemas.errors import ConfigError
from schemas.names import shown_name

__all__ = ["MAX_CONFIG_BYTES", "MAX_TOKENIZER_BYTES", "read_flag_file"]

#: The largest tokenizer.json read (the largest published ones are tens of MB).
MAX_TOKENIZER_BYTES = 1 << 30
#: The largest --config file read (objective parameters: a few kB).
MAX_CONFIG_BYTES = 16 << 20
#: Names that Beam's ``FileSystems.open`` decompresses (CompressionTypes.AUTO).
_COMPRESSED = (".gz", ".bz2", ".zst", ".zstd", ".deflate", ".lzma", ".xz")


def _kind(mode: int) -> str:
    if stat.S_ISDIR(mode):
        return "a directory"
    if stat.S_ISFIFO(mode):
        return "a FIFO"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "a device"
    if stat.S_ISSOCK(mode):
        return "a socket"
    return "not a regular file"


def _too_big(flag: str, path: str, limit: int) -> ConfigError:
    return ConfigError(f"{flag} {shown_name(path)}: more than {limit:,} bytes, larger than such a file can be")


def _read_local(flag: str, path: str, limit: int) -> bytes:
    info = _check_local_regular(flag, path)
    if info.st_size > limit:
        raise _too_big(flag, path, limit)
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_NOCTTY", 0))
    except OSError as exc:
        raise ConfigError(f"{flag} {shown_name(path)}: cannot read ({exc.strerror or exc})") from None
    with os.fdopen(fd, "rb") as handle:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):  # replaced since the check
            raise ConfigError(f"{flag} {shown_name(path)}: {_kind(mode)}, not a regular file")
        try:
            data = handle.read(limit + 1)
        except OSError as exc:
            raise ConfigError(f"{flag} {shown_name(path)}: cannot read ({exc.strerror or exc})") from None
    if len(data) > limit:
        raise _too_big(flag, path, limit)
    return data


def read_flag_file(flag: str, path: str, limit: int) -> bytes:
    """The bytes of the file ``path`` that ``flag`` names, at most ``limit`` of them (a ``.gz``
    or other compressed name is decompressed, as Beam's ``FileSystems.open`` does, within the
    same bound).

    Raises:
        ConfigError: not a regular file, missing or unreadable, or more than ``limit`` bytes.
    """
    from apache_beam.io.filesystems import FileSystems

    local = FileSystems.get_scheme(path) in (None, "file")
    if local:
        local_path = path[len("file://"):] if path.startswith("file://") else path
        if not local_path.endswith(_COMPRESSED):
            return _read_local(flag, local_path, limit)
        _check_local_regular(flag, local_path)  # then decompressed by Beam, within the bound
    try:
        with FileSystems.open(path) as handle:
            data = handle.read(limit + 1)
    except Exception as exc:  # noqa: BLE001 - Beam raises its own IO errors
        raise ConfigError(f"{flag} {shown_name(path)}: cannot read ({_first_line(exc)})") from None
    if len(data) > limit:
        raise _too_big(flag, path, limit)
    return data


def _check_local_regular(flag: str, path: str) -> os.stat_result:
    """The stat of ``path``, a regular file (else a one-line ConfigError)."""
    try:
        info = os.stat(path)
    except OSError as exc:
        raise ConfigError(f"{flag} {shown_name(path)}: cannot read ({exc.strerror or exc})") from None
    if not stat.S_ISREG(info.st_mode):
        raise ConfigError(f"{flag} {shown_name(path)}: {_kind(info.st_mode)}, not a regular file")
    return info


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return shown_name(text.splitlines()[0]) if text else type(exc).__name__
