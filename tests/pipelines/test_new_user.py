"""A new user's mistakes fail loudly in one line, and a finished run says what it made.

One test per row of the new-user table: a missing text field, stray arguments
from an unquoted glob, abbreviated and mistyped flags, ``--workers``, the special tokens a
tokenizer lacks, tokens added to the vocabulary, Beam's own warnings, a split with no
examples, the summary, ``validate`` on an empty split.
"""

from __future__ import annotations

import json

import pytest
from lmshards_testing import ROOT, SAMPLE_GLOB, TOKENIZER, run_with_blocked_imports
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

from pipelines.cli import main as cli
from pipelines.materialize import main
from pipelines.options import parse_args

FAQ = str(ROOT / "data" / "sample" / "faq.jsonl")


def _error(capsys, argv) -> tuple[int, list[str]]:
    code = main(argv)
    return code, capsys.readouterr().err.strip().splitlines()


def test_a_text_field_no_record_has_fails_before_any_work_naming_the_fields_seen(tmp_path, capsys):
    code, err = _error(capsys, ["--input", FAQ, "--tokenizer", TOKENIZER, "--output", str(tmp_path / "o"),
                                "--text-field", "body"])
    assert code == 2 and err == [f"lmshards materialize: error: --text-field body: no record has the field 'body' "
                                 f"(the first 185 of {FAQ}); fields seen: section, source, text"]
    assert not (tmp_path / "o").exists()


def test_more_than_half_rejected_fails_by_default_naming_the_top_reason(tmp_path, capsys):
    """The first records have the field, later ones do not: the run fails at the end (exit 1, no
    manifest) under the default --max-rejected-fraction 0.5, naming the reason and what to check."""
    corpus = tmp_path / "mixed.jsonl"
    lines = [json.dumps({"text": f"document number {i} is fine"}) for i in range(3)]
    lines += [json.dumps({"body": f"document number {i} has its text elsewhere"}) for i in range(5)]
    corpus.write_text("\n".join(lines) + "\n", encoding="utf-8")
    out = tmp_path / "o"
    code, err = _error(capsys, ["--input", str(corpus), "--tokenizer", TOKENIZER, "--output", str(out),
                                "--seq-len", "4"])
    assert code == 1 and len(err) == 1
    assert err[0].startswith("lmshards materialize: error: --max-rejected-fraction 0.5 exceeded: 62.50% of "
                             "documents rejected (5 of 8 read: missing_text_field 5); mostly missing_text_field: "
                             "check --text-field; no manifest written")
    assert not (out / "manifest.json").exists()
    assert parse_args(["--input", "x", "--tokenizer", "t", "--output", "o"]).max_rejected_fraction == 0.5
    assert main(["--input", str(corpus), "--tokenizer", TOKENIZER, "--output", str(tmp_path / "all"), "--seq-len", "4",
                 "--max-rejected-fraction", "1"]) == 0


def test_a_split_with_no_examples_fails_the_run(tmp_path, capsys):
    out = tmp_path / "o"
    code, err = _error(capsys, ["--input", FAQ, "--tokenizer", TOKENIZER, "--output", str(out),
                                "--seq-len", "100000"])
    assert code == 1 and err == [
        "lmshards materialize: error: split train has no examples: 185 documents of 48,443 tokens in all make no "
        "example (--last-chunk pad keeps a split's last partial chunk, or lower the example length); no manifest "
        "written"]
    assert not (out / "manifest.json").exists()


@pytest.mark.parametrize("packing", ["best_fit", "none"])
def test_a_packing_mode_the_objective_cannot_take_fails_before_any_work(tmp_path, capsys, packing):
    """UL2 varies its chunk length from example to example: best_fit and none are refused in
    one line naming the flag (they once failed inside a worker, with a traceback)."""
    code, err = _error(capsys, ["--input", FAQ, "--tokenizer", TOKENIZER, "--output", str(tmp_path / "o"),
                                "--objective", "ul2", "--inputs-length", "128", "--packing", packing])
    assert code == 2 and err == [f"lmshards materialize: error: --packing {packing}: needs a fixed chunk length, "
                                 "and ul2 varies it from example to example; use --packing concat"]
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize(("flags", "message"), [
    (["--seq-len", "100000000000"], "--seq-len 100000000000: seq_len 100000000000"),
    (["--objective", "span_corruption", "--inputs-length", "100000000000"],
     "--inputs-length 100000000000: inputs_length 100000000000"),
])
def test_an_example_length_beyond_any_model_fails_before_any_work(tmp_path, capsys, flags, message):
    """Such a length once overflowed Arrow's int32 offsets (a traceback) or hung span
    corruption's length search; it is a one-line configuration error."""
    code, err = _error(capsys, ["--input", FAQ, "--tokenizer", TOKENIZER, "--output", str(tmp_path / "o"), *flags])
    assert code == 2 and err == [f"lmshards materialize: error: {message} is more than 16,777,216 tokens per example"]


