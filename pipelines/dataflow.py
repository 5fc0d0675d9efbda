"""Ship the installed lmshards to Dataflow workers, wherever ``lmshards materialize`` runs.

Dataflow workers start from Beam's SDK container, which has Apache Beam but not lmshards.
Beam's own ways to ship code (``--setup_file ./setup.py``, ``--extra_package``,
``--requirements_file``, a custom ``--sdk_container_image``) all need the user to point at
something; after ``pip install 'lmshards[gcp]'`` there is no setup.py to point at. So when
the runner is Dataflow and the user passed none of those flags, :func:`stage_installed_package`
builds a wheel of the lmshards this process runs (the modules as imported here: an installed
wheel, or an editable checkout with its edits) and adds it as ``--extra_package``. Beam's
container installs an extra package with ``pip install --force-reinstall --no-deps`` and then
resolves its dependencies, which the wheel pins to the versions installed here (Beam, pyarrow,
tokenizers, numpy, zstandard, PyYAML): the workers encode, pack and noise with the same
libraries as a local run, so they write the same bytes. The wheel's version carries a digest of
the modules (``0.1.0+src1a2b3c4d5e6f``), so a worker log names exactly what it runs.
"""

from __future__ import annotations

import atexit
import base64
import hashlib
import importlib
import importlib.metadata
import os
import re
import shutil
import tempfile
import zipfile

__all__ = ["PACKAGES", "STAGING_FLAGS", "build_wheel", "pinned_requirements", "ships_itself",
           "stage_installed_package"]

#: The top-level packages of lmshards (setup.py's ``packages``).
PACKAGES = ("pipelines", "transforms", "schemas", "loaders")
#: Flags with which the user ships code to the workers in a way of their own.
STAGING_FLAGS = ("--setup_file", "--extra_package", "--extra_packages", "--requirements_file",
                 "--sdk_container_image", "--worker_harness_container_image")
#: What every install needs (setup.py's ``install_requires``), pinned to the installed versions.
CORE_REQUIREMENTS = ("apache-beam", "pyarrow", "tokenizers", "numpy", "zstandard", "pyyaml")
_ZIP_TIME = (1980, 1, 1, 0, 0, 0)


def _runner(beam_args: list[str]) -> str:
    runner = ""
    for index, arg in enumerate(beam_args):
        if arg == "--runner" and index + 1 < len(beam_args):
            runner = beam_args[index + 1]
        elif arg.startswith("--runner="):
            runner = arg.split("=", 1)[1]
    return runner.rsplit(".", 1)[-1]


def ships_itself(beam_args: list[str]) -> bool:
    """Whether lmshards must ship itself: Dataflow, and none of :data:`STAGING_FLAGS` given."""
    if _runner(beam_args) not in ("DataflowRunner", "TestDataflowRunner"):
        return False
    return not any(arg == flag or arg.startswith(flag + "=") for arg in beam_args for flag in STAGING_FLAGS)


def pinned_requirements() -> list[str]:
    """``name==version`` of every core requirement, as installed here."""
    pins = []
    for name in CORE_REQUIREMENTS:
        try:
            pins.append(f"{name}=={importlib.metadata.version(name)}")
        except importlib.metadata.PackageNotFoundError:
            pins.append(name)
    return pins


def _package_files() -> list[tuple[str, str]]:
    """``(path inside the wheel, path on disk)`` of every module of :data:`PACKAGES`, sorted."""
    files = []
    for package in PACKAGES:
        root = os.path.dirname(importlib.import_module(package).__file__)
        for directory, dirnames, names in os.walk(root):
            dirnames[:] = sorted(d for d in dirnames if d != "__pycache__")
            for name in sorted(names):
                if name.endswith(".py"):
                    path = os.path.join(directory, name)
                    files.append((f"{package}/{os.path.relpath(path, root).replace(os.sep, '/')}", path))
    return sorted(files)


def _record_hash(data: bytes) -> str:
    return "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


def build_wheel(directory: str) -> str:
    """Write a wheel of the lmshards modules imported here into ``directory``; return its path.

    Pure Python, ``py3-none-any``; its metadata pins :func:`pinned_requirements`, and its
    version is the installed version plus a local label with a digest of the modules.
    """
    try:
        base_version = importlib.metadata.version("lmshards")
    except importlib.metadata.PackageNotFoundError:
        from pipelines import __version__ as base_version
    base_version = base_version.split("+", 1)[0]
    files = [(inside, open(path, "rb").read()) for inside, path in _package_files()]
    digest = hashlib.sha256()
    for inside, data in files:
        digest.update(inside.encode() + b"\0" + hashlib.sha256(data).digest())
    version = f"{base_version}+src{digest.hexdigest()[:12]}"
    dist_info = f"lmshards-{version}.dist-info"
    metadata = "".join([
        "Metadata-Version: 2.1\n", "Name: lmshards\n", f"Version: {version}\n",
        "Summary: Turn raw text corpora into sharded pretraining examples with Apache Beam\n",
        "Requires-Python: >=3.10\n", *(f"Requires-Dist: {pin}\n" for pin in pinned_requirements()),
    ])
    files += [
        (f"{dist_info}/METADATA", metadata.encode()),
        (f"{dist_info}/WHEEL", b"Wheel-Version: 1.0\nGenerator: lmshards\nRoot-Is-Purelib: true\nTag: py3-none-any\n"),
        (f"{dist_info}/entry_points.txt", b"[console_scripts]\nlmshards = pipelines.cli:main\n"),
        (f"{dist_info}/top_level.txt", "".join(f"{p}\n" for p in PACKAGES).encode()),
    ]
    record = "".join(f"{inside},{_record_hash(data)},{len(data)}\n" for inside, data in files)
    record += f"{dist_info}/RECORD,,\n"
    files.append((f"{dist_info}/RECORD", record.encode()))
    path = os.path.join(directory, f"lmshards-{re.sub('[^A-Za-z0-9.+]', '_', version)}-py3-none-any.whl")
    with zipfile.ZipFile(path, "w", compression=zipfile.ZIP_DEFLATED) as wheel:
        for inside, data in files:
            info = zipfile.ZipInfo(inside, date_time=_ZIP_TIME)
            info.external_attr = 0o644 << 16
            info.compress_type = zipfile.ZIP_DEFLATED
            wheel.writestr(info, data)
    return path


def stage_installed_package(beam_args: list[str]) -> list[str]:
    """``beam_args``, plus ``--extra_package`` with a wheel of this lmshards when the job must
    ship itself (:func:`ships_itself`); the wheel lives in a temporary directory removed at exit."""
    if not ships_itself(beam_args):
        return list(beam_args)
    directory = tempfile.mkdtemp(prefix="lmshards-wheel-")
    atexit.register(shutil.rmtree, directory, True)
    return [*beam_args, f"--extra_package={build_wheel(directory)}"]
