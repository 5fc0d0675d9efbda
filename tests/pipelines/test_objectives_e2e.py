"""End-to-end tests of every objective: the pipeline on the sample corpus, checked on the written shards.

Each objective runs once on the whole sample corpus (train + validation). Every example is
read back with :mod:`loaders.access.reader` and turned back into the raw chunk it was made from
(span corruption: inputs and targets interleaved at the sentinels; BART: targets; MLM:
labels over the inputs; UL2: per denoiser), which must (1) satisfy the objective's
invariants, (2) concatenate, in chunk-key order, into the documents of each packing
bucket, and (3) add up to the counters of the manifest, recomputed here without the
objective code. The rest checks the CLI surface: ``--draws``, ``--config`` files, custom UL2
mixtures, one-line errors, and byte-identical output across Beam runner modes.
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import io
import json
import re

import numpy as np
import pytest
from lmshards_testing import ROOT, encode_documents, file_digests, materialize
from tokenizers import Tokenizer

from loaders.access.reader import open_dataset
from schemas.manifest import Manifest
from transforms.tokenizing.tokenize import assign_split, bucket_of, document_key

SEQ = 128
NUM_BUCKETS = 8
VALIDATION = 0.1
SUBSET = str(ROOT / "data" / "sample" / "faq.jsonl")  # 185 documents: enough for the quick runs
OBJECTIVE_ARGS = {
    "clm": ["--seq-len", str(SEQ)],
    "prefix_lm": ["--seq-len", str(SEQ)],
    "mlm": ["--seq-len", str(SEQ), "--whole-word-mask", "--frame"],
    "span_corruption": ["--inputs-length", str(SEQ)],
    "bart": ["--seq-len", str(SEQ)],
    "ul2": ["--inputs-length", str(SEQ)],
}
OBJECTIVES = list(OBJECTIVE_ARGS)
RUNNER_MODES = {
    "multi_processing": ["--direct_running_mode=multi_processing", "--direct_num_workers=2"],
    "bundle_repeat": ["--direct_runner_bundle_repeat=1"],
}
IGNORE = -100


def _args(objective: str, inputs: str, tokenizer: str, *extra: str) -> list[str]:
    return ["--input", inputs, "--tokenizer", tokenizer, "--objective", objective, *OBJECTIVE_ARGS[objective],
            "--num-buckets", str(NUM_BUCKETS), "--formats", "arrow,webdataset", *extra]


@dataclasses.dataclass(frozen=True)
class Ids:
    """Token ids of a written dataset, read from its own tokenizer.json."""

    pad: int
    eos: int
    bos: int
    mask: int
    cls: int
    sep: int
    sentinels: dict[int, int]  # id -> k of <extra_id_k>
    modes: dict[str, int]
    special: frozenset[int]

    @classmethod
    def of(cls, out) -> Ids:
        tokenizer = Tokenizer.from_file(str(out / "tokenizer.json"))
        vocab = tokenizer.get_vocab(with_added_tokens=True)
        decoder = tokenizer.get_added_tokens_decoder()
        return cls(
            pad=vocab["<pad>"], eos=vocab["</s>"], bos=vocab["<s>"], mask=vocab["<mask>"], cls=vocab["<s>"],
            sep=vocab["</s>"],
            sentinels={i: int(m.group(1)) for t, i in vocab.items() if (m := re.fullmatch(r"<extra_id_(\d+)>", t))},
            modes={t.content: i for i, t in decoder.items() if re.fullmatch(r"\[[A-Z0-9]+\]", t.content)},
            special=frozenset(i for i, t in decoder.items() if t.special),
        )


@dataclasses.dataclass
class Dataset:
    name: str
    out: object
    manifest: Manifest
    ids: Ids
    examples: dict[str, list[dict]]


def _load(name, out, manifest) -> Dataset:
    reader = open_dataset(str(out))
    examples = {
        split: [{k: np.array(v) if isinstance(v, np.ndarray) else v for k, v in ex.items()}
                for ex in reader.iter_examples(split)]
        for split in manifest.splits
    }
    return Dataset(name, out, manifest, Ids.of(out), examples)


@pytest.fixture(scope="module", params=OBJECTIVES)
def dataset(request, tmp_path_factory, sample_glob, tokenizer_path) -> Dataset:
    out = tmp_path_factory.mktemp(request.param) / "out"
    manifest = materialize(out, *_args(request.param, sample_glob, tokenizer_path, "--validation-fraction",
                                       str(VALIDATION), "--num-shards", "2"))
    return _load(request.param, out, manifest)


@pytest.fixture(scope="module")
def streams(sample_texts, tokenizer_path) -> dict[tuple[str, int], np.ndarray]:
    """The token stream of every (split, bucket): unique documents in key order, EOS after each."""
    eos = Tokenizer.from_file(tokenizer_path).token_to_id("</s>")
    parts = collections.defaultdict(list)
    seen = set()
    pairs = sorted(zip(sample_texts, encode_documents(sample_texts, tokenizer_path)), key=lambda p: document_key(p[0]))
    for text, ids in pairs:
        key = document_key(text)
        if key not in seen:
            seen.add(key)
            parts[(assign_split(key, VALIDATION), bucket_of(key, NUM_BUCKETS))].append(np.append(ids, eos))
    return {k: np.concatenate(v) for k, v in parts.items()}


# --- from an example back to its chunk, with the counters the manifest should hold ---------------------------------


def _unpad(values: np.ndarray, pad: int) -> np.ndarray:
    kept = np.flatnonzero(values != pad)
    return values[: kept[-1] + 1] if kept.size else values[:0]


def _interleave(inputs: np.ndarray, targets: np.ndarray, ids: Ids) -> tuple[np.ndarray, list[int]]:
    """T5 layout back to the chunk: each sentinel of ``inputs`` replaced by its span of ``targets``."""
    assert inputs[-1] == ids.eos and targets[-1] == ids.eos
    inputs, targets = inputs[:-1].tolist(), targets[:-1].tolist()
    in_inputs = [t for t in inputs if t in ids.sentinels]
    starts = [i for i, t in enumerate(targets) if t in ids.sentinels]
    assert [ids.sentinels[t] for t in in_inputs] == list(range(len(in_inputs)))  # <extra_id_0>, 1, ... in order
    assert [targets[i] for i in starts] == in_inputs and (not targets or starts[0] == 0)
    spans = [targets[a + 1 : b] for a, b in zip(starts, [*starts[1:], len(targets)])]
    assert all(spans), "empty noise span"
    if spans:  # runs alternate, clean run first and noise run last, none empty
        assert inputs[0] not in ids.sentinels and inputs[-1] in ids.sentinels
        assert not any(a in ids.sentinels and b in ids.sentinels for a, b in zip(inputs, inputs[1:]))
    chunk = []
    for token in inputs:
        chunk.extend(spans[ids.sentinels[token]] if token in ids.sentinels else [token])
    return np.array(chunk, dtype=np.int32), [len(s) for s in spans]


def _span_counters(raw: int, inputs: int, targets: int, spans: list[int], prefix: str = "") -> dict[str, int]:
    counters = {"examples": 1, "raw_tokens": raw, "noise_tokens": sum(spans), "noise_spans": len(spans),
                "inputs_tokens": inputs, "targets_tokens": targets}
    for length in spans:
        name = f"span_len_hist_{min(length, 64)}"
        counters[name] = counters.get(name, 0) + 1
    return {prefix + k: v for k, v in counters.items()}


def _rebuild_decoder(ds: Dataset, ex: dict) -> tuple[np.ndarray, dict[str, int]]:
    length = int(ex["doc_lengths"].sum())
    assert (ex["doc_lengths"] > 0).all() and length <= SEQ and (ex["input_ids"][length:] == ds.ids.pad).all()
    chunk = ex["input_ids"][:length]
    counters = {"examples": 1, "tokens": length, "padding_tokens": SEQ - length}
    if ds.name == "clm":
        counters["documents_segments"] = len(ex["doc_lengths"])
    else:
        prefixes, docs = ex["prefix_lengths"].tolist(), ex["doc_lengths"].tolist()
        assert len(prefixes) == len(docs)  # a prefix per packed document segment
        # a 1-token segment (or piece, --packing none) has nothing to predict
        assert all(1 <= p <= max(1, d - 1) for p, d in zip(prefixes, docs, strict=True))
        prefix = sum(prefixes)
        counters.update(prefix_tokens=prefix, suffix_tokens=length - prefix)
    return chunk, counters


def _rebuild_mlm(ds: Dataset, ex: dict) -> tuple[np.ndarray, dict[str, int]]:
    ids, inputs, labels = ds.ids, ex["input_ids"], ex["labels"]
    selected = labels != IGNORE
    framed = np.where(selected, labels, inputs)
    length = len(_unpad(framed, ids.pad))
    assert (inputs[length:] == ids.pad).all()
    frame = int(ds.manifest.objective["params"]["frame"])
    if frame:
        assert framed[0] == ids.cls and framed[length - 1] == ids.sep
    is_special = np.isin(framed, list(ids.special))
    assert not (selected & is_special).any(), "a special token was selected"
    replaced = inputs[selected]
    assert not np.isin(replaced[replaced != ids.mask], list(ids.special)).any(), "a special random replacement"
    masked = int((replaced == ids.mask).sum())
    changed = int(((replaced != ids.mask) & (replaced != labels[selected])).sum())
    counters = {"examples": 1, "tokens": length, "padding_tokens": SEQ - length,
                "maskable_tokens": int((~is_special[:length]).sum()), "selected": int(selected.sum()),
                "masked": masked, "random+kept": int(selected.sum()) - masked, "changed": changed}
    return framed[frame : length - frame], counters


def _rebuild_span_corruption(ds: Dataset, ex: dict) -> tuple[np.ndarray, dict[str, int]]:
    params = ds.manifest.objective["params"]
    inputs, targets = _unpad(ex["inputs"], ds.ids.pad), _unpad(ex["targets"], ds.ids.pad)
    assert len(ex["inputs"]) == params["inputs_length"] and len(ex["targets"]) == params["targets_length"]
    chunk, spans = _interleave(inputs, targets, ds.ids)
    assert len(chunk) <= params["raw_length"] and len(inputs) <= params["inputs_length"]
    if len(chunk) == params["raw_length"]:  # a full chunk fills the inputs budget exactly
        assert len(inputs) == params["inputs_length"]
    counters = _span_counters(len(chunk), len(inputs), len(targets), spans)
    counters["partial_examples"] = int(len(chunk) < params["raw_length"])
    return chunk, counters


def _rebuild_bart(ds: Dataset, ex: dict) -> tuple[np.ndarray, dict[str, int]]:
    ids, inputs, targets = ds.ids, ex["inputs"], ex["targets"]
    params = ds.manifest.objective["params"]
    assert targets[0] == inputs[0] == ids.bos and targets[-1] == inputs[-1] == ids.eos
    assert len(targets) <= SEQ and 2 <= len(inputs) <= SEQ + np.ceil(SEQ * params["insert"])
    # Noise never removes, moves out of frame or produces a special token other than <mask>.
    specials = collections.Counter(t for t in inputs.tolist() if t in ids.special and t != ids.mask)
    assert specials == collections.Counter(t for t in targets.tolist() if t in ids.special)
    counters = {"examples": 1, "tokens": len(targets), "source_tokens": len(targets), "input_tokens": len(inputs),
                "mask_tokens": int((inputs == ids.mask).sum())}
    return targets[1:-1], counters


def _rebuild_ul2(ds: Dataset, ex: dict) -> tuple[np.ndarray, dict[str, int]]:
    params = ds.manifest.objective["params"]
    denoiser = {d["name"]: d for d in params["mixture"]}[ex["denoiser"]]
    if params["layout"] == "decoder":
        total = int(ex["doc_lengths"].sum())
        (cut,) = ex["prefix_lengths"].tolist()  # one segment: the inputs
        inputs, targets = ex["input_ids"][:cut], ex["input_ids"][cut:total]
        assert len(ex["input_ids"]) == params["seq_len"] and (ex["input_ids"][total:] == ds.ids.pad).all()
    else:
        inputs, targets = ex["inputs"], ex["targets"]
    assert inputs[0] == ds.ids.modes[denoiser["mode_token"]], "the mode token comes first"
    modes = list(ds.ids.modes.values())
    assert not np.isin(inputs[1:], modes).any() and not np.isin(targets, modes).any()
    assert len(inputs) <= params["inputs_length"] and len(targets) <= params["targets_length"]
    if denoiser["kind"] == "span":
        chunk, spans = _interleave(inputs[1:], targets, ds.ids)
        if len(chunk) == denoiser["raw_length"]:  # a full chunk fills the budget, mode token included
            assert len(inputs) == params["inputs_length"]
    else:
        assert inputs[-1] == targets[-1] == ds.ids.eos and len(inputs) >= 3 and len(targets) >= 2
        chunk, spans = np.concatenate([inputs[1:-1], targets[:-1]]), [len(targets) - 1]
    assert len(chunk) <= denoiser["raw_length"]
    prefix = f"denoiser/{ex['denoiser']}/"
    own = _span_counters(len(chunk), len(inputs), len(targets), spans)
    counters = {k: v for k, v in own.items() if "hist_" not in k}  # histograms are per span denoiser only
    counters.update({prefix + k: v for k, v in own.items() if denoiser["kind"] == "span" or "hist_" not in k})
    if params["layout"] == "decoder":
        counters["padding_tokens"] = params["seq_len"] - len(inputs) - len(targets)
    return chunk, counters


REBUILD = {"clm": _rebuild_decoder, "prefix_lm": _rebuild_decoder, "mlm": _rebuild_mlm,
           "span_corruption": _rebuild_span_corruption, "bart": _rebuild_bart, "ul2": _rebuild_ul2}


def _rebuilt(ds: Dataset, split: str) -> list[tuple[str, np.ndarray, dict[str, int]]]:
    out = []
    for ex in ds.examples[split]:
        chunk, counters = REBUILD[ds.name](ds, ex)
        counters["chunk_tokens"] = len(chunk)
        out.append((ex["key"], chunk, counters))
    return out


def _parse_key(key: str) -> tuple[str, str, int, int]:
    split, where, chunk, draw = key.split("-")
    return split, where, int(chunk[1:]), int(draw[1:])


def _sum(counter_dicts) -> dict[str, int]:
    total: collections.Counter = collections.Counter()
    for counters in counter_dicts:
        total.update(counters)
    return dict(total)


def _share(a: int, b: int) -> float:
    return round(a / b, 6)


# --- per objective, on the full sample corpus ----------------------------------------------------------------------


def test_chunks_rebuild_the_document_stream(dataset, streams):
    ds = dataset
    for split in ("train", "validation"):
        chunks = collections.defaultdict(dict)
        for key, chunk, _ in _rebuilt(ds, split):
            key_split, where, index, draw = _parse_key(key)
            assert (key_split, draw) == (split, 0) and index not in chunks[where]
            chunks[where][index] = chunk
        lengths = {len(c) for where in chunks.values() for c in where.values()}
        raw = max(lengths)
        if ds.name != "ul2":
            assert lengths == {raw}  # one raw length: 128, or 126 with <s>/</s> or [CLS]/[SEP] framing
        rests = []
        for bucket in range(NUM_BUCKETS):
            stream = streams.get((split, bucket), np.zeros(0, np.int32))
            got = chunks.pop(f"b{bucket:05d}", {})
            assert sorted(got) == list(range(len(got)))
            joined = np.concatenate([got[i] for i in range(len(got))]) if got else np.zeros(0, np.int32)
            np.testing.assert_array_equal(joined, stream[: len(joined)])
            if ds.name != "ul2":
                assert len(got) == len(stream) // raw
            rests.append(stream[len(joined) :])
        rest, got = np.concatenate(rests), chunks.pop("r", {})
        assert not chunks and sorted(got) == list(range(len(got)))
        joined = np.concatenate([got[i] for i in range(len(got))]) if got else np.zeros(0, np.int32)
        np.testing.assert_array_equal(joined, rest[: len(joined)])
        dropped = len(rest) - len(joined)
        if ds.name == "ul2":
            raw = max(d["raw_length"] for d in ds.manifest.objective["params"]["mixture"])
        assert ds.manifest.splits[split]["dropped_tokens"] == dropped and 0 <= dropped < raw


def test_manifest_statistics_equal_counts_from_the_shards(dataset):
    ds = dataset
    for split in ("train", "validation"):
        expected = _sum(counters for _, _, counters in _rebuilt(ds, split))
        counters = ds.manifest.stats[split]["objective"]
        summary = ds.manifest.stats[split]["objective_summary"]
        examples = len(ds.examples[split])
        assert ds.manifest.splits[split]["examples"] == examples == expected["examples"] == summary["examples"]
        assert ds.manifest.splits[split]["tokens"] == expected["chunk_tokens"] == summary["chunk_tokens"]
        if ds.name == "mlm":
            random_kept, changed = expected.pop("random+kept"), expected.pop("changed")
            assert counters["random"] + counters["kept"] == random_kept
            assert changed <= counters["random"] <= changed + 3  # a random draw may equal the original
        if ds.name == "bart":  # spans are counted in words, which the shards do not show: check consistency
            assert counters["deleted"] - counters["inserted"] == expected["source_tokens"] - expected["input_tokens"]
            spans = sum(v for k, v in counters.items() if k.startswith("span_len_hist_"))
            assert spans == counters["masked_spans"] + counters["zero_length_spans"] > 0
        else:
            assert {k for k in counters if "hist_" in k} == {k for k in expected if "hist_" in k}
        assert {k: counters.get(k, 0) for k in expected} == expected
        _check_summary(ds, summary, expected)


def _check_summary(ds: Dataset, summary: dict, c: dict[str, int]) -> None:
    """The summary against values computed here from the shards' counts."""
    if ds.name == "clm":
        assert summary["mean_documents_per_example"] == _share(c["documents_segments"], c["examples"])
    elif ds.name == "prefix_lm":
        assert summary["prefix_share"] == _share(c["prefix_tokens"], c["tokens"])
        assert 0.4 < summary["prefix_share"] < 0.6  # the split point is uniform
    elif ds.name == "mlm":
        assert summary["noise_density"] == _share(c["selected"], c["maskable_tokens"])
        assert abs(summary["noise_density"] - 0.15) < 0.01 and summary["target"]["noise_density"] == 0.15
        assert summary["replacement"]["mask"] == _share(c["masked"], c["selected"])
        assert abs(summary["replacement"]["mask"] - 0.8) < 0.03
        assert abs(summary["replacement"]["random"] - 0.1) < 0.03 and abs(summary["replacement"]["keep"] - 0.1) < 0.03
    elif ds.name == "span_corruption":
        assert summary["noise_density"] == _share(c["noise_tokens"], c["raw_tokens"])
        assert abs(summary["noise_density"] - 0.15) < 0.005
        spans = summary["spans"]
        assert (spans["count"], spans["mean_length"]) == (c["noise_spans"], _share(c["noise_tokens"], c["noise_spans"]))
        histogram = {k[len("span_len_hist_") :]: v for k, v in c.items() if k.startswith("span_len_hist_")}
        assert spans["histogram"] == {(f">={k}" if k == "64" else f"{int(k):02d}"): v for k, v in histogram.items()}
        assert list(spans["histogram"]) == sorted(spans["histogram"], key=lambda k: int(k.lstrip(">=")))
    elif ds.name == "bart":
        assert summary["noise_tokens"]["mask"] == c["mask_tokens"]
        assert summary["length_ratio"] == _share(c["input_tokens"], c["source_tokens"])
        assert abs(summary["spans"]["mean_poisson_length"] - 3.5) < 0.35  # trimmed last spans pull it down a bit
        assert 0.2 < summary["masked_word_share"] <= summary["mask_budget_share"] < 0.32
    elif ds.name == "ul2":
        names = sorted({k.split("/")[1] for k in c if k.startswith("denoiser/")})
        assert summary["mix"]["by_examples"] == {n: _share(c[f"denoiser/{n}/examples"], c["examples"]) for n in names}
        assert summary["mix"]["by_raw_tokens"] == {
            n: _share(c[f"denoiser/{n}/raw_tokens"], c["raw_tokens"]) for n in names
        }
        for name in names:
            own = summary["denoisers"][name]
            assert own["noise_density"] == _share(c[f"denoiser/{name}/noise_tokens"], c[f"denoiser/{name}/raw_tokens"])
        modes = summary["mix"]["by_mode_token"]
        assert set(modes) == {"[R]", "[S]", "[X]"} and sum(m["examples"] for m in modes.values()) == pytest.approx(1)


