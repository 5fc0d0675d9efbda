"""Where a dataset's files are and whether they are intact.

A dataset is a local directory or a URL (``gs://``, ``s3://``, any scheme ``fsspec``
knows; ``gs://`` needs ``gcsfs``, the ``[remote]`` extra). Remote shards are downloaded
into a local cache (``cache_dir``, by default ``~/.cache/lmshards``), hashed while they
stream in and renamed into place only when the sha256 matches the manifest; shards are
then memory-mapped from the cache like local ones. The cache is bounded
(``cache_size_bytes``, 20 GiB by default, least recently used files that no process is
using are evicted) and the loader downloads the next shards of its order in the
background: see :mod:`loaders.access.cache`. ``fsspec`` is imported only for remote datasets.

With ``STORAGE_EMULATOR_HOST`` set (a local GCS emulator), ``gs://`` URLs go to that
server with anonymous credentials, as Google's own clients do; ``storage_options``
passed explicitly win. A ``gs://`` dataset with an ``endpoint_url`` (an emulator) is read
with gcsfs's plain JSON-API filesystem: its default class first asks a gRPC API for the
bucket's type, which emulators do not serve (a minute's timeout at every call).

Checksums (``verify``): ``once`` hashes a shard the first time this process opens it
(and remembers it while the file's size and mtime stay the same), ``always`` hashes it at
every open (every epoch), ``never`` only compares sizes and trusts the bytes (a flipped
byte then reads as different data). A mismatch raises
:class:`~loaders.errors.ShardIntegrityError` naming the shard.

A manifest is untrusted input (:func:`parse_manifest`): it must be UTF-8 JSON of the
expected shape, and every path in it must be relative and normalized (no ``..``, no
absolute path, no backslash, no scheme or drive), so that it names a file inside the
dataset; in the cache of a remote dataset, the path must also resolve (symbolic links
followed) inside the cache directory. Anything else is a
:class:`~loaders.errors.ShardIntegrityError` naming the manifest, raised before any file
is opened, downloaded or deleted.

This module is the one way in for every reader (:class:`~loaders.dataset.ShardedDataset` and
so :class:`~loaders.mixture.MixtureDataset`, :func:`~loaders.access.reader.open_dataset` and the
inspection commands): :meth:`DatasetLocation.read_manifest` is the only manifest reader,
:meth:`DatasetLocation.open_shard` the only way to a shard file (fetched, size and sha256
checked) and :meth:`DatasetLocation.tokenizer_file` the only way to the tokenizer (its sha256
checked when the manifest records one). What is inside a shard is checked by the one opener
per format (:mod:`loaders.access.arrow_shard`, :mod:`loaders.access.tar_shard`).

Claims before allocations: a manifest's row counts are only believed when the file sizes it
states can hold them (:func:`schemas.manifest.min_row_bytes`, checked as it is parsed), and
its sizes only when the files have them (:meth:`DatasetLocation.check_claims`: one ``stat``
per local shard, one listing per remote directory) and, remote, when each fits the cache's
bound. A reader sizes its epoch order from the rows, and the cache makes room from the sizes,
so both are checked before either happens: a lying manifest is a
:class:`~loaders.errors.ShardIntegrityError`, not a ``MemoryError`` or a cache emptied of
another dataset's files.
"""

from __future__ import annotations

import hashlib
import os
from stat import S_ISREG
from typing import Any, BinaryIO
from urllib.parse import urlparse

from loaders.access.cache import DEFAULT_CACHE_BYTES, Lease, ShardCache
from loaders.errors import ShardIntegrityError
from schemas.errors import ConfigError
from schemas.manifest import MANIFEST_NAME, Manifest, ShardFile

__all__ = ["MAX_MANIFEST_BYTES", "VERIFY_MODES", "DatasetLocation", "check_manifest_paths", "check_relative",
           "parse_manifest", "sha256_file", "verify_file"]

VERIFY_MODES = ("once", "always", "never")
#: Largest manifest read (a manifest of a million shards is a few hundred MB).
MAX_MANIFEST_BYTES = 1 << 30
_CHUNK = 1 << 22
# (real path, size, mtime_ns) -> sha256 of files already verified by this process
_VERIFIED: dict[tuple[str, int, int], str] = {}


