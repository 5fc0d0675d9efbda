"""Pure parts of :mod:`loaders.inspection`: the expected span-length law, chart ticks, the
colour decision, the objective rebuilt from a manifest, rendering of hand-made examples,
and reading a dataset through a URL (the loader's file layer). The commands themselves are
tested end to end in tests/pipelines/test_inspect.py."""

from __future__ import annotations

import io
import os
import uuid
from collections import Counter

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from lmshards_testing import write_arrow

from loaders.inspection.anatomy import ObjectiveView, take_apart
from loaders.inspection.checks import example_problems
from loaders.inspection.render import render_example, to_text
from loaders.inspection.source import Located, objective_from_manifest, open_inspected
from loaders.inspection.svg import Series, bar_chart, nice_ticks
from pipelines.inspect import use_color
from transforms.objectives.base import build_example
from transforms.objectives.common import SpecialIds
from transforms.objectives.layout import example_digests, example_randoms
from transforms.objectives.randoms import compositions
from transforms.objectives.registry import make_objective
from transforms.objectives.span_views import composition_pmf, expected_span_lengths, restored_chunk
from transforms.objectives.spans import NOISE_STREAM

SPECIAL = SpecialIds(vocab_size=100, pad=0, eos=1, bos=2, mask=4, sentinels=tuple(range(10, 20)),
                     mode_tokens={"[R]": 20, "[S]": 21, "[X]": 22}, all_special=frozenset(range(0, 23)))


@given(st.integers(2, 200), st.integers(1, 40))
def test_composition_law_is_a_distribution_with_mean_total_over_parts(total, parts):
    parts = min(parts, total)
    pmf = [composition_pmf(total, parts, k) for k in range(1, total + 1)]
    assert sum(pmf) == pytest.approx(1.0)
    assert sum(k * p for k, p in zip(range(1, total + 1), pmf)) == pytest.approx(total / parts)


def test_expected_span_lengths_match_t5_masks_drawn_many_times():
    # a 60-token chunk at r=.3, mu=3: 18 noise tokens in 6 spans, T5's uniform composition
    runs = compositions(example_digests(0, [f"m{i}" for i in range(3000)]).randoms, NOISE_STREAM, 18, 6)
    measured: Counter = Counter(runs.reshape(-1).tolist())
    expected = expected_span_lengths(Counter({(18, 6): 3000}))
    for length in (1, 2, 3, 5):
        assert measured[length] == pytest.approx(expected[length], rel=0.06)


def test_ticks_and_chart_carry_the_values():
    assert nice_ticks(93)[-1] >= 93 and nice_ticks(0.8) == [0.0, 0.2, 0.4, 0.6000000000000001, 0.8]
    svg = bar_chart("t", ["a", "b"], [Series("m", [3.0, None], "#000"), Series("e", [1.0, 2.0], "#f00", "line")])
    assert svg.count('class="bar"') == 1 and svg.count('class="marker"') == 2 and "<polyline" in svg


class _Stream(io.StringIO):
    def __init__(self, tty: bool):
        super().__init__()
        self._tty = tty

    def isatty(self) -> bool:
        return self._tty


def test_colour_only_on_a_terminal_without_no_color(monkeypatch):
    monkeypatch.delenv("NO_COLOR", raising=False)
    assert use_color("auto", _Stream(True)) and not use_color("auto", _Stream(False))
    monkeypatch.setenv("NO_COLOR", "1")
    assert not use_color("auto", _Stream(True)) and use_color("always", _Stream(False))
    assert not use_color("never", _Stream(True))


@pytest.mark.parametrize("name, params", [
    ("clm", {"seq_len": 32}),
    ("prefix_lm", {"seq_len": 32}),
    ("mlm", {"seq_len": 32, "frame": True, "whole_word_mask": True, "mask_ratio": 0.7, "keep_ratio": 0.2}),
    ("span_corruption", {"inputs_length": 64, "noise_density": 0.3, "mean_noise_span_length": 5.0}),
    ("bart", {"seq_len": 32, "rotate": 0.5, "poisson_lambda": 2.0}),
    ("ul2", {"inputs_length": 64, "layout": "decoder", "targets_length": 70}),
    ("ul2", {"inputs_length": 64, "mixture": "paper"}),
])
def test_objective_rebuilt_from_the_manifest_has_the_same_parameters(name, params):
    objective = make_objective(name, params)
    rebuilt = objective_from_manifest({"name": name, "params": objective.params()})
    assert rebuilt.params() == objective.params()


class _Ids:
    """A stand-in tokenizer: token ``i`` decodes to ``.i``."""

    def decode(self, ids, skip_special_tokens=False):
        return "".join(f".{i}" for i in ids)


def _view(name: str, **params) -> ObjectiveView:
    return ObjectiveView(make_objective(name, params), SPECIAL)


def test_mlm_example_renders_each_replacement_and_replays():
    view = _view("mlm", seq_len=12)
    chunk = np.arange(30, 42, dtype=np.int32)
    key = "train-b00001-c000001-d0"
    example = {"key": key, **build_example(make_objective("mlm", {"seq_len": 12}), chunk, SPECIAL,
                                           example_randoms(0, [key]))[0]}
    a = take_apart(example, view)
    assert example_problems("train", example, a, view, seed=0) == []
    text = to_text(render_example(Located("train", 0, 0, example), a, view), _Ids())
    assert "[MASK:" in text and "\x1b[" not in text
    example["labels"] = example["labels"].copy()
    # a selected token left in place (or replaced at random): at a mask the label is all there is
    position = int(np.flatnonzero((example["labels"] >= 0) & (example["input_ids"] != SPECIAL.mask))[0])
    example["labels"][position] += 1  # the model would be taught the wrong token
    bad = take_apart(example, view)
    assert example_problems("train", example, bad, view, seed=0)


