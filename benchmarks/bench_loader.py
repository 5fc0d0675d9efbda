"""Loader throughput: lmshards' DataLoader against np.memmap, MosaicML streaming and webdataset.

One run writes the same tokens (``--sequences`` rows of ``--seq-len`` int32 tokens, random
ids, two documents per row) in every format, warms the page cache, then measures each
system in a fresh subprocess (so peak RSS is its own) over one shuffled epoch:

- ``memmap``: the ceiling: a plain loop gathering shuffled rows from an ``np.memmap`` of
  the flat ``(N, L)`` token file into a torch tensor, batch by batch (no DataLoader).
- ``transfer-floor``: ready-made batch tensors through a stock DataLoader: with workers,
  the cost of torch's own hand-over of batches to the main process (a new shared-memory
  segment per tensor), which lmshards' loader uses too.
- ``memmap-dataloader``: the common map-style idiom over the same ``np.memmap`` (one row
  per ``__getitem__``, ``shuffle=True``, default collate) through the same DataLoader.
- ``lmshards``: :class:`loaders.ShardedDataset` over the Arrow shards (shuffle on) through
  :func:`loaders.make_dataloader`, collating ``input_ids`` only, as stored (int32, like the
  baselines), with :class:`loaders.StackCollator`.
- ``lmshards+causal``: the same with the full :class:`loaders.CausalCollator` (labels,
  per-document position ids, FlashAttention's ``cu_seq_lens_q/k``: ``documents="position_ids"``).
- ``lmshards+clm``: the loader's default clm batches (:func:`loaders.make_dataloader` with no
  collator options): whatever the checkout's default is (here: labels, restarting position ids,
  ``use_cache=False``; before format 3, a ``(B, 1, L, L)`` float mask).
- ``lmshards+clm-mask``: clm's O(L^2) option, ``documents="mask"`` (the per-document 4-D mask).
- ``lmshards+prefix_lm``: prefix-LM batches over the same tokens stored with ``prefix_lengths``
  (a prefix per document): the 4-D float32 mask prefix-LM needs.
  The two mask systems hand batches over one at a time (``group_batches=1``): a 4-D mask at
  L=4096, batch 8 is 512 MiB, and groups of eight would hold gigabytes per worker.
- ``lmshards-wds``: :class:`loaders.ShardedDataset` over the WebDataset tars.
- ``mosaic``: MosaicML ``streaming.StreamingDataset`` over MDS shards of the same rows
  (``ndarray:int32:L`` column, shuffle on, ``py1e``), torch DataLoader.
- ``webdataset``: ``webdataset.WebDataset`` over the same tars (shard shuffle, a 1,000-
  sample shuffle buffer, ``.npy`` decode, batched in the workers).

Each is run with ``--workers`` DataLoader workers (default 0 and 2), ``--repeats`` times
(best throughput and time to first batch kept: the machine may be shared). Printed per
run: tokens/s, ratio to memmap, time to first batch (dataset construction to first batch,
imports excluded), peak RSS (VmHWM) of the main process and of the largest worker (RSS
includes pages of memory-mapped files that were read). Peers are
skipped when not installed; mosaicml-streaming's package ``__init__`` imports
``transformers`` and ``torchvision`` (for its text and vision helpers, unused here), which
are stubbed when absent.

Per run also: the CPU time of the main (trainer's) process per million tokens. ``--against DIR``
compares this checkout's loader with another's (``lmshards`` and ``lmshards+causal``, alternating
subprocesses, ratios per round): how the loader's own tuning is held to account.

Usage::

    python benchmarks/bench_loader.py --sequences 50000 --seq-len 1024 --batch-size 32
    git archive 9e2b0b3 | tar -x -C /tmp/before   # the loader with its shared-memory ring and mallopt
    python benchmarks/bench_loader.py --sequences 40000 --workers 0,2 --repeats 5 --against /tmp/before
    python benchmarks/bench_loader.py --sequences 2000 --seq-len 4096 --batch-size 8 \
        --systems memmap,lmshards+clm,lmshards+clm-mask,lmshards+prefix_lm
"""

