"""Command-line options of ``lmshards materialize``.

Our flags are parsed with :func:`argparse.ArgumentParser.parse_known_args`; everything it
does not know goes to Beam's ``PipelineOptions`` unchanged (``--runner``,
``--direct_num_workers``, Dataflow flags), as in Beam's wordcount example. Objective
parameters can also come from ``--config FILE`` (JSON or YAML); flags given on the command
line win over the file.
"""

from __future__ import annotations

import argparse
import json
import os
from dataclasses import dataclass, field
from typing import Any

from transforms.accounting import DEFAULT_MAX_REJECTED_FRACTION
from transforms.encoder import ENCODER_CHOICES
from transforms.group import DEFAULT_PACK_GROUP_TOKENS
from transforms.objectives.packing import PACKING_MODES
from transforms.pack import LAST_CHUNK_MODES
from transforms.parallel import BLOCK_ROWS
from transforms.read import TEXT_MODES
from transforms.record_policy import (
    INVALID_UTF8_POLICIES,
    LONG_DOC_POLICIES,
    MAX_RECORD_BYTES,
    NUL_POLICIES,
    UNVERIFIED_ZSTD_POLICIES,
    RecordPolicy,
)
from transforms.write import REJECTED_PER_SHARD

__all__ = ["BUILD_STAGES", "FORMATS", "MaterializeOptions", "RunnerSetup", "build_parser", "parse_args",
           "estimated_groups", "resolve_build_stage", "resolve_encoder_threads",
           "worker_flags"]

FORMATS = ("arrow", "webdataset")
#: What ends each document in the packed stream (--document-separator).
DOCUMENT_SEPARATORS = ("eos", "none")
DEFAULT_RUNNER = "FnApiRunner"
#: Runners that run the pipeline in this process (unless --direct_running_mode=multi_processing).
IN_PROCESS_RUNNERS = ("FnApiRunner", "DirectRunner", "SwitchingDirectRunner", "BundleBasedDirectRunner")


@dataclass
class MaterializeOptions:
    """Parsed options of one materialize run (ours, not Beam's)."""

    inputs: list[str]
    output: str
    tokenizer: str
    objective: str
    objective_params: dict[str, Any]
    formats: tuple[str, ...]
    num_shards: int | None
    shard_size_mb: float
    seed: int
    validation_fraction: float
    packing: str
    last_chunk: str
    #: fixed hash buckets per split (``--num-buckets``), or None: groups sized by tokens
    num_buckets: int | None
    text_mode: str
    text_field: str
    draws: int
    special_tokens: dict[str, str]
    add_special_tokens: bool
    overwrite: bool
    batch_size: int
    progress_seconds: float
    beam_args: list[str] = field(default_factory=list)
    config_file: str | None = None
    invalid_utf8: str = "reject"
    nul_bytes: str = "reject"
    max_doc_chars: int | None = None
    long_docs: str = "split"
    max_rejected_fraction: float | None = DEFAULT_MAX_REJECTED_FRACTION
    #: most rejected records per file of ``OUT/rejected/`` (``--rejected-per-file``)
    rejected_per_file: int = REJECTED_PER_SHARD
    #: rows the objective builds in one call (``--block-rows``; never changes the output)
    block_rows: int = BLOCK_ROWS
    max_record_bytes: int = MAX_RECORD_BYTES
    unverified_zstd: str = "keep"
    #: size of a read task in MB (``--input-split-mb``: byte ranges, Parquet row groups)
    input_split_mb: float = 64.0
    #: most tokens of a pack group (None with ``--num-buckets``)
    pack_group_tokens: int | None = DEFAULT_PACK_GROUP_TOKENS
    #: ``fused`` (the objective runs where chunks are packed), ``separate`` (a stage of its own) or
    #: ``auto`` (until :func:`resolve_build_stage` decides)
    build_stage: str = "auto"
    #: threads of each worker's Rust encoder (None: the tokenizer's default, every core)
    encoder_threads: int | None = None
    #: the encoder backend asked for: auto, fastokens or tokenizers (:mod:`transforms.encoder`)
    encoder: str = "auto"
    #: show the warnings Beam's workers relay (``--verbose``)
    verbose: bool = False
    #: JSONL field naming each document's source, for per-source statistics (``--source-field``)
    source_field: str | None = None
    #: run Beam's construction-time type check (``--pipeline-type-check``)
    pipeline_type_check: bool = False
    #: what ends each document in the packed stream: "eos" or "none" (T5's join)
    document_separator: str = "eos"
    #: the runner runs every stage in this process (large values cross its shuffles by reference)
    in_one_process: bool = False
    #: objective parameter -> where the user set it (``--seq-len 1``, ``--config params.yaml``)
    param_sources: dict[str, str] = field(default_factory=dict)

    @property
    def record_policy(self) -> RecordPolicy:
        """The reader's policy for invalid UTF-8, NUL bytes and long documents."""
        return RecordPolicy(self.invalid_utf8, self.nul_bytes, self.max_doc_chars, self.long_docs,
                            self.max_record_bytes, self.unverified_zstd)


