"""``lmshards materialize``: raw corpus -> packed, sharded pretraining examples.

Pipeline (DESIGN.md section 2)::

    ReadCorpus -> Tokenize -> Pack -> BuildExamples -> WriteShards -> WriteManifest
         \\-> rejected records --------------------------------> rejected/rejected.jsonl

Everything that can be checked before the pipeline starts is checked here, and fails in
one line naming the flag: unknown flags, a bad objective or parameter, a missing or
invalid tokenizer, missing special tokens or sentinels, inputs that match nothing, a
non-empty output directory. Run as ``lmshards materialize ...`` or
``python -m pipelines.materialize ...``.

Exit status: 0 done; 1 the job failed (for example ``--max-rejected-fraction`` exceeded:
one line naming the flag, the measured fraction and the counts, and no manifest);
2 a configuration error, before any work.
"""

from __future__ import annotations

import contextlib
import datetime
import gc
import json
import logging
import os
import re
import sys
import time
from typing import Any

import apache_beam as beam
from apache_beam.io.filesystems import FileSystems
from apache_beam.options.pipeline_options import (
    DirectOptions,
    PipelineOptions,
    TestOptions,
    TypeOptions,
    _BeamArgumentParser,
)

from pipelines import __version__
from pipelines.options import MaterializeOptions, parse_args
from schemas.examples import example_schema
from schemas.manifest import FORMAT_DIRS, MANIFEST_NAME, Manifest
from transforms.accounting import RejectedFractionError, UnreconciledCountsError
from transforms.build import BuildExamples
from transforms.encoder import EncoderChoice, choose_encoder
from transforms.handoff import release, scope, unwrap
from transforms.manifest import WriteManifest
from transforms.objectives.registry import make_objective
from transforms.pack import CountersCombineFn, Pack
from transforms.parallel import prestart
from transforms.read import ReadCorpus, expand_inputs, iter_file_records
from transforms.tokenize import Tokenize, needs_full_encodings, read_tokenizer_bytes
from transforms.tokenizer_utils import ResolvedTokenizer, resolve_special_tokens, tokenizer_from_bytes
from transforms.write import TMP_DIR, WriteRejected, WriteShards, join_path, write_atomic

__all__ = ["Plan", "plan_run", "plan_encoder", "probe_documents", "build_pipeline", "run", "run_job", "main",
           "serial_encoder_warning"]

_LOG = logging.getLogger("lmshards")


class Plan:
    """Everything decided before the pipeline starts."""

    def __init__(self, options: MaterializeOptions, objective, resolved: ResolvedTokenizer, files, schema,
                 encoder: EncoderChoice | None = None):
        self.options = options
        self.objective = objective
        self.resolved = resolved
        self.files = files
        self.schema = schema
        #: the encoder backend every worker uses (decided here, probed against tokenizers)
        self.encoder = encoder or EncoderChoice(options.encoder, "tokenizers")
        self.splits = ["train", "validation"] if options.validation_fraction > 0 else ["train"]


def check_beam_args(beam_args: list[str]) -> None:
    """Fail on flags neither we nor Beam know (Beam itself only logs and drops them)."""
    parser = _BeamArgumentParser(allow_abbrev=False)
    seen = set()
    for cls in PipelineOptions.__subclasses__():
        if str(cls) not in seen:
            seen.add(str(cls))
            cls._add_argparse_args(parser)
    _, unknown = parser.parse_known_args(beam_args)
    flags = [a for a in unknown if a.startswith("-")]
    if flags:
        raise ValueError(f"unknown option {flags[0].split('=', 1)[0]} (not an lmshards or Apache Beam flag)")
    if PipelineOptions(beam_args).view_as(DirectOptions).direct_running_mode == "multi_threading":
        raise ValueError(
            "--direct_running_mode=multi_threading: not supported: Beam's multi-threading mode drops elements "
            "of long bundles (reproduced with a plain Beam pipeline, Beam 2.77); use in_memory (the default) "
            "or multi_processing"
        )


def _output_is_empty(output: str) -> bool:
    try:
        matches = FileSystems.match([join_path(output, "**")])[0].metadata_list
    except Exception:
        return True
    return not matches