from __future__ import annotations

import argparse
import gc
import hashlib
import json
import os
import subprocess
import sys
import time

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

SYSTEMS = ("memmap", "transfer-floor", "memmap-dataloader", "lmshards", "lmshards+causal", "lmshards+clm",
           "lmshards+clm-mask", "lmshards+prefix_lm", "lmshards-wds", "mosaic", "webdataset")


# -- data -----------------------------------------------------------------------------------
def rows_of_shard(args, shard: int) -> np.ndarray:
    per_shard = -(-args.sequences // args.shards)
    start = shard * per_shard
    count = max(0, min(per_shard, args.sequences - start))
    rng = np.random.default_rng([args.seed, shard])
    return rng.integers(5, 8000, size=(count, args.seq_len), dtype=np.int32)


def prepare(args) -> str:
    """Write every format once per (sequences, seq_len, shards, seed); return the directory."""
    from schemas.examples import example_schema
    from schemas.manifest import Manifest, shard_name
    from transforms.writing.shard_format import ExampleColumns, write_arrow_columns, write_tar_columns

    tag = f"n{args.sequences}-l{args.seq_len}-s{args.shards}-seed{args.seed}"
    root = os.path.join(args.data_dir, tag)
    if os.path.exists(os.path.join(root, "ready")):
        return root
    os.makedirs(root, exist_ok=True)
    schema = example_schema("decoder", seq_len=args.seq_len)
    shards, offset = [], 0
    flat = np.lib.format.open_memmap(os.path.join(root, "tokens.npy"), mode="w+", dtype=np.int32,
                                     shape=(args.sequences, args.seq_len))
    mds = _mds_writer(root, args.seq_len)
    for index in range(args.shards):
        tokens = rows_of_shard(args, index)
        first = 1 + (np.arange(len(tokens)) * 7919) % (args.seq_len - 1)
        examples = [{"key": f"s{index}-r{r}", "input_ids": tokens[r],
                     "doc_lengths": np.array([first[r], args.seq_len - first[r]], np.int32)}
                    for r in range(len(tokens))]
        files = {}
        columns = ExampleColumns.from_examples(examples, schema)
        for fmt, write in (("arrow", write_arrow_columns), ("webdataset", write_tar_columns)):
            rel = shard_name("train", fmt, index, args.shards)
            path = os.path.join(root, "lmshards", rel)
            os.makedirs(os.path.dirname(path), exist_ok=True)
            with open(path, "wb") as handle:
                write(handle, columns)
            digest = hashlib.sha256()
            with open(path, "rb") as handle:
                while chunk := handle.read(1 << 22):
                    digest.update(chunk)
            files[fmt] = {"path": rel, "bytes": os.path.getsize(path), "sha256": digest.hexdigest()}
        shards.append({"split": "train", "index": index, "rows": len(tokens), "tokens": tokens.size, "files": files})
        flat[offset : offset + len(tokens)] = tokens
        offset += len(tokens)
        if mds is not None:
            for row in tokens:
                mds.write({"input_ids": row})
    flat.flush()
    if mds is not None:
        mds.finish()
    # clm rows are the same in formats 2 and 3: written as format 2, so that an older checkout
    # (--against) reads the same files
    manifest = Manifest(objective={"name": "clm", "family": "decoder", "params": {"seq_len": args.seq_len}},
                        config={"seed": args.seed, "formats": ["arrow", "webdataset"]},
                        tokenizer={"special_ids": {"pad": 0, "eos": 1}, "vocab_size": 8000},
                        schema=schema.to_metadata(), counts={},
                        splits={"train": {"examples": args.sequences, "shards": shards}}, format_version=2)
    with open(os.path.join(root, "lmshards", "manifest.json"), "w") as handle:
        handle.write(manifest.dumps())
    open(os.path.join(root, "ready"), "w").close()
    return root


def prepare_prefix(root: str, args) -> str:
    """The same rows as a prefix-LM dataset (Arrow): each of a row's two documents split in half."""
    from schemas.examples import example_schema
    from schemas.manifest import Manifest, shard_name
    from transforms.writing.shard_format import ExampleColumns, write_arrow_columns

    out = os.path.join(root, "prefix")
    if os.path.exists(os.path.join(out, "ready")):
        return out
    schema = example_schema("decoder", seq_len=args.seq_len, prefix_lengths=True)
    shards = []
    for index in range(args.shards):
        tokens = rows_of_shard(args, index)
        first = 1 + (np.arange(len(tokens)) * 7919) % (args.seq_len - 1)
        examples = [{"key": f"s{index}-r{r}", "input_ids": tokens[r],
                     "doc_lengths": np.array([first[r], args.seq_len - first[r]], np.int32),
                     "prefix_lengths": np.array([max(1, first[r] // 2), max(1, (args.seq_len - first[r]) // 2)],
                                                np.int32)} for r in range(len(tokens))]
        rel = shard_name("train", "arrow", index, args.shards)
        path = os.path.join(out, rel)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "wb") as handle:
            write_arrow_columns(handle, ExampleColumns.from_examples(examples, schema))
        with open(path, "rb") as handle:
            digest = hashlib.sha256(handle.read()).hexdigest()
        files = {"arrow": {"path": rel, "bytes": os.path.getsize(path), "sha256": digest}}
        shards.append({"split": "train", "index": index, "rows": len(tokens), "tokens": tokens.size, "files": files})
    manifest = Manifest(objective={"name": "prefix_lm", "family": "decoder", "params": {"seq_len": args.seq_len}},
                        config={"seed": args.seed, "formats": ["arrow"]},
                        tokenizer={"special_ids": {"pad": 0, "eos": 1}, "vocab_size": 8000},
                        schema=schema.to_metadata(), counts={},
                        splits={"train": {"examples": args.sequences, "shards": shards}})
    with open(os.path.join(out, "manifest.json"), "w") as handle:
        handle.write(manifest.dumps())
    open(os.path.join(out, "ready"), "w").close()
    return out


def _mds_writer(root: str, seq_len: int):
    try:
        streaming = _import_streaming()
    except ImportError:
        return None
    return streaming.MDSWriter(out=os.path.join(root, "mds"), columns={"input_ids": f"ndarray:int32:{seq_len}"},
                               size_limit=1 << 26)


def _import_streaming():
    """Import mosaicml-streaming, stubbing transformers/torchvision when they are not installed."""
    import importlib.abc
    import importlib.machinery
    import importlib.util
    import types

    missing = [name for name in ("transformers", "torchvision") if importlib.util.find_spec(name) is None]

    class _Stub(types.ModuleType):
        def __getattr__(self, name):
            if name.startswith("__"):
                raise AttributeError(name)
            return type(name, (object,), {})

    class _Finder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
        def find_spec(self, name, path=None, target=None):
            if name.split(".")[0] in missing:
                return importlib.machinery.ModuleSpec(name, self, is_package=True)
            return None

        def create_module(self, spec):
            return _Stub(spec.name)

        def exec_module(self, module):
            module.__path__ = []

    if missing:
        sys.meta_path.insert(0, _Finder())
    import streaming

    return streaming


def warm(root: str) -> None:
    """Read every file once so that all systems start from a warm page cache."""
    for dirpath, _, names in os.walk(root):
        for name in names:
            with open(os.path.join(dirpath, name), "rb") as handle:
                while handle.read(1 << 24):
                    pass


# -- systems --------------------------------------------------------------------------------
def input_ids_only(examples):
    import torch

    return {"input_ids": torch.from_numpy(np.stack([e["input_ids"] for e in examples]))}


def memmap_batches(root, args, workers):
    import torch

    tokens = np.load(os.path.join(root, "tokens.npy"), mmap_mode="r")
    order = np.random.default_rng(args.seed).permutation(len(tokens))
    for start in range(0, len(order), args.batch_size):
        index = np.sort(order[start : start + args.batch_size])  # sorted: friendlier reads, same rows
        yield {"input_ids": torch.from_numpy(tokens[index])}


class _MemmapRows:
    """The common map-style idiom: one row of an ``np.memmap`` per ``__getitem__``."""

    def __init__(self, path: str):
        self.path, self.tokens = path, None

    def __len__(self) -> int:
        return len(np.load(self.path, mmap_mode="r"))

    def __getitem__(self, index: int) -> np.ndarray:
        if self.tokens is None:  # opened lazily: once per worker process
            self.tokens = np.load(self.path, mmap_mode="r")
        return self.tokens[index]


def memmap_dataloader_batches(root, args, workers):
    import torch
    from torch.utils.data import DataLoader

    dataset = _MemmapRows(os.path.join(root, "tokens.npy"))
    generator = torch.Generator().manual_seed(args.seed)
    loader = DataLoader(dataset, batch_size=args.batch_size, shuffle=True, num_workers=workers, generator=generator)
    for batch in loader:
        yield {"input_ids": batch}


def lmshards_batches(root, args, workers, *, fmt="arrow", full=False):
    from loaders import ShardedDataset, StackCollator, make_dataloader


    columns = ["input_ids", "doc_lengths"] if full else ["input_ids"]  # read what the batch needs, like the peers
    dataset = ShardedDataset(os.path.join(root, "lmshards"), batch_size=args.batch_size, seed=args.seed, fmt=fmt,
                             verify="never", columns=columns)
    if full:
        loader = make_dataloader(dataset, num_workers=workers, documents="position_ids", flash_attention_kwargs=True)
    else:
        loader = make_dataloader(dataset, num_workers=workers, collate_fn=StackCollator(["input_ids"]))
    yield from loader


def lmshards_default_batches(root, args, workers, *, mode=None):
    """The loader's own default collator (``mode``: ``mask`` for clm's O(L^2) option, ``prefix_lm``)."""
    from loaders import ShardedDataset, make_dataloader

    if mode == "prefix_lm":
        path, columns = prepare_prefix(root, args), ["input_ids", "doc_lengths", "prefix_lengths"]
    else:
        path, columns = os.path.join(root, "lmshards"), ["input_ids", "doc_lengths"]
    dataset = ShardedDataset(path, batch_size=args.batch_size, seed=args.seed, verify="never", columns=columns)
    options = {"group_batches": 1} if mode else {}  # a 4-D mask per batch: one batch at a time
    if mode == "mask":
        options["documents"] = "mask"
    yield from make_dataloader(dataset, num_workers=workers, **options)


def mosaic_batches(root, args, workers):
    from torch.utils.data import DataLoader

    streaming = _import_streaming()
    streaming.base.util.clean_stale_shared_memory()
    dataset = streaming.StreamingDataset(local=os.path.join(root, "mds"), shuffle=True, shuffle_seed=args.seed,
                                         batch_size=args.batch_size)
    loader = DataLoader(dataset, batch_size=args.batch_size, num_workers=workers)
    yield from loader


def webdataset_batches(root, args, workers):
    import webdataset as wds
    from torch.utils.data import DataLoader

    tar_dir = os.path.join(root, "lmshards", "train", "wds")
    urls = sorted(os.path.join(tar_dir, n) for n in os.listdir(tar_dir) if n.endswith(".tar"))
    dataset = (wds.WebDataset(urls, shardshuffle=len(urls), seed=args.seed, empty_check=False)
               .shuffle(1000)
               .decode()
               .to_tuple("input_ids.npy")
               .batched(args.batch_size))
    loader = DataLoader(dataset, batch_size=None, num_workers=workers)
    for (batch,) in loader:
        yield {"input_ids": batch}


class _PremadeBatches:
    """Ready batch tensors: what any loader with DataLoader workers can at best deliver."""

    def __init__(self, batches: int, shape: tuple[int, int]):
        self.batches, self.shape = batches, shape

    def __iter__(self):
        import torch
        from torch.utils.data import get_worker_info

        info = get_worker_info()
        worker, workers = (info.id, info.num_workers) if info is not None else (0, 1)
        template = torch.zeros(self.shape, dtype=torch.int32)
        for _ in range(worker, self.batches, workers):
            yield {"input_ids": template.clone()}


def transfer_floor_batches(root, args, workers):
    from torch.utils.data import DataLoader, IterableDataset

    class Premade(_PremadeBatches, IterableDataset):
        pass

    batches = -(-args.sequences // args.batch_size)
    yield from DataLoader(Premade(batches, (args.batch_size, args.seq_len)), batch_size=None, num_workers=workers)


RUNNERS = {
    "transfer-floor": transfer_floor_batches,
    "memmap": memmap_batches,
    "memmap-dataloader": memmap_dataloader_batches,
    "lmshards": lmshards_batches,
    "lmshards+causal": lambda root, args, workers: lmshards_batches(root, args, workers, full=True),
    "lmshards+clm": lmshards_default_batches,
    "lmshards+clm-mask": lambda root, args, workers: lmshards_default_batches(root, args, workers, mode="mask"),
    "lmshards+prefix_lm": lambda root, args, workers: lmshards_default_batches(root, args, workers,
                                                                              mode="prefix_lm"),
    "lmshards-wds": lambda root, args, workers: lmshards_batches(root, args, workers, fmt="webdataset"),
    "mosaic": mosaic_batches,
    "webdataset": webdataset_batches,
}


def _peak_rss_mb(pid: int | str = "self") -> float:
    """High-water RSS of a process (VmHWM: reset at exec, unlike getrusage's ru_maxrss)."""
    try:
        with open(f"/proc/{pid}/status") as handle:
            for line in handle:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    return 0.0


def _children() -> list[int]:
    pids = []
    for task in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{task}/children") as handle:
                pids += [int(p) for p in handle.read().split()]
        except OSError:
            pass
    return pids


_LIBRARIES = {"mosaic": "streaming", "webdataset": "webdataset", "lmshards-wds": "webdataset"}


def measure(root: str, args, system: str, workers: int) -> dict:
    """One epoch of ``system``: tokens/s after the first batch, time to first batch, peak RSS."""
    import torch  # noqa: F401  (imports are not part of the time to first batch)

    import loaders.streaming.dataloader  # noqa: F401

    if system == "mosaic":
        _import_streaming()
    elif system in _LIBRARIES:
        __import__(_LIBRARIES[system])
    start = time.perf_counter()
    batches = RUNNERS[system](root, args, workers)
    first = next(batches)
    first_batch = time.perf_counter() - start
    tokens, rows, worker_peak = first["input_ids"].numel(), first["input_ids"].shape[0], 0.0
    steady, steady_cpu = time.perf_counter(), time.process_time()
    for index, batch in enumerate(batches):
        ids = batch["input_ids"]
        tokens += ids.numel()
        rows += ids.shape[0]
        if index % 64 == 0:
            worker_peak = max([worker_peak, *(_peak_rss_mb(pid) for pid in _children())])
    elapsed, main_cpu = time.perf_counter() - steady, time.process_time() - steady_cpu
    del batches
    gc.collect()
    return {
        "system": system,
        "workers": workers,
        "rows": rows,
        "tokens": tokens,
        "tokens_per_s": (tokens - first["input_ids"].numel()) / max(elapsed, 1e-9),
        "first_batch_s": first_batch,
        # CPU time of the main (trainer's) process, all its threads, per million tokens handed out
        "main_cpu_s_per_mtok": main_cpu / max((tokens - first["input_ids"].numel()) / 1e6, 1e-9),
        "peak_rss_mb": _peak_rss_mb(),
        "peak_worker_rss_mb": worker_peak,
    }


def available(system: str) -> bool:
    import importlib.util

    if system == "mosaic":
        return importlib.util.find_spec("streaming") is not None
    if system in ("webdataset", "lmshards-wds"):
        return importlib.util.find_spec("webdataset") is not None
    return True


def _run_one(script: str, passthrough: list[str], spec: str) -> dict | None:
    cmd = [sys.executable, script, *passthrough, f"--measure={spec}"]
    done = subprocess.run(cmd, capture_output=True, text=True, cwd=os.path.dirname(os.path.dirname(script)))
    if done.returncode != 0:
        print(f"{script} {spec} failed:\n{done.stderr[-2000:]}")
        return None
    return json.loads(done.stdout.strip().splitlines()[-1])


def against(args, passthrough: list[str]) -> None:
    """This checkout's loader against another's (``--against DIR``, e.g. ``git archive COMMIT``
    unpacked there), on the same data: every round runs each cell on both sides, alternating, so
    a busy phase of the shared machine slows both alike. Printed per cell: the median tokens/s of
    each side over the rounds, the median and range of the per-round ratio (this / other), and
    the median CPU time of the main (trainer's) process per million tokens on each side."""
    import statistics

    sides = {"this": os.path.abspath(__file__), "other": os.path.join(os.path.abspath(args.against), "benchmarks",
                                                                      "bench_loader.py")}
    workers = [int(w) for w in args.workers.split(",")]
    compared = args.systems.split(",") if args.systems != ",".join(SYSTEMS) else ["lmshards", "lmshards+causal"]
    cells = [(system, w) for w in workers for system in compared]
    runs: dict[tuple, dict[str, list]] = {cell: {"this": [], "other": []} for cell in cells}
    for round_index in range(args.repeats):
        for cell in cells:
            for side in (("this", "other") if round_index % 2 == 0 else ("other", "this")):
                result = _run_one(sides[side], passthrough, f"{cell[0]}:{cell[1]}")
                runs[cell][side].append(result)
        print(f"round {round_index + 1}/{args.repeats} done", flush=True)
    header = (f"{'system':<16} {'workers':>7} {'this Mtok/s':>11} {'other':>8} {'this/other':>10} {'min':>6} "
              f"{'max':>6} {'main ms/Mtok this':>17} {'other':>6}")
    print(header)
    print("-" * len(header))
    table = []
    for (system, w), found in runs.items():
        pairs = [(a, b) for a, b in zip(found["this"], found["other"], strict=True) if a and b]
        if not pairs:
            continue
        ratios = [a["tokens_per_s"] / b["tokens_per_s"] for a, b in pairs]

        def median(side: int, key: str, pairs=pairs) -> float:
            return statistics.median(p[side].get(key, float("nan")) for p in pairs)

        row = {"system": system, "workers": w, "this_tokens_per_s": median(0, "tokens_per_s"),
               "other_tokens_per_s": median(1, "tokens_per_s"), "ratios": ratios,
               "this_main_cpu_s_per_mtok": median(0, "main_cpu_s_per_mtok"),
               "other_main_cpu_s_per_mtok": median(1, "main_cpu_s_per_mtok")}
        table.append(row)
        print(f"{system:<16} {w:>7} {row['this_tokens_per_s'] / 1e6:>11.1f} {row['other_tokens_per_s'] / 1e6:>8.1f} "
              f"{statistics.median(ratios):>10.2f} {min(ratios):>6.2f} {max(ratios):>6.2f} "
              f"{row['this_main_cpu_s_per_mtok'] * 1e3:>17.1f} {row['other_main_cpu_s_per_mtok'] * 1e3:>6.1f}")
    if args.json:
        with open(args.json, "w") as handle:
            json.dump(table, handle, indent=2)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sequences", type=int, default=50_000)
    parser.add_argument("--seq-len", type=int, default=1024)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--shards", type=int, default=16)
    parser.add_argument("--workers", default="0,2", help="comma-separated DataLoader worker counts")
    parser.add_argument("--systems", default=",".join(SYSTEMS))
    parser.add_argument("--data-dir", default=os.path.join("/tmp", "lmshards-bench"))
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--repeats", type=int, default=3, help="runs per measurement; the best is reported")
    parser.add_argument("--json", help="also write the results here")
    parser.add_argument("--against", metavar="DIR",
                        help="another checkout (e.g. `git archive COMMIT | tar -x -C DIR`): lmshards and "
                             "lmshards+causal (or --systems) here and there, alternating, in --repeats rounds, with "
                             "ratios; the other side runs DIR/benchmarks/bench_loader.py (copy this one there to "
                             "measure systems it lacks, e.g. lmshards+clm: that checkout's default collator)")
    parser.add_argument("--measure", help=argparse.SUPPRESS)  # internal: SYSTEM:WORKERS in a subprocess
    args = parser.parse_args(argv)

    if args.measure:
        system, workers = args.measure.rsplit(":", 1)
        root = prepare(args)
        print(json.dumps(measure(root, args, system, int(workers))))
        return

    t0 = time.perf_counter()
    root = prepare(args)
    warm(root)
    print(f"data: {args.sequences:,} x {args.seq_len} tokens in {root} (prepared in {time.perf_counter() - t0:.1f} s)")
    results = []
    passthrough = [f"--sequences={args.sequences}", f"--seq-len={args.seq_len}", f"--batch-size={args.batch_size}",
                   f"--shards={args.shards}", f"--data-dir={args.data_dir}", f"--seed={args.seed}"]
    if args.against:
        against(args, passthrough)
        return
    for workers in [int(w) for w in args.workers.split(",")]:
        for system in args.systems.split(","):
            if not available(system):
                print(f"skip {system}: not installed")
                continue
            if system == "memmap" and workers != 0:
                continue  # a plain loop: no workers
            cmd = [sys.executable, os.path.abspath(__file__), *passthrough, f"--measure={system}:{workers}"]
            runs = []
            for _ in range(args.repeats):
                done = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT)
                if done.returncode != 0:
                    print(f"{system} (workers {workers}) failed:\n{done.stderr[-2000:]}")
                    break
                runs.append(json.loads(done.stdout.strip().splitlines()[-1]))
            if runs:  # best of the repeats: the machine may be shared
                best = max(runs, key=lambda r: r["tokens_per_s"])
                best["first_batch_s"] = min(r["first_batch_s"] for r in runs)
                results.append(best)
    memmap = next((r["tokens_per_s"] for r in results if r["system"] == "memmap"), None)
    header = (f"{'system':<18} {'workers':>7} {'Mtok/s':>9} {'x memmap':>9} {'1st batch s':>11} {'RSS MB':>8} "
              f"{'worker MB':>9}")
    print(header)
    print("-" * len(header))
    for r in results:
        ratio = r["tokens_per_s"] / memmap if memmap else float("nan")
        r["ratio_to_memmap"] = ratio
        print(f"{r['system']:<18} {r['workers']:>7} {r['tokens_per_s'] / 1e6:>9.1f} {ratio:>9.2f} "
              f"{r['first_batch_s']:>11.3f} {r['peak_rss_mb']:>8.0f} {r['peak_worker_rss_mb']:>9.0f}")
    for workers in sorted({r["workers"] for r in results}):
        ours = next((r for r in results if r["system"] == "lmshards" and r["workers"] == workers), None)
        for peer in ("mosaic", "webdataset"):
            other = next((r for r in results if r["system"] == peer and r["workers"] == workers), None)
            if ours and other:
                print(f"workers {workers}: lmshards / {peer} = {ours['tokens_per_s'] / other['tokens_per_s']:.2f}x")
    if args.json:
        with open(args.json, "w") as handle:
            json.dump(results, handle, indent=2)


if __name__ == "__main__":
    main()
