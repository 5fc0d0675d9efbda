"""Adding an objective: a toy one defined here, not shipped, registered with one line.

``reverse`` is a seq2seq objective: ``inputs`` are a token of its own, ``[REV]``, the chunk and
EOS, ``targets`` the chunk reversed in windows of ``window`` tokens and EOS. Its module (this
file) declares all there is: its config with two flags (``--seq-len``, shared with the built-in
objectives, and its own ``--reverse-window``), its schema, its counters and manifest summary,
its decoder start token, the token it needs (``token_needs``: ``train-tokenizer`` makes it, the
plan refuses a tokenizer without it unless ``--add-special-tokens`` adds it), and its
inspection hooks (taking an example apart, its invariant, the counters ``validate``
recomputes, its own measured statistic: the tokens the reversal moves, counted in ``inspect``'s
statistics and shown in its table, the report and ``--json``; how ``show`` and the report show an
example: its windows and its targets turned back). Every hook gets the same
:class:`~transforms.objectives.base.InspectionContext`. The tests run the real command line, the
real ``materialize`` pipeline on the bundled sample corpus with FnApiRunner, ``inspect``,
``validate`` and ``show``, and the loader with its collator, and check exact values against
a plain-Python reference of the objective and the corpus's own token count.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import re
from dataclasses import dataclass
from typing import Any

import numpy as np
import pytest
from lmshards_testing import ROOT, TOKENIZER, encode_documents, materialize

from pipelines.cli import main as cli
from transforms.objectives.base import Block, Built, Objective, TokenNeeds, flat_rows, padded_rows
from transforms.objectives.common import SpecialIds
from transforms.objectives.flags import flag
from transforms.objectives.lines import number
from transforms.objectives.registry import OBJECTIVES, objective_flags, register_objective, unregister_objective
from transforms.objectives.shown import Marks, Shown, family_shown
from transforms.objectives.summary import common_summary, ratio

CORPUS = ROOT / "data" / "sample" / "faq.jsonl"
SEQ, WINDOW, EOS, PAD = 16, 4, 1, 0
#: reverse's own token, and its id once --add-special-tokens adds it to the project's tokenizer (8,000 ids)
MARK, MARK_ID = "[REV]", 8000
ARGS = ["--input", str(CORPUS), "--tokenizer", TOKENIZER, "--objective", "reverse", "--seq-len", str(SEQ),
        "--reverse-window", str(WINDOW), "--last-chunk", "pad", "--validation-fraction", "0.1", "--num-shards", "2",
        "--formats", "arrow,webdataset", "--add-special-tokens"]


# --- the objective: everything a new one needs, in its own module -------------------------


@dataclass(frozen=True)
class ReverseConfig:
    """Settings of the toy reverse objective."""

    seq_len: int = flag(64, "tokens per example")
    window: int = flag(8, "tokens reversed together", name="--reverse-window")

    def __post_init__(self) -> None:
        if not isinstance(self.window, int) or self.window < 1:
            raise ValueError(f"window must be an int >= 1, got {self.window!r}")


def reverse_windows(tokens: np.ndarray, window: int) -> np.ndarray:
    """``tokens`` with every run of ``window`` tokens reversed in place (the last run may be shorter)."""
    pieces = [tokens[start : start + window][::-1] for start in range(0, tokens.shape[0], window)]
    return np.concatenate(pieces).astype(np.int32) if pieces else np.zeros(0, np.int32)


class Reverse(Objective):
    """Sequence reversal in windows, as a seq2seq objective."""

    name = "reverse"
    family = "seq2seq"
    config_class = ReverseConfig
    required_specials = frozenset({"eos", "pad"})
    decoder_start = "eos"
    exact_counters = frozenset({"windows"})

    def __init__(self, config: ReverseConfig):
        self.config = config
        self.fixed_raw_length = config.seq_len

    def token_needs(self) -> TokenNeeds:
        return TokenNeeds(0, (MARK,))

    def build(self, block: Block, special: SpecialIds) -> Built:
        chunks = [block.tokens[block.offsets[i] : block.offsets[i + 1]] for i in range(block.count)]
        mark, width = special.mode_tokens[MARK], self.config.seq_len + 1
        inputs, in_offsets, in_padding = padded_rows(*flat_rows([np.r_[mark, c, special.eos] for c in chunks]),
                                                     width + 1, special.pad)
        targets, out_offsets, out_padding = padded_rows(
            *flat_rows([np.append(reverse_windows(c, self.config.window), special.eos) for c in chunks]),
            width, special.pad)
        counters = {"examples": block.count, "tokens": int(block.offsets[-1]),
                    "windows": sum(math.ceil(c.shape[0] / self.config.window) for c in chunks),
                    "padding_tokens": in_padding + out_padding}
        return Built({"inputs": (inputs, in_offsets), "targets": (targets, out_offsets)}, {}, {}, counters)

    def schema_kwargs(self) -> dict[str, Any]:
        return {"inputs_length": self.config.seq_len + 2, "targets_length": self.config.seq_len + 1}

    def params(self) -> dict[str, Any]:
        return {"seq_len": self.config.seq_len, "window": self.config.window}

    @staticmethod
    def summarize(counters, params=None) -> dict[str, Any]:
        return {**common_summary(counters),
                "mean_windows_per_example": ratio(counters.get("windows", 0), counters.get("examples", 0))}

    # Its inspection hooks: each gets one InspectionContext (special ids, seed, split, the example
    # and its anatomy, the split's statistics, measured values and manifest counters, as known).

    def take_apart(self, ctx) -> None:
        a = ctx.anatomy
        if a.inputs.size == 0 or a.inputs[0] != ctx.special.mode_tokens.get(MARK):
            a.issues.append(f"inputs do not start with {MARK}")
        if a.inputs.size == 0 or a.inputs[-1] != ctx.special.eos:
            a.issues.append("inputs do not end with EOS")
        a.raw_tokens = max(int(a.inputs.size) - 2, 0)

    def example_problems(self, ctx) -> list[str]:
        a = ctx.anatomy
        if not np.array_equal(a.targets, np.append(reverse_windows(a.inputs[1:-1], self.config.window),
                                                   ctx.special.eos)):
            return [f"targets are not the inputs reversed in windows of {self.config.window}"]
        return []

    def shard_counters(self, ctx) -> dict[str, int]:
        return {"windows": math.ceil(ctx.anatomy.raw_tokens / self.config.window)}

    def count_measured(self, ctx) -> None:
        a, raw = ctx.anatomy, ctx.anatomy.raw_tokens
        ctx.stats.counts["out_of_place_tokens"] += int((a.targets[:raw] != a.inputs[1 : raw + 1]).sum())

    def measured_summary(self, ctx) -> dict[str, Any]:
        c = ctx.stats.counts
        return {"reverse": {"window": self.config.window, "mean_raw_tokens": ratio(c["raw_tokens"], c["examples"]),
                            "out_of_place_tokens": c["out_of_place_tokens"],
                            "out_of_place_share": ratio(c["out_of_place_tokens"], c["raw_tokens"])}}

    def measured_lines(self, ctx) -> list[str]:
        r = ctx.measured["reverse"]
        return [f"  reversed in windows of {r['window']}: {number(r['out_of_place_tokens'])} of "
                f"{number(ctx.measured['raw_tokens'])} tokens out of place = {number(r['out_of_place_share'])}"]

    def example_lines(self, ctx) -> Shown:
        """What its family shows (inputs, targets), its windows in the header, and the targets
        turned back."""
        a, shown = ctx.anatomy, family_shown(ctx)
        back = reverse_windows(a.targets[: a.raw_tokens], self.config.window)
        return Shown([*shown.facts, f"windows={math.ceil(a.raw_tokens / self.config.window)}"],
                     [*shown.lines, ("turned back", Marks(ctx.special).kinds(back, "text"))])


# --- the tests -------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def registered():
    register_objective(Reverse)  # the one registry line a shipped objective adds
    yield Reverse
    unregister_objective("reverse")


def _reference(tokens: list[int], window: int) -> list[int]:
    """Plain-Python windowed reversal, independent of the objective's numpy code."""
    out: list[int] = []
    for start in range(0, len(tokens), window):
        out += tokens[start : start + window][::-1]
    return out