def prepare_output(options: MaterializeOptions, splits: list[str]) -> None:
    """Refuse a non-empty output unless --overwrite; create the directory layout."""
    output = options.output
    if not _output_is_empty(output):
        if not options.overwrite:
            raise ValueError(f"--output {output}: directory is not empty (pass --overwrite to replace it)")
        manifest = join_path(output, MANIFEST_NAME)
        if FileSystems.exists(manifest):
            FileSystems.delete([manifest])  # first, so a half-deleted directory never looks complete
        FileSystems.delete([output])
    dirs = [output, join_path(output, TMP_DIR), join_path(output, "rejected")]
    dirs += [join_path(output, f"{split}/{FORMAT_DIRS[fmt]}") for split in splits for fmt in options.formats]
    for path in dirs:
        if not FileSystems.exists(path):
            FileSystems.mkdirs(path)


def _naming_the_flag(message: str, options: MaterializeOptions) -> str:
    """Prefix an objective error with the flag (or config file) that set the parameter."""
    if message.startswith("-"):
        return message
    named = []  # (where the message names the parameter, where the user set it)
    for name, source in options.param_sources.items():
        found = re.search(rf"\b{re.escape(name)}\b", message)
        if found:
            named.append((found.start(), source))
    return f"{min(named)[1] if named else f'--objective {options.objective}'}: {message}"


def plan_run(options: MaterializeOptions) -> Plan:
    """Validate the configuration and resolve the tokenizer, without writing anything."""
    check_beam_args(options.beam_args)
    try:
        objective = make_objective(options.objective, options.objective_params)
    except ValueError as exc:
        raise ValueError(_naming_the_flag(str(exc), options)) from exc
    if options.seed < 0:
        raise ValueError(f"--seed {options.seed}: must be >= 0")
    try:
        data = read_tokenizer_bytes(options.tokenizer)
    except Exception as exc:
        raise ValueError(f"--tokenizer {options.tokenizer}: cannot read ({exc})") from exc
    tokenizer = tokenizer_from_bytes(data, options.tokenizer)
    dropout = json.loads(tokenizer.to_str()).get("model", {}).get("dropout")
    if dropout:
        raise ValueError(f"--tokenizer {options.tokenizer}: BPE dropout (model.dropout {dropout}) makes every encoding "
                         "random, so the dataset could not be reproduced; remove it from the tokenizer.json")
    required = set(objective.required_specials)
    if options.packing != "concat" or options.last_chunk == "pad":
        required.add("pad")
    try:
        resolved = resolve_special_tokens(
            tokenizer,
            required=required,
            overrides=options.special_tokens,
            num_sentinels=objective.max_sentinels(),
            mode_tokens=objective.mode_tokens,
            add_missing=options.add_special_tokens,
        )
    except ValueError as exc:
        message = str(exc)
        raise ValueError(message if message.startswith("-") else f"--tokenizer {options.tokenizer}: {message}") from exc
    files = expand_inputs(options.inputs)
    schema = example_schema(objective.family, **objective.schema_kwargs())
    encoder = plan_encoder(options, resolved, objective.features, files)
    return Plan(options, objective, resolved, files, schema, encoder)


#: The corpus sample of the encoder's parity probe: the first documents of the first input file,
#: up to this many documents or characters, whichever comes first.
PROBE_DOCUMENTS, PROBE_CHARS = 1000, 1 << 20


def probe_documents(options: MaterializeOptions, files: list[tuple[str, int]]) -> list[str]:
    """The first documents of the first input file (read as the pipeline reads them), for the probe."""
    texts: list[str] = []
    chars = 0
    if not files:
        return texts
    records = iter_file_records(files[0][0], text_mode=options.text_mode, text_field=options.text_field,
                                policy=options.record_policy)
    for record in records:
        if isinstance(record, dict):  # a rejected record: the pipeline reports it
            continue
        texts.append(record[2])
        chars += len(record[2])
        if len(texts) >= PROBE_DOCUMENTS or chars >= PROBE_CHARS:
            break
    return texts


