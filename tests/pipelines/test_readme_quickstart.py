"""The README's "Your own data in five commands" runs as written, on a copy of the sample corpus."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys

import pytest
from lmshards_testing import ROOT


def _quickstart_commands() -> list[str]:
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    section = readme.split("## Your own data in five commands", 1)[1]
    block = re.search(r"```\n(.*?)```", section, re.S).group(1)
    return [line for line in block.splitlines() if line.strip()]


@pytest.mark.e2e
def test_the_five_commands_run_as_written(tmp_path):
    commands = _quickstart_commands()
    assert len(commands) == 5
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    for path in (ROOT / "data" / "sample").glob("*.jsonl"):
        shutil.copy(path, corpus)
    bin_dir = os.path.dirname(sys.executable)
    env = {**os.environ, "PATH": bin_dir + os.pathsep + os.environ["PATH"],
           "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    outputs = []
    for command in commands:
        done = subprocess.run(command, shell=True, cwd=tmp_path, env=env, capture_output=True, text=True)
        assert done.returncode == 0, (command, done.stderr[-2000:])
        outputs.append(done.stdout)
    assert (tmp_path / "tokenizer.json").exists() and (tmp_path / "datasets" / "clm" / "manifest.json").exists()
    assert outputs[1].startswith("dataset: datasets/clm (manifest.json)")
    assert (tmp_path / "report.html").stat().st_size > 10_000
    assert outputs[4].strip() == "torch.Size([8, 1024])"