def test_stray_arguments_of_an_unquoted_glob_are_refused(tmp_path, capsys):
    files = sorted(str(p) for p in (ROOT / "data" / "sample").glob("*.jsonl"))
    code, err = _error(capsys, ["--input", *files, "--tokenizer", TOKENIZER, "--output", str(tmp_path / "o")])
    assert code == 2 and len(err) == 1
    assert err[0].startswith(f"lmshards materialize: error: unexpected arguments {files[1]} {files[2]}: an unquoted "
                             "glob? The shell expands --input data/*.jsonl into several names and only the first is "
                             "read; quote it")
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize(("flag", "suggestion"), [
    (["--seq-lne", "5"], "unknown option --seq-lne (not an lmshards or Apache Beam flag); did you mean --seq-len?"),
    (["--enc", "fastokens"], "unknown option --enc (not an lmshards or Apache Beam flag); did you mean --encoder or "
                             "--encoder-threads? (flags are not abbreviated)"),
    (["--direct_num_worker=2"], "unknown option --direct_num_worker (not an lmshards or Apache Beam flag); did you "
                                "mean --direct_num_workers?"),
])
def test_mistyped_and_abbreviated_flags_are_refused_with_a_suggestion(tmp_path, capsys, flag, suggestion):
    code, err = _error(capsys, ["--input", FAQ, "--tokenizer", TOKENIZER, "--output", str(tmp_path / "o"), *flag])
    assert code == 2 and err == [f"lmshards materialize: error: {suggestion}"]


def test_workers_maps_to_the_runner_s_own_flags(capsys):
    base = ["--input", "x", "--tokenizer", "t", "--output", "o"]
    assert parse_args([*base, "--workers", "2"]).beam_args == [
        "--runner=FnApiRunner", "--direct_running_mode=multi_processing", "--direct_num_workers=2"]
    assert parse_args([*base, "--workers", "1"]).in_one_process
    dataflow = parse_args([*base, "--workers", "8", "--runner", "DataflowRunner"]).beam_args
    assert dataflow[-1] == "--num_workers=8"
    for extra, message in ((["--direct_num_workers=3"], "--workers 2: also given --direct_num_workers"),
                           (["--runner", "BundleBasedDirectRunner"], "--workers 2: not supported with --runner "
                                                                     "BundleBasedDirectRunner")):
        with pytest.raises(ValueError, match=message):
            parse_args([*base, "--workers", "2", *extra])


def _gpt2_style_tokenizer(path) -> str:
    """A byte-level BPE whose only special token is <|endoftext|>, like GPT-2's."""
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    texts = [json.loads(line)["text"] for line in open(FAQ, encoding="utf-8")]
    tokenizer.train_from_iterator(texts, trainer=trainers.BpeTrainer(
        vocab_size=500, special_tokens=["<|endoftext|>"], initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False))
    tokenizer.save(str(path))
    return str(path)


def test_every_missing_special_token_is_named_in_one_message(tmp_path, capsys):
    tokenizer = _gpt2_style_tokenizer(tmp_path / "gpt2.json")
    code, err = _error(capsys, ["--input", FAQ, "--tokenizer", tokenizer, "--output", str(tmp_path / "o"),
                                "--objective", "mlm"])
    assert code == 2 and err == [
        f"lmshards materialize: error: --tokenizer {tokenizer}: the tokenizer is short of special tokens: no pad token "
        "(tried <pad>, [PAD], <|pad|>, <|padding|>); no mask token (tried <mask>, [MASK], <|mask|>) (pass "
        "--special-token ROLE=TOKEN for pad, mask, or --add-special-tokens to add what is missing)"]