def test_the_registry_refuses_what_it_cannot_dispatch_to(registered):
    class Unconfigured(Reverse):
        name = "unconfigured"
        config_class = None

    class Clashing(Reverse):
        name = "clashing"

    @dataclass(frozen=True)
    class ClashingConfig:
        seq_len: str = flag("x", "another meaning")

    Clashing.config_class = ClashingConfig
    with pytest.raises(TypeError, match="is registered already"):
        register_objective(Reverse)
    with pytest.raises(TypeError, match="config_class must be the objective's config dataclass"):
        register_objective(Unconfigured)
    with pytest.raises(TypeError, match="flag --seq-len sets seq_len"):
        register_objective(Clashing)
    with pytest.raises(TypeError, match="not a subclass"):
        register_objective(dict)
    assert list(OBJECTIVES)[-1] == "reverse" and list(OBJECTIVES).count("reverse") == 1
    assert "unconfigured" not in OBJECTIVES and "clashing" not in OBJECTIVES


def test_its_flags_and_help_come_from_its_config_fields(registered, tmp_path):
    from pipelines.options import parse_args
    from pipelines.parser import build_parser

    flags = {f.flag: f for f in objective_flags()}
    assert flags["--reverse-window"] == ("--reverse-window", "window", int, ("reverse",),
                                         "tokens reversed together (8)")
    sharing = tuple(name for name, cls in OBJECTIVES.items()
                    if "seq_len" in {f.name for f in dataclasses.fields(cls.config_class)})
    assert flags["--seq-len"].objectives == sharing and sharing[-1] == "reverse"
    assert flags["--seq-len"].help.startswith("tokens per example (")
    assert flags["--seq-len"].help.endswith(", reverse 64)")
    text = " ".join(build_parser().format_help().split())
    assert "--reverse-window WINDOW tokens reversed together (8) [reverse]" in text
    first, *others, last = list(OBJECTIVES)
    assert f"--objective OBJECTIVE {first} (default), {', '.join(others)} or {last}" in text and last == "reverse"
    base = ["--input", str(CORPUS), "--tokenizer", TOKENIZER, "--output", str(tmp_path / "o")]
    options = parse_args([*base, "--objective", "reverse", "--seq-len", "16", "--reverse-window", "3"])
    assert options.objective_params == {"seq_len": 16, "window": 3}
    assert options.param_sources == {"seq_len": "--seq-len 16", "window": "--reverse-window 3"}
    with pytest.raises(ValueError, match=r"^--reverse-window is not a parameter of objective clm \(it is for "
                                         r"reverse\)$"):
        parse_args([*base, "--reverse-window", "3"])


