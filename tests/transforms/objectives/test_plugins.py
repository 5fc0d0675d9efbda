"""Objectives of other packages: found through the entry-point group ``lmshards.objectives``.

The registry loads the installed packages' entry points on its first lookup, once per process
(transforms/objectives/registry.py). The fast tests give :func:`load_entry_points` the entry
points of distributions written here as an installer writes them (a ``.dist-info`` directory
with ``entry_points.txt``) and read back by ``importlib.metadata``, and run the command line in
a fresh interpreter with such a distribution on its path. The end-to-end test pip-installs the
example package of ``tests/plugin_example`` (``tagged_clm``: clm rows that start with a token of
their own) into a folder of its own and runs ``train-tokenizer``, ``materialize`` with two Beam
worker processes, ``inspect``, ``validate``, ``show``, ``report`` and the loader (stored and
on-the-fly) with that folder on ``PYTHONPATH``, checking exact ids.
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import re
import shutil
import subprocess
import sys
import textwrap

import pytest
from lmshards_testing import ROOT

from schemas.errors import ConfigError
from transforms.objectives.registry import (
    ENTRY_POINT_GROUP,
    OBJECTIVES,
    load_entry_points,
    objective_flags,
    tokens_needed,
    unregister_objective,
)

PLUGIN = ROOT / "tests" / "plugin_example"

#: A plugin module whose objective is clm under another name and default length.
ECHO = """
from dataclasses import dataclass

from transforms.objectives.clm import CLM
from transforms.objectives.flags import flag


@dataclass(frozen=True)
class EchoConfig:
    seq_len: int = flag(32, "tokens per example")


class Echo(CLM):
    name = "{name}"
    config_class = EchoConfig