def plan_encoder(options: MaterializeOptions, resolved: ResolvedTokenizer, features, files) -> EncoderChoice:
    """``--encoder``: the backend the workers use; ``auto`` falls back to tokenizers with a
    one-line warning when fastokens is not importable or its parity probe fails.

    Raises:
        ValueError: ``--encoder fastokens`` where it cannot be used (:func:`choose_encoder`).
    """
    if options.encoder == "tokenizers":
        return EncoderChoice(options.encoder, "tokenizers")
    tokenizer_bytes = resolved.to_json_bytes()
    needs_full = needs_full_encodings(tokenizer_from_bytes(tokenizer_bytes, options.tokenizer), features)
    documents = [] if needs_full else probe_documents(options, files)
    choice = choose_encoder(options.encoder, tokenizer_bytes.decode("utf-8"), needs_full=needs_full,
                            documents=documents)
    if choice.reason and (choice.probe.get("result") in ("mismatch", "error") or "not importable" in choice.reason):
        _LOG.warning("lmshards: encoding with tokenizers: %s", choice.reason)
    return choice


def _static_manifest(plan: Plan, argv: list[str] | None) -> dict[str, Any]:
    o = plan.options
    resolved = plan.resolved
    special = resolved.special
    return {
        "splits": plan.splits,
        "formats": list(o.formats),
        "objective": {"name": plan.objective.name, "family": plan.objective.family, "params": plan.objective.params()},
        "config": {
            "seed": o.seed,
            "packing": o.packing,
            "last_chunk": o.last_chunk,
            "document_separator": o.document_separator,
            "num_buckets": o.num_buckets,
            "validation_fraction": o.validation_fraction,
            "formats": list(o.formats),
            "num_shards": o.num_shards,
            "shard_size_mb": o.shard_size_mb,
            "text_mode": o.text_mode,
            "text_field": o.text_field,
            "draws": o.draws,
            "deduplicate": "exact",
            **o.record_policy.to_json(),
            "max_rejected_fraction": o.max_rejected_fraction,
        },
        "tokenizer": {
            "file": "tokenizer.json",
            "sha256": resolved.sha256(),
            "vocab_size": special.vocab_size,
            "roles": dict(sorted(resolved.roles.items())),
            "special_ids": {
                role: getattr(special, role)
                for role in ("pad", "eos", "bos", "unk", "mask", "cls", "sep")
                if getattr(special, role) is not None
            },
            "num_sentinels": len(special.sentinels),
            "mode_tokens": dict(special.mode_tokens),
            "added_tokens": list(resolved.added),
        },
        "schema": plan.schema.to_metadata(),
        "run": {
            "created_at": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "lmshards_version": __version__,
            "argv": list(argv) if argv is not None else sys.argv[1:],
            "output": o.output,
            "tokenizer_source": o.tokenizer,
            "input_patterns": list(o.inputs),
            "input_files": [{"path": p, "bytes": size} for p, size in plan.files],
            "beam_args": list(o.beam_args),
            "encoder": plan.encoder.to_json(),
        },
    }


def shard_sizing(plan: Plan) -> dict[str, int | None]:
    """Arguments of :func:`transforms.objectives.layout.shard_count` (after split and tokens)."""
    length = round(plan.objective.mean_raw_length)
    o = plan.options
    return {
        "num_shards": o.num_shards,
        "tokens_per_example": max(1, length),
        "draws": o.draws,
        "bytes_per_example": max(1, 4 * length * len(plan.schema.token_columns)),
        "shard_bytes": int(o.shard_size_mb * 2**20),
    }