def test_its_config_errors_name_the_flag(registered, tmp_path, capsys):
    from pipelines.materialize import main

    argv = ["--input", str(CORPUS), "--tokenizer", TOKENIZER, "--output", str(tmp_path / "o"),
            "--objective", "reverse", "--reverse-window", "0"]
    assert main(argv) == 2
    assert capsys.readouterr().err.strip().endswith("--reverse-window 0: window must be an int >= 1, got 0")


def test_its_own_token_is_made_by_train_tokenizer_checked_by_the_plan_and_added_on_request(registered, tmp_path,
                                                                                           capsys):
    from tokenizers import Tokenizer

    from pipelines.options import parse_args
    from pipelines.plan import plan_run
    from pipelines.train_tokenizer import main as train
    from transforms.objectives.registry import tokens_needed

    assert tokens_needed().tokens == ("[R]", "[S]", "[X]", "[NLU]", "[S2S]", "[NLG]", MARK)
    trained = tmp_path / "trained.json"
    assert train(["--input", str(CORPUS), "--output", str(trained), "--vocab-size", "400", "--num-sentinels", "1",
                  "--max-documents", "20"]) == 0
    assert capsys.readouterr().out.strip() == (
        f"wrote {trained}: bpe, vocab 400, 13 special tokens (1 sentinel, the objectives' own tokens [R] [S] [X] "
        f"[NLU] [S2S] [NLG] {MARK}), trained on 20 documents")
    assert Tokenizer.from_file(str(trained)).token_to_id(MARK) == 12  # 5 roles, 1 sentinel, UL2's 6, then its own

    def plan(tokenizer, *extra):
        return plan_run(parse_args(["--input", str(CORPUS), "--tokenizer", str(tokenizer), "--output",
                                    str(tmp_path / "o"), "--objective", "reverse", "--seq-len", str(SEQ), *extra]))

    resolved = plan(trained).resolved
    assert (resolved.added, resolved.special.mode_tokens) == ([], {MARK: 12})
    with pytest.raises(ValueError) as refused:
        plan(TOKENIZER)
    assert str(refused.value) == (f"--tokenizer {TOKENIZER}: the tokenizer is short of special tokens: tokens "
                                  f"['{MARK}'] the objective needs as single ids are missing (pass "
                                  "--add-special-tokens to add what is missing)")
    resolved = plan(TOKENIZER, "--add-special-tokens").resolved
    assert (resolved.added, resolved.special.mode_tokens) == ([MARK], {MARK: MARK_ID})


