"""End-to-end tests of ``lmshards materialize`` on the bundled sample corpus (clm)."""

from __future__ import annotations

import collections
import glob
import gzip
import hashlib
import json
import os

import numpy as np
import pytest
from lmshards_testing import encode_documents, file_digests, group_of, materialize, materialize_command

from loaders import open_dataset
from schemas.manifest import Manifest
from transforms.tokenizing.tokenize import assign_split, bucket_of, document_key

SEQ_LEN = 128
NUM_BUCKETS = 8


def _base_args(sample_glob, tokenizer_path, *extra):
    return ["--input", sample_glob, "--tokenizer", tokenizer_path, "--objective", "clm", "--seq-len", str(SEQ_LEN),
            "--num-buckets", str(NUM_BUCKETS), "--validation-fraction", "0.1", "--num-shards", "3",
            "--formats", "arrow,webdataset", *extra]


@pytest.fixture(scope="module")
def clm_dataset(tmp_path_factory, sample_glob, tokenizer_path):
    out = tmp_path_factory.mktemp("clm") / "out"
    manifest = materialize(out, *_base_args(sample_glob, tokenizer_path))
    return out, manifest


def _parse_key(key):
    split, where, chunk, draw = key.split("-")
    return split, where, int(chunk[1:]), int(draw[1:])


GROUP_TOKENS = 30000


@pytest.fixture(scope="module")
def clm_groups_dataset(tmp_path_factory, sample_glob, tokenizer_path):
    """The clm dataset with pack groups sized in tokens (the default), small enough to make many."""
    out = tmp_path_factory.mktemp("clm-groups") / "out"
    args = [a for a in _base_args(sample_glob, tokenizer_path) if a not in ("--num-buckets", str(NUM_BUCKETS))]
    manifest = materialize(out, *args, "--pack-group-tokens", str(GROUP_TOKENS))
    return out, manifest


def _groups_of_planned(sample_texts, docs):
    """key -> (letter, group) by the plan of pack groups, recomputed from every document."""
    from transforms.packing.group import SUB_BUCKETS, plan_groups

    tokens = collections.Counter()
    for text, ids in zip(sample_texts, docs):
        key = document_key(text)
        tokens[assign_split(key, 0.1), bucket_of(key, SUB_BUCKETS)] += len(ids) + 1
    plans = {split: plan_groups([(b, n) for (s, b), n in tokens.items() if s == split], GROUP_TOKENS)
             for split in ("train", "validation")}
    return lambda key: ("g", group_of(plans[assign_split(key, 0.1)], bucket_of(key, SUB_BUCKETS)))


