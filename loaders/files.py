"""Where a dataset's files are and whether they are intact.

A dataset is a local directory or a URL (``gs://``, ``s3://``, any scheme ``fsspec``
knows). Remote shards are downloaded once into a local cache (``cache_dir``, by default
``~/.cache/lmshards``), hashed while they stream in and renamed into place only when the
sha256 matches the manifest; shards are then memory-mapped from the cache like local
ones. ``fsspec`` is imported only for remote datasets.

Checksums (``verify``): ``once`` hashes a shard the first time this process opens it
(and remembers it while the file's size and mtime stay the same), ``always`` hashes it at
every open (every epoch), ``never`` only compares sizes. A mismatch raises
:class:`~loaders.errors.ShardIntegrityError` naming the shard.
"""

from __future__ import annotations

import hashlib
import os
from urllib.parse import urlparse

from loaders.errors import ShardIntegrityError
from schemas.manifest import MANIFEST_NAME, Manifest

__all__ = ["VERIFY_MODES", "DatasetLocation", "sha256_file", "verify_file"]

VERIFY_MODES = ("once", "always", "never")
_CHUNK = 1 << 22
# (real path, size, mtime_ns) -> sha256 of files already verified by this process
_VERIFIED: dict[tuple[str, int, int], str] = {}


def sha256_file(path: str) -> str:
    """Hex sha256 of a local file."""
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while chunk := handle.read(_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def verify_file(path: str, *, name: str, sha256: str, size: int, mode: str) -> None:
    """Check a local shard against the manifest.

    Raises:
        ShardIntegrityError: wrong size or sha256 (names ``name``).
        FileNotFoundError: the shard is missing.
    """
    if mode not in VERIFY_MODES:
        raise ValueError(f"verify={mode!r}: expected one of {VERIFY_MODES}")
    try:
        stat = os.stat(path)
    except FileNotFoundError:
        raise FileNotFoundError(f"shard {name} listed in the manifest is missing ({path})") from None
    if stat.st_size != size:
        raise ShardIntegrityError(f"shard {name}: {stat.st_size} bytes on disk, the manifest says {size}")
    if mode == "never":
        return
    key = (os.path.realpath(path), stat.st_size, stat.st_mtime_ns)
    if mode == "once" and _VERIFIED.get(key) == sha256:
        return
    actual = sha256_file(path)
    if actual != sha256:
        raise ShardIntegrityError(f"shard {name}: sha256 {actual} does not match the manifest's {sha256}")
    _VERIFIED[key] = actual


class DatasetLocation:
    """A dataset directory, local or remote.

    Args:
        path: local directory, ``file://`` URL or remote URL.
        cache_dir: local cache for remote shards.
    """

    def __init__(self, path: str, cache_dir: str | None = None):
        self.path = str(path)
        scheme = urlparse(self.path).scheme
        self.remote = len(scheme) > 1 and scheme != "file"  # one letter: a Windows drive
        self.root = self.path[len("file://") :] if scheme == "file" else self.path.rstrip("/")
        if self.remote:
            base = cache_dir or os.path.join(os.path.expanduser("~"), ".cache", "lmshards")
            tag = hashlib.blake2b(self.root.encode("utf-8"), digest_size=8).hexdigest()
            self.cache_root = os.path.join(base, tag)

    def _fs(self):
        import fsspec

        return fsspec.core.url_to_fs(self.root)

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
            text = fs.cat_file(target).decode("utf-8")
        else:
            target = os.path.join(self.root, MANIFEST_NAME)
            if not os.path.isfile(target):
                raise missing
            with open(target, encoding="utf-8") as handle:
                text = handle.read()
        try:
            return Manifest.loads(text)
        except (ValueError, KeyError) as exc:
            raise ValueError(f"{self.path}/{MANIFEST_NAME}: {exc}") from exc

    def local_file(self, relative: str, *, sha256: str | None = None) -> str:
        """Local path of a dataset file; remote files are fetched into the cache first."""
        if not self.remote:
            return os.path.join(self.root, relative)
        local = os.path.join(self.cache_root, relative)
        if os.path.exists(local):
            return local
        os.makedirs(os.path.dirname(local), exist_ok=True)
        partial = f"{local}.partial-{os.getpid()}"
        digest = hashlib.sha256()
        fs, root = self._fs()
        with fs.open(f"{root}/{relative}", "rb") as source, open(partial, "wb") as sink:
            while chunk := source.read(_CHUNK):
                digest.update(chunk)
                sink.write(chunk)
        if sha256 is not None and digest.hexdigest() != sha256:
            os.remove(partial)
            raise ShardIntegrityError(
                f"shard {relative} downloaded from {self.root}: sha256 {digest.hexdigest()} does not match the "
                f"manifest's {sha256}"
            )
        os.replace(partial, local)  # atomic: concurrent workers downloading the same shard all end the same
        stat = os.stat(local)
        _VERIFIED[(os.path.realpath(local), stat.st_size, stat.st_mtime_ns)] = digest.hexdigest()
        return local
