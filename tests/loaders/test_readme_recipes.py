"""The README's "Training with the loader" recipes, run as written (on small synthetic datasets):
a plain torch loop, HF Trainer under torchrun (2 processes) and Lightning."""

from __future__ import annotations

import glob
import json
import os
import re
import subprocess
import sys

import pytest
import torch
from conftest import ROOT, TOKENIZER, write_dataset


def recipes() -> dict[str, str]:
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    section = text[text.index("## Training with the loader"):]
    section = section[: section.index("\n## ", 10)]
    blocks = re.findall(r"```python\n(.*?)```", section, flags=re.S)
    return {re.match(r"# recipe: (\S+)", b).group(1): b for b in blocks if b.startswith("# recipe:")}


@pytest.fixture(scope="module")
def datasets(tmp_path_factory):
    root = tmp_path_factory.mktemp("recipes")
    clm = write_dataset(root / "clm", [40, 24], seq_len=32, formats=("arrow",), tokenizer=TOKENIZER)
    bart = write_dataset(root / "bart", [40, 24], family="seq2seq", seq_len=32, formats=("arrow",),
                         objective="bart", tokenizer=TOKENIZER)
    return {"out/sample": clm, "out/bart": bart}


def run(code: str, datasets: dict[str, str], cwd, launcher: list[str]) -> None:
    for placeholder, path in datasets.items():
        code = code.replace(f'"{placeholder}"', repr(path))
    script = cwd / "train.py"
    script.write_text(code, encoding="utf-8")
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false", "OMP_NUM_THREADS": "1",
           "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    done = subprocess.run([*launcher, str(script)], cwd=cwd, env=env, stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-5000:]


def test_readme_has_the_three_recipes():
    assert sorted(recipes()) == ["hf-trainer", "lightning", "torch"]


@pytest.mark.e2e
def test_torch_loop_recipe(datasets, tmp_path):
    run(recipes()["torch"], datasets, tmp_path, [sys.executable])
    saved = torch.load(tmp_path / "checkpoint.pt", weights_only=True)
    assert (saved["loader"]["epoch"], saved["loader"]["samples"]) == (2, 0)  # two full epochs, no set_epoch


@pytest.mark.e2e
def test_hf_trainer_recipe_under_torchrun(datasets, tmp_path):
    run(recipes()["hf-trainer"], datasets, tmp_path,
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2"])
    states = {}
    for path in glob.glob(str(tmp_path / "run" / "checkpoint-*" / "lmshards_loader_state.json")):
        with open(path, encoding="utf-8") as handle:
            state = json.load(handle)
        step = int(path.split("checkpoint-")[1].split(os.sep)[0])
        states[step] = (state["epoch"], state["samples"], state["world_size"])
    # 64 samples, 2 ranks of 8 per step: 4 steps per epoch, a checkpoint every 4 steps
    assert states == {4: (1, 0, 2), 8: (2, 0, 2)}


@pytest.mark.e2e
def test_lightning_recipe(datasets, tmp_path):
    run(recipes()["lightning"], datasets, tmp_path, [sys.executable])
    checkpoints = glob.glob(str(tmp_path / "lightning" / "**" / "*.ckpt"), recursive=True)
    assert len(checkpoints) == 1
    saved = torch.load(checkpoints[0], weights_only=False)
    loader_states = saved["loops"]["fit_loop"]["state_dict"]["combined_loader"]
    assert [(s["epoch"], s["samples"]) for s in loader_states] == [(2, 0)]