def test_added_tokens_are_announced_with_the_new_vocabulary_size(tmp_path, capsys):
    tokenizer = _gpt2_style_tokenizer(tmp_path / "gpt2.json")
    out = tmp_path / "o"
    assert main(["--input", FAQ, "--tokenizer", tokenizer, "--output", str(out), "--objective", "ul2",
                 "--add-special-tokens"]) == 0
    lines = capsys.readouterr().out.splitlines()
    manifest = json.loads((out / "manifest.json").read_text())["tokenizer"]
    added = len(manifest["added_tokens"])
    assert added == 1 + 127 + 3  # pad, the sentinels UL2's X denoisers need at 512, [R] [S] [X]
    assert (manifest["source_vocab_size"], manifest["vocab_size"]) == (500, 500 + added)
    assert f"tokenizer: added {added} special tokens: vocabulary 500 -> {500 + added} (resize the model's " \
           f"embeddings to {500 + added}); {out / 'tokenizer.json'}" in lines


def test_the_summary_tells_where_what_and_how_much(tmp_path, capsys):
    out = tmp_path / "o"
    assert main(["--input", SAMPLE_GLOB, "--tokenizer", TOKENIZER, "--output", str(out),
                 "--formats", "arrow,webdataset"]) == 0
    lines = capsys.readouterr().out.splitlines()
    manifest = json.loads((out / "manifest.json").read_text())
    assert lines[0] == f"dataset: {out} (manifest.json)"
    assert lines[1] == "objective: clm, seq_len 1,024 (default), packing concat"
    train = manifest["splits"]["train"]
    arrow = sum(s["files"]["arrow"]["bytes"] for s in train["shards"])
    assert any(line.startswith(f"train: {train['examples']:,} examples, {train['tokens']:,} tokens in 1 shard "
                               f"(arrow {arrow / 2**20:,.1f} MB, webdataset ") for line in lines)
    assert "validation: none (--validation-fraction 0; e.g. --validation-fraction 0.01 holds out 1%)" in lines
    assert main(["--input", SAMPLE_GLOB, "--tokenizer", TOKENIZER, "--output", str(tmp_path / "v"),
                 "--seq-len", "512", "--validation-fraction", "0.05"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[1] == "objective: clm, seq_len 512, packing concat"
    assert any(line.startswith("validation: ") and "examples" in line for line in lines)


def test_the_summary_names_the_rejected_records_file(tmp_path, capsys):
    corpus = tmp_path / "c.jsonl"
    corpus.write_text("".join(json.dumps({"text": f"fine document {i}"}) + "\n" for i in range(9)) + "{oops\n",
                      encoding="utf-8")
    out = tmp_path / "o"
    assert main(["--input", str(corpus), "--tokenizer", TOKENIZER, "--output", str(out), "--seq-len", "4"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert f"rejected records: {out / 'rejected' / 'rejected.jsonl'}" in lines


_HELP = """
from pipelines.cli import main
sys.exit(main(sys.argv[2:]))
"""


@pytest.mark.parametrize("argv", [["--help"], ["materialize", "--help"], ["inspect", "--help"]])
def test_beam_s_import_warnings_stay_unseen(argv):
    """Without the [gcp] extra (apitools not importable) Beam logs a warning on import."""
    done = run_with_blocked_imports(_HELP, "apitools", *argv)
    assert done.returncode == 0, done.stderr
    assert "apitools" not in done.stderr and "WARNING" not in done.stderr


@pytest.mark.e2e
def test_a_materialize_run_without_the_gcp_extra_prints_no_beam_warning(tmp_path):
    """The README's first command installs lmshards without Beam's [gcp] extra: the run's
    output is lmshards' own, not Beam's import-time warning."""
    done = run_with_blocked_imports(_HELP, "apitools", "materialize", "--input", FAQ, "--tokenizer", TOKENIZER,
                                    "--seq-len", "64", "--output", str(tmp_path / "o"))
    assert done.returncode == 0, done.stderr
    assert "apitools" not in done.stderr and "WARNING" not in done.stderr
    assert "objective: clm, seq_len 64" in done.stdout


@pytest.mark.e2e
def test_multi_process_workers_keep_their_warnings_unless_verbose(tmp_path):
    import subprocess
    import sys

    args = [sys.executable, "-m", "pipelines.materialize", "--input", FAQ, "--tokenizer", TOKENIZER,
            "--seq-len", "256", "--workers", "2"]
    quiet = subprocess.run([*args, "--output", str(tmp_path / "q")], capture_output=True, text=True, cwd=ROOT)
    assert quiet.returncode == 0, quiet.stderr
    assert "semi_persistent_directory" not in quiet.stderr and "WARN" not in quiet.stderr
    verbose = subprocess.run([*args, "--output", str(tmp_path / "v"), "--verbose"], capture_output=True, text=True,
                             cwd=ROOT)
    assert verbose.returncode == 0 and "No semi_persistent_directory found" in verbose.stderr


def test_validate_flags_an_empty_split(tmp_path, capsys):
    out = tmp_path / "o"
    assert main(["--input", SAMPLE_GLOB, "--tokenizer", TOKENIZER, "--output", str(out), "--seq-len", "256",
                 "--validation-fraction", "0.05"]) == 0
    manifest = json.loads((out / "manifest.json").read_text())
    manifest["splits"]["validation"].update(examples=0, tokens=0, num_shards=0, shards=[])
    (out / "manifest.json").write_text(json.dumps(manifest), encoding="utf-8")
    capsys.readouterr()
    for command in (["validate"], ["inspect"], ["show"], ["report", "-o", str(tmp_path / "r.html")]):
        code = cli([*command, str(out)])  # every reader refuses it, as validate does
        err = capsys.readouterr().err.strip()
        assert code == 1 and err.count("\n") == 0, (command, err)
        assert "splits.validation lists no shards" in err and "no examples" in err


def test_source_field_records_documents_tokens_and_lengths_per_source(tmp_path, capsys):
    """``--source-field source``: per split, each source's documents, tokens and length histogram;
    they add up to the split's, and the shards are those of a run without it."""
    args = ["--input", SAMPLE_GLOB, "--tokenizer", TOKENIZER, "--seq-len", "256", "--validation-fraction", "0.1"]
    assert main([*args, "--output", str(tmp_path / "plain")]) == 0
    assert main([*args, "--output", str(tmp_path / "sources"), "--source-field", "source"]) == 0
    capsys.readouterr()
    manifest = json.loads((tmp_path / "sources" / "manifest.json").read_text())
    expected = {}
    for path in sorted((ROOT / "data" / "sample").glob("*.jsonl")):
        for line in path.open(encoding="utf-8"):
            expected.setdefault(json.loads(line)["source"], 0)
            expected[json.loads(line)["source"]] += 1
    total = {}
    for split, stats in manifest["stats"].items():
        sources = stats["sources"]
        assert sum(s["documents"] for s in sources.values()) == manifest["splits"][split]["documents"]
        assert sum(s["tokens"] for s in sources.values()) == stats["document_lengths"]["sum"]
        for name, entry in sources.items():
            assert entry["document_lengths"]["count"] == entry["documents"]
            assert sum(entry["document_lengths"]["log2_histogram"].values()) == entry["documents"]
            total[name] = total.get(name, 0) + entry["documents"]
    assert total == expected and len(expected) >= 2
    assert manifest["config"]["source_field"] == "source"
    from lmshards_testing import file_digests

    plain, with_sources = file_digests(tmp_path / "plain"), file_digests(tmp_path / "sources")
    assert {k: v for k, v in plain.items() if "/" in k} == {k: v for k, v in with_sources.items() if "/" in k}


def test_source_summary_keeps_the_largest_sources_and_sums_the_rest():
    import numpy as np

    from transforms.objectives.counters import length_counters
    from transforms.writing.manifest import MAX_SOURCES, source_summary

    sources = [(("train", f"s{i:04d}"), {"documents": i + 1, **length_counters("doc_tokens", np.full(i + 1, 10))})
               for i in range(MAX_SOURCES + 10)]
    summary = source_summary(sources, "train")
    assert len(summary) == MAX_SOURCES and "(other sources)" in summary
    assert f"s{MAX_SOURCES + 9:04d}" in summary and "s0000" not in summary
    assert sum(s["documents"] for s in summary.values()) == sum(i + 1 for i in range(MAX_SOURCES + 10))
    assert summary["(other sources)"]["documents"] == sum(range(1, 12))