def test_webdataset_shards_hold_the_same_examples(dataset):
    reader = open_dataset(str(dataset.out))
    for split in ("train", "validation"):
        tar = {ex["key"]: ex for ex in reader.iter_examples(split, "webdataset")}
        assert [ex["key"] for ex in dataset.examples[split]] == list(tar)
        for ex in dataset.examples[split]:
            assert set(ex) == set(tar[ex["key"]])
            for column, value in ex.items():
                np.testing.assert_array_equal(np.asarray(tar[ex["key"]][column]), np.asarray(value))


# --- the CLI surface, on a corpus subset ---------------------------------------------------------------------------


def test_draws_give_distinct_keys_and_noise_of_the_same_chunk(tmp_path, tokenizer_path):
    out = tmp_path / "draws"
    manifest = materialize(out, *_args("span_corruption", SUBSET, tokenizer_path, "--draws", "3"))
    ds = _load("span_corruption", out, manifest)
    by_chunk = collections.defaultdict(dict)
    for key, chunk, _ in _rebuilt(ds, "train"):
        by_chunk[key.rsplit("-", 1)[0]][_parse_key(key)[3]] = chunk
    noise = collections.defaultdict(set)
    for ex in ds.examples["train"]:
        noise[ex["key"].rsplit("-", 1)[0]].add(ex["inputs"].tobytes())
    assert manifest.config["draws"] == 3 and manifest.splits["train"]["examples"] == 3 * len(by_chunk) > 0
    for chunk_key, draws in by_chunk.items():
        assert sorted(draws) == [0, 1, 2]
        np.testing.assert_array_equal(draws[0], draws[1])
        np.testing.assert_array_equal(draws[0], draws[2])
        assert len(noise[chunk_key]) == 3, chunk_key