def check_relative(relative: Any, where: str) -> str:
    """``relative`` if it is a safe path inside a dataset (see the module docstring).

    Raises:
        ShardIntegrityError: naming ``where`` (the manifest) and the path.
    """
    if not isinstance(relative, str) or not relative or len(relative) > 4096:
        raise ShardIntegrityError(f"{where}: {relative!r} is not a file path")
    parts = relative.split("/")
    if (relative.startswith("/") or "\\" in relative or "\x00" in relative or ":" in parts[0]
            or any(part in ("", ".", "..") for part in parts)):
        raise ShardIntegrityError(f"{where}: the path {relative!r} is not a normalized relative path inside the "
                                  "dataset (absolute, '..', '.', empty parts, backslashes and schemes are refused)")
    return relative


def check_manifest_paths(manifest: Manifest, where: str) -> None:
    """Every path the manifest names (shards, tokenizer, rejected records) passes :func:`check_relative`."""
    check_relative(manifest.tokenizer.get("file", "tokenizer.json"), where)
    for info in manifest.splits.values():
        for shard in info["shards"]:
            for entry in shard["files"].values():
                check_relative(entry["path"], where)
    for entry in manifest.counts.get("rejected_files", []) or []:
        if isinstance(entry, dict) and "path" in entry:
            check_relative(entry["path"], where)


def parse_manifest(raw: bytes, where: str) -> Manifest:
    """A manifest from its bytes, checked (see the module docstring).

    Raises:
        ShardIntegrityError: not UTF-8, not an lmshards manifest of the expected shape, or an unsafe path.
    """
    if len(raw) > MAX_MANIFEST_BYTES:
        raise ShardIntegrityError(f"{where}: {len(raw):,} bytes, more than a manifest can be ({MAX_MANIFEST_BYTES:,})")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise ShardIntegrityError(f"{where}: not UTF-8 text (a damaged file, or not a manifest)") from None
    try:
        manifest = Manifest.loads(text)
    except (ValueError, KeyError, TypeError, RecursionError) as exc:
        raise ShardIntegrityError(f"{where}: {exc}") from None
    check_manifest_paths(manifest, where)
    return manifest