def _positive_int(flag):
    def parse(value):
        try:
            number = int(value)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{flag} {value}: not an integer") from None
        if number <= 0:
            raise argparse.ArgumentTypeError(f"{flag} {value}: must be > 0")
        return number

    return parse


def _positive_float(flag):
    def parse(value):
        try:
            number = float(value)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{flag} {value}: not a number") from None
        if not number > 0:
            raise argparse.ArgumentTypeError(f"{flag} {value}: must be > 0")
        return number

    return parse


def _int(flag):
    def parse(value):
        try:
            return int(value)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{flag} {value}: not an integer") from None

    return parse


def _fraction(value):
    try:
        number = float(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"--validation-fraction {value}: not a number") from None
    if not 0.0 <= number < 1.0:
        raise argparse.ArgumentTypeError(f"--validation-fraction {value}: must be in [0, 1)")
    return number


def _rejected_fraction(value):
    try:
        number = float(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"--max-rejected-fraction {value}: not a number") from None
    if not 0.0 <= number <= 1.0:
        raise argparse.ArgumentTypeError(f"--max-rejected-fraction {value}: must be in [0, 1]")
    return number


def _auto_or_count(flag: str, noun: str, minimum: int):
    """argparse type of a flag that takes ``auto`` or a whole number >= ``minimum``."""

    def parse(value):
        if value == "auto":
            return value
        try:
            number = int(value)
        except ValueError:
            number = minimum - 1
        if number < minimum:
            raise argparse.ArgumentTypeError(f"{flag} {value}: expected auto or a number of {noun} >= {minimum}")
        return number

    return parse


def _usable_cores() -> int:
    affinity = getattr(os, "sched_getaffinity", None)  # Linux; elsewhere every core counts
    return len(affinity(0)) if affinity else os.cpu_count() or 1


def _copies_chunks(objective: str | None) -> bool:
    """The objective's examples are copies of its chunks (``Objective.copies_chunks``: sending a
    chunk to a build worker and its example back costs as much as building it)."""
    from transforms.objectives.registry import OBJECTIVES

    return objective in OBJECTIVES and OBJECTIVES[objective].copies_chunks