def test_config_files_give_the_same_bytes_as_flags(tmp_path, tokenizer_path):
    from pipelines.options import parse_args

    params = {"inputs_length": SEQ, "noise_density": 0.25, "mean_noise_span_length": 4}  # 4 records as 4.0
    yaml_text = "objective: span_corruption\n" + "".join(f"{k}: {v}\n" for k, v in params.items())
    (tmp_path / "sc.yaml").write_text(yaml_text)
    (tmp_path / "sc.json").write_text(json.dumps({"objective": "span_corruption", **params}))
    base = ["--input", SUBSET, "--tokenizer", tokenizer_path, "--num-buckets", "4"]
    flags = ["--objective", "span_corruption", "--inputs-length", str(SEQ), "--noise-density", "0.25",
             "--mean-noise-span-length", "4"]
    reference = materialize(tmp_path / "flags", *base, *flags)
    for name in ("sc.yaml", "sc.json"):
        manifest = materialize(tmp_path / f"out-{name}", *base, "--config", str(tmp_path / name))
        assert file_digests(tmp_path / f"out-{name}") == file_digests(tmp_path / "flags"), name
        assert manifest.deterministic_view() == reference.deterministic_view(), name
    recorded = reference.objective["params"]
    assert (recorded["noise_density"], recorded["mean_noise_span_length"], recorded["inputs_length"]) == (0.25, 4, SEQ)
    assert reference.stats["train"]["objective_summary"]["target"] == {"noise_density": 0.25, "mean_span_length": 4}
    # A flag wins over the file.
    options = parse_args([*base, "--output", "x", "--config", str(tmp_path / "sc.yaml"), "--noise-density", "0.3"])
    assert options.objective == "span_corruption" and options.objective_params["noise_density"] == 0.3