"""


def write_distribution(root, dist: str, entry_points: dict[str, str], modules: dict[str, str]) -> None:
    """A distribution as an installer lays it out in ``root``: its modules and its ``.dist-info``
    declaring ``entry_points`` in the group ``lmshards.objectives``."""
    info = root / f"{dist.replace('-', '_')}-0.1.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist}\nVersion: 0.1\n", encoding="utf-8")
    lines = [f"[{ENTRY_POINT_GROUP}]", *(f"{name} = {value}" for name, value in entry_points.items())]
    (info / "entry_points.txt").write_text("\n".join(lines) + "\n", encoding="utf-8")
    for module, source in modules.items():
        (root / f"{module}.py").write_text(textwrap.dedent(source), encoding="utf-8")


def entry_points_in(root) -> list[importlib.metadata.EntryPoint]:
    """The ``lmshards.objectives`` entry points of the distributions in ``root`` (``importlib.metadata``'s)."""
    return [ep for dist in importlib.metadata.distributions(path=[str(root)]) for ep in dist.entry_points
            if ep.group == ENTRY_POINT_GROUP]


def test_an_entry_point_registers_its_objective_once(tmp_path, monkeypatch):
    before = list(OBJECTIVES)  # the first lookup has loaded what is installed: tmp_path is not on the path yet
    write_distribution(tmp_path, "lmshards-echo", {"echo_clm": "lmshards_plugin_echo:Echo"},
                       {"lmshards_plugin_echo": ECHO.format(name="echo_clm")})
    monkeypatch.syspath_prepend(str(tmp_path))
    try:
        assert load_entry_points(entry_points_in(tmp_path)) == ["echo_clm"]
        import lmshards_plugin_echo

        assert list(OBJECTIVES) == [*before, "echo_clm"] and OBJECTIVES["echo_clm"] is lmshards_plugin_echo.Echo
        assert load_entry_points(entry_points_in(tmp_path)) == []  # loaded already: nothing changes
        seq_len = {f.flag: f for f in objective_flags()}["--seq-len"]
        assert seq_len.objectives[-1] == "echo_clm" and seq_len.help.endswith(", echo_clm 32)")
        assert tokens_needed().tokens == ("[R]", "[S]", "[X]", "[NLU]", "[S2S]", "[NLG]")  # it needs none
    finally:
        unregister_objective("echo_clm")
    assert list(OBJECTIVES) == before


NOT_AN_OBJECTIVE = "Thing = dict\n"
FAILS = 'raise RuntimeError("needs a GPU\\nand more")\n'
BAD_FLAG = """
from dataclasses import dataclass

from transforms.objectives.clm import CLM
from transforms.objectives.flags import flag


@dataclass(frozen=True)
class Config:
    seq_len: str = flag("long", "tokens per example")


class Bad(CLM):
    name = "bad_flag"
    config_class = Config
"""


@pytest.mark.parametrize("name, value, modules, message", [
    ("missing", "lmshards_plugin_missing:Thing", {},
     "cannot be imported: ModuleNotFoundError: No module named 'lmshards_plugin_missing'"),
    ("fails", "lmshards_plugin_fails:Thing", {"lmshards_plugin_fails": FAILS},
     "cannot be imported: RuntimeError: needs a GPU"),
    ("notobj", "lmshards_plugin_notobj:Thing", {"lmshards_plugin_notobj": NOT_AN_OBJECTIVE},
     "<class 'dict'> is not a subclass of transforms.objectives.base.Objective"),
    ("other_name", "lmshards_plugin_named:Echo", {"lmshards_plugin_named": ECHO.format(name="echo_named")},
     "the class names its objective 'echo_named'; the entry point must be named as the objective (the --objective "
     "value)"),
    ("clm", "lmshards_plugin_clm:Echo", {"lmshards_plugin_clm": ECHO.format(name="clm")},
     "objective clm is registered already (by lmshards' own CLM); uninstall one of the two"),
    ("bad_flag", "lmshards_plugin_flag:Bad", {"lmshards_plugin_flag": BAD_FLAG},
     "objective bad_flag: flag --seq-len sets seq_len (str, 'tokens per example'); another objective declares it as "
     "seq_len (int, 'tokens per example')"),
])
def test_a_plugin_that_cannot_be_used_is_a_config_error_in_one_line_naming_it(tmp_path, monkeypatch, name, value,
                                                                             modules, message):
    before = list(OBJECTIVES)  # the first lookup has loaded what is installed: tmp_path is not on the path yet
    write_distribution(tmp_path, "lmshards-broken", {name: value}, modules)
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(ConfigError) as refused:
        load_entry_points(entry_points_in(tmp_path))
    assert str(refused.value) == (f"objective plugin entry point {name} = {value} of lmshards-broken (group "
                                  f"lmshards.objectives): {message}")
    assert refused.value.exit_code == 2 and list(OBJECTIVES) == before


def test_two_packages_that_declare_one_name_are_refused_naming_the_first(tmp_path, monkeypatch):
    assert "dup_clm" not in OBJECTIVES  # the first lookup has loaded what is installed, before these are
    first, second = tmp_path / "a", tmp_path / "b"
    write_distribution(first, "plugin-a", {"dup_clm": "lmshards_plugin_dup_a:Echo"},
                       {"lmshards_plugin_dup_a": ECHO.format(name="dup_clm")})
    write_distribution(second, "plugin-b", {"dup_clm": "lmshards_plugin_dup_b:Echo"},
                       {"lmshards_plugin_dup_b": ECHO.format(name="dup_clm")})
    monkeypatch.syspath_prepend(str(first))
    monkeypatch.syspath_prepend(str(second))
    try:
        assert load_entry_points(entry_points_in(first)) == ["dup_clm"]
        with pytest.raises(ConfigError) as refused:
            load_entry_points(entry_points_in(second))
        assert str(refused.value) == (
            "objective plugin entry point dup_clm = lmshards_plugin_dup_b:Echo of plugin-b (group "
            "lmshards.objectives): objective dup_clm is registered already (by entry point dup_clm = "
            "lmshards_plugin_dup_a:Echo of plugin-a); uninstall one of the two")
    finally:
        unregister_objective("dup_clm")


#: Run in a fresh interpreter (the registry loads the installed plugins once per process): what
#: each command says, and whether the plugin's module was imported before the first lookup.
COMMANDS = """
import contextlib, io, json, sys

import pipelines.materialize, pipelines.train_tokenizer

out = {"imported before a lookup": "lmshards_plugin_lazy" in sys.modules}
for name, main, argv in (("materialize", pipelines.materialize.main, sys.argv[1:]),
                         ("train-tokenizer", pipelines.train_tokenizer.main, ["--help"])):
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        code = main(argv)
    out[name] = [code, err.getvalue()]
out["imported after"] = "lmshards_plugin_lazy" in sys.modules  # loaded before the broken one: names in order
print(json.dumps(out))
"""


def test_the_command_line_loads_plugins_at_the_first_lookup_and_refuses_a_broken_one_in_one_line(tmp_path):
    write_distribution(tmp_path, "lmshards-lazy", {"echo_lazy": "lmshards_plugin_lazy:Echo"},
                       {"lmshards_plugin_lazy": ECHO.format(name="echo_lazy")})
    write_distribution(tmp_path, "lmshards-broken", {"missing": "lmshards_plugin_missing:Thing"}, {})
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), str(ROOT)])}
    argv = ["--input", str(ROOT / "data" / "sample" / "faq.jsonl"), "--tokenizer",
            str(ROOT / "data" / "tokenizer.json"), "--output", str(tmp_path / "never"), "--objective", "echo_lazy"]
    done = subprocess.run([sys.executable, "-c", COMMANDS, *argv], env=env, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    refusal = ("error: objective plugin entry point missing = lmshards_plugin_missing:Thing of lmshards-broken (group "
               "lmshards.objectives): cannot be imported: ModuleNotFoundError: No module named "
               "'lmshards_plugin_missing'\n")
    assert json.loads(done.stdout) == {
        "imported before a lookup": False,
        "materialize": [2, f"lmshards materialize: {refusal}"],
        "train-tokenizer": [2, f"lmshards train-tokenizer: {refusal}"],
        "imported after": True,
    }
    assert not (tmp_path / "never").exists()


# --- end to end: the example package, pip-installed ---------------------------------------

SEQ, TAG, EOS, PAD = 48, "[TAGGED]", 1, 0
TEXTS = ["the cat sat on the mat", "a dog ran in the park", "birds sing at dawn"]


@pytest.fixture(scope="module")
def installed(tmp_path_factory):
    """The example package pip-installed (built from a copy: a build writes into its source tree)
    into a folder of its own; the environment that puts it on the path, as an install would."""
    root = tmp_path_factory.mktemp("plugin")
    source, site = root / "source", root / "site"
    shutil.copytree(PLUGIN, source)
    done = subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-build-isolation",
                           "--no-index", "--target", str(site), str(source)], capture_output=True, text=True,
                          timeout=600)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(site), str(ROOT)])}
    return root, site, env


