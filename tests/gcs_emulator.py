"""A real local GCS server (gcp-storage-emulator) for gs:// tests.

Beam's GCS filesystem talks to it through ``STORAGE_EMULATOR_HOST``. Beam first looks
for Google credentials, with four retries over about 20 s when there are none; an
emulator needs none, so :func:`start_emulator` records "no credentials" in Beam's
credential cache for this process (anonymous access, as Beam would end up using).
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
import urllib.request


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class Emulator:
    def __init__(self, bucket: str):
        self.bucket = bucket
        self.port = _free_port()
        self.host = f"http://127.0.0.1:{self.port}"
        self.process = subprocess.Popen(
            [sys.executable, "-m", "gcp_storage_emulator", "start", "--host", "127.0.0.1", "--port", str(self.port),
             "--in-memory", "--default-bucket", bucket],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + 30
        while True:
            try:
                urllib.request.urlopen(f"{self.host}/storage/v1/b", timeout=1).read()
                break
            except OSError:
                if time.monotonic() > deadline or self.process.poll() is not None:
                    self.stop()
                    raise RuntimeError("gcp-storage-emulator did not start") from None
                time.sleep(0.2)

    def stop(self) -> None:
        self.process.terminate()
        try:
            self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.process.kill()


def start_emulator(bucket: str = "lmshards-test") -> Emulator:
    """Start a server, point ``STORAGE_EMULATOR_HOST`` at it, skip the credential lookup."""
    emulator = Emulator(bucket)
    os.environ["STORAGE_EMULATOR_HOST"] = emulator.host
    from apache_beam.internal.gcp import auth

    auth._Credentials._credentials_init = True
    auth._Credentials._credentials = None
    return emulator


def upload(local_path: str, url: str) -> None:
    from apache_beam.io.filesystems import FileSystems

    with open(local_path, "rb") as source, FileSystems.create(url) as target:
        target.write(source.read())


def download_tree(url: str) -> dict[str, bytes]:
    """Every object under ``url`` as relative path -> bytes."""
    from apache_beam.io.filesystems import FileSystems

    prefix = url.rstrip("/") + "/"
    out = {}
    for meta in FileSystems.match([prefix + "**"])[0].metadata_list:
        with FileSystems.open(meta.path) as handle:
            out[meta.path[len(prefix):]] = handle.read()
    return out