def test_custom_ul2_mixture_from_a_config_file(tmp_path, tokenizer_path):
    config = tmp_path / "ul2.yaml"
    config.write_text(
        "objective: ul2\n"
        f"inputs_length: {SEQ}\n"
        "layout: decoder\n"
        "mixture:\n"
        "  - {name: short, mode_token: '[NLU]', mean_noise_span_length: 2, noise_density: 0.2, weight: 3}\n"
        "  - {mode_token: '[S2S]', kind: prefix}\n"
    )
    out = tmp_path / "ul2"
    manifest = materialize(out, "--input", SUBSET, "--tokenizer", tokenizer_path, "--config", str(config))
    ds = _load("ul2", out, manifest)
    mixture = {d["name"]: (d["mode_token"], d["weight"]) for d in manifest.objective["params"]["mixture"]}
    assert mixture == {"short": ("[NLU]", 3), "S2S": ("[S2S]", 1.0)}
    assert manifest.schema["family"] == "decoder"
    rebuilt = _rebuilt(ds, "train")  # mode token first, chunk rebuilt, budgets kept (decoder layout)
    names = collections.Counter(ex["denoiser"] for ex in ds.examples["train"])
    summary = manifest.stats["train"]["objective_summary"]
    assert set(names) == {"short", "S2S"}
    assert summary["mix"]["by_examples"] == {n: _share(k, len(rebuilt)) for n, k in sorted(names.items())}
    assert summary["mix"]["weights"] == {"short": 0.75, "S2S": 0.25}
    assert abs(summary["mix"]["by_examples"]["short"] - 0.75) < 4 * np.sqrt(0.75 * 0.25 / len(rebuilt))
    expected = _sum(counters for _, _, counters in rebuilt)
    counters = manifest.stats["train"]["objective"]
    assert {k: counters.get(k, 0) for k in expected} == expected


