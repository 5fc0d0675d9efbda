"""Ship the installed lmshards to Dataflow workers, wherever ``lmshards materialize`` runs.

Dataflow workers start from Beam's SDK container, which has Apache Beam but not lmshards.
Beam's own ways to ship code (``--setup_file ./setup.py``, ``--extra_package``,
``--requirements_file``, a custom ``--sdk_container_image``) all need the user to point at
something; after ``pip install 'lmshards[gcp]'`` there is no setup.py to point at. So when
the runner is Dataflow and the user passed none of those flags, :func:`stage_installed_package`
builds a wheel of the lmshards this process runs and adds it as ``--extra_package``.

The wheel is built by the standard tools: the modules as imported here (an installed wheel, or
an editable checkout with its edits) are laid out in a temporary source tree whose
``pyproject.toml`` is generated from the project's own metadata, and ``build`` runs the
setuptools backend on it (PEP 517; offline with the setuptools installed here, in an isolated
environment where it is missing). That metadata is the checkout's, from its build backend (so
``setup.py`` as it is now), or, for an installed wheel, the ``.dist-info`` beside the modules.
There is no second list of dependencies: every core requirement (``install_requires``, no
extra) is pinned to the version installed here (a requirement not installed here keeps its
declared range). Beam's container installs an extra package with ``pip install
--force-reinstall --no-deps`` and then resolves its dependencies from those pins, so the
workers plan nothing differently from the launcher: the encoder the job was planned with
(fastokens, when its probe passed here) is there, and they encode, pack and noise with the
same libraries as a local run, so they write the same bytes. The wheel's version carries a
digest of the modules and the pins (``0.1.0+src1a2b3c4d5e6f``), so a worker log names exactly
what it runs.

A package the user passes with ``--extra_package`` that is not lmshards (an objective plugin's
wheel, docs/design.md section 4) ships only itself: lmshards still stages its own wheel, ahead of
the user's packages, so that a plugin's requirement on lmshards is met by the wheel staged here.
"""

from __future__ import annotations

import atexit
import contextlib
import hashlib
import importlib
import importlib.metadata
import json
import os
import pathlib
import re
import shutil
import tempfile

from schemas.errors import ConfigError

__all__ = ["PACKAGES", "STAGING_FLAGS", "StagingError", "build_wheel", "pinned_requirements", "project_metadata",
           "ships_itself", "stage_installed_package"]

#: The top-level packages of lmshards (setup.py's ``packages``).
PACKAGES = ("pipelines", "transforms", "schemas", "loaders")
#: Flags with which the user ships code to the workers in a way of their own.
STAGING_FLAGS = ("--setup_file", "--extra_package", "--extra_packages", "--requirements_file",
                 "--sdk_container_image", "--worker_harness_container_image")
#: Flags that name package files for the workers: one that is not an lmshards file ships only itself.
_PACKAGE_FLAGS = ("--extra_package", "--extra_packages")
#: What a user who cannot (or will not) let lmshards build its wheel can do instead.
_SHIP_IT_YOURSELF = "or ship lmshards yourself with --setup_file, --extra_package or --sdk_container_image"


class StagingError(ConfigError):
    """lmshards cannot build the wheel it would stage for the Dataflow workers (exit 2, before any work)."""


def _runner(beam_args: list[str]) -> str:
    runner = ""
    for index, arg in enumerate(beam_args):
        if arg == "--runner" and index + 1 < len(beam_args):
            runner = beam_args[index + 1]
        elif arg.startswith("--runner="):
            runner = arg.split("=", 1)[1]
    return runner.rsplit(".", 1)[-1]


def _flag_values(beam_args: list[str], flags: tuple[str, ...]) -> list[str]:
    """The values given to ``flags`` (``--flag value`` or ``--flag=value``)."""
    values = []
    for index, arg in enumerate(beam_args):
        name, equals, value = arg.partition("=")
        if name in flags:
            values.append(value if equals else beam_args[index + 1] if index + 1 < len(beam_args) else "")
    return values


def _is_lmshards_file(path: str) -> bool:
    """A wheel or sdist of lmshards itself, by its file name (``lmshards-0.1.0-py3-none-any.whl``),
    not of another distribution (``lmshards_fim-0.1-py3-none-any.whl``)."""
    return _canonical(os.path.basename(path).split("-", 1)[0]) == "lmshards"