@pytest.mark.parametrize("grouping", ["buckets", "token_groups"])
def test_every_token_of_every_document_appears_exactly_once(request, sample_texts, tokenizer_path, grouping):
    out, manifest = request.getfixturevalue("clm_dataset" if grouping == "buckets" else "clm_groups_dataset")
    eos = manifest.tokenizer["special_ids"]["eos"]
    docs = encode_documents(sample_texts, tokenizer_path)
    if grouping == "buckets":
        def group_of_key(key):
            return "b", bucket_of(key, NUM_BUCKETS)
    else:
        group_of_key = _groups_of_planned(sample_texts, docs)
    # The expected token stream of every (split, group): documents sorted by key, EOS after each.
    streams = collections.defaultdict(list)
    seen = set()
    for text, ids in sorted(zip(sample_texts, docs), key=lambda pair: document_key(pair[0])):
        key = document_key(text)
        if key in seen:
            continue
        seen.add(key)
        streams[(assign_split(key, 0.1), *group_of_key(key))].append(np.append(ids, eos))
    reader = open_dataset(str(out))
    for split in ("train", "validation"):
        examples = sorted(reader.iter_examples(split), key=lambda ex: _parse_key(ex["key"]))
        chunks = collections.defaultdict(list)
        for ex in examples:
            _, where, index, draw = _parse_key(ex["key"])
            assert draw == 0
            assert int(ex["doc_lengths"].sum()) == SEQ_LEN
            chunks[where].append((index, ex["input_ids"]))
        groups = sorted((letter, group) for s, letter, group in streams if s == split)
        if grouping == "token_groups":
            assert len(groups) == manifest.splits[split]["pack_groups"]["groups"]
            assert [g for _, g in groups] == list(range(len(groups)))
        remainder_stream = []
        for letter, group in groups:
            stream = np.concatenate(streams[(split, letter, group)])
            name = f"{letter}{group:05d}"
            indexed = sorted(chunks.pop(name, []))
            got = [ids for _, ids in indexed]
            assert [i for i, _ in indexed] == list(range(len(got)))
            full = len(stream) // SEQ_LEN
            assert len(got) == full
            if got:
                np.testing.assert_array_equal(np.concatenate(got), stream[: full * SEQ_LEN])
            remainder_stream.append(stream[full * SEQ_LEN :])
        rest = np.concatenate(remainder_stream)
        got = [ids for _, ids in sorted(chunks.pop("r", []))]
        assert not chunks  # no chunk of a group that should not exist
        assert len(got) == len(rest) // SEQ_LEN
        if got:
            np.testing.assert_array_equal(np.concatenate(got), rest[: len(got) * SEQ_LEN])
        dropped = len(rest) - len(got) * SEQ_LEN
        assert manifest.splits[split]["dropped_tokens"] == dropped
        assert 0 <= dropped < SEQ_LEN
        info = manifest.splits[split]
        assert info["tokens"] + dropped == info["document_tokens"] == sum(len(s) for k, v in streams.items()
                                                                            if k[0] == split for s in v)


def test_manifest_counts_and_shards(clm_dataset, sample_texts):
    out, manifest = clm_dataset
    counts = manifest.counts
    unique = len(set(sample_texts))
    assert counts["documents_read"] == len(sample_texts)
    assert counts["documents_written"] == unique
    assert counts["duplicates"] == len(sample_texts) - unique
    assert counts["rejected"] == 0 and counts["reconciled"]
    assert manifest.splits["train"]["num_shards"] == 3
    assert manifest.splits["validation"]["num_shards"] == 1
    assert manifest.splits["validation"]["documents"] > 0
    for split in ("train", "validation"):
        shards = manifest.shards(split)
        assert sum(s.rows for s in shards) == manifest.splits[split]["examples"]
        for shard in shards:
            for f in shard.files.values():
                path = os.path.join(out, f.path)
                data = open(path, "rb").read()
                assert len(data) == f.bytes
                assert hashlib.sha256(data).hexdigest() == f.sha256
    tokenizer_bytes = open(out / "tokenizer.json", "rb").read()
    assert manifest.tokenizer["sha256"] == hashlib.sha256(tokenizer_bytes).hexdigest()
    assert not os.path.exists(out / ".tmp")
    assert manifest.stats["train"]["document_lengths"]["count"] == manifest.splits["train"]["documents"]


def test_rows_are_sorted_by_hashed_key_inside_each_shard(clm_dataset):
    out, manifest = clm_dataset
    for shard in manifest.shards("train"):
        from loaders.access.reader import read_arrow_shard

        keys = [ex["key"] for ex in read_arrow_shard(os.path.join(out, shard.files["arrow"].path))]
        # bytes 8-23 of blake2b-256(f"{seed}:{key}", person=lmshards-example) (transforms/objectives/layout.py)
        order = [hashlib.blake2b(f"{manifest.config['seed']}:{k}".encode(), digest_size=32,
                                 person=b"lmshards-example").digest()[8:24] for k in keys]
        assert order == sorted(order) and len(keys) == shard.rows