@pytest.mark.parametrize(
    "args, config, message",
    [
        (["--objective", "span_corruption", "--noise-density", "1.5"], None, "--noise-density 1.5: noise_density"),
        (["--objective", "mlm", "--noise-density", "0.2"], None, "--noise-density is not a parameter of objective mlm"),
        (["--objective", "mlm", "--mask-ratio", "0.5"], None, "mask_ratio + random_ratio + keep_ratio must be 1"),
        (["--objective", "bart", "--bart-mask-length", "words"], None, "mask_length must be one of"),
        ([], "objective: span_corruption\nnoise_densty: 0.2\n", "unknown parameter(s) ['noise_densty']"),
        ([], "objective: ul2\nmixture: [{mode_token: '[R]', weight: -1}]\n", "weight must be a finite number > 0"),
        ([], "objective: ul2\nmixture: fancy\n", "unknown UL2 mixture preset 'fancy'"),
        ([], "objective: mlm\nwhole_word_mask: 'no'\n", "whole_word_mask must be bool, got 'no'"),
        ([], "objective: bart\nmask: '0.3'\n", "mask must be float, got '0.3'"),
    ],
)
def test_a_bad_parameter_fails_in_one_line_naming_it(tmp_path, tokenizer_path, args, config, message):
    from pipelines.materialize import main

    out = tmp_path / "never"
    if config is not None:
        (tmp_path / "bad.yaml").write_text(config)
        args = [*args, "--config", str(tmp_path / "bad.yaml")]
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        assert main(["--input", SUBSET, "--tokenizer", tokenizer_path, "--output", str(out), *args]) == 2
    assert message in err.getvalue()
    assert len(err.getvalue().strip().splitlines()) == 1 and not out.exists()