def ships_itself(beam_args: list[str]) -> bool:
    """Whether lmshards must ship itself: Dataflow, and none of :data:`STAGING_FLAGS` given,
    except ``--extra_package`` files that are not lmshards (a plugin's wheel ships only itself)."""
    if _runner(beam_args) not in ("DataflowRunner", "TestDataflowRunner"):
        return False
    others = tuple(flag for flag in STAGING_FLAGS if flag not in _PACKAGE_FLAGS)
    if _flag_values(beam_args, others):
        return False
    return not any(_is_lmshards_file(path) for path in _flag_values(beam_args, _PACKAGE_FLAGS))


def _import_build():
    try:
        import build
        import pyproject_hooks
    except ImportError:
        raise StagingError("lmshards: building the wheel it stages for the Dataflow workers needs the 'build' "
                           f"package (pip install 'lmshards[gcp]'), {_SHIP_IT_YOURSELF}") from None
    return build, pyproject_hooks


@contextlib.contextmanager
def _backend(source_dir: str):
    """A ``build.ProjectBuilder`` of ``source_dir`` whose build requirements are met: those
    installed here when they suffice (offline), else a temporary isolated environment (as
    ``python -m build`` makes one)."""
    build, hooks = _import_build()
    from build.env import DefaultIsolatedEnv

    try:
        builder = build.ProjectBuilder(source_dir, runner=hooks.quiet_subprocess_runner)
        if not builder.check_dependencies("wheel"):
            yield builder
            return
        with DefaultIsolatedEnv() as env:
            builder = build.ProjectBuilder.from_isolated_env(env, source_dir, runner=hooks.quiet_subprocess_runner)
            env.install(builder.build_system_requires)
            env.install(builder.get_requires_for_build("wheel"))
            yield builder
    except (build.BuildException, build.BuildBackendException, OSError) as exc:
        raise StagingError(f"lmshards: could not build the wheel it stages for the Dataflow workers from "
                           f"{source_dir} ({_last_line(exc)}), {_SHIP_IT_YOURSELF}") from None


def _last_line(exc: BaseException) -> str:
    """The last line a failed build step printed, else the exception's own line."""
    inner = getattr(exc, "exception", None)
    output = getattr(inner, "output", None) or getattr(inner, "stderr", None)
    if isinstance(output, bytes):
        output = output.decode("utf-8", "replace")
    lines = [line.strip() for line in (output or str(exc)).splitlines() if line.strip()]
    return lines[-1] if lines else type(exc).__name__


def _modules_root() -> str:
    """The directory that holds the lmshards packages as imported here (a checkout or site-packages)."""
    roots = {os.path.dirname(os.path.dirname(os.path.abspath(importlib.import_module(p).__file__))) for p in PACKAGES}
    if len(roots) != 1:
        raise StagingError(f"lmshards: its packages are imported from different directories "
                           f"({', '.join(sorted(roots))}), so no one wheel holds what runs here; {_SHIP_IT_YOURSELF}")
    return roots.pop()


def _canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def project_metadata(work_dir: str) -> importlib.metadata.Distribution:
    """The metadata of the lmshards whose modules run here.

    In a checkout (a ``setup.py`` or ``pyproject.toml`` beside the packages) its build backend
    writes it into ``work_dir`` (PEP 517 ``prepare_metadata_for_build_wheel``: ``setup.py`` as
    it is now, not as it was when the checkout was installed); otherwise it is the installed
    ``lmshards`` distribution beside the modules.

    Raises:
        StagingError: no such metadata, or the project there is not lmshards.
    """
    root = _modules_root()
    if any(os.path.isfile(os.path.join(root, name)) for name in ("setup.py", "pyproject.toml")):
        with _backend(root) as builder:
            distribution = importlib.metadata.PathDistribution(pathlib.Path(builder.metadata_path(work_dir)))
    else:
        found = [d for d in importlib.metadata.distributions(path=[root]) if _canonical(d.name or "") == "lmshards"]
        if not found:
            raise StagingError(f"lmshards: no lmshards distribution metadata (.dist-info) beside its modules in "
                               f"{root}, so it cannot build the wheel it stages for the Dataflow workers; "
                               f"{_SHIP_IT_YOURSELF}")
        distribution = found[0]
    if _canonical(distribution.name or "") != "lmshards":
        raise StagingError(f"lmshards: the project in {root} is {distribution.name!r}, not lmshards; "
                           f"{_SHIP_IT_YOURSELF}")
    return distribution