def test_datasets_and_webdataset_read_the_shards(clm_dataset):
    import datasets
    import webdataset

    out, manifest = clm_dataset
    ours = {ex["key"]: ex for ex in open_dataset(str(out)).iter_examples("train")}
    hf = datasets.load_from_disk(str(out / "train" / "arrow"))
    assert len(hf) == len(ours) == manifest.splits["train"]["examples"]
    row = hf[5]
    np.testing.assert_array_equal(np.asarray(row["input_ids"], np.int32), ours[row["key"]]["input_ids"])
    assert row["doc_lengths"] == ours[row["key"]]["doc_lengths"].tolist()
    # The dataset root opens as a DatasetDict of its splits, a split directory as one split.
    splits = datasets.load_from_disk(str(out))
    assert isinstance(splits, datasets.DatasetDict) and sorted(splits) == sorted(manifest.splits)
    for split, info in manifest.splits.items():
        assert len(splits[split]) == len(datasets.load_from_disk(str(out / split))) == info["examples"]
    assert splits["train"][5]["key"] == row["key"] and splits["train"][5]["input_ids"] == row["input_ids"]
    urls = sorted(glob.glob(str(out / "train" / "wds" / "*.tar")))
    n = 0
    for sample in webdataset.WebDataset(urls, shardshuffle=False).decode():
        ex = ours[sample["__key__"]]
        np.testing.assert_array_equal(sample["input_ids.npy"], ex["input_ids"])
        np.testing.assert_array_equal(sample["doc_lengths.npy"], ex["doc_lengths"])
        n += 1
    assert n == len(ours)


def _write_split_corpus(texts, directory, parts):
    """The same documents in another order, split over ``parts`` files, some compressed."""
    os.makedirs(directory, exist_ok=True)
    rng = np.random.default_rng(7)
    order = rng.permutation(len(texts))
    for part in range(parts):
        name = os.path.join(directory, f"part-{part}.jsonl" + (".gz" if part % 2 else ""))
        opener = gzip.open if part % 2 else open
        with opener(name, "wt", encoding="utf-8") as handle:
            for i in order[part::parts]:
                handle.write(json.dumps({"text": texts[i], "id": int(i)}) + "\n")
    return os.path.join(directory, "part-*")


@pytest.mark.e2e
def test_bytes_identical_across_runners_and_input_splits(tmp_path, clm_dataset, sample_glob, tokenizer_path,
                                                         sample_texts):
    reference_out, reference = clm_dataset
    reference_digests = file_digests(reference_out)
    resplit = _write_split_corpus(sample_texts, tmp_path / "resplit", 5)
    variants = {
        "multi_processing": ["--direct_running_mode=multi_processing", "--direct_num_workers=2"],
        "bundle_repeat": ["--direct_runner_bundle_repeat=1"],
        "resplit_inputs": None,
    }
    for name, beam_args in variants.items():
        out = tmp_path / name
        if beam_args is None:
            args = _base_args(resplit, tokenizer_path)
        else:
            args = _base_args(sample_glob, tokenizer_path, *beam_args)
        manifest = materialize(out, *args)
        assert file_digests(out) == reference_digests, name
        assert manifest.deterministic_view() == reference.deterministic_view(), name
        on_disk = Manifest.loads(open(out / "manifest.json").read())
        assert on_disk.deterministic_view() == reference.deterministic_view(), name