def lmshards(env, *argv: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "pipelines.cli", *argv], env=env, capture_output=True, text=True,
                          timeout=600)


@pytest.fixture(scope="module")
def made(installed):
    """A tokenizer trained with the plugin installed, and a tagged_clm dataset made with it by two
    Beam worker processes (each unpickles the objective, so each imports the plugin's module)."""
    root, _, env = installed
    corpus = root / "corpus.jsonl"
    corpus.write_text("".join(json.dumps({"text": text}) + "\n" for text in TEXTS), encoding="utf-8")
    tokenizer, out = root / "tokenizer.json", root / "data"
    trained = lmshards(env, "train-tokenizer", "--input", str(corpus), "--output", str(tokenizer), "--vocab-size",
                       "300", "--num-sentinels", "1")
    assert trained.returncode == 0, trained.stderr[-3000:]
    assert trained.stdout.rstrip().endswith(
        f"13 special tokens (1 sentinel, the objectives' own tokens [R] [S] [X] [NLU] [S2S] [NLG] {TAG}), trained on "
        "3 documents")
    done = lmshards(env, "materialize", "--input", str(corpus), "--tokenizer", str(tokenizer), "--output", str(out),
                    "--objective", "tagged_clm", "--seq-len", str(SEQ), "--last-chunk", "pad", "--workers", "2",
                    "--progress-seconds", "0")
    assert done.returncode == 0, done.stderr[-3000:]
    return tokenizer, out, env