@pytest.fixture(scope="module")
def dataset(registered, tmp_path_factory):
    out = tmp_path_factory.mktemp("reverse") / "data"
    manifest = materialize(out, *ARGS, "--runner", "FnApiRunner")
    return out, manifest


@pytest.mark.e2e
def test_multi_process_workers_write_the_same_bytes(dataset, tmp_path, monkeypatch):
    """Beam's worker processes unpickle the objective by reference: its module must be importable
    there (an installed package for a user; this directory on PYTHONPATH here)."""
    from lmshards_testing import file_digests

    out, manifest = dataset
    here = str(ROOT / "tests" / "transforms" / "objectives")
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([here, str(ROOT / "tests"), str(ROOT)]))
    other = materialize(tmp_path / "mp", *ARGS, "--direct_running_mode=multi_processing", "--direct_num_workers=2")
    assert file_digests(tmp_path / "mp") == file_digests(out)
    assert other.stats == manifest.stats


def _examples(out) -> dict[str, list[dict]]:
    from loaders.access.reader import open_dataset

    reader = open_dataset(str(out))
    return {split: list(reader.iter_examples(split)) for split in reader.manifest.splits}


@pytest.mark.e2e
def test_materialize_writes_its_examples_counters_and_summary(dataset):
    out, manifest = dataset
    assert manifest.objective == {"name": "reverse", "family": "seq2seq", "params": {"seq_len": SEQ, "window": WINDOW}}
    assert [c["name"] for c in manifest.schema["columns"]] == ["key", "inputs", "targets"]
    examples = _examples(out)
    raw_total = 0
    for split, rows in examples.items():
        windows = raw = padding = 0
        for row in rows:
            inputs, targets = [int(t) for t in row["inputs"]], [int(t) for t in row["targets"]]
            assert (len(inputs), len(targets), inputs[0]) == (SEQ + 2, SEQ + 1, MARK_ID)
            end = len(inputs) - inputs[::-1].index(EOS) - 1  # the appended EOS
            chunk = inputs[1:end]
            length = len(chunk)
            assert inputs[end:] == [EOS] + [PAD] * (SEQ - length), row["key"]
            assert targets == _reference(chunk, WINDOW) + [EOS] + [PAD] * (SEQ - length), row["key"]
            windows, raw, padding = windows + -(-length // WINDOW), raw + length, padding + 2 * (SEQ - length)
        counters = manifest.stats[split]["objective"]
        assert (counters["examples"], counters["tokens"], counters["windows"], counters["padding_tokens"]) == (
            len(rows), raw, windows, padding)
        assert manifest.stats[split]["objective_summary"] == {
            "examples": len(rows), "chunk_tokens": raw, "mean_chunk_tokens": round(raw / len(rows), 6),
            "padding_tokens": padding, "mean_windows_per_example": round(windows / len(rows), 6)}
        raw_total += raw
    # Every token of the corpus, each document ended by EOS, is in exactly one example (--last-chunk pad).
    texts = [json.loads(line)["text"] for line in CORPUS.read_text(encoding="utf-8").splitlines()]
    assert raw_total == sum(len(ids) + 1 for ids in encode_documents(texts, TOKENIZER))


def _out_of_place(rows: list[dict]) -> tuple[int, int]:
    """Plain Python: (target tokens not where the same input token is, raw tokens) of stored examples."""
    moved = raw = 0
    for row in rows:
        inputs, targets = [int(t) for t in row["inputs"]], [int(t) for t in row["targets"]]
        length = len(inputs) - inputs[::-1].index(EOS) - 2  # [REV] and the appended EOS are no chunk tokens
        moved += sum(inputs[1 + i] != targets[i] for i in range(length))
        raw += length
    return moved, raw


@pytest.mark.e2e
def test_inspect_validate_show_and_report_dispatch_to_its_hooks(dataset, capsys):
    out, manifest = dataset
    examples = _examples(out)
    own = {split: _out_of_place(rows) for split, rows in examples.items()}
    lines = {split: f"  reversed in windows of {WINDOW}: {moved:,} of {raw:,} tokens out of place = "
                    f"{moved / raw:.4f}" for split, (moved, raw) in own.items()}
    assert all(0 < moved < raw for moved, raw in own.values())
    assert cli(["validate", str(out)]) == 0
    assert "validate: OK" in capsys.readouterr().out
    assert cli(["inspect", str(out), "--json", "--limit", "0"]) == 0
    summary = json.loads(capsys.readouterr().out)
    for split, info in summary["splits"].items():
        measured = info["measured"]
        counters = manifest.stats[split]["objective"]
        assert (measured["examples"], measured["raw_tokens"], measured["examples_with_issues"]) == (
            counters["examples"], counters["tokens"], 0)
        moved, raw = own[split]
        assert raw == counters["tokens"]
        assert measured["reverse"] == {"window": WINDOW,
                                       "mean_raw_tokens": round(counters["tokens"] / counters["examples"], 6),
                                       "out_of_place_tokens": moved, "out_of_place_share": round(moved / raw, 6)}
    assert cli(["show", str(out), "-n", "1", "--color", "never", "--split", "train", "--width", "0",
                "--no-legend"]) == 0
    first = examples["train"][0]
    header, *body = capsys.readouterr().out.rstrip("\n").split("\n")
    raw = len(first["inputs"]) - list(first["inputs"])[::-1].index(EOS) - 2  # [REV] and EOS are no chunk tokens
    assert header == (f"── {first['key']}  split=train  shard=0  row=0  inputs={raw + 2}  targets={raw + 1}  "
                      + (f"padding={2 * (SEQ - raw)}  " if raw < SEQ else "") + f"windows={-(-raw // WINDOW)}")
    shown: dict[str, str] = {}  # line name -> its text, continuation lines joined
    for line in body:
        named = re.match(r"^ *(inputs|targets|turned back): (.*)$", line)
        if named:
            name = named.group(1)
            shown[name] = named.group(2)
        else:
            shown[name] += "\n" + line[len("turned back: "):]
    assert list(shown) == ["inputs", "targets", "turned back"]
    # its own line: the chunk again, between its own token and EOS in the inputs
    assert f"{MARK}{shown['turned back']}</s>" == shown["inputs"] != shown["targets"]
    assert summary["tokenizer"]["mode_tokens"] == {MARK: MARK_ID}  # the manifest's key for an objective's own tokens
    assert cli(["inspect", str(out)]) == 0
    table = capsys.readouterr().out
    assert "reverse" in table and f"{manifest.splits['train']['examples']:,}" in table
    assert [line for line in table.splitlines() if line.startswith("tokenizer")][0].endswith(
        f"  sentinels 128  objective tokens {MARK}={MARK_ID}")
    assert [line for line in table.splitlines() if "out of place" in line] == [lines["train"], lines["validation"]]
    assert cli(["report", str(out), "-o", str(out / "report.html"), "--examples", "2"]) == 0
    page = (out / "report.html").read_text(encoding="utf-8")
    assert page.count('class="example"') == 2 and first["key"] in page
    assert page.count('<span class="name">turned back</span>') == 2  # its example_lines hook, in the report too
    assert f'<li><span class="seg mode">{MARK}</span> a token of the objective&#x27;s own</li>' in page  # legend
    assert all(line in page for line in lines.values())
    assert f"[R] [S] [X] [NLU] [S2S] [NLG] {MARK} in the tokenizer; used by the objective: {MARK}={MARK_ID}" in page


@pytest.mark.e2e
def test_a_bug_in_its_hook_prints_a_traceback_not_a_damaged_dataset(dataset, capsys, tmp_path):
    """A plain exception from an objective's inspection hook is a bug: its traceback, exit 3;
    a damaged dataset stays one line (tests/pipelines/test_damaged_datasets.py)."""
    out, _ = dataset

    class BuggyReverse(Reverse):
        def count_measured(self, ctx) -> None:
            ctx.stats.counts["issues_per_token"] += ctx.anatomy.raw_tokens // len(ctx.anatomy.issues)  # 1 // 0

    unregister_objective("reverse")
    register_objective(BuggyReverse)
    try:
        for argv in (["inspect", str(out)], ["report", str(out), "-o", str(tmp_path / "r.html")]):
            assert cli(argv) == 3
            err = capsys.readouterr().err
            assert err.startswith(f"lmshards {argv[0]}: internal error: ZeroDivisionError: integer division or "
                                  "modulo by zero (a bug in lmshards or in the objective 'reverse', not a damaged "
                                  "dataset); traceback:\nTraceback (most recent call last):\n"), err
            assert ", in count_measured\n" in err and err.rstrip().endswith("ZeroDivisionError: integer division or "
                                                                              "modulo by zero")
            assert "run 'lmshards validate" not in err
    finally:
        unregister_objective("reverse")
        register_objective(Reverse)
    shard = next((out / "train" / "arrow").glob("*.arrow"))
    data = shard.read_bytes()
    try:
        shard.write_bytes(data[: len(data) // 2])
        assert cli(["inspect", str(out)]) == 1
        err = capsys.readouterr().err
        assert len(err.strip().splitlines()) == 1 and err.startswith("lmshards inspect: error: ")
        assert "Traceback" not in err
    finally:
        shard.write_bytes(data)


@pytest.mark.e2e
def test_validate_reports_its_own_invariant_on_a_bad_example(dataset):
    from loaders.inspection.anatomy import ObjectiveView, take_apart
    from loaders.inspection.checks import example_problems
    from loaders.inspection.source import open_inspected

    out, _ = dataset
    ds = open_inspected(str(out))
    view = ds.view
    example = dict(_examples(out)["train"][0])
    assert example_problems("train", example, take_apart(example, view), view, ds.seed) == []
    targets = np.array(example["targets"])
    targets[[0, 1]] = targets[[1, 0]]
    swapped = {**example, "targets": targets}
    assert example_problems("train", swapped, take_apart(swapped, view), view, ds.seed) == [
        f"targets are not the inputs reversed in windows of {WINDOW}"]
    inputs = np.array(example["inputs"])
    inputs[inputs == EOS] = 2
    broken = take_apart({**example, "inputs": inputs}, ObjectiveView(view.objective, view.special))
    assert broken.issues == ["inputs do not end with EOS"]
    inputs = np.array(example["inputs"])
    inputs[0] = 2
    unmarked = take_apart({**example, "inputs": inputs}, ObjectiveView(view.objective, view.special))
    assert unmarked.issues == ["inputs do not start with [REV]"]


@pytest.mark.e2e
def test_the_loader_collates_it_with_its_decoder_start(dataset):
    from loaders.collation.collate import collator_for
    from loaders.collation.collate_encoder import Seq2SeqCollator
    from loaders.dataset import ShardedDataset

    out, _ = dataset
    ds = ShardedDataset(str(out), "train", batch_size=2, shuffle=False)
    collator = collator_for(ds)
    assert type(collator) is Seq2SeqCollator and (collator.pad_id, collator.decoder_start_id) == (PAD, EOS)
    rows = _examples(out)["train"][:2]
    batch = collator(rows)
    targets = np.stack([np.asarray(r["targets"]) for r in rows])
    assert batch["decoder_input_ids"][:, 0].tolist() == [EOS, EOS]
    assert np.array_equal(batch["decoder_input_ids"][:, 1:].numpy(), targets[:, : batch["labels"].shape[1] - 1])
    width = batch["labels"].shape[1]
    assert np.array_equal(batch["labels"].numpy(), np.where(targets == PAD, -100, targets)[:, :width])
    from loaders.integrations.hf import model_config_kwargs

    assert model_config_kwargs(ds)["decoder_start_token_id"] == EOS
    first = next(iter(ds))
    assert first["key"] == rows[0]["key"] and np.array_equal(np.asarray(first["targets"]), rows[0]["targets"])
