"""Shared fixtures: the bundled sample corpus and tokenizer."""

from __future__ import annotations

import glob
import json
import os

import pytest
from hypothesis import settings
from lmshards_testing import SAMPLE_GLOB, TOKENIZER

# pytest-xdist runs one test process per core, and torch's thread pool would take every core in
# each of them: the small models' matrix products then wait on threads that cannot run. One
# thread each (a value set in the environment is kept; child processes inherit it).
os.environ.setdefault("OMP_NUM_THREADS", "1")

# Timing is never a test criterion here (the machine is shared): no per-example deadline.
# In CI the examples are derandomized, so a run is reproducible; locally they vary.
settings.register_profile("lmshards", deadline=None, print_blob=True, derandomize=bool(os.environ.get("CI")))
settings.load_profile("lmshards")


@pytest.fixture(scope="session")
def sample_glob() -> str:
    return SAMPLE_GLOB


@pytest.fixture(scope="session")
def tokenizer_path() -> str:
    return TOKENIZER


@pytest.fixture(scope="session")
def sample_texts() -> list[str]:
    texts = []
    for path in sorted(glob.glob(SAMPLE_GLOB)):
        with open(path, encoding="utf-8") as handle:
            texts.extend(json.loads(line)["text"] for line in handle if line.strip())
    return texts
