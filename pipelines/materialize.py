"""``lmshards materialize``: raw corpus -> packed, sharded pretraining examples.

Pipeline (docs/design.md section 2)::

    ReadCorpus -> Tokenize -> DropDuplicates -> AssignGroups -> Pack -> BuildExamples -> WriteShards -> WriteManifest
        |            \\-> PlanGroups (tokens per sub-bucket: the groups AssignGroups uses)
        \\-> rejected records ----------------------------------------------> rejected/*.jsonl

WriteManifest checks the run's conservation laws (documents, tokens, examples, rows) first.

Everything that can be checked before the pipeline starts is checked here, and fails in
one line naming the flag: unknown flags, a bad objective or parameter, a missing or
invalid tokenizer, missing special tokens or sentinels, inputs that match nothing (or
file names that are not UTF-8), an unknown runner, an output that is a file, a non-empty
output directory, or with ``--overwrite`` one that holds anything but an lmshards
dataset or its debris. Only then does the run take the output's lock and, with
``--overwrite``, delete the old dataset (:mod:`transforms.output`). A run that fails
afterwards removes what it wrote (except ``rejected/`` when too many records were
rejected: the message points there) and its lock. Run as ``lmshards materialize ...`` or
``python -m pipelines.materialize ...``.

Exit status: 0 done; 1 the job failed (for example ``--max-rejected-fraction`` exceeded:
one line naming the flag, the measured fraction and the counts, and no manifest; or an
input that changed while it was read); 2 a configuration error, before any work (a live
run holding the output's lock included).
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import difflib
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
from pipelines.beam_logging import set_beam_verbosity
from pipelines.dataflow import stage_installed_package
from pipelines.options import (
    MaterializeOptions,
    RunnerSetup,
    build_parser,
    estimated_groups,
    parse_args,
    resolve_build_stage,
)
from schemas.errors import ConfigError, JobFailedError, LmshardsError, exit_code
from schemas.examples import example_schema
from schemas.manifest import FORMAT_DIRS, MANIFEST_NAME, Manifest
from transforms.accounting import EmptySplitError, RejectedFractionError, UnreconciledCountsError
from transforms.build import BuildExamples
from transforms.encoder import EncoderChoice, choose_encoder
from transforms.group import SUB_BUCKETS, AssignGroups, DropDuplicates, PlanGroups
from transforms.handoff import release, scope, unwrap
from transforms.inputs import InputChangedError
from transforms.manifest import WriteManifest
from transforms.objectives.counters import sum_counters
from transforms.objectives.registry import make_objective, objective_flags
from transforms.output import (
    LOCK_NAME,
    LockLostError,
    OutputLockedError,
    RunLock,
    acquire_lock,
    foreign_files,
    list_output,
    read_lock,
    remove_output_files,
)
from transforms.pack import Pack
from transforms.parallel import prestart
from transforms.progress import PROGRESS
from transforms.read import ReadCorpus, file_format, iter_file_records, list_inputs, record_fields
from transforms.tokenize import Tokenize, needs_full_encodings, read_tokenizer_bytes
from transforms.tokenizer_utils import ResolvedTokenizer, resolve_special_tokens, tokenizer_from_bytes
from transforms.write import TMP_DIR, WriteRejected, WriteShards, join_path, write_atomic

__all__ = ["Plan", "plan_run", "plan_encoder", "sample_records", "check_text_field", "build_pipeline", "run",
           "run_job", "main", "serial_encoder_warning", "summary_lines"]

_LOG = logging.getLogger("lmshards")


class Plan:
    """Everything decided before the pipeline starts."""

    def __init__(self, options: MaterializeOptions, objective, resolved: ResolvedTokenizer, files, schema,
                 inputs=None, skipped=(), encoder: EncoderChoice | None = None):
        self.options = options
        self.objective = objective
        self.resolved = resolved
        self.files = files  #: ``(path, bytes)`` of every input file
        self.inputs = list(inputs) if inputs is not None else None  #: the same as InputFile (with mtimes)
        self.skipped = list(skipped)  #: glob matches that are not files (SkippedInput)
        self.schema = schema
        #: the encoder backend every worker uses (decided here, probed against tokenizers)
        self.encoder = encoder or EncoderChoice(options.encoder, "tokenizers")
        self.splits = ["train", "validation"] if options.validation_fraction > 0 else ["train"]


def _beam_parser() -> argparse.ArgumentParser:
    parser = _BeamArgumentParser(allow_abbrev=False)
    seen = set()
    for cls in PipelineOptions.__subclasses__():
        if str(cls) not in seen:
            seen.add(str(cls))
            cls._add_argparse_args(parser)
    return parser


def _suggestion(flag: str, beam_flags: list[str]) -> str:
    """``; did you mean --seq-len?`` for a mistyped flag (ours first), else an empty string."""
    ours = [option for option in build_parser()._option_string_actions if option.startswith("--")]
    for candidates in (ours, beam_flags):
        close = difflib.get_close_matches(flag, candidates, n=1, cutoff=0.75)
        if close:
            return f"; did you mean {close[0]}?"
    prefixed = sorted(option for option in ours if option.startswith(flag) and len(flag) > 2)
    if prefixed:  # a prefix abbreviation, which lmshards does not accept
        return f"; did you mean {' or '.join(prefixed)}? (flags are not abbreviated)"
    return ""


def check_beam_args(beam_args: list[str]) -> None:
    """Fail on flags neither we nor Beam know (Beam itself only logs and drops them), with a
    suggestion for a typo, and on stray positional arguments (an unquoted glob the shell
    expanded into several file names: only the first would be read)."""
    parser = _beam_parser()
    _, unknown = parser.parse_known_args(beam_args)
    flags = [a for a in unknown if a.startswith("-")]
    if flags:
        flag = flags[0].split("=", 1)[0]
        beam_flags = [option for option in parser._option_string_actions if option.startswith("--")]
        raise ValueError(f"unknown option {flag} (not an lmshards or Apache Beam flag){_suggestion(flag, beam_flags)}")
    if unknown:
        shown = " ".join(unknown[:3]) + (" ..." if len(unknown) > 3 else "")
        raise ValueError(f"unexpected argument{'s' if len(unknown) > 1 else ''} {shown}: an unquoted glob? The shell "
                         "expands --input data/*.jsonl into several names and only the first is read; quote it "
                         "(--input 'data/*.jsonl') or repeat --input for each file")
    if PipelineOptions(beam_args).view_as(DirectOptions).direct_running_mode == "multi_threading":
        raise ValueError(
            "--direct_running_mode=multi_threading: not supported: Beam's multi-threading mode drops elements "
            "of long bundles (reproduced with a plain Beam pipeline, Beam 2.77); use in_memory (the default) "
            "or multi_processing"
        )


def _output_is_empty(output: str) -> bool:
    return not list_output(output)


def _is_file(output: str) -> bool:
    scheme = FileSystems.get_scheme(output)
    if scheme in (None, "file"):
        local = output[len("file://"):] if output.startswith("file://") else output
        return os.path.lexists(local) and not os.path.isdir(local)
    try:
        return any(m.path == output for m in FileSystems.match([output])[0].metadata_list)
    except Exception:  # noqa: BLE001 - nothing there
        return False


def check_output(options: MaterializeOptions, own: RunLock | None = None) -> list[str]:
    """Check, changing nothing, that the run may write to ``--output``; return the files there.

    ``own``: the lock this run holds (not another run's).

    Raises:
        ValueError: the output is a file; it is not empty (without ``--overwrite``); with
            ``--overwrite``, it holds a file that is not part of an lmshards dataset.
        OutputLockedError: a live run holds its lock.
    """
    output = options.output
    if _is_file(output):
        raise ValueError(f"--output {output}: is a file, not a directory")
    existing = list_output(output)
    held = read_lock(output) if LOCK_NAME in existing else None
    if held is not None and (own is None or held.run_id != own.run_id) and not held.stale():
        raise OutputLockedError(f"--output {output}: another run is writing there ({held.describe()}; {LOCK_NAME}); "
                                f"wait for it, or delete {LOCK_NAME} if no such run exists")
    if [r for r in existing if own is None or r != LOCK_NAME] and not options.overwrite:
        raise ValueError(f"--output {output}: directory is not empty (pass --overwrite to replace it)")
    foreign = foreign_files(existing)
    if foreign:
        more = f" and {len(foreign) - 1} more" if len(foreign) > 1 else ""
        raise ValueError(f"--output {output}: --overwrite replaces only an lmshards dataset or its debris, and "
                         f"{foreign[0]}{more} is not part of one; move it away or choose another --output")
    return existing


def prepare_output(options: MaterializeOptions, splits: list[str], lock: RunLock | None = None) -> RunLock:
    """Check the output (:func:`check_output`), take its lock, delete the old dataset (with
    ``--overwrite``) and create the directory layout; return the lock.

    Raises:
        ValueError: as :func:`check_output`, or an output that cannot be written.
        OutputLockedError: another run holds (or just took) the lock.
    """
    output = options.output
    check_output(options)
    try:
        lock = acquire_lock(output, lock)
    except OSError as exc:
        raise ValueError(f"--output {output}: cannot write there ({exc.strerror or exc})") from exc
    try:
        existing = [r for r in check_output(options, lock) if r != LOCK_NAME]  # again: no other run can start now
        remove_output_files(output, existing)
        dirs = [output, join_path(output, TMP_DIR), join_path(output, "rejected")]
        dirs += [join_path(output, f"{split}/{FORMAT_DIRS[fmt]}") for split in splits for fmt in options.formats]
        for path in dirs:
            if not FileSystems.exists(path):
                FileSystems.mkdirs(path)
    except OSError as exc:
        lock.release()
        raise ValueError(f"--output {output}: cannot write there ({exc.strerror or exc})") from exc
    except BaseException:
        lock.release()
        raise
    return lock


def _clean_failed_run(output: str, lock: RunLock, keep_rejected: bool) -> None:
    """Remove what a failed run wrote (``rejected/`` too unless ``keep_rejected``), then its lock."""
    try:
        lock.check()
    except LockLostError:
        return  # the output is another run's now
    except Exception:  # noqa: BLE001 - the output cannot be read: nothing to clean
        return
    try:
        files = [r for r in list_output(output) if not (keep_rejected and r.startswith("rejected/"))]
        remove_output_files(output, files)
    except Exception:  # noqa: BLE001 - leave the rest for --overwrite
        pass
    lock.release()
    if FileSystems.get_scheme(output) in (None, "file"):
        try:
            os.rmdir(output[len("file://"):] if output.startswith("file://") else output)  # only if empty
        except OSError:
            pass


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
    listing = list_inputs(options.inputs, file_format)
    groups = estimated_groups([(f.path, f.size) for f in listing.files], options.pack_group_tokens,
                              options.num_buckets)
    options.build_stage = resolve_build_stage(options.build_stage, RunnerSetup.from_beam_args(options.beam_args),
                                              options.objective, groups)
    schema = example_schema(objective.family, **objective.schema_kwargs())
    files = [(f.path, f.size) for f in listing.files]
    texts, rejected = sample_records(options, files)
    if files:
        check_text_field(options, files[0][0], texts, rejected)
    encoder = plan_encoder(options, resolved, objective.features, texts)
    return Plan(options, objective, resolved, files, schema, listing.files, listing.skipped, encoder)


#: The corpus sample read before the pipeline starts (the encoder's parity probe, the text-field
#: check): the first records of the first input file, up to this many records or characters.
SAMPLE_RECORDS, SAMPLE_CHARS = 1000, 1 << 20


def sample_records(options: MaterializeOptions, files: list[tuple[str, int]]) -> tuple[list[str], list[dict]]:
    """The texts and the rejected records among the first records of the first input file,
    read as the pipeline reads them, at most :data:`SAMPLE_CHARS` characters of text in all."""
    texts: list[str] = []
    rejected: list[dict] = []
    chars = 0
    if not files:
        return texts, rejected
    # Not verified: a sample must not decompress a whole archive (the pipeline verifies every file).
    records = iter_file_records(files[0][0], text_mode=options.text_mode, text_field=options.text_field,
                                policy=options.record_policy, verify=False)
    for record in records:
        if isinstance(record, dict):
            rejected.append(record)
        else:
            # A record beyond the budget is cut (at a space where there is one): the probe encodes
            # the sample with both encoders whole, so the sample itself must stay small.
            text = record[2][: SAMPLE_CHARS - chars]
            cut = len(text) < len(record[2])
            if cut and " " in text[len(text) // 2:]:
                text = text[: text.rindex(" ")]
            texts.append(text)
            chars += len(text)
            if cut:
                break
        if len(texts) + len(rejected) >= SAMPLE_RECORDS or chars >= SAMPLE_CHARS:
            break
    return texts, rejected


def check_text_field(options: MaterializeOptions, path: str, texts: list[str], rejected: list[dict]) -> None:
    """Fail before any work when no record at the start of the first file has ``--text-field``:
    every document of the run would be rejected.

    Raises:
        ValueError: naming the field, the file and the fields its records have.
    """
    if texts or not rejected or any(r["reason"] != "missing_text_field" for r in rejected):
        return
    fields = record_fields(path)
    seen = f"; fields seen: {', '.join(fields)}" if fields else ""
    raise ValueError(f"--text-field {options.text_field}: no record has the field {options.text_field!r} "
                     f"(the first {len(rejected):,} of {path}){seen}")


def plan_encoder(options: MaterializeOptions, resolved: ResolvedTokenizer, features,
                 documents: list[str]) -> EncoderChoice:
    """``--encoder``: the backend the workers use; ``auto`` falls back to tokenizers with a
    one-line warning when fastokens is not importable or its parity probe fails.

    Raises:
        ValueError: ``--encoder fastokens`` where it cannot be used (:func:`choose_encoder`).
    """
    if options.encoder == "tokenizers":
        return EncoderChoice(options.encoder, "tokenizers")
    tokenizer_bytes = resolved.to_json_bytes()
    needs_full = needs_full_encodings(tokenizer_from_bytes(tokenizer_bytes, options.tokenizer), features)
    choice = choose_encoder(options.encoder, tokenizer_bytes.decode("utf-8"), needs_full=needs_full,
                            documents=[] if needs_full else documents)
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
            "pack_group_tokens": o.pack_group_tokens,
            "sub_buckets": None if o.num_buckets else SUB_BUCKETS,
            "validation_fraction": o.validation_fraction,
            "formats": list(o.formats),
            "num_shards": o.num_shards,
            "shard_size_mb": o.shard_size_mb,
            "text_mode": o.text_mode,
            "text_field": o.text_field,
            "source_field": o.source_field,
            "draws": o.draws,
            "deduplicate": "exact",
            **o.record_policy.to_json(),
            "max_rejected_fraction": o.max_rejected_fraction,
        },
        "tokenizer": {
            "file": "tokenizer.json",
            "sha256": resolved.sha256(),
            "vocab_size": special.vocab_size,
            "source_vocab_size": special.vocab_size - len(resolved.added),
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
            "input_files": ([{"path": f.path, "bytes": f.size, "modified": f.mtime} for f in plan.inputs]
                            if plan.inputs is not None else [{"path": p, "bytes": size} for p, size in plan.files]),
            "skipped_inputs": [s.to_json() for s in plan.skipped],
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


def _split_tokens(element):
    """``((split, sub-bucket), Document)`` -> ``(split, its tokens and EOS)``."""
    (split, _), document = element
    return split, unwrap(document).tokens + 1


def build_pipeline(pipeline: beam.Pipeline, plan: Plan, argv: list[str] | None = None,
                   handoff_scope: str | None = None, lock: RunLock | None = None) -> None:
    """Add the materialize steps to ``pipeline``.

    ``handoff_scope``: hand token arrays and example batches across the shuffles by
    reference, under this scope (:mod:`transforms.handoff`; only for a runner that runs every
    stage in this process); None copies them through the runner. ``lock``: the run's lock,
    checked by every writer before it renames a file into place.
    """
    o = plan.options
    tokenizer_out = join_path(o.output, "tokenizer.json")
    read = pipeline | "ReadCorpus" >> ReadCorpus(
        plan.inputs if plan.inputs is not None else [p for p, _ in plan.files], text_mode=o.text_mode,
        text_field=o.text_field, policy=o.record_policy, split_bytes=max(1, int(o.input_split_mb * 2**20)),
        source_field=o.source_field,
    )
    tokenized = read["texts"] | "Tokenize" >> Tokenize(
        tokenizer_out,
        features=plan.objective.features,
        validation_fraction=o.validation_fraction,
        num_buckets=o.num_buckets or SUB_BUCKETS,
        batch_size=o.batch_size,
        progress_seconds=o.progress_seconds,
        encoder_threads=o.encoder_threads,
        handoff_scope=handoff_scope,
        encoder=plan.encoder.backend,
    )
    # Pack groups are planned from every document's tokens while duplicates are dropped; each
    # unique document then goes to its group (with --num-buckets its bucket is its group).
    groups = tokenized.documents | "PlanGroups" >> PlanGroups(o.pack_group_tokens)
    unique = tokenized.documents | "DropDuplicates" >> DropDuplicates()
    documents = unique.documents
    if o.num_buckets is None:
        documents = documents | "AssignGroups" >> AssignGroups(groups)
    chunks, packing_stats = documents | "Pack" >> Pack(
        plan.objective, mode=o.packing, seed=o.seed, last_chunk=o.last_chunk,
        eos=plan.resolved.special.eos if o.document_separator == "eos" else None,
        group_name="b" if o.num_buckets else "g",
    )
    pack_stats = (
        (packing_stats, unique[DropDuplicates.STATS])
        | "AllPackingStats" >> beam.Flatten()
        | "SumPackingStats" >> beam.CombinePerKey(sum_counters)
    )
    # Document tokens (EOS included) per split size the splits' shards before any example exists.
    split_tokens = (
        tokenized.documents
        | "DocumentTokens" >> beam.Map(_split_tokens)
        | "TokensPerSplit" >> beam.CombinePerKey(sum)
    )
    sizing = shard_sizing(plan)
    # The objective runs on both chunk outputs of Pack apart (flattening them would make Beam's
    # local runner encode every chunk); their example batches meet in WriteShards' one shuffle.
    settings = dict(seed=o.seed, draws=o.draws, sizing=sizing, processes=o.build_processes,
                    handoff_scope=handoff_scope)
    build = BuildExamples(plan.objective, plan.resolved.special, plan.schema, **settings,
                          separate=o.build_stage == "separate")
    build_repacked = BuildExamples(plan.objective, plan.resolved.special, plan.schema, **settings)
    bucket_chunks, repacked_chunks = chunks
    batches, build_stats = (bucket_chunks, split_tokens) | "BuildExamples" >> build
    rest_batches, rest_stats = (repacked_chunks, split_tokens) | "BuildRepackedExamples" >> build_repacked
    objective_stats = (
        (build_stats, rest_stats)
        | "AllObjectiveStats" >> beam.Flatten()
        | "SumObjectiveStats" >> beam.CombinePerKey(sum_counters)
    )
    shards = (batches, rest_batches, split_tokens) | "WriteShards" >> WriteShards(
        o.output, plan.schema, formats=o.formats, sizing=sizing, lock=lock
    )
    rejected = (read[ReadCorpus.REJECTED], tokenized[Tokenize.REJECTED]) | "AllRejected" >> beam.Flatten()
    rejected_files, reasons = rejected | "WriteRejected" >> WriteRejected(o.output, lock=lock)
    read_stats = read[ReadCorpus.STATS] | "SumReadStats" >> beam.CombineGlobally(sum_counters)
    source_stats = tokenized[Tokenize.SOURCES] | "SumSourceStats" >> beam.CombinePerKey(sum_counters)
    _ = (shards, objective_stats, pack_stats, read_stats, reasons, rejected_files, groups,
         source_stats) | "WriteManifest" >> WriteManifest(o.output, _static_manifest(plan, argv), lock)


def run(argv: list[str] | None = None) -> Manifest | None:
    """Run a materialize job; return the manifest it wrote (None for a Dataflow ``--dry_run``).

    Raises:
        ConfigError: a configuration error (before any work is done; a ``ValueError``).
        JobFailedError: the job ran and failed (no manifest written).
    """
    return run_job(argv)[0]


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


def _prepare(argv: list[str] | None):
    """Parse, plan and check everything before any work; ``(options, plan, dry run, pipeline)``.

    Raises:
        ConfigError: any problem found here (a ``ValueError`` of a check becomes one).
    """
    try:
        options = parse_args(argv)
        set_beam_verbosity(options.verbose)
        # On Dataflow, unless the user ships the code some way of their own, a wheel of this lmshards
        # (and its pinned dependencies) goes to the workers.
        options.beam_args = stage_installed_package(options.beam_args)
        pipeline_options = PipelineOptions(options.beam_args)
        if not options.pipeline_type_check:
            # Beam type-checks every transform's hints while the graph is built, for a graph that is
            # fixed and run by the tests.
            pipeline_options.view_as(TypeOptions).pipeline_type_check = False
        FileSystems.set_options(pipeline_options)
        plan = plan_run(options)
        warning = serial_encoder_warning(options) if plan.encoder.backend == "tokenizers" else None
        if warning:  # fastokens does not read TOKENIZERS_PARALLELISM
            _LOG.warning(warning)
        dry_run = bool(pipeline_options.view_as(TestOptions).dry_run)
        check_output(options)  # before anything else: it changes nothing
        _shorten_state_sampling()
        pipeline = beam.Pipeline(options=pipeline_options)  # an unknown runner fails here, before the output changes
    except LmshardsError:
        raise
    except ValueError as exc:
        raise ConfigError(str(exc)) from exc
    return options, plan, dry_run, pipeline


def run_job(argv: list[str] | None = None) -> tuple[Manifest | None, beam.runners.runner.PipelineResult]:
    """Like :func:`run`, also returning Beam's ``PipelineResult`` (metrics, a dry run's ``job``)."""
    start = time.monotonic()
    options, plan, dry_run, pipeline = _prepare(argv)
    handoff_scope = scope() if options.in_one_process and not dry_run else None
    lock = None if dry_run else RunLock.new(options.output)
    build_pipeline(pipeline, plan, argv, handoff_scope, lock)
    if lock is not None:
        # Everything that can be checked has passed: only now is the output locked and the old dataset removed.
        try:
            prepare_output(options, plan.splits, lock)
        except BaseException as exc:
            if handoff_scope is not None:
                release(handoff_scope)
            if isinstance(exc, ValueError) and not isinstance(exc, LmshardsError):
                raise ConfigError(str(exc)) from exc
            raise
    failure: tuple[BaseException, bool] | None = None
    if options.in_one_process:  # every stage runs here: the whole run's progress (workers report their own)
        PROGRESS.configure(sum(size for _, size in plan.files), options.progress_seconds)
    try:
        if lock is not None:
            tokenizer_bytes = plan.resolved.to_json_bytes()
            write_atomic(options.output, "tokenizer.json", lambda handle: handle.write(tokenizer_bytes), lock)
            prestart(options.build_processes)  # the workers start while Beam does
        with _quiet_logs_of(RejectedFractionError), _quiet_logs_of(UnreconciledCountsError), \
                _quiet_logs_of(EmptySplitError), _quiet_logs_of(InputChangedError), _quiet_logs_of(LockLostError), \
                _quiet_logs_of(OSError), _frozen_heap():
            result = pipeline.run()
            result.wait_until_finish()
    except BaseException as exc:
        failure = _job_error(exc)
        error, chained = failure
        if error is exc:
            raise
        raise error from (exc if chained else None)
    finally:
        PROGRESS.close()
        if handoff_scope is not None:
            release(handoff_scope)
        if lock is not None and failure is not None:
            _clean_failed_run(options.output, lock, keep_rejected=isinstance(failure[0], RejectedFractionError))
    if dry_run:
        return None, result
    with FileSystems.open(join_path(options.output, MANIFEST_NAME)) as handle:
        manifest = Manifest.loads(handle.read().decode("utf-8"))
    lock.release()
    manifest.run["wall_seconds"] = round(time.monotonic() - start, 3)
    return manifest, result


def _job_error(exc: BaseException) -> tuple[BaseException, bool]:
    """``(the error a failed pipeline is reported as, whether it chains exc)``: one line, with no
    chained traceback, for the failures the job checks itself."""
    if not isinstance(exc, Exception):
        return exc, False  # KeyboardInterrupt, SystemExit
    message = _check_message(exc, RejectedFractionError, "--max-rejected-fraction ")
    if message is not None:
        return RejectedFractionError(message), False
    for error_type, start in ((UnreconciledCountsError, ""), (EmptySplitError, "split "),
                              (InputChangedError, "--input "), (LockLostError, "--output "), (OSError, "[Errno ")):
        message = _check_message(exc, error_type, start)
        if message is not None:
            return JobFailedError(message), False
    first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
    return JobFailedError(f"the pipeline failed: {type(exc).__name__}: {first}"), True


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


#: Objective parameters the summary names (the lengths that shape every example).
_KEY_LENGTHS = ("seq_len", "inputs_length", "targets_length")


def _size(count: int) -> str:
    for unit, scale in (("GB", 2**30), ("MB", 2**20), ("kB", 2**10)):
        if count >= scale:
            return f"{count / scale:,.1f} {unit}"
    return f"{count:,} B"


def _objective_line(manifest: Manifest) -> str:
    """``clm, seq_len 1024 (default), packing concat``: the default lengths marked as such."""
    argv = manifest.run.get("argv") or []
    flags_given = {a.split("=", 1)[0] for a in argv}
    from_config = "--config" in flags_given
    flag_of = {dest: flag for flag, dest, *_ in objective_flags()}
    params = manifest.objective.get("params", {})
    parts = [manifest.objective["name"]]
    for name in _KEY_LENGTHS:
        if params.get(name) is not None:
            default = not from_config and flag_of.get(name) not in flags_given
            parts.append(f"{name} {params[name]:,}{' (default)' if default else ''}")
    parts.append(f"packing {manifest.config.get('packing')}")
    return ", ".join(parts)


def summary_lines(manifest: Manifest, wall_seconds: float) -> list[str]:
    """Human summary of a finished run: where it went, what was built, the document accounting,
    the splits with their shards, what was added to the tokenizer, the encoder."""
    output = manifest.run.get("output", "")
    counts = manifest.counts
    reasons = ", ".join(f"{k} {v:,}" for k, v in counts["rejected_by_reason"].items())
    lines = [
        f"dataset: {output} (manifest.json)",
        f"objective: {_objective_line(manifest)}",
        f"documents: read {counts['documents_read']:,} {'=' if counts['reconciled'] else '!='} "
        f"written {counts['documents_written']:,} + duplicates {counts['duplicates']:,} "
        f"+ rejected {counts['rejected']:,}{f' ({reasons})' if reasons else ''} + filtered {counts['filtered']:,}",
    ]
    if counts["rejected"]:
        files = [entry["path"] for entry in counts.get("rejected_files", [])] or ["rejected/rejected.jsonl"]
        lines.append(f"rejected records: {', '.join(join_path(output, f) for f in files)}")
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
    skipped = manifest.run.get("skipped_inputs") or []
    if skipped:
        shown = ", ".join(f"{s['path']} ({s['reason']})" for s in skipped[:3])
        lines.append(f"skipped {len(skipped):,} glob match(es) that are not files: {shown}"
                     + (f" and {len(skipped) - 3} more (manifest run.skipped_inputs)" if len(skipped) > 3 else ""))
    unverified = manifest.run.get("unverified_inputs") or []
    if unverified:
        lines.append(f"unverified: {len(unverified):,} zstd file(s) without content checksums were read as they are "
                     f"(manifest run.unverified_inputs; --unverified-zstd reject refuses them): {unverified[0]}"
                     + (" ..." if len(unverified) > 1 else ""))
    total_tokens = 0
    for split, info in manifest.splits.items():
        total_tokens += info["document_tokens"]
        sizes: dict[str, int] = {}
        for shard in info["shards"]:
            for fmt, entry in shard["files"].items():
                sizes[fmt] = sizes.get(fmt, 0) + entry["bytes"]
        shards = f"{info['num_shards']} shard{'s' if info['num_shards'] != 1 else ''}"
        formats = ", ".join(f"{fmt} {_size(size)}" for fmt, size in sizes.items())
        lines.append(
            f"{split}: {info['examples']:,} examples, {info['tokens']:,} tokens in {shards} ({formats}; "
            f"padding {info['padding_tokens']:,}, dropped {info['dropped_tokens']:,})"
        )
    if "validation" not in manifest.splits:
        lines.append("validation: none (--validation-fraction 0; e.g. --validation-fraction 0.01 holds out 1%)")
    added = manifest.tokenizer.get("added_tokens") or []
    if added:
        after = manifest.tokenizer["vocab_size"]
        before = manifest.tokenizer.get("source_vocab_size", after - len(added))
        lines.append(f"tokenizer: added {len(added):,} special tokens: vocabulary {before:,} -> {after:,} "
                     f"(resize the model's embeddings to {after:,}); {join_path(output, 'tokenizer.json')}")
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
    """CLI entry: run and print the summary; an error is one line, its exit status that of its
    class (:func:`schemas.errors.exit_code`: 2 a configuration error, 1 a job that failed)."""
    try:
        manifest = run(argv)
    except SystemExit as exc:  # argparse has printed its one-line error
        return int(exc.code or 0)
    except (LmshardsError, OSError) as exc:  # OSError: a file that cannot be read or written, outside the pipeline
        print(f"lmshards materialize: error: {exc}", file=sys.stderr)
        return exit_code(exc)
    if manifest is None:
        print("dry run: the pipeline was built and validated, nothing was submitted")
        return 0
    for line in summary_lines(manifest, manifest.run["wall_seconds"]):
        print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