def test_in_process_runs_hand_documents_and_examples_over_by_reference(tmp_path, monkeypatch, clm_dataset,
                                                                    sample_glob, tokenizer_path):
    """The in-process runner gets documents and example batches by reference (the shuffles copy
    no bytes), writes the bytes the copying runners write, and holds none of them to the end:
    each is let go of by its last reader; chunks never leave the stage that cut them (the
    objective is applied there, no Flatten holds them); other runners never get a reference."""
    from pipelines import reference_handoff
    from pipelines.tuned_run import TunedRun
    from transforms.elements import Chunk, DocumentBatch

    reference_out, reference = clm_dataset
    stored, left = {}, []  # every value a run's store took (by id), and what it held at the end
    release = TunedRun.release

    class Recording(dict):
        def __setitem__(self, token, value):
            stored[id(value)] = value
            super().__setitem__(token, value)

    class Stores(dict):  # the run's store of values becomes a Recording one
        def __setitem__(self, scope, values):
            super().__setitem__(scope, Recording(values))

    def recording(self):
        left.extend(reference_handoff._STORE.get(self.scope, {}).values())
        release(self)

    monkeypatch.setattr(reference_handoff, "_STORE", Stores())
    monkeypatch.setattr(TunedRun, "release", recording)
    out = tmp_path / "by-reference"
    manifest = materialize(out, *_base_args(sample_glob, tokenizer_path))
    assert file_digests(out) == file_digests(reference_out)
    assert manifest.deterministic_view() == reference.deterministic_view()
    # Every document (in Tokenize's batches, then in AssignGroups' blocks) and example batch went
    # by reference, no chunk did
    handed = list(stored.values())
    assert not [value for value in handed if isinstance(value, Chunk)]
    documents = [DocumentBatch.decode(tuple(value)) for value in handed if len(value) == 6]
    batches = [value for value in handed if len(value) == 4]
    assert len(documents) + len(batches) == len(handed)
    keys = [document.keys[index].tobytes() for document in documents for index in range(document.count)]
    assert len(set(keys)) == manifest.counts["documents_written"]
    # each copy of a document twice: in its batch, then in its block
    assert len(keys) == 2 * (manifest.counts["documents_written"] + manifest.counts["duplicates"])
    assert {document.ids.dtype.itemsize for document in documents} == {2}  # the sample's 16k vocabulary: uint16
    batch_rows = sum(len(value[0]) // 16 for value in batches)
    examples = sum(info["examples"] for info in manifest.splits.values())
    assert examples == batch_rows
    # and none of them waited for the end of the run (Beam's size samples of them included)
    assert left == []
    from pipelines.options import parse_args

    base = _base_args(sample_glob, tokenizer_path)
    assert parse_args(["--output", "o", *base]).in_one_process
    for beam_args in (["--direct_running_mode=multi_processing"], ["--runner", "DataflowRunner"],
                      ["--runner", "DirectRunner"]):
        assert not parse_args(["--output", "o", *base, *beam_args]).in_one_process, beam_args


def test_beam_type_check_is_off_unless_asked_for_and_never_changes_bytes(tmp_path, clm_dataset, sample_glob,
                                                                       tokenizer_path):
    from apache_beam.options.pipeline_options import TypeOptions

    from pipelines.materialize import _prepare

    def type_check(*extra):
        argv = ["--output", str(tmp_path / "planned"), *_base_args(sample_glob, tokenizer_path, *extra)]
        return _prepare(argv)[3].options.view_as(TypeOptions).pipeline_type_check

    assert type_check("--pipeline-type-check") is True and type_check() is False
    reference_out, reference = clm_dataset
    out = tmp_path / "type-checked"
    manifest = materialize(out, *_base_args(sample_glob, tokenizer_path, "--pipeline-type-check"))
    assert file_digests(out) == file_digests(reference_out)
    assert manifest.deterministic_view() == reference.deterministic_view()


def test_the_run_keeps_older_objects_out_of_full_collections_and_undoes_that_after(tmp_path, monkeypatch,
                                                                                  clm_dataset, sample_glob,
                                                                                  tokenizer_path):
    """While an in-process pipeline runs, the objects made before it are frozen (full collections
    skip them); afterwards nothing stays frozen. (A freeze somebody else made is left as it is:
    tests/pipelines/test_runner_tuning.py.)"""
    import gc

    import transforms.writing.write as write

    reference_out, reference = clm_dataset
    seen = []
    atomic = write.write_atomic

    def spying(root, relative, writer, lock=None):  # every shard, rejected-record file and manifest write
        if relative != "tokenizer.json":  # (written by the launcher before the pipeline starts)
            seen.append(gc.get_freeze_count())
        return atomic(root, relative, writer, lock)

    monkeypatch.setattr(write, "write_atomic", spying)
    assert gc.get_freeze_count() == 0
    out = tmp_path / "frozen"
    manifest = materialize(out, *_base_args(sample_glob, tokenizer_path))
    assert seen and min(seen) > 1000
    assert gc.get_freeze_count() == 0
    assert file_digests(out) == file_digests(reference_out)
    assert manifest.deterministic_view() == reference.deterministic_view()


def test_batch_sizes_inside_the_pipeline_never_change_bytes(tmp_path, clm_dataset, sample_glob,
                                                           tokenizer_path):
    """Tiny tokenizer batches and example blocks give the
    same bytes as the defaults: batching follows bundles, the written data must not."""
    reference_out, reference = clm_dataset
    out = tmp_path / "small-batches"
    manifest = materialize(out, *_base_args(sample_glob, tokenizer_path, "--batch-size", "3", "--block-rows", "3"))
    assert file_digests(out) == file_digests(reference_out)
    assert manifest.deterministic_view() == reference.deterministic_view()


def test_another_seed_changes_the_order_not_the_content(tmp_path, clm_dataset, sample_glob, tokenizer_path):
    reference_out, reference = clm_dataset
    manifest = materialize(tmp_path / "seed1", *_base_args(sample_glob, tokenizer_path, "--seed", "1"))
    assert manifest.splits["train"]["examples"] == reference.splits["train"]["examples"]
    a = {ex["key"]: ex["input_ids"].tolist() for ex in open_dataset(str(reference_out)).iter_examples()}
    b_examples = list(open_dataset(str(tmp_path / "seed1")).iter_examples())
    assert {ex["key"]: ex["input_ids"].tolist() for ex in b_examples} == a
    assert [ex["key"] for ex in b_examples] != [k for k in a]


# A whole run of best_fit: every token once, padding counted; Pack's chunks in both modes, exactly:
# tests/transforms/test_pack.py (a whole run of none: test_reliability.py's hostile corpus).
@pytest.mark.parametrize("packing", ["best_fit"])
def test_best_fit_and_none_never_truncate_a_document(tmp_path, sample_glob, tokenizer_path, sample_texts, packing):
    out = tmp_path / packing
    manifest = materialize(out, "--input", sample_glob, "--tokenizer", tokenizer_path, "--seq-len", str(SEQ_LEN),
                           "--packing", packing, "--num-buckets", "4")
    eos, pad = manifest.tokenizer["special_ids"]["eos"], manifest.tokenizer["special_ids"]["pad"]
    docs = {document_key(t): np.append(ids, eos) for t, ids in zip(sample_texts, encode_documents(sample_texts,
                                                                                                   tokenizer_path))}
    expected = collections.Counter()
    for ids in docs.values():
        expected.update(ids.tolist())
    got = collections.Counter()
    segments = 0
    for ex in open_dataset(str(out)).iter_examples():
        used = int(ex["doc_lengths"].sum())
        assert used <= SEQ_LEN
        assert (ex["input_ids"][used:] == pad).all()
        got.update(ex["input_ids"][:used].tolist())
        segments += len(ex["doc_lengths"])
        if packing == "none":
            assert len(ex["doc_lengths"]) == 1
    assert got == expected
    assert manifest.splits["train"]["dropped_tokens"] == 0
    long_pieces = sum(-(-len(ids) // SEQ_LEN) for ids in docs.values())
    assert segments == long_pieces
    assert manifest.splits["train"]["padding_tokens"] == manifest.splits["train"]["examples"] * SEQ_LEN - sum(
        expected.values())


def test_refuses_non_empty_output_and_overwrites_when_asked(tmp_path, sample_glob, tokenizer_path):
    out = tmp_path / "busy"
    out.mkdir()
    (out / "keep.txt").write_text("x")
    faq = os.path.join(os.path.dirname(sample_glob), "faq.jsonl")  # one file of the sample is enough here
    cmd = ["--input", faq, "--tokenizer", tokenizer_path, "--seq-len", "256", "--output", str(out)]
    proc = materialize_command(*cmd)
    assert proc.returncode == 2
    assert "not empty" in proc.stderr and "--overwrite" in proc.stderr
    assert (out / "keep.txt").exists() and not (out / "manifest.json").exists()
    # --overwrite replaces only an lmshards dataset: a file lmshards did not write is refused, in one line.
    proc = materialize_command(*cmd, "--overwrite")
    assert proc.returncode == 2 and len(proc.stderr.strip().splitlines()) == 1
    assert "keep.txt is not part of one" in proc.stderr
    assert os.listdir(out) == ["keep.txt"]
    (out / "keep.txt").unlink()
    proc = materialize_command(*cmd)
    assert proc.returncode == 0, proc.stderr
    first = (out / "manifest.json").read_bytes()
    stale = out / "train" / "arrow" / "data-00007-of-00009.arrow"  # a shard name this run does not write
    stale.write_bytes(b"an old shard of another run")
    proc = materialize_command(*cmd, "--overwrite")
    assert proc.returncode == 0, proc.stderr
    assert not stale.exists()
    assert json.loads((out / "manifest.json").read_bytes())["splits"] == json.loads(first)["splits"]
    assert "documents: read 185" in proc.stdout and "tokens/s" in proc.stdout and " shard" in proc.stdout


@pytest.mark.parametrize(
    "extra, message",
    [
        (["--input", "/nonexistent/*.jsonl"], "matches no file"),
        (["--tokenizer", "/nonexistent/tok.json"], "--tokenizer /nonexistent/tok.json: cannot read"),
        (["--objective", "nope"], "--objective nope: unknown objective"),
        (["--seq-len-typo", "5"], "unknown option --seq-len-typo"),
        (["--seq-len", "1"], "--seq-len 1"),
        (["--num-buckets", "8", "--pack-group-tokens", "1000"],
         "--num-buckets 8 and --pack-group-tokens 1000: choose one (fixed hash buckets, or groups sized by tokens)"),
        (["--pack-group-tokens", "0"], "--pack-group-tokens 0: must be > 0"),
    ],
)
def test_configuration_errors_fail_before_any_work(tmp_path, sample_glob, tokenizer_path, extra, message):
    from pipelines.materialize import main

    out = tmp_path / "never"
    args = ["--input", sample_glob, "--tokenizer", tokenizer_path, "--seq-len", "64", "--output", str(out)]
    for i in range(0, len(extra), 2):
        flag = extra[i]
        if flag in args:
            args[args.index(flag) + 1] = extra[i + 1]
        else:
            args += extra[i : i + 2]
    import contextlib
    import io

    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        assert main(args) == 2
    assert message in err.getvalue()
    assert len(err.getvalue().strip().splitlines()) == 1
    assert not out.exists()


def test_shard_size_mb_sizes_each_split_from_its_document_tokens(tmp_path, sample_glob, tokenizer_path, sample_texts):
    import math

    target_mb = 0.1
    manifest = materialize(tmp_path / "sized", "--input", sample_glob, "--tokenizer", tokenizer_path,
                           "--objective", "clm", "--seq-len", str(SEQ_LEN), "--validation-fraction", "0.1",
                           "--shard-size-mb", str(target_mb), "--formats", "arrow")
    tokens = collections.Counter()  # document tokens + EOS per split, duplicates included (sized before dedup)
    for text, ids in zip(sample_texts, encode_documents(sample_texts, tokenizer_path)):
        tokens[assign_split(document_key(text), 0.1)] += len(ids) + 1
    for split in ("train", "validation"):
        estimated_examples = math.ceil(tokens[split] / SEQ_LEN)
        expected = max(1, math.ceil(estimated_examples * 4 * SEQ_LEN / (target_mb * 2**20)))
        shards = manifest.shards(split)
        assert manifest.splits[split]["num_shards"] == len(shards) == expected
        assert sum(s.rows for s in shards) == manifest.splits[split]["examples"]
    train = manifest.shards("train")
    assert len(train) >= 8
    sizes = [s.files["arrow"].bytes for s in train]
    assert max(sizes) < 1.5 * target_mb * 2**20 and min(sizes) > 0.5 * target_mb * 2**20


def test_every_shard_index_is_written_even_when_no_example_goes_there(tmp_path, tokenizer_path):
    import tarfile

    import pyarrow as pa

    corpus = tmp_path / "tiny.jsonl"
    corpus.write_text("".join(json.dumps({"text": f"Document number {i} is short but has a few words."}) + "\n"
                              for i in range(6)))
    out = tmp_path / "out"
    manifest = materialize(out, "--input", str(corpus), "--tokenizer", tokenizer_path, "--objective", "clm",
                           "--seq-len", "16", "--num-shards", "12", "--formats", "arrow,webdataset",
                           "--pack-group-tokens", "20")  # about a document per group: most chunks re-packed
    shards = manifest.shards("train")
    assert [s.index for s in shards] == list(range(12))
    examples = manifest.splits["train"]["examples"]
    assert 0 < examples < 12 and sum(s.rows for s in shards) == examples
    empty = [s for s in shards if s.rows == 0]
    assert len(empty) >= 12 - examples
    # Most chunks come from re-packed bucket remainders (they meet the others in the writers'
    # shuffle): every one is written exactly once, whatever else its shard got.
    keys = [ex["key"] for ex in open_dataset(str(out)).iter_examples()]
    assert len(keys) == len(set(keys)) == examples
    assert any("-r-" in key for key in keys)
    texts = [json.loads(line)["text"] for line in corpus.read_text().splitlines()]
    total = sum(len(ids) + 1 for ids in encode_documents(texts, tokenizer_path))
    assert examples == total // 16 and manifest.splits["train"]["dropped_tokens"] == total % 16
    for shard in empty:
        table = pa.ipc.open_stream(open(out / shard.files["arrow"].path, "rb").read()).read_all()
        assert table.num_rows == 0 and table.schema.names == ["key", "input_ids", "doc_lengths"]
        with tarfile.open(out / shard.files["webdataset"].path) as tar:
            assert tar.getmembers() == []
        assert shard.tokens == 0


def test_a_tokenizer_kept_on_one_thread_by_the_environment_is_warned_about(tmp_path, monkeypatch, caplog, sample_glob,
                                                                            tokenizer_path):
    """TOKENIZERS_PARALLELISM=false (training scripts set it; the tokenizer sets it itself after
    a fork) keeps the Rust encoder on one thread: a run that would use several says so."""
    from pipelines.options import parse_args
    from pipelines.plan import serial_encoder_warning
    from pipelines.runner_tuning import tuning_for

    def warning(options, environ):
        return serial_encoder_warning(options, tuning_for(options, []), environ)

    base = ["--output", "o", *_base_args(sample_glob, tokenizer_path)]
    in_process = parse_args(base)
    multi = parse_args([*base, "--direct_running_mode=multi_processing", "--direct_num_workers=2"])
    multi_threads = parse_args([*base, "--direct_running_mode=multi_processing", "--encoder-threads", "2"])
    for value in ("false", "FALSE", "0", "off", "no", ""):
        assert warning(in_process, {"TOKENIZERS_PARALLELISM": value}) == (
            f"TOKENIZERS_PARALLELISM={value} in the environment: the Rust encoder runs on one thread "
            "(unset it to encode on every core)")
        assert warning(multi_threads, {"TOKENIZERS_PARALLELISM": value})
    assert warning(in_process, {}) is None
    assert warning(in_process, {"TOKENIZERS_PARALLELISM": "true"}) is None
    # one encoder thread per worker process anyway (2 cores, 2 workers): nothing to warn about
    if tuning_for(multi, []).encoder_threads == 1:
        assert warning(multi, {"TOKENIZERS_PARALLELISM": "false"}) is None
    # The run's planning gives the warning (before any work), from the environment it runs in.
    from pipelines.materialize import _prepare

    monkeypatch.setenv("TOKENIZERS_PARALLELISM", "false")
    with caplog.at_level("WARNING", logger="lmshards"):
        _prepare(["--output", str(tmp_path / "serial"), *_base_args(sample_glob, tokenizer_path), "--encoder",
                  "tokenizers"])
    assert [r.getMessage() for r in caplog.records if r.name == "lmshards"] == [
        warning(in_process, {"TOKENIZERS_PARALLELISM": "false"})]
    caplog.clear()
    with caplog.at_level("WARNING", logger="lmshards"):  # fastokens does not read the variable
        plan = _prepare(["--output", str(tmp_path / "fast"), *_base_args(sample_glob, tokenizer_path)])[1]
    assert plan.encoder.backend == "fastokens"
    assert [r.getMessage() for r in caplog.records if r.name == "lmshards"] == []