@dataclass(frozen=True)
class RunnerSetup:
    """What the parallelism defaults depend on, read once from the Beam flags."""

    runner: str  #: the runner's class name (``FnApiRunner``, ``DataflowRunner``, ...)
    multi_processing: bool  #: ``--direct_running_mode=multi_processing``
    num_workers: int  #: ``--direct_num_workers`` (0: one per core)
    experiments: tuple[str, ...]  #: ``--experiments``

    @property
    def in_one_process(self) -> bool:
        """The runner runs every stage in this process: FnApiRunner, not multi_processing."""
        return self.runner == "FnApiRunner" and not self.multi_processing

    @classmethod
    def from_beam_args(cls, beam_args: list[str]) -> RunnerSetup:
        from apache_beam.options.pipeline_options import (
            DebugOptions,
            DirectOptions,
            PipelineOptions,
            StandardOptions,
        )

        options = PipelineOptions(beam_args)
        runner = options.view_as(StandardOptions).runner or "DirectRunner"
        direct = options.view_as(DirectOptions)
        return cls(runner=(runner if isinstance(runner, str) else type(runner).__name__).rsplit(".", 1)[-1],
                   multi_processing=direct.direct_running_mode == "multi_processing",
                   num_workers=direct.direct_num_workers or 0,
                   experiments=tuple(options.view_as(DebugOptions).experiments or ()))