@pytest.mark.e2e
@pytest.mark.parametrize("objective", OBJECTIVES)
def test_bytes_identical_across_runner_modes(tmp_path, tokenizer_path, objective):
    args = _args(objective, SUBSET, tokenizer_path, "--num-shards", "2")
    reference = materialize(tmp_path / "in_process", *args)
    digests = file_digests(tmp_path / "in_process")
    assert any(path.endswith(".tar") for path in digests) and any(path.endswith(".arrow") for path in digests)
    for mode, beam_args in RUNNER_MODES.items():
        manifest = materialize(tmp_path / mode, *args, *beam_args)
        assert file_digests(tmp_path / mode) == digests, mode
        assert manifest.deterministic_view() == reference.deterministic_view(), mode


@pytest.mark.e2e
def test_t5s_join_keeps_eos_out_of_span_corrupted_examples(tmp_path, tokenizer_path):
    """``--document-separator none`` joins documents as T5's reduce_concat_tokens does: no EOS
    inside inputs or targets (the default puts one after each document, which then shows up
    inside examples), every document token still in exactly one example, the manifest's
    document tokens without the EOS."""
    eos = Tokenizer.from_file(tokenizer_path).token_to_id("</s>")
    found = {}
    for separator in ("eos", "none"):
        out = tmp_path / separator
        manifest = materialize(out, *_args("span_corruption", SUBSET, tokenizer_path, "--document-separator",
                                           separator, "--last-chunk", "pad"))
        inner = examples = 0
        for split in manifest.splits:
            for example in open_dataset(str(out)).iter_examples(split):
                for column in ("inputs", "targets"):
                    real = np.asarray(example[column])
                    real = real[: int(np.flatnonzero(real == eos)[-1]) + 1]  # cut the padding: EOS ends both
                    inner += int(np.count_nonzero(real[:-1] == eos))
                examples += 1
        documents = sum(info["documents"] for info in manifest.splits.values())
        tokens = sum(info["tokens"] + info["dropped_tokens"] for info in manifest.splits.values())
        assert tokens == sum(info["document_tokens"] for info in manifest.splits.values())
        found[separator] = (inner, examples, documents, tokens, manifest.config["document_separator"])
    assert found["none"][0] == 0 and found["eos"][0] > 0.1 * found["eos"][1]
    assert found["none"][4] == "none" and found["eos"][4] == "eos"
    assert found["eos"][3] - found["none"][3] == found["eos"][2]  # one EOS per document less
