"""The import rules of docs/design.md section 1, checked in fresh interpreters.

Each case imports every module of some packages while an import hook makes the
forbidden top-level packages unimportable, so a leak fails here instead of on a
Dataflow worker or in a training job.
"""

from __future__ import annotations

import subprocess

import pytest
from lmshards_testing import run_with_blocked_imports

WALK = """
import importlib, pkgutil
for package in sys.argv[2].split(","):
    skip = set(filter(None, sys.argv[3].split(","))) if len(sys.argv) > 3 else set()
    module = importlib.import_module(package)
    names = [package]
    if hasattr(module, "__path__"):
        names += [m.name for m in pkgutil.walk_packages(module.__path__, package + ".")]
    for name in names:
        if name not in skip:
            importlib.import_module(name)
print("ok")
"""


def _probe(blocked: str, packages: str, skip: str = "") -> subprocess.CompletedProcess:
    return run_with_blocked_imports(WALK, blocked, packages, skip)


@pytest.mark.parametrize(
    "blocked, packages, skip",
    [
        # Dataflow workers do not install torch.
        ("torch", "pipelines,transforms,schemas", ""),
        # A training job installs torch, not Beam.
        ("apache_beam", "loaders,schemas,transforms.objectives", ""),
        # Objectives are pure numpy; schemas need only pyarrow.
        ("apache_beam,torch,tokenizers,pyarrow,webdataset", "transforms.objectives", ""),
        ("apache_beam,torch,tokenizers,numpy", "schemas", ""),
    ],
)
def test_import_rules(blocked, packages, skip):
    result = _probe(blocked, packages, skip)
    assert result.returncode == 0 and result.stdout.strip() == "ok", result.stderr[-2000:]


def test_the_probe_catches_a_leak():
    result = _probe("numpy", "transforms.objectives")
    assert result.returncode != 0 and "blocked import of numpy" in result.stderr


def test_loaders_package_imports_without_torch():
    result = run_with_blocked_imports("import loaders, loaders.access.reader\nprint('ok')\n", "torch,apache_beam")
    assert result.returncode == 0 and result.stdout.strip() == "ok", result.stderr[-2000:]