def resolve_encoder_threads(value: int | str, setup: RunnerSetup) -> int | None:
    """``--encoder-threads``: ``auto`` shares the cores among the worker processes of
    ``--direct_running_mode=multi_processing`` (each worker's encoder would otherwise start a
    thread per core: measured 6-9% slower on 2 cores with 2 workers) and is 1 on Dataflow,
    whose workers run one SDK process per core (unless the ``no_use_multiple_sdk_containers``
    experiment makes it one process); elsewhere None, the tokenizer's own default (every
    core; one in-process encoder). A number is taken as given."""
    if value != "auto":
        return int(value)
    if setup.runner == "DataflowRunner":
        return None if "no_use_multiple_sdk_containers" in setup.experiments else 1
    if not setup.multi_processing:
        return None
    cores = _usable_cores()
    return max(1, cores // (setup.num_workers or cores))  # Beam: 0 workers means one per core


#: Beam flags that --workers sets, which the user must not also give.
_WORKER_FLAGS = ("--direct_running_mode", "--direct_num_workers", "--num_workers")


def worker_flags(workers: int, beam_args: list[str]) -> list[str]:
    """The Beam flags of ``--workers N`` for the runner in ``beam_args``.

    Raises:
        ValueError: the user also gave one of those flags, or the runner has no such setting.
    """
    given = [a.split("=", 1)[0] for a in beam_args if a.split("=", 1)[0] in _WORKER_FLAGS]
    if given:
        raise ValueError(f"--workers {workers}: also given {given[0]}; use one or the other")
    runner = RunnerSetup.from_beam_args(beam_args).runner
    if runner in ("FnApiRunner", "DirectRunner", "SwitchingDirectRunner"):
        if workers == 1:
            return ["--direct_running_mode=in_memory"]
        return ["--direct_running_mode=multi_processing", f"--direct_num_workers={workers}"]
    if runner == "DataflowRunner":
        return [f"--num_workers={workers}"]
    raise ValueError(f"--workers {workers}: not supported with --runner {runner}; use that runner's own flag for "
                     "its parallelism")
BUILD_STAGES = ("auto", "fused", "separate")
#: ``--build-stage auto`` on a distributed runner builds in a stage of its own below this many
#: estimated pack groups: fused, building has only as many workers as there are groups.
SEPARATE_BELOW_GROUPS = 64
#: Bytes of text per token, and of text per byte of a compressed file, to estimate groups with.
_TEXT_BYTES_PER_TOKEN, _COMPRESSION_RATIO = 4, 4


def estimated_groups(files: list[tuple[str, int]], pack_group_tokens: int | None, num_buckets: int | None) -> int:
    """About how many pack groups per split the inputs make (from their sizes alone)."""
    if num_buckets:
        return num_buckets
    text_bytes = sum(size * (_COMPRESSION_RATIO if path.lower().endswith((".gz", ".zst", ".zstd", ".gzip")) else 1)
                     for path, size in files)
    return -(-text_bytes // (_TEXT_BYTES_PER_TOKEN * (pack_group_tokens or 1)))


def resolve_build_stage(value: str, setup: RunnerSetup, objective: str | None = None, groups: int = 0) -> str:
    """``--build-stage``: ``auto`` runs the objective in a stage of its own (``separate``) only
    where that buys parallelism: on a distributed runner (Dataflow, ...) when the corpus makes
    fewer than :data:`SEPARATE_BELOW_GROUPS` pack groups (``groups``, estimated from the input
    sizes), so that building is spread over every worker instead of one per group; not for clm
    (its examples are copies of its chunks). Everywhere else it runs where the chunks are packed
    (``fused``): on Beam's local multi-processing runner, spreading the chunks over its workers
    cost more than the building it spread (README, Runners). Either way the output is the same;
    the choice depends on file sizes and the runner, never the bytes."""
    if value != "auto":
        return value
    if _copies_chunks(objective) or setup.runner in IN_PROCESS_RUNNERS:
        return "fused"
    return "separate" if groups < SEPARATE_BELOW_GROUPS else "fused"


def _formats(value):
    formats = tuple(f.strip() for f in value.split(",") if f.strip())
    bad = [f for f in formats if f not in FORMATS]
    if not formats or bad:
        raise argparse.ArgumentTypeError(f"--formats {value}: choose from {', '.join(FORMATS)} (comma-separated)")
    return tuple(sorted(set(formats), key=FORMATS.index))


def _role(value):
    if "=" not in value:
        raise argparse.ArgumentTypeError(f"--special-token {value}: expected ROLE=TOKEN, e.g. eos=</s>")
    role, token = value.split("=", 1)
    return role.strip(), token


class _Parser(argparse.ArgumentParser):
    """Errors in one line naming the flag (no usage block), exit status 2."""

    def error(self, message):
        self.exit(2, f"{self.prog}: error: {message}\n")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        allow_abbrev=False,  # a new flag must never change what an old command line means
        prog="lmshards materialize",
        description="Turn a raw text corpus into packed, sharded pretraining examples. "
        "Flags not listed here are passed to Apache Beam (--runner, --direct_num_workers, Dataflow flags).",
    )
    io = parser.add_argument_group("input and output")
    io.add_argument("--input", action="append", required=True, metavar="GLOB",
                    help="input files (.txt/.jsonl/.parquet, optionally .gz/.zst; local or gs://); repeatable")
    io.add_argument("--output", required=True, metavar="DIR", help="dataset directory to create")
    io.add_argument("--tokenizer", required=True, metavar="PATH", help="a HF tokenizers tokenizer.json")
    io.add_argument("--text-mode", choices=TEXT_MODES, default="line",
                    help="documents of text files: one per line, per blank-line paragraph, or per file")
    io.add_argument("--text-field", default="text", help="JSONL field (dotted path) or Parquet column of the text")
    io.add_argument("--source-field", default=None, metavar="FIELD",
                    help="JSONL field (dotted path) naming each document's source (a corpus, a language): the "
                    "manifest and the report then give documents, tokens and lengths per source")
    io.add_argument("--formats", type=_formats, default=("arrow",), help="arrow,webdataset (default: arrow)")
    io.add_argument("--num-shards", type=_positive_int("--num-shards"), default=None,
                    help="train shards (default: sized by --shard-size-mb)")
    io.add_argument("--shard-size-mb", type=float, default=256.0, help="target shard size (default 256)")
    io.add_argument("--overwrite", action="store_true", help="replace a non-empty output directory")
    io.add_argument("--input-split-mb", type=_positive_float("--input-split-mb"), default=64.0, metavar="MB",
                    help="read uncompressed text/JSONL files in byte ranges, and Parquet in runs of row groups, "
                    "of about this size, in parallel (default 64; never changes the output)")
    bad = parser.add_argument_group("bad input (see README, Bad input)")
    bad.add_argument("--invalid-utf8", choices=INVALID_UTF8_POLICIES, default="reject",
                     help="reject a record with invalid UTF-8 (default) or replace bad bytes with U+FFFD")
    bad.add_argument("--nul-bytes", choices=NUL_POLICIES, default="reject",
                     help="reject a record with NUL bytes (default), strip them, or keep them")
    bad.add_argument("--max-doc-chars", type=_positive_int("--max-doc-chars"), default=None, metavar="N",
                     help="longest document in characters (default: no limit); see --long-docs")
    bad.add_argument("--long-docs", choices=LONG_DOC_POLICIES, default=None,
                     help="split a longer document (or record) at paragraph/line/space boundaries (default) "
                          "or reject it")
    bad.add_argument("--max-record-bytes", type=_positive_int("--max-record-bytes"), default=MAX_RECORD_BYTES,
                     metavar="N", help="most bytes of one record held in memory (default 64 MiB): a longer text "
                                       "record is split or rejected as --long-docs says, a longer JSON line rejected")
    bad.add_argument("--unverified-zstd", choices=UNVERIFIED_ZSTD_POLICIES, default="keep",
                     help="zstd frames written without a checksum: keep their files (listed in the manifest as "
                          "unverified; default) or reject them")
    bad.add_argument("--max-rejected-fraction", type=_rejected_fraction, default=DEFAULT_MAX_REJECTED_FRACTION,
                     metavar="F", help="fail the job, writing no manifest, when more than F of the documents read "
                     f"are rejected (default {DEFAULT_MAX_REJECTED_FRACTION}; 1 never fails)")
    bad.add_argument("--rejected-per-file", type=_positive_int("--rejected-per-file"), default=REJECTED_PER_SHARD,
                     metavar="N", help="most rejected records per file of OUT/rejected/ (default "
                     f"{REJECTED_PER_SHARD:,}; records spread over ceil(rejected / N) files by a digest of each)")
    from transforms.objectives.registry import OBJECTIVES, objective_flags

    obj = parser.add_argument_group("objective")
    others = [name for name in OBJECTIVES if name != "clm"]
    obj.add_argument("--objective", default="clm",
                     help=f"clm (default), {', '.join(others[:-1])} or {others[-1]}" if others else "clm")
    obj.add_argument("--config", dest="config_file", metavar="FILE",
                     help="JSON or YAML file of objective parameters (flags win)")
    # Each registered objective's flags, from its config fields (transforms/objectives/flags.py).
    for flag, dest, kind, objectives, help_text in objective_flags():
        help_text = f"{help_text} [{', '.join(objectives)}]"
        if kind is bool:
            obj.add_argument(flag, dest=dest, action=argparse.BooleanOptionalAction, default=None, help=help_text)
        elif kind is int:
            obj.add_argument(flag, dest=dest, type=_int(flag), default=None, help=help_text)
        else:
            obj.add_argument(flag, dest=dest, type=kind, default=None, help=help_text)
    obj.add_argument("--draws", type=_positive_int("--draws"), default=1,
                     help="independent noisings of each chunk (distinct example keys)")
    pack = parser.add_argument_group("packing and splits")
    pack.add_argument("--packing", choices=PACKING_MODES, default="concat")
    pack.add_argument("--last-chunk", choices=LAST_CHUNK_MODES, default="drop",
                      help="the split's final partial chunk in concat packing")
    pack.add_argument("--pack-group-tokens", type=_positive_int("--pack-group-tokens"), default=None, metavar="N",
                      help="most tokens of a pack group, the unit a worker packs in memory; groups, and the "
                      f"parallelism of packing, grow with the corpus (default {DEFAULT_PACK_GROUP_TOKENS:,}: "
                      "about 1 GB of a worker; part of the config: changes the bytes)")
    pack.add_argument("--num-buckets", type=_positive_int("--num-buckets"), default=None, metavar="N",
                      help="expert override of --pack-group-tokens: N hash buckets per split, whatever their "
                      "sizes (the grouping of dataset format 1; part of the config: changes the bytes)")
    pack.add_argument("--document-separator", choices=DOCUMENT_SEPARATORS, default="eos",
                      help="what ends each document in the packed stream: eos (default) or none, T5's join "
                           "(reduce_concat_tokens: span corruption then never sees an EOS inside a chunk)")
    pack.add_argument("--seed", type=int, default=0)
    pack.add_argument("--validation-fraction", type=_fraction, default=0.0,
                      help="share of documents (by content hash) in the validation split")
    tok = parser.add_argument_group("tokenizer")
    tok.add_argument("--special-token", action="append", type=_role, default=[], metavar="ROLE=TOKEN",
                     help="use TOKEN for ROLE (pad, eos, bos, unk, mask, cls, sep); repeatable")
    tok.add_argument("--add-special-tokens", action="store_true",
                     help="add missing special tokens, sentinels and mode tokens to the tokenizer")
    tok.add_argument("--encoder", choices=ENCODER_CHOICES, default="auto",
                     help="token encoder backend; both give the same ids. auto (default): fastokens where it loads "
                     "the tokenizer and a parity probe against tokenizers passes, else HF tokenizers")
    tok.add_argument("--batch-size", type=_positive_int("--batch-size"), default=2048,
                     help="texts per encode_batch call (default 2048; batches also stop at 8M characters)")
    tok.add_argument("--progress-seconds", type=float, default=10.0,
                     help="print tokenizing progress to stderr this often (0: never; default 10)")
    io.add_argument("--verbose", action="store_true",
                    help="also show the warnings Beam's workers relay (multi-process runs; hidden by default)")
    run = parser.add_argument_group("parallelism")
    run.add_argument("--workers", type=_positive_int("--workers"), default=None, metavar="N",
                     help="worker processes: on the local runners --direct_running_mode=multi_processing "
                     "--direct_num_workers=N (1: in-process), on Dataflow --num_workers=N")
    run.add_argument("--pipeline-type-check", action="store_true",
                     help="run Beam's construction-time type check of the transforms (off by default: the "
                     "pipeline is fixed and tested, and the check takes about a third of its start-up)")
    run.add_argument("--encoder-threads", type=_auto_or_count("--encoder-threads", "threads", 1), default="auto",
                     metavar="N",
                     help="threads of each worker's Rust encoder (default auto: cores / workers with "
                     "multi_processing, 1 on Dataflow, else the tokenizer's default, every core); sets "
                     "RAYON_NUM_THREADS in "
                     "workers where it is unset")
    run.add_argument("--build-stage", choices=BUILD_STAGES, default="auto",
                     help="where the objective runs: fused with packing, or separate (its own stage, chunks "
                     f"spread over every worker); default auto: separate on Dataflow when the corpus makes fewer "
                     f"than {SEPARATE_BELOW_GROUPS} pack groups (not for clm), else fused; never changes the output")
    run.add_argument("--block-rows", type=_positive_int("--block-rows"), default=BLOCK_ROWS, metavar="N",
                     help=f"rows (chunks times draws) the objective builds in one call (default {BLOCK_ROWS}): "
                     "fewer holds less memory per call; never changes the output")
    return parser


def _load_config(path: str) -> dict[str, Any]:
    from apache_beam.io.filesystems import FileSystems

    try:
        with FileSystems.open(path) as handle:
            text = handle.read().decode("utf-8")
    except Exception as exc:
        raise ValueError(f"--config {path}: cannot read ({exc})") from exc
    try:
        if path.endswith((".yaml", ".yml")):
            import yaml

            data = yaml.safe_load(text)
        else:
            data = json.loads(text)
    except Exception as exc:
        kind = "YAML" if path.endswith((".yaml", ".yml")) else "JSON"
        raise ValueError(f"--config {path}: not valid {kind} ({exc})") from exc
    if not isinstance(data, dict):
        raise ValueError(f"--config {path}: expected a mapping of parameter names to values")
    return data


def parse_args(argv: list[str] | None) -> MaterializeOptions:
    """Parse our flags; the rest become ``beam_args`` (FnApiRunner unless a runner is given).

    Raises:
        SystemExit: argparse errors (one line, naming the flag).
        ValueError: a bad ``--config`` file.
    """
    parser = build_parser()
    args, beam_args = parser.parse_known_args(argv)
    params: dict[str, Any] = {}
    sources: dict[str, str] = {}
    if args.config_file:
        params.update(_load_config(args.config_file))
        objective = params.pop("objective", None)
        if objective and "--objective" not in (argv or []):
            args.objective = objective
        sources = {name: f"--config {args.config_file}" for name in params}
    if args.max_record_bytes < 1024:
        raise ValueError(f"--max-record-bytes {args.max_record_bytes}: must be at least 1024")
    if args.num_buckets is not None and args.pack_group_tokens is not None:
        raise ValueError(f"--num-buckets {args.num_buckets} and --pack-group-tokens {args.pack_group_tokens}: "
                         "choose one (fixed hash buckets, or groups sized by tokens)")
    from transforms.objectives.registry import objective_flags, objective_parameters

    objective_parameters(args.objective)  # unknown objective: fail first, naming it
    for flag, dest, _, objectives, _ in objective_flags():
        value = getattr(args, dest)
        if value is None:
            continue
        if args.objective not in objectives:
            raise ValueError(f"{flag} is not a parameter of objective {args.objective} "
                             f"(it is for {', '.join(objectives)})")
        params[dest] = value
        sources[dest] = (flag if value else f"--no-{flag[2:]}") if isinstance(value, bool) else f"{flag} {value}"
    if not any(a == "--runner" or a.startswith("--runner=") for a in beam_args):
        beam_args = [f"--runner={DEFAULT_RUNNER}", *beam_args]
    if args.workers is not None:
        beam_args = [*beam_args, *worker_flags(args.workers, beam_args)]
    runner_setup = RunnerSetup.from_beam_args(beam_args)
    roles = dict(args.special_token)
    return MaterializeOptions(
        inputs=args.input,
        output=args.output.rstrip("/") if args.output != "/" else args.output,
        tokenizer=args.tokenizer,
        objective=args.objective,
        objective_params=params,
        formats=args.formats,
        num_shards=args.num_shards,
        shard_size_mb=args.shard_size_mb,
        seed=args.seed,
        validation_fraction=args.validation_fraction,
        packing=args.packing,
        last_chunk=args.last_chunk,
        document_separator=args.document_separator,
        num_buckets=args.num_buckets,
        input_split_mb=args.input_split_mb,
        pack_group_tokens=None if args.num_buckets else (args.pack_group_tokens or DEFAULT_PACK_GROUP_TOKENS),
        text_mode=args.text_mode,
        text_field=args.text_field,
        draws=args.draws,
        special_tokens=roles,
        add_special_tokens=args.add_special_tokens,
        overwrite=args.overwrite,
        batch_size=args.batch_size,
        progress_seconds=args.progress_seconds,
        beam_args=beam_args,
        config_file=args.config_file,
        invalid_utf8=args.invalid_utf8,
        nul_bytes=args.nul_bytes,
        max_doc_chars=args.max_doc_chars,
        long_docs=args.long_docs or "split",
        max_rejected_fraction=args.max_rejected_fraction,
        rejected_per_file=args.rejected_per_file,
        block_rows=args.block_rows,
        max_record_bytes=args.max_record_bytes,
        unverified_zstd=args.unverified_zstd,
        build_stage=args.build_stage,  # resolved once the inputs are listed (materialize.plan_run)
        encoder_threads=resolve_encoder_threads(args.encoder_threads, runner_setup),
        encoder=args.encoder,
        verbose=args.verbose,
        source_field=args.source_field,
        in_one_process=runner_setup.in_one_process,
        pipeline_type_check=args.pipeline_type_check,
        param_sources=sources,
    )