def sha256_file(path: str) -> str:
    """Hex sha256 of a local file."""
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while chunk := handle.read(_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def verify_file(path: str, *, name: str, sha256: str, size: int | None, mode: str, kind: str = "shard") -> None:
    """Check a local file of a dataset against the manifest (``size`` None: not recorded).

    Raises:
        ShardIntegrityError: wrong size or sha256 (names ``name``).
        FileNotFoundError: the file is missing.
    """
    if mode not in VERIFY_MODES:
        raise ValueError(f"verify={mode!r}: expected one of {VERIFY_MODES}")
    try:
        stat = os.stat(path)
    except FileNotFoundError:
        raise FileNotFoundError(f"{kind} {name} listed in the manifest is missing ({path})") from None
    if size is not None and stat.st_size != size:
        raise ShardIntegrityError(f"{kind} {name}: {stat.st_size} bytes on disk, the manifest says {size}")
    if mode == "never":
        return
    key = (os.path.realpath(path), stat.st_size, stat.st_mtime_ns)
    if mode == "once" and _VERIFIED.get(key) == sha256:
        return
    actual = sha256_file(path)
    if actual != sha256:
        raise ShardIntegrityError(f"{kind} {name}: sha256 {actual} does not match the manifest's {sha256}")
    _VERIFIED[key] = actual


class DatasetLocation:
    """A dataset directory, local or remote.

    Args:
        path: local directory, ``file://`` URL or remote URL.
        cache_dir: local cache for remote shards (default ``~/.cache/lmshards``).
        cache_size_bytes: bound of the cache directory (None: unbounded), see :mod:`loaders.access.cache`.
        storage_options: keyword arguments of the ``fsspec`` filesystem (credentials, endpoint, ...).
    """

    def __init__(self, path: str, cache_dir: str | None = None, *,
                 cache_size_bytes: int | None = DEFAULT_CACHE_BYTES, storage_options: dict[str, Any] | None = None):
        self.path = str(path)
        scheme = urlparse(self.path).scheme
        self.remote = len(scheme) > 1 and scheme != "file"  # one letter: a Windows drive
        self.root = self.path[len("file://") :] if scheme == "file" else self.path.rstrip("/")
        if cache_size_bytes is not None and (not isinstance(cache_size_bytes, int) or cache_size_bytes < 0):
            raise ValueError(f"cache_size_bytes must be an int >= 0 or None, got {cache_size_bytes!r}")
        self.storage_options = dict(storage_options or {})
        self.cache: ShardCache | None = None
        if self.remote:
            base = os.path.abspath(cache_dir or os.path.join(os.path.expanduser("~"), ".cache", "lmshards"))
            tag = hashlib.blake2b(self.root.encode("utf-8"), digest_size=8).hexdigest()
            self.cache_root = os.path.join(base, tag)
            self.cache = ShardCache(base, cache_size_bytes)

    def _options(self) -> dict[str, Any]:
        options = dict(self.storage_options)
        emulator = os.environ.get("STORAGE_EMULATOR_HOST")
        if emulator not in (None, "", "default") and urlparse(self.root).scheme in ("gs", "gcs"):
            options.setdefault("token", "anon")
            options.setdefault("endpoint_url", emulator if "://" in emulator else f"http://{emulator}")
        return options

    def _fs(self):
        options = self._options()
        if urlparse(self.root).scheme in ("gs", "gcs") and options.get("endpoint_url"):
            # Not Google's endpoint (an emulator): see the module docstring.
            from gcsfs.core import GCSFileSystem

            fs = GCSFileSystem(**options)
            return fs, fs._strip_protocol(self.root)
        import fsspec

        try:
            return fsspec.core.url_to_fs(self.root, **options)
        except (ValueError, ImportError) as exc:  # a URL scheme fsspec does not know, or its package is missing
            raise ConfigError(f"{self.path}: {exc}") from exc

    def read_manifest(self) -> Manifest:
        """The dataset's manifest.

        Raises:
            FileNotFoundError: no manifest (a missing dataset, or a run that did not finish).
            ValueError: not an lmshards manifest.
        """
        missing = FileNotFoundError(
            f"{self.path}: no {MANIFEST_NAME}; the dataset is missing or incomplete (the manifest is written last)"
        )
        if self.remote:
            fs, root = self._fs()
            target = f"{root}/{MANIFEST_NAME}"
            if not fs.exists(target):
                raise missing
            with fs.open(target, "rb") as handle:
                raw = handle.read(MAX_MANIFEST_BYTES + 1)
        else:
            target = os.path.join(self.root, MANIFEST_NAME)
            if not os.path.isfile(target):
                raise missing
            with open(target, "rb") as handle:
                raw = handle.read(MAX_MANIFEST_BYTES + 1)
        return parse_manifest(raw, f"{self.path}/{MANIFEST_NAME}")

    def check_claims(self, files: list[ShardFile]) -> None:
        """Check the sizes a manifest states for ``files`` against the files themselves, and for a
        remote dataset against the cache's bound, before anything is sized or evicted by them.

        Raises:
            ShardIntegrityError: a file whose size is not the manifest's (naming it).
            FileNotFoundError: a file the manifest lists that does not exist.
            ConfigError: a remote shard larger than the whole cache (``cache_size_bytes``).
        """
        if self.remote:
            bound = self.cache.max_bytes if self.cache is not None else None
            for file in files:
                if bound is not None and file.bytes > bound:
                    raise ConfigError(f"shard {file.path} of {self.path}: the manifest says {file.bytes:,} bytes, more "
                                      f"than the whole cache (cache_size_bytes={bound:,}); raise cache_size_bytes")
        sizes = self._sizes(files)
        for file in files:
            size = sizes.get(file.path)
            if size is None:
                raise FileNotFoundError(f"shard {file.path} listed in the manifest is missing from {self.path}")
            if size != file.bytes:
                where = f"at {self.path}" if self.remote else "on disk"
                raise ShardIntegrityError(f"shard {file.path}: {size} bytes {where}, the manifest says {file.bytes}")

    def _sizes(self, files: list[ShardFile]) -> dict[str, int]:
        """``{relative path: size}`` of the files that exist (remote: one listing per directory)."""
        sizes: dict[str, int] = {}
        if not self.remote:
            for file in files:
                try:
                    stat = os.stat(self.local_path(file.path))
                except (FileNotFoundError, NotADirectoryError):
                    continue
                if S_ISREG(stat.st_mode):
                    sizes[file.path] = stat.st_size
            return sizes
        fs, root = self._fs()
        directories: dict[str, list[str]] = {}
        for file in files:
            directory, _, name = check_relative(file.path, self.path).rpartition("/")
            directories.setdefault(directory, []).append(name)
        for directory, names in directories.items():
            try:
                listing = fs.ls(f"{root}/{directory}" if directory else root, detail=True)
            except FileNotFoundError:
                continue
            found = {entry["name"].rstrip("/").rsplit("/", 1)[-1]: entry for entry in listing
                     if entry.get("type") != "directory"}
            for name in names:
                if name in found and isinstance(found[name].get("size"), int):
                    sizes[f"{directory}/{name}" if directory else name] = found[name]["size"]
        return sizes

    # -- the cache -------------------------------------------------------------------------
    def cache_path(self, relative: str) -> str:
        """Where a remote dataset file lives in the local cache.

        Raises:
            ShardIntegrityError: an unsafe path, or one that resolves outside the cache (a symbolic link).
        """
        where = f"{self.path}/{MANIFEST_NAME}"
        path = os.path.join(self.cache_root, *check_relative(relative, where).split("/"))
        base = os.path.realpath(self.cache.root if self.cache is not None else self.cache_root)
        if not os.path.realpath(path).startswith(base + os.sep):
            raise ShardIntegrityError(f"{where}: {relative} resolves outside the cache {base} (a symbolic link in the "
                                      "cache?); refusing to write there")
        return path

    def local_path(self, relative: str) -> str:
        """Where a file of a local dataset is (the path checked, see :func:`check_relative`)."""
        return os.path.join(self.root, *check_relative(relative, f"{self.path}/{MANIFEST_NAME}").split("/"))

    def on_disk(self, relative: str) -> str:
        """Where a dataset file is read from on this machine: its path (local), or its place in
        the cache (remote; there only once fetched)."""
        return self.cache_path(relative) if self.remote else self.local_path(relative)

    def _fetcher(self, relative: str, sha256: str | None, size: int | None = None):
        """Writes the remote file to a sink, hashing it; raises if the sha256 is not the manifest's, or
        as soon as more than the manifest's ``size`` bytes come in (a download is bounded by the manifest)."""
        local = self.cache_path(relative)

        def fetch(sink: BinaryIO) -> None:
            digest = hashlib.sha256()
            fs, root = self._fs()
            received = 0
            with fs.open(f"{root}/{check_relative(relative, self.path)}", "rb") as source:
                while chunk := source.read(_CHUNK if size is None else min(_CHUNK, size + 1 - received)):
                    received += len(chunk)
                    if size is not None and received > size:
                        raise ShardIntegrityError(f"{relative} downloaded from {self.root}: more than the "
                                                  f"{size:,} bytes the manifest says")
                    digest.update(chunk)
                    sink.write(chunk)
            if sha256 is not None and digest.hexdigest() != sha256:
                raise ShardIntegrityError(
                    f"shard {relative} downloaded from {self.root}: sha256 {digest.hexdigest()} does not match the "
                    f"manifest's {sha256}"
                )
            sink.flush()
            stat = os.fstat(sink.fileno())  # the inode keeps its mtime when renamed into place
            _VERIFIED[(os.path.realpath(local), stat.st_size, stat.st_mtime_ns)] = digest.hexdigest()

        return fetch

    def open_file(self, relative: str, *, sha256: str | None = None, size: int | None = None,
                  protect: tuple[str, ...] | frozenset[str] = ()) -> Lease:
        """A dataset file held for reading: remote files are fetched into the cache first and
        not evicted until the lease is closed. ``protect``: cache paths needed soon (kept if possible)."""
        if not self.remote:
            path = self.local_path(relative)
            if not os.path.isfile(path):
                raise FileNotFoundError(f"{relative} listed in the manifest is missing from {self.path}")
            return Lease(path)
        assert self.cache is not None
        return self.cache.acquire(self.cache_path(relative), self._fetcher(relative, sha256, size), size=size,
                                  protect=protect)

    def prefetch_file(self, relative: str, *, sha256: str | None = None, size: int | None = None,
                      protect: tuple[str, ...] | frozenset[str] = ()) -> bool:
        """Fetch a remote file into the cache unless cached, within the bound; True if it is cached."""
        if not self.remote:
            return True
        assert self.cache is not None
        return self.cache.prefetch(self.cache_path(relative), self._fetcher(relative, sha256, size), size=size,
                                   protect=protect)

    def discard(self, relative: str, *, damaged: bool = False) -> None:
        """Drop a remote file from the cache (unless some process uses it and it is not ``damaged``)."""
        if self.remote:
            assert self.cache is not None
            self.cache.discard(self.cache_path(relative), damaged=damaged)

    def local_file(self, relative: str, *, sha256: str | None = None, size: int | None = None) -> str:
        """Local path of a dataset file; remote files are fetched into the cache first.

        The file is not leased: read it at once (use :meth:`open_file` to keep it).

        Raises:
            FileNotFoundError: the file is missing.
        """
        lease = self.open_file(relative, sha256=sha256, size=size)
        lease.close()
        return lease.path

    # -- the one way to a dataset's files --------------------------------------------------
    def open_shard(self, file: ShardFile, *, verify: str,
                   protect: tuple[str, ...] | frozenset[str] = ()) -> Lease:
        """A shard file held for reading: fetched (remote), then its size and sha256 checked against
        the manifest (``verify``, see the module docstring).

        A cached copy that fails verification is dropped and downloaded again (the download
        itself is checked while it streams in).

        Raises:
            ShardIntegrityError: wrong size or sha256, or an unsafe path (naming the shard).
            FileNotFoundError: the shard is missing.
        """
        return self._open_checked(file.path, sha256=file.sha256, size=file.bytes, verify=verify, protect=protect)

    def _open_checked(self, relative: str, *, sha256: str, size: int | None, verify: str, kind: str = "shard",
                      protect: tuple[str, ...] | frozenset[str] = ()) -> Lease:
        lease = self.open_file(relative, sha256=sha256, size=size, protect=protect)
        try:
            verify_file(lease.path, name=relative, sha256=sha256, size=size, mode=verify, kind=kind)
        except ShardIntegrityError:
            lease.close()
            if not self.remote:
                raise
            self.discard(relative, damaged=True)  # a damaged cached copy: fetch it again
            lease = self.open_file(relative, sha256=sha256, size=size, protect=protect)
            try:
                verify_file(lease.path, name=relative, sha256=sha256, size=size, mode=verify, kind=kind)
            except BaseException:
                lease.close()
                raise
        except BaseException:
            lease.close()
            raise
        return lease

    def check_tokenizer(self, manifest: Manifest, *, verify: str = "once") -> None:
        """Check the dataset's tokenizer as every reader does on open, when the manifest records its
        sha256 (the writer always does): the ids in the shards mean what that tokenizer says, so a
        missing, altered or replaced tokenizer.json is an error before any example is read.

        Raises:
            ShardIntegrityError: a sha256 that differs (naming the file).
            FileNotFoundError: the tokenizer is missing.
        """
        if isinstance(manifest.tokenizer.get("sha256"), str) and manifest.tokenizer["sha256"]:
            self.tokenizer_file(manifest, verify=verify)

    def tokenizer_file(self, manifest: Manifest, *, verify: str = "once") -> str:
        """Local path of the dataset's ``tokenizer.json``, checked against the manifest's sha256
        when it records one (``verify``: as for shards; ``never`` only finds the file).

        Raises:
            ShardIntegrityError: a sha256 that differs (naming the file).
            FileNotFoundError: the tokenizer is missing.
        """
        name = check_relative(manifest.tokenizer.get("file", "tokenizer.json"), f"{self.path}/{MANIFEST_NAME}")
        expected = manifest.tokenizer.get("sha256")
        if not isinstance(expected, str) or not expected:
            expected = None
        if expected is None:
            return self.local_file(name)
        lease = self._open_checked(name, sha256=expected, size=None, verify=verify, kind="tokenizer")
        lease.close()  # (read at once: a cached copy is not evicted in between by this process)
        return lease.path