def build_pipeline(pipeline: beam.Pipeline, plan: Plan, argv: list[str] | None = None,
                   handoff_scope: str | None = None) -> None:
    """Add the materialize steps to ``pipeline``.

    ``handoff_scope``: hand token arrays and example batches across the shuffles by
    reference, under this scope (:mod:`transforms.handoff`; only for a runner that runs every
    stage in this process); None copies them through the runner.
    """
    o = plan.options
    tokenizer_out = join_path(o.output, "tokenizer.json")
    read = pipeline | "ReadCorpus" >> ReadCorpus(
        [p for p, _ in plan.files], text_mode=o.text_mode, text_field=o.text_field, policy=o.record_policy
    )
    tokenized = read.texts | "Tokenize" >> Tokenize(
        tokenizer_out,
        features=plan.objective.features,
        validation_fraction=o.validation_fraction,
        num_buckets=o.num_buckets,
        batch_size=o.batch_size,
        progress_seconds=o.progress_seconds,
        encoder_threads=o.encoder_threads,
        handoff_scope=handoff_scope,
        encoder=plan.encoder.backend,
    )
    chunks, pack_stats = tokenized.documents | "Pack" >> Pack(
        plan.objective, mode=o.packing, seed=o.seed, last_chunk=o.last_chunk,
        eos=plan.resolved.special.eos if o.document_separator == "eos" else None
    )
    # Document tokens (EOS included) per split size the splits' shards before any example exists.
    split_tokens = (
        tokenized.documents
        | "DocumentTokens" >> beam.Map(lambda element: (element[0][0], len(unwrap(element[1])[1]) // 4 + 1))
        | "TokensPerSplit" >> beam.CombinePerKey(sum)
    )
    sizing = shard_sizing(plan)
    # The objective runs on both chunk outputs of Pack apart, and the few re-packed examples reach
    # the shard writers as a side input: flattening either pair would make Beam's local runner
    # copy every chunk or example through an extra stage.
    build = BuildExamples(plan.objective, plan.resolved.special, plan.schema, seed=o.seed, draws=o.draws,
                          sizing=sizing, processes=o.build_processes, handoff_scope=handoff_scope)
    bucket_chunks, repacked_chunks = chunks
    batches, build_stats = (bucket_chunks, split_tokens) | "BuildExamples" >> build
    rest_batches, rest_stats = (repacked_chunks, split_tokens) | "BuildRepackedExamples" >> build
    objective_stats = (
        (build_stats, rest_stats)
        | "AllObjectiveStats" >> beam.Flatten()
        | "SumObjectiveStats" >> beam.CombinePerKey(CountersCombineFn())
    )
    shards = (batches, rest_batches, split_tokens) | "WriteShards" >> WriteShards(
        o.output, plan.schema, formats=o.formats, sizing=sizing
    )
    rejected = (read[ReadCorpus.REJECTED], tokenized[Tokenize.REJECTED]) | "AllRejected" >> beam.Flatten()
    rejected_files, reasons = rejected | "WriteRejected" >> WriteRejected(o.output)
    read_stats = read[ReadCorpus.STATS] | "SumReadStats" >> beam.CombineGlobally(CountersCombineFn())
    _ = (shards, objective_stats, pack_stats, read_stats, reasons, rejected_files) | "WriteManifest" >> WriteManifest(
        o.output, _static_manifest(plan, argv)
    )


def run(argv: list[str] | None = None) -> Manifest | None:
    """Run a materialize job; return the manifest it wrote (None for a Dataflow ``--dry_run``).

    Raises:
        ValueError: a configuration error (before any work is done).
    """
    return run_job(argv)[0]


class JobFailedError(RuntimeError):
    """The pipeline started and failed (as opposed to a configuration error)."""


#: Values of ``TOKENIZERS_PARALLELISM`` with which the Rust tokenizer encodes a batch on one thread.
_SERIAL_TOKENIZERS = frozenset({"", "off", "false", "f", "no", "n", "0"})


def serial_encoder_warning(options: MaterializeOptions, environ=None) -> str | None:
    """The warning to give when ``TOKENIZERS_PARALLELISM`` keeps the encoder on one thread
    where it would use several (set by training scripts to quiet the tokenizer's fork warning,
    and by the tokenizer itself in a process that forked after encoding in parallel); else None."""
    environ = os.environ if environ is None else environ
    value = environ.get("TOKENIZERS_PARALLELISM")
    if value is None or value.strip().lower() not in _SERIAL_TOKENIZERS:
        return None
    if not options.in_one_process and (options.encoder_threads or 1) <= 1:
        return None  # workers of one encoder thread each: nothing is lost
    return (f"TOKENIZERS_PARALLELISM={value} in the environment: the Rust encoder runs on one thread "
            "(unset it to encode on every core)")


def run_job(argv: list[str] | None = None) -> tuple[Manifest | None, beam.runners.runner.PipelineResult]:
    """Like :func:`run`, also returning Beam's ``PipelineResult`` (metrics, a dry run's ``job``)."""
    options = parse_args(argv)
    start = time.monotonic()
    pipeline_options = PipelineOptions(options.beam_args)
    if not options.pipeline_type_check:
        # Beam type-checks every transform's hints while the graph is built: about 0.2 s of a
        # 0.6 s start-up (measured), for a graph that is fixed and run by the tests.
        pipeline_options.view_as(TypeOptions).pipeline_type_check = False
    FileSystems.set_options(pipeline_options)
    plan = plan_run(options)
    warning = serial_encoder_warning(options) if plan.encoder.backend == "tokenizers" else None
    if warning:  # fastokens does not read TOKENIZERS_PARALLELISM
        _LOG.warning(warning)
    dry_run = bool(pipeline_options.view_as(TestOptions).dry_run)
    if dry_run:
        # Build and validate the job only: check the output, but change nothing there.
        if not options.overwrite and not _output_is_empty(options.output):
            raise ValueError(f"--output {options.output}: directory is not empty (pass --overwrite to replace it)")
    else:
        prepare_output(options, plan.splits)
        tokenizer_bytes = plan.resolved.to_json_bytes()
        write_atomic(options.output, "tokenizer.json", lambda handle: handle.write(tokenizer_bytes))
        prestart(options.build_processes)  # the workers start while Beam does
    _shorten_state_sampling()
    pipeline = beam.Pipeline(options=pipeline_options)
    handoff_scope = scope() if options.in_one_process and not dry_run else None
    build_pipeline(pipeline, plan, argv, handoff_scope)
    try:
        with _quiet_logs_of(RejectedFractionError), _quiet_logs_of(UnreconciledCountsError), _frozen_heap():
            result = pipeline.run()
            result.wait_until_finish()
    except Exception as exc:
        message = _check_message(exc, RejectedFractionError, "--max-rejected-fraction ")
        if message is not None:
            raise RejectedFractionError(message) from None
        message = _check_message(exc, UnreconciledCountsError, "documents do not add up")
        if message is not None:
            raise JobFailedError(message) from None
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
        raise JobFailedError(f"the pipeline failed: {type(exc).__name__}: {first}") from exc
    finally:
        if handoff_scope is not None:
            release(handoff_scope)
    if dry_run:
        return None, result
    with FileSystems.open(join_path(options.output, MANIFEST_NAME)) as handle:
        manifest = Manifest.loads(handle.read().decode("utf-8"))
    manifest.run["wall_seconds"] = round(time.monotonic() - start, 3)
    return manifest, result


@contextlib.contextmanager
def _frozen_heap():
    """Keep the objects that exist when the pipeline starts (modules, Beam's and the graph's)
    out of the garbage collector's full passes while it runs.

    The in-process runner holds its stages' data in this process, so full collections come
    during the run; each traversed every object of the process, Beam's hundreds of
    thousands included: about 80 ms each, two of them in a 60 MB run (0.16 s of its 11 s,
    measured). Frozen, those objects are skipped; what the run makes is collected as usual.
    Left alone when something in this process froze objects already (:func:`gc.freeze` has
    no undo of one caller's freeze alone).
    """
    if gc.get_freeze_count():
        yield
        return
    gc.freeze()
    try:
        yield
    finally:
        gc.unfreeze()


#: Longest sleep of Beam's state-sampler thread, in ms (Beam's default: 200).
STATE_SAMPLING_MS = 20


def _shorten_state_sampling() -> None:
    """Make Beam's state sampler sleep at most :data:`STATE_SAMPLING_MS` between samples.

    Every bundle starts a sampler thread (it times the steps) and joins it at the end; the
    thread sleeps up to 200 ms between samples, so each long bundle ended with up to 200 ms
    of idle waiting (about 0.4 s per run of the in-process runner, measured). Sampling more
    often only makes those timings finer. Affects bundles run in this process; a Beam
    version without this constructor default is left alone.
    """
    try:
        from apache_beam.runners.worker import statesampler

        init = statesampler.StateSampler.__init__
        if init.__defaults__ and len(init.__defaults__) == 1 and isinstance(init.__defaults__[0], int):
            init.__defaults__ = (min(init.__defaults__[0], STATE_SAMPLING_MS),)
    except (ImportError, AttributeError):
        pass


_BEAM_SUFFIX = re.compile(r"\s*\[while running [^\]]*\]\s*$")


def _check_message(exc: BaseException, error_type: type[BaseException], start: str) -> str | None:
    """The one-line message of an ``error_type`` (a final check of WriteManifest) behind a failed pipeline.

    In-process runners re-raise the DoFn's exception (chained); others report only its
    traceback as text, where the line after the exception's class name is the message,
    which begins with ``start``.
    """
    seen = exc
    while seen is not None:
        if isinstance(seen, error_type):
            return _BEAM_SUFFIX.sub("", str(seen).splitlines()[0])
        seen = seen.__cause__ or seen.__context__
    found = re.search(rf"{error_type.__name__}: ({re.escape(start)}[^\n]*)", str(exc))
    return _BEAM_SUFFIX.sub("", found.group(1)) if found else None


class _DropErrorsOf(logging.Filter):
    def __init__(self, error_type: type[BaseException]):
        super().__init__()
        self._error_type = error_type

    def filter(self, record: logging.LogRecord) -> bool:
        error = record.exc_info[1] if record.exc_info else None
        return not isinstance(error, self._error_type) and self._error_type.__name__ not in record.getMessage()


@contextlib.contextmanager
def _quiet_logs_of(error_type: type[BaseException]):
    """Keep Beam from logging the traceback of an expected job failure: main prints one line."""
    loggers = [logging.getLogger(name) for name in (
        "apache_beam.runners.common",
        "apache_beam.runners.worker.sdk_worker",
        "apache_beam.runners.portability.fn_api_runner.fn_runner",
        "apache_beam.runners.portability.local_job_service",  # worker logs of multi_processing
    )]
    drop = _DropErrorsOf(error_type)
    for logger in loggers:
        logger.addFilter(drop)
    try:
        yield
    finally:
        for logger in loggers:
            logger.removeFilter(drop)


def summary_lines(manifest: Manifest, wall_seconds: float) -> list[str]:
    """Human summary of a finished run: the document accounting first, then the splits."""
    counts = manifest.counts
    reasons = ", ".join(f"{k} {v:,}" for k, v in counts["rejected_by_reason"].items())
    lines = [
        f"documents: read {counts['documents_read']:,} {'=' if counts['reconciled'] else '!='} "
        f"written {counts['documents_written']:,} + duplicates {counts['duplicates']:,} "
        f"+ rejected {counts['rejected']:,}{f' ({reasons})' if reasons else ''} + filtered {counts['filtered']:,}",
    ]
    repaired = counts.get("repaired", {})
    repairs = [
        f"{name.replace('_', ' ')} {repaired[name]:,}"
        for name in ("invalid_utf8_replaced", "nul_bytes_stripped")
        if repaired.get(name)
    ]
    if repaired.get("long_documents_split"):
        repairs.append(f"long documents split {repaired['long_documents_split']:,} "
                       f"(into {repaired['split_pieces']:,} documents)")
    if repairs:
        lines.append(f"repaired: {', '.join(repairs)}")
    total_tokens = 0
    for split, info in manifest.splits.items():
        total_tokens += info["document_tokens"]
        lines.append(
            f"{split}: {info['examples']:,} examples, {info['tokens']:,} tokens in {info['num_shards']} shards"
            f" (padding {info['padding_tokens']:,}, dropped {info['dropped_tokens']:,})"
        )
    encoder = manifest.run.get("encoder")
    if encoder:
        lines.append(f"encoder: {encoder_summary(encoder)}")
    rate = total_tokens / wall_seconds if wall_seconds > 0 else 0.0
    lines.append(f"wall time {wall_seconds:.1f} s, {total_tokens:,} document tokens, {rate:,.0f} tokens/s")
    return lines


def encoder_summary(encoder: dict[str, Any]) -> str:
    """One phrase for the manifest's ``run.encoder``: the backend, its version and why."""
    backend = encoder["backend"]
    version = encoder.get(f"{backend}_version") or "?"
    probe = encoder.get("probe", {})
    if backend == "fastokens":
        return f"fastokens {version} (parity probe against tokenizers passed on {probe.get('texts', 0):,} texts)"
    why = encoder.get("reason") or f"--encoder {encoder.get('requested', 'tokenizers')}"
    return f"tokenizers {version} ({why})"


def main(argv: list[str] | None = None) -> int:
    """CLI entry: run and print the summary; errors are one line (exit 2: configuration, 1: job)."""
    try:
        manifest = run(argv)
    except SystemExit as exc:  # argparse has printed its one-line error
        return int(exc.code or 0)
    except (RejectedFractionError, JobFailedError) as exc:  # the job ran and failed
        print(f"lmshards materialize: error: {exc}", file=sys.stderr)
        return 1
    except ValueError as exc:
        print(f"lmshards materialize: error: {exc}", file=sys.stderr)
        return 2
    if manifest is None:
        print("dry run: the pipeline was built and validated, nothing was submitted")
        return 0
    for line in summary_lines(manifest, manifest.run["wall_seconds"]):
        print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