def pinned_requirements(distribution: importlib.metadata.Distribution | None = None) -> list[str]:
    """The core requirements of ``distribution`` (default: :func:`project_metadata`), each pinned
    ``name==version`` to the version installed here, in the metadata's order.

    Requirements of extras, and those whose environment marker is false here, are left out; a
    requirement not installed here keeps its declared range (the job was not planned with it).
    """
    _import_build()  # packaging comes with build
    from packaging.requirements import Requirement

    if distribution is None:
        with tempfile.TemporaryDirectory(prefix="lmshards-metadata-") as work:
            return pinned_requirements(project_metadata(work))
    pins = []
    for line in distribution.requires or []:
        requirement = Requirement(line)
        if requirement.marker is not None and not requirement.marker.evaluate({"extra": ""}):
            continue
        extras = f"[{','.join(sorted(requirement.extras))}]" if requirement.extras else ""
        marker = f"; {requirement.marker}" if requirement.marker is not None else ""
        try:
            pins.append(f"{requirement.name}{extras}=={importlib.metadata.version(requirement.name)}{marker}")
        except importlib.metadata.PackageNotFoundError:
            pins.append(f"{requirement.name}{extras}{requirement.specifier}{marker}")
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


def _pyproject(distribution: importlib.metadata.Distribution, version: str, requirements: list[str],
               packages: list[str]) -> str:
    """The ``pyproject.toml`` of the staged wheel: ``distribution``'s metadata with ``version`` and
    ``requirements``. (JSON strings and arrays of strings are TOML too.)"""
    metadata = distribution.metadata
    lines = ["[build-system]", 'requires = ["setuptools>=61"]', 'build-backend = "setuptools.build_meta"', "",
             "[project]", f"name = {json.dumps(metadata['Name'])}", f"version = {json.dumps(version)}"]
    if metadata["Summary"]:
        lines.append(f"description = {json.dumps(metadata['Summary'])}")
    if metadata["Requires-Python"]:
        lines.append(f"requires-python = {json.dumps(metadata['Requires-Python'])}")
    lines.append(f"dependencies = {json.dumps(requirements)}")
    groups: dict[str, list[str]] = {}
    for entry in sorted(distribution.entry_points, key=lambda e: (e.group, e.name)):
        groups.setdefault(entry.group, []).append(f"{json.dumps(entry.name)} = {json.dumps(entry.value)}")
    for group, entries in groups.items():
        table = "[project.scripts]" if group == "console_scripts" else f"[project.entry-points.{json.dumps(group)}]"
        lines += ["", table, *entries]
    lines += ["", "[tool.setuptools]", f"packages = {json.dumps(packages)}", "include-package-data = false"]
    return "\n".join(lines) + "\n"


def build_wheel(directory: str) -> str:
    """Build a wheel of the lmshards modules imported here into ``directory``; return its path.

    Pure Python (``py3-none-any``), built by the setuptools backend from a temporary source
    tree of those modules and the project's metadata (:func:`project_metadata`); it requires
    :func:`pinned_requirements`, and its version is the project's version with a local label,
    a digest of the modules and the pins.

    Raises:
        StagingError: the wheel cannot be built here (no ``build`` package, a failed build).
    """
    with tempfile.TemporaryDirectory(prefix="lmshards-build-") as work:
        distribution = project_metadata(os.path.join(work, "metadata"))
        requirements = pinned_requirements(distribution)
        files = _package_files()
        digest = hashlib.sha256()
        for inside, path in files:
            with open(path, "rb") as handle:
                digest.update(inside.encode() + b"\0" + hashlib.sha256(handle.read()).digest())
        for requirement in requirements:
            digest.update(b"requires\0" + requirement.encode())
        version = f"{distribution.version.split('+', 1)[0]}+src{digest.hexdigest()[:12]}"
        source = os.path.join(work, "source")
        for inside, path in files:
            os.makedirs(os.path.dirname(os.path.join(source, inside)), exist_ok=True)
            shutil.copyfile(path, os.path.join(source, inside))
        packages = sorted({os.path.dirname(inside).replace("/", ".") for inside, _ in files})
        with open(os.path.join(source, "pyproject.toml"), "w", encoding="utf-8") as handle:
            handle.write(_pyproject(distribution, version, requirements, packages))
        os.makedirs(directory, exist_ok=True)
        with _backend(source) as builder:
            return builder.build("wheel", directory)


def stage_installed_package(beam_args: list[str]) -> list[str]:
    """``beam_args``, plus ``--extra_package`` with a wheel of this lmshards when the job must
    ship itself (:func:`ships_itself`), ahead of any package of the user's (the workers install
    them in that order, so a plugin's requirement on lmshards finds it installed); the wheel
    lives in a temporary directory removed at exit.

    Raises:
        StagingError: the wheel cannot be built here.
    """
    if not ships_itself(beam_args):
        return list(beam_args)
    directory = tempfile.mkdtemp(prefix="lmshards-wheel-")
    atexit.register(shutil.rmtree, directory, True)
    return [f"--extra_package={build_wheel(directory)}", *beam_args]
