"""Command-line options of ``lmshards materialize``: :class:`MaterializeOptions` and
:func:`parse_args`, which reads them from the command line and a ``--config`` file and checks
what no single flag can check alone.

Our flags (:mod:`pipelines.parser`) are parsed with
:func:`argparse.ArgumentParser.parse_known_args`; everything it does not know goes to Beam's
``PipelineOptions`` unchanged (``--runner``, ``--direct_num_workers``, Dataflow flags), as in
Beam's wordcount example. Objective parameters can also come from ``--config FILE`` (JSON or
YAML); flags given on the command line win over the file. What ``auto`` values become on the
runner is :mod:`pipelines.runner_tuning`'s.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from pipelines.parallelism import RunnerSetup, worker_flags
from pipelines.parser import build_parser, refuse_mistyped_flags
from schemas.errors import ConfigError
from schemas.names import shown_name
from transforms.building.parallel import BLOCK_ROWS
from transforms.flag_values import DEFAULT_PACK_GROUP_TOKENS, REJECTED_PER_SHARD
from transforms.objectives.registry import objective_flags, objective_parameters
from transforms.reading.flag_files import MAX_CONFIG_BYTES, read_flag_file
from transforms.reading.record_policy import MAX_RECORD_BYTES, RecordPolicy
from transforms.writing.accounting import DEFAULT_MAX_REJECTED_FRACTION

__all__ = ["MaterializeOptions", "parse_args"]

DEFAULT_RUNNER = "FnApiRunner"


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
    #: rejected records per file of ``OUT/rejected/``, about (``--rejected-per-file``: spread by digest)
    rejected_per_file: int = REJECTED_PER_SHARD
    #: rows the objective builds in one call (``--block-rows``; never changes the output)
    block_rows: int = BLOCK_ROWS
    max_record_bytes: int = MAX_RECORD_BYTES
    unverified_zstd: str = "keep"
    #: size of a read task in MB (``--input-split-mb``: byte ranges, Parquet row groups)
    input_split_mb: float = 64.0
    #: most tokens of a pack group (None with ``--num-buckets``)
    pack_group_tokens: int | None = DEFAULT_PACK_GROUP_TOKENS
    #: ``--build-stage`` as given: ``fused`` (the objective runs where chunks are packed),
    #: ``separate`` (a stage of its own) or ``auto`` (the runner tuning decides)
    build_stage: str = "auto"
    #: ``--encoder-threads`` as given: threads of each worker's Rust encoder, or ``auto`` (the
    #: runner tuning decides: :attr:`pipelines.runner_tuning.RunnerTuning.encoder_threads`)
    encoder_threads: int | str = "auto"
    #: the encoder backend asked for: auto, fastokens or tokenizers (:mod:`transforms.tokenizing.encoder`)
    encoder: str = "auto"
    #: show the warnings Beam's workers relay (``--verbose``)
    verbose: bool = False
    #: JSONL field naming each document's source, for per-source statistics (``--source-field``)
    source_field: str | None = None
    #: run Beam's construction-time type check (``--pipeline-type-check``)
    pipeline_type_check: bool = False
    #: what ends each document in the packed stream: "eos" or "none" (T5's join)
    document_separator: str = "eos"
    #: the runner runs every stage in this process (where the run's progress is counted; what
    #: the graph does for that runner is :mod:`pipelines.runner_tuning`'s)
    in_one_process: bool = False
    #: FnApiRunner with ``--direct_running_mode=multi_processing``: local SDK worker processes,
    #: which report progress to this one and are ended on Ctrl-C
    local_workers: bool = False
    #: objective parameter -> where the user set it (``--seq-len 1``, ``--config params.yaml``)
    param_sources: dict[str, str] = field(default_factory=dict)
    #: ``(--text-mode, --text-field)`` as given (None: not given), for the checks of
    #: :mod:`pipelines.input_checks` (a flag the inputs would ignore is refused)
    text_flags_given: tuple[str | None, str | None] = (None, None)

    @property
    def record_policy(self) -> RecordPolicy:
        """The reader's policy for invalid UTF-8, NUL bytes and long documents."""
        return RecordPolicy(self.invalid_utf8, self.nul_bytes, self.max_doc_chars, self.long_docs,
                            self.max_record_bytes, self.unverified_zstd)





def _load_config(path: str) -> dict[str, Any]:
    data = read_flag_file("--config", path, MAX_CONFIG_BYTES)
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        raise ConfigError(f"--config {shown_name(path)}: not UTF-8 text") from None
    try:
        if path.endswith((".yaml", ".yml")):
            import yaml

            data = yaml.safe_load(text)
        else:
            data = json.loads(text)
    except Exception as exc:
        kind = "YAML" if path.endswith((".yaml", ".yml")) else "JSON"
        raise ConfigError(f"--config {shown_name(path)}: not valid {kind} ({exc})") from exc
    if not isinstance(data, dict):
        raise ConfigError(f"--config {shown_name(path)}: expected a mapping of parameter names to values")
    return data


def parse_args(argv: list[str] | None) -> MaterializeOptions:
    """Parse our flags; the rest become ``beam_args`` (FnApiRunner unless a runner is given).

    Raises:
        SystemExit: argparse errors (one line, naming the flag).
        ConfigError: a bad ``--config`` file, an unknown objective or a flag it does not take, flags
            that contradict each other.
    """
    parser = build_parser()
    args, beam_args = parser.parse_known_args(argv)
    refuse_mistyped_flags(beam_args, parser)  # before Beam is imported (it knows the rest)
    params: dict[str, Any] = {}
    sources: dict[str, str] = {}
    if args.config_file:
        params.update(_load_config(args.config_file))
        objective = params.pop("objective", None)
        if objective and "--objective" not in (argv or []):
            args.objective = objective
        sources = {name: f"--config {args.config_file}" for name in params}
    if args.max_record_bytes < 1024:
        raise ConfigError(f"--max-record-bytes {args.max_record_bytes}: must be at least 1024")
    if args.num_buckets is not None and args.pack_group_tokens is not None:
        raise ConfigError(f"--num-buckets {args.num_buckets} and --pack-group-tokens {args.pack_group_tokens}: "
                          "choose one (fixed hash buckets, or groups sized by tokens)")
    try:
        objective_parameters(args.objective)  # unknown objective: fail first, naming it
    except ValueError as exc:  # the registry's (objectives import no schemas): the user's --objective
        raise ConfigError(str(exc)) from None
    for flag, dest, _, objectives, _ in objective_flags():
        value = getattr(args, dest)
        if value is None:
            continue
        if args.objective not in objectives:
            raise ConfigError(f"{flag} is not a parameter of objective {args.objective} "
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
        text_mode=args.text_mode or "line",
        text_field=args.text_field or "text",
        text_flags_given=(args.text_mode, args.text_field),
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
        build_stage=args.build_stage,
        encoder_threads=args.encoder_threads,
        encoder=args.encoder,
        verbose=args.verbose,
        source_field=args.source_field,
        in_one_process=runner_setup.in_one_process,
        local_workers=runner_setup.local_workers,
        pipeline_type_check=args.pipeline_type_check,
        param_sources=sources,
    )