@pytest.mark.e2e
def test_an_installed_plugin_works_in_every_command_on_beam_workers_and_in_the_loader(made, installed):
    from tokenizers import Tokenizer

    tokenizer_path, out, env = made
    tokenizer = Tokenizer.from_file(str(tokenizer_path))
    tag = tokenizer.token_to_id(TAG)
    assert tag == 12  # 5 roles, 1 sentinel, UL2's 6 mode tokens, then the plugin's own
    documents = sorted(e.ids + [EOS] for e in tokenizer.encode_batch(TEXTS, add_special_tokens=False))
    raw = sum(map(len, documents))

    shown = lmshards(env, "materialize", "--help")
    help_text = " ".join(shown.stdout.split())
    assert "ul2 or tagged_clm" in help_text and "tagged_clm 64) [clm, prefix_lm, mlm, bart, tagged_clm]" in help_text
    assert f"--tagged-token TOKEN the token every example starts with ({TAG}) [tagged_clm]" in help_text

    manifest = json.loads((out / "manifest.json").read_text(encoding="utf-8"))
    assert manifest["objective"] == {"name": "tagged_clm", "family": "decoder",
                                     "params": {"seq_len": SEQ, "token": TAG}}
    assert manifest["tokenizer"]["mode_tokens"] == {TAG: tag}
    counters = manifest["stats"]["train"]["objective"]
    assert (counters["examples"], counters["tokens"], counters["padding_tokens"]) == (1, raw, SEQ - 1 - raw)

    # The loader in a process of its own (this one has loaded its plugins already): the stored
    # example, and tagged_clm applied on the fly to the stored rows as token chunks (its tag then
    # comes before the stored row's own, and its seq_len is fitted to the stored rows: SEQ + 1).
    loaded = subprocess.run([sys.executable, "-c", textwrap.dedent(f"""
        import json
        import numpy as np
        from loaders import ShardedDataset

        def plain(example):
            return {{k: v if k == "key" else np.asarray(v).tolist() for k, v in example.items()}}

        dynamic = ShardedDataset({str(out)!r}, "train", shuffle=False, objective="tagged_clm")
        print(json.dumps([plain(next(iter(ShardedDataset({str(out)!r}, "train", shuffle=False)))),
                          plain(next(iter(dynamic))), dynamic.objective.config.seq_len]))
        """)], env=env, capture_output=True, text=True, timeout=600)
    assert loaded.returncode == 0, loaded.stderr[-3000:]
    stored, dynamic, fitted = json.loads(loaded.stdout)
    row, doc_lengths = stored["input_ids"], stored["doc_lengths"]
    assert row[0] == tag and row[1 + raw:] == [PAD] * (SEQ - 1 - raw) and sum(doc_lengths) == 1 + raw
    ends = [sum(doc_lengths[: i + 1]) for i in range(len(doc_lengths))]
    assert sorted(row[max(start, 1):end] for start, end in zip([0, *ends], ends)) == documents
    assert fitted == SEQ + 1
    assert dynamic == {"key": stored["key"], "input_ids": [tag, *row[: 1 + raw], *[PAD] * (SEQ - 1 - raw)],
                       "doc_lengths": [doc_lengths[0] + 1, *doc_lengths[1:]]}

    checked = lmshards(env, "validate", str(out))
    assert (checked.returncode, checked.stdout) == (0, "validate: OK; checked 1 examples, hashed 2 files\n")
    inspected = lmshards(env, "inspect", str(out), "--json")
    assert inspected.returncode == 0, inspected.stderr
    summary = json.loads(inspected.stdout)
    measured = summary["splits"]["train"]["measured"]
    assert (measured["examples"], measured["raw_tokens"], measured["examples_with_issues"]) == (1, raw, 0)
    assert summary["tokenizer"]["mode_tokens"] == {TAG: tag}
    table = lmshards(env, "inspect", str(out)).stdout
    assert [line for line in table.splitlines() if line.startswith("objective")] == [
        f"objective  tagged_clm (decoder)  seq_len={SEQ}  token={TAG}"]
    assert f"  objective tokens {TAG}={tag}" in table
    legend, example = lmshards(env, "show", str(out), "-n", "1", "--color", "never").stdout.split("\n\n", 1)
    assert re.search(rf"^  {re.escape(TAG)} +a token of the objective's own$", legend, re.M) and example.count(TAG) == 1
    assert lmshards(env, "report", str(out), "-o", str(out / "report.html")).returncode == 0
    page = (out / "report.html").read_text(encoding="utf-8")
    assert f"[R] [S] [X] [NLU] [S2S] [NLG] {TAG} in the tokenizer; used by the objective: {TAG}={tag}" in page

    # Another installed package whose plugin cannot be imported: one line naming it, exit 2.
    broken = out.parent / "broken"
    write_distribution(broken, "lmshards-broken", {"missing": "lmshards_plugin_missing:Thing"}, {})
    env = {**env, "PYTHONPATH": os.pathsep.join([str(broken), env["PYTHONPATH"]])}
    for command in ("inspect", "validate"):
        refused = lmshards(env, command, str(out))
        assert (refused.returncode, refused.stdout) == (2, "")
        assert refused.stderr == (
            f"lmshards {command}: error: objective plugin entry point missing = lmshards_plugin_missing:Thing of "
            "lmshards-broken (group lmshards.objectives): cannot be imported: ModuleNotFoundError: No module named "
            "'lmshards_plugin_missing'\n")
