"""The README's "Training with the loader" recipes, run as written: a plain torch loop, HF Trainer
under torchrun (2 processes) and Lightning, each on the dataset its ``# data:`` command makes from
the bundled sample (into a temporary directory instead of ``out/``); each recipe's ``# install:``
extra of setup.py holds every distribution it imports."""

from __future__ import annotations

import ast
import glob
import json
import os
import re
import shlex
import subprocess
import sys

import pytest
import torch
from conftest import ROOT


def recipes() -> dict[str, str]:
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    section = text[text.index("## Training with the loader"):]
    section = section[: section.index("\n## ", 10)]
    blocks = re.findall(r"```python\n(.*?)```", section, flags=re.S)
    return {re.match(r"# recipe: (\S+)", b).group(1): b for b in blocks if b.startswith("# recipe:")}


def data_command(code: str) -> list[str]:
    """The recipe's ``# data:`` command (``lmshards materialize ...``) as argv."""
    line = re.search(r"^# data: (.+)$", code, flags=re.M)
    assert line, "every recipe names the command that makes its dataset"
    return shlex.split(line.group(1))


def extras() -> dict[str, list[str]]:
    """setup.py's ``extras_require``, read without running setup.py."""
    tree = ast.parse((ROOT / "setup.py").read_text(encoding="utf-8"))
    call = next(n for n in ast.walk(tree) if isinstance(n, ast.Call) and getattr(n.func, "id", "") == "setup")
    value = next(k.value for k in call.keywords if k.arg == "extras_require")
    return ast.literal_eval(value)


@pytest.fixture(scope="module")
def datasets(tmp_path_factory):
    """Every recipe's dataset, made by its ``# data:`` command as written (the output redirected)."""
    root = tmp_path_factory.mktemp("recipes")
    env = {**os.environ, "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    out = {}
    for code in recipes().values():
        argv = data_command(code)
        assert argv[:2] == ["lmshards", "materialize"], argv
        output = argv[argv.index("--output") + 1]
        if output in out:
            continue
        target = root / output.replace("/", "_")
        argv[argv.index("--output") + 1] = str(target)
        done = subprocess.run([sys.executable, "-m", "pipelines.cli", *argv[1:], "--progress-seconds", "0"], cwd=ROOT,
                              env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=900)
        assert done.returncode == 0, done.stdout[-3000:]
        out[output] = str(target)
    return out


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


#: distributions a recipe needs beyond what it imports, by a name it uses (HF's Trainer needs accelerate)
IMPLIED = {"LMShardsTrainer": "accelerate"}


def test_readme_has_the_three_recipes_each_with_its_extra_and_its_data():
    assert sorted(recipes()) == ["hf-trainer", "lightning", "torch"]
    available = extras()
    for name, code in recipes().items():
        line = re.search(r"^# install: pip install -e '\.\[(\w+)\]'$", code, flags=re.M)
        assert line, f"recipe {name} names no extra to install"
        packages = {re.split(r"[<>=\[]", requirement)[0] for requirement in available[line.group(1)]}
        imported = {node.names[0].name.split(".")[0] if isinstance(node, ast.Import) else node.module.split(".")[0]
                    for node in ast.walk(ast.parse(code)) if isinstance(node, (ast.Import, ast.ImportFrom))}
        needed = (imported - {"loaders"}) | {v for k, v in IMPLIED.items() if k in code}
        assert needed <= packages, (name, needed - packages)
        assert data_command(code)[:2] == ["lmshards", "materialize"]


@pytest.mark.e2e
def test_torch_loop_recipe(datasets, tmp_path):
    run(recipes()["torch"], datasets, tmp_path, [sys.executable])
    saved = torch.load(tmp_path / "checkpoint.pt", weights_only=True)
    assert (saved["loader"]["epoch"], saved["loader"]["samples"]) == (2, 0)  # two full epochs, no set_epoch


@pytest.mark.e2e
def test_hf_trainer_recipe_under_torchrun(datasets, tmp_path):
    run(recipes()["hf-trainer"], datasets, tmp_path,
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2"])
    from loaders import ShardedDataset

    per_rank = len(ShardedDataset(datasets["out/sample"], "train", batch_size=8, seed=0, rank=0, world_size=2))
    steps = -(-per_rank // 8)  # per epoch
    states = {}
    for path in glob.glob(str(tmp_path / "run" / "checkpoint-*" / "lmshards_loader_state.json")):
        with open(path, encoding="utf-8") as handle:
            state = json.load(handle)
        step = int(path.split("checkpoint-")[1].split(os.sep)[0])
        states[step] = (state["epoch"], state["samples"], state["world_size"])
    # a checkpoint every 4 steps: the epoch and the samples both ranks consumed in it (8 each per step)
    assert sorted(states) == list(range(4, 2 * steps + 1, 4))
    assert states == {s: (s // steps, min(s % steps * 16, 2 * per_rank), 2) for s in states}


@pytest.mark.e2e
def test_lightning_recipe(datasets, tmp_path):
    run(recipes()["lightning"], datasets, tmp_path, [sys.executable])
    checkpoints = glob.glob(str(tmp_path / "lightning" / "**" / "*.ckpt"), recursive=True)
    assert len(checkpoints) == 1
    saved = torch.load(checkpoints[0], weights_only=False)
    loader_states = saved["loops"]["fit_loop"]["state_dict"]["combined_loader"]
    assert [(s["epoch"], s["samples"]) for s in loader_states] == [(2, 0)]