def test_span_example_renders_sentinels_spans_and_the_restored_chunk():
    view = _view("span_corruption", inputs_length=10, noise_density=0.3, mean_noise_span_length=2.0)
    example = {"key": "train-x-c1-d0", "inputs": np.array([30, 10, 33, 11, 1, 0, 0, 0, 0, 0], np.int32),
               "targets": np.array([10, 31, 32, 11, 34, 1], np.int32)}
    a = take_apart(example, view)
    assert a.issues == [] and a.parts.span_lengths.tolist() == [2, 1] and a.raw_tokens == 5 and a.padding == 5
    assert restored_chunk(a, view.special).tolist() == [30, 31, 32, 33, 34]
    lines = to_text(render_example(Located("train", 0, 0, example), a, view), _Ids()).splitlines()
    assert lines[1:] == ["  inputs: .30.10.33.11.1", " targets: .10.31.32.11.34.1",
                         "restored: .30[<extra_id_0>:.31.32].33[<extra_id_1>:.34].1"]
    colour = to_text(render_example(Located("train", 0, 0, example), a, view), _Ids(), color=True)
    assert "\x1b[1;33m.10\x1b[0m" in colour  # <extra_id_0> and its span share a colour
    swapped = {**example, "inputs": example["inputs"][[0, 3, 2, 1, 4, 5, 6, 7, 8, 9]]}
    assert "sentinels out of order" in take_apart(swapped, view).issues[0]


def test_decoder_example_marks_documents_prefix_and_padding():
    view = _view("prefix_lm", seq_len=8)
    example = {"key": "train-x-c1-d0", "input_ids": np.array([30, 31, 1, 33, 34, 35, 0, 0], np.int32),
               "doc_lengths": np.array([3, 3], np.int32), "prefix_length": 4}
    a = take_apart(example, view)
    line = to_text(render_example(Located("train", 0, 0, example), a, view), _Ids()).splitlines()[1]
    assert line == "input_ids: .30.31.1[/doc].33[/prefix].34.35.0*2"  # format 2: one prefix per row
    packed = {**example, "prefix_length": None, "prefix_lengths": np.array([1, 2], np.int32)}
    del packed["prefix_length"]
    a = take_apart(packed, view)
    assert not a.issues and a.prefix_length == 3
    line = to_text(render_example(Located("train", 0, 0, packed), a, view), _Ids()).splitlines()[1]
    assert line == "input_ids: .30[/prefix].31.1[/doc].33.34[/prefix].35.0*2"  # each document its own prefix
    bad = take_apart({**packed, "prefix_lengths": np.array([3, 1], np.int32)}, view)
    assert "outside [1, d-1]" in bad.issues[0]


def test_a_dataset_behind_a_url_is_read_through_the_loader_file_layer(tmp_path, monkeypatch):
    """A URL goes through loaders.access.files (fsspec, local cache): here fsspec's in-memory filesystem."""
    import fsspec

    from loaders.inspection.validate import validate_dataset

    monkeypatch.setenv("HOME", str(tmp_path))  # the loader's default cache lives under ~/.cache
    view = _view("clm", seq_len=4)
    examples = [{"key": f"train-b00000-c{i:06d}-d0", "input_ids": np.arange(30 + i, 34 + i, dtype=np.int32),
                 "doc_lengths": np.array([4], np.int32)} for i in range(3)]
    buffer = io.BytesIO()
    write_arrow(buffer, examples, view.schema)
    root = f"memory://inspection-{uuid.uuid4().hex}"
    fs = fsspec.filesystem("memory")
    fs.pipe(f"{root}/train/arrow/data-00000-of-00001.arrow", buffer.getvalue())
    import json

    from schemas.manifest import Manifest, ShardFile, ShardInfo

    size = len(buffer.getvalue()) + 1  # a made-up size (that could still hold the 3 rows)
    shard = ShardInfo("train", 0, 3, 12, {"arrow": ShardFile("train/arrow/data-00000-of-00001.arrow", size, "x")})
    tokenizer_path = os.path.join(os.path.dirname(__file__), "..", "..", "data", "tokenizer.json")
    with open(tokenizer_path, "rb") as handle:
        fs.pipe(f"{root}/tokenizer.json", handle.read())
    manifest = Manifest(objective={"name": "clm", "family": "decoder", "params": {"seq_len": 4}},
                        config={"seed": 0, "formats": ["arrow"]}, tokenizer={"file": "tokenizer.json", "sha256": "x",
                                                                              "special_ids": {"pad": 0, "eos": 1}},
                        schema=view.schema.to_metadata(), counts={},
                        splits={"train": {"examples": 3, "tokens": 12, "num_shards": 1, "shards": [shard.to_json()]}})
    fs.pipe(f"{root}/manifest.json", json.dumps(manifest.to_json()).encode())
    ds = open_inspected(root)
    ds.verify_reads = False  # the manifest's sizes and checksums are made up: validate reports them below
    assert [located.example["key"] for located in ds.iter_split("train")] == [e["key"] for e in examples]
    found = Counter(p.check for p in validate_dataset(ds).problems)
    assert found["checksum"] == 2 and found["size"] == 1  # the made-up sha256 values and size are caught
