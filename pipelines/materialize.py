"""``lmshards materialize``: raw corpus -> packed, sharded pretraining examples.

Pipeline (docs/design.md section 2)::

    ReadCorpus -> Tokenize -> AssignGroups -> Pack (drops duplicates) -> BuildExamples -> WriteShards -> WriteManifest
        |            \\-> PlanGroups (tokens per sub-bucket: the groups AssignGroups uses)
        \\-> rejected records ----------------------------------------------> rejected/*.jsonl

WriteManifest checks the run's conservation laws (documents, tokens, examples, rows) first.

Before the graph is built, :mod:`pipelines.plan` checks everything it can (one line naming
the flag) and :mod:`pipelines.output_dir` checks the output; only then does the run take the
output's lock and, with ``--overwrite``, delete the old dataset. A run that fails afterwards
removes what it wrote and reports the failure in one line (:mod:`pipelines.failures`). What
differs by runner is chosen once, before the graph is built (:mod:`pipelines.runner_tuning`),
and applied by :func:`build_pipeline` (:mod:`pipelines.tuned_run`). Run as
``lmshards materialize ...`` or ``python -m pipelines.materialize ...``.

Exit status: 0 done; 1 the job failed (for example ``--max-rejected-fraction`` exceeded:
one line naming the flag, the measured fraction and the counts, and no manifest; or an
input that changed while it was read); 2 a configuration error, before any work (a live
run holding the output's lock included); 3 a bug (an exception outside lmshards' errors and
I/O errors), printed with its traceback.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
import time
from typing import TYPE_CHECKING, Any

from pipelines.beam_logging import set_beam_verbosity
from pipelines.interrupts import interruptible, quiet_exit_on_interrupt
from pipelines.options import parse_args
from pipelines.runner_tuning import tuning_for
from pipelines.terminal import hidden_stderr, report_failure
from schemas.errors import ConfigError
from schemas.manifest import MANIFEST_NAME, Manifest
from schemas.names import shown_name
from transforms.objectives.registry import objective_flags
from transforms.progress import PROGRESS, ProgressRelay
from transforms.writing.accounting import RejectedFractionError
from transforms.writing.process_info import process_age

if TYPE_CHECKING:
    import apache_beam as beam

    from pipelines.engine_run import LocalEngine
    from pipelines.plan import Plan
    from pipelines.tuned_run import TunedRun
    from transforms.writing.output import RunLock

# Apache Beam, and every module that imports it, is imported inside the functions below, once
# lmshards' own flags are parsed (pipelines.options.parse_args): a mistyped flag or --help is
# answered without the seconds Beam's import takes. So is pipelines.dataflow, which needs no
# Beam but loads importlib.metadata (and the email package with it).

_LOG = logging.getLogger("lmshards")
_IMPORTED = time.monotonic()

__all__ = ["build_pipeline", "run", "run_job", "main", "summary_lines"]

def build_pipeline(pipeline: beam.Pipeline, plan: Plan, argv: list[str] | None = None,
                   tuned: TunedRun | None = None, lock: RunLock | None = None) -> None:
    """Add the materialize steps to ``pipeline``.

    ``tuned``: the run's runner tuning (:mod:`pipelines.runner_tuning`), applied where the graph
    differs by runner; None: the plain graph, with the tokenizer's own encoder threads.
    ``lock``: the run's lock, checked by every writer before it renames a file into place.
    """
    import apache_beam as beam

    from pipelines.plan import shard_sizing, static_manifest
    from pipelines.tuned_run import TunedRun
    from transforms.building.build import BuildExamples
    from transforms.packing.group import SUB_BUCKETS, AssignGroups, PlanGroups, split_tokens
    from transforms.packing.pack import Pack
    from transforms.reading.read import ReadCorpus
    from transforms.tokenizing.tokenize import Tokenize
    from transforms.writing.manifest import SumStatistics, WriteManifest
    from transforms.writing.write import WriteRejected, WriteShards, join_path

    tuned = tuned or TunedRun()
    o = plan.options
    tokenizer_out = join_path(o.output, "tokenizer.json")
    read = pipeline | "ReadCorpus" >> ReadCorpus(
        plan.inputs if plan.inputs is not None else [p for p, _ in plan.files], text_mode=o.text_mode,
        text_field=o.text_field, policy=o.record_policy, split_bytes=max(1, int(o.input_split_mb * 2**20)),
        source_field=o.source_field,
    )
    tokenized = tuned.before_tokenize(read["texts"]) | "Tokenize" >> Tokenize(
        tokenizer_out,
        features=plan.objective.features,
        validation_fraction=o.validation_fraction,
        num_buckets=o.num_buckets or SUB_BUCKETS,
        batch_size=o.batch_size,
        progress_seconds=o.progress_seconds,
        encoder_threads=tuned.tuning.encoder_threads,
        encoder=plan.encoder.backend,
    )
    # Pack groups are planned from every document's tokens; each batch of documents is then split
    # by group (with --num-buckets its bucket is its group) into blocks, and in each group exact
    # duplicates, which share a key and so a group, are dropped.
    groups = tokenized.documents | "PlanGroups" >> PlanGroups(o.pack_group_tokens)
    documents = tuned.hand_over(tokenized.documents, "HandOverDocuments", values_only=True)
    # (named apart with --num-buckets: a fixed key space, not groups sized by tokens)
    blocks = documents | ("AssignGroups" if o.num_buckets is None else "AssignBuckets") >> AssignGroups(groups)
    blocks = tuned.hand_over(blocks, "HandOverBlocks", values_only=True)
    chunks, packing_stats = blocks | "Pack" >> Pack(
        plan.objective, mode=o.packing, seed=o.seed, last_chunk=o.last_chunk,
        eos=plan.resolved.special.eos if o.document_separator == "eos" else None,
        group_name="b" if o.num_buckets else "g",
    )
    # Document tokens (EOS included) per split size the splits' shards before any example exists.
    split_tokens = (
        tokenized.documents
        | "DocumentTokens" >> beam.Map(split_tokens)
        | "TokensPerSplit" >> beam.CombinePerKey(sum)
    )
    sizing = shard_sizing(plan)

    def make_build(separate_ok: bool) -> BuildExamples:
        return BuildExamples(plan.objective, plan.resolved.special, plan.schema, seed=o.seed, draws=o.draws,
                             sizing=sizing, separate=separate_ok and tuned.tuning.build_stage == "separate",
                             block_rows=o.block_rows)

    batches, build_stats = tuned.build_examples(chunks, split_tokens, make_build)
    shards = (*batches, split_tokens) | "WriteShards" >> WriteShards(
        o.output, plan.schema, formats=o.formats, sizing=sizing, lock=lock
    )
    rejected = (read[ReadCorpus.REJECTED], tokenized[Tokenize.REJECTED]) | "AllRejected" >> beam.Flatten()
    rejected_files, reasons = rejected | "WriteRejected" >> WriteRejected(
        o.output, per_file=o.rejected_per_file, lock=lock
    )
    statistics = {"read": read[ReadCorpus.STATS], "source": tokenized[Tokenize.SOURCES], "pack": packing_stats,
                  "objective": build_stats} | "SumStatistics" >> SumStatistics()
    _ = (shards, statistics, reasons, rejected_files, groups) | "WriteManifest" >> WriteManifest(
        o.output, static_manifest(plan, argv), lock)


def run(argv: list[str] | None = None) -> Manifest | None:
    """Run a materialize job; return the manifest it wrote (None for a Dataflow ``--dry_run``).

    Raises:
        ConfigError: a configuration error (before any work is done; a ``ValueError``).
        JobFailedError: the job ran and failed (no manifest written).
    """
    return run_job(argv)[0]


def _prepare(argv: list[str] | None):
    """Parse, plan and check everything before any work; ``(options, plan, dry run, pipeline,
    the local engine of PrismRunner, FlinkRunner and SparkRunner or None, the runner tuning)``.

    Raises:
        ConfigError: any problem found here.
    """
    options = parse_args(argv)  # imports Beam quietly (RunnerSetup.from_beam_args)
    import apache_beam as beam
    from apache_beam.io.filesystems import FileSystems
    from apache_beam.options.pipeline_options import PipelineOptions, TestOptions, TypeOptions

    from pipelines.dataflow import stage_installed_package
    from pipelines.engine_run import local_engine
    from pipelines.output_dir import check_output
    from pipelines.plan import check_beam_args, plan_run, serial_encoder_warning

    set_beam_verbosity(options.verbose)
    # On Dataflow, unless the user ships the code some way of their own, a wheel of this lmshards
    # (and its pinned dependencies) goes to the workers.
    options.beam_args = stage_installed_package(options.beam_args)
    # Beam's flags are checked (one line each) before an engine is fetched or started for them.
    check_beam_args(options.beam_args)
    # Prism, Flink and Spark: the engine is fetched into the cache (once) and Beam pointed at it.
    engine = local_engine(options.beam_args)
    if engine is not None:
        options.beam_args = engine.beam_args
    pipeline_options = PipelineOptions(options.beam_args)
    if not options.pipeline_type_check:
        # Beam type-checks every transform's hints while the graph is built, for a graph that is
        # fixed and run by the tests.
        pipeline_options.view_as(TypeOptions).pipeline_type_check = False
    FileSystems.set_options(pipeline_options)
    plan = plan_run(options)
    dry_run = bool(pipeline_options.view_as(TestOptions).dry_run)
    tuning = tuning_for(options, plan.files, dry_run=dry_run)  # everything that differs by runner
    warning = serial_encoder_warning(options, tuning) if plan.encoder.backend == "tokenizers" else None
    if warning:  # fastokens does not read TOKENIZERS_PARALLELISM
        _LOG.warning(warning)
    check_output(options, inputs=[path for path, _ in plan.files])  # before anything else: it changes nothing
    try:
        pipeline = beam.Pipeline(options=pipeline_options)  # an unknown runner fails here, before the output changes
    except ValueError as exc:  # Beam's refusal of a --runner it does not know
        raise ConfigError(str(exc)) from None
    return options, plan, dry_run, pipeline, engine, tuning


def _running(engine: LocalEngine | None, dry_run: bool, verbose: bool):
    """The engine's processes while the pipeline runs (none for a dry run, or another runner)."""
    return engine.running(verbose) if engine is not None and not dry_run else contextlib.nullcontext()


def run_job(argv: list[str] | None = None) -> tuple[Manifest | None, beam.runners.runner.PipelineResult]:
    """Like :func:`run`, also returning Beam's ``PipelineResult`` (metrics, a dry run's ``job``)."""
    start = time.monotonic()
    options, plan, dry_run, pipeline, engine, tuning = _prepare(argv)
    from apache_beam.io.filesystems import FileSystems

    from pipelines.failures import job_error, quiet_beam
    from pipelines.output_dir import clean_failed_run, prepare_output
    from pipelines.tuned_run import TunedRun
    from transforms.writing.output import RunLock
    from transforms.writing.write import join_path, write_atomic

    local_workers = options.local_workers or engine is not None  # processes of this machine, not this one
    tuned = TunedRun(tuning, output=None if dry_run else options.output)
    lock = None if dry_run else RunLock.new(options.output)
    build_pipeline(pipeline, plan, argv, tuned, lock)
    if lock is not None:
        # Everything that can be checked has passed: only now is the output locked and the old dataset removed.
        try:
            prepare_output(options, plan.splits, lock, [path for path, _ in plan.files])
        except BaseException:
            tuned.release()
            raise
    failure: tuple[BaseException, bool] | None = None
    # Every stage runs here, or in local worker processes that report to this one: the whole
    # run's progress (workers of a distributed runner report their own).
    whole_run = options.in_one_process or (local_workers and not dry_run)
    if whole_run:
        PROGRESS.configure(sum(size for _, size in plan.files), options.progress_seconds)
    relay = ProgressRelay(PROGRESS, options.progress_seconds if local_workers and not dry_run else 0)
    interrupt = None
    try:
        if lock is not None:
            tokenizer_bytes = plan.resolved.to_json_bytes()
            write_atomic(options.output, "tokenizer.json", lambda handle: handle.write(tokenizer_bytes), lock)
        with interruptible(options.local_workers) as interrupt, quiet_beam(options.verbose), relay, \
                tuned.running(), _running(engine, dry_run, options.verbose):
            pipeline_start = time.monotonic()
            result = pipeline.run()
            result.wait_until_finish()
            pipeline_seconds = time.monotonic() - pipeline_start
    except BaseException as exc:
        if interrupt is not None and interrupt.interrupted and not isinstance(exc, KeyboardInterrupt):
            failure = (KeyboardInterrupt(), False)  # Beam re-raised the interrupt as an error of its own
        else:
            failure = engine.job_error(exc) if engine is not None else job_error(exc)
        error, chained = failure
        if error is exc:
            raise
        raise error from (exc if chained else None)
    finally:
        PROGRESS.close()
        tuned.release()
        if lock is not None and failure is not None:
            clean_failed_run(options.output, lock, keep_rejected=isinstance(failure[0], RejectedFractionError))
    if dry_run:
        return None, result
    with FileSystems.open(join_path(options.output, MANIFEST_NAME)) as handle:
        manifest = Manifest.loads(handle.read().decode("utf-8"))
    lock.release()
    manifest.run["wall_seconds"] = round(time.monotonic() - start, 3)
    manifest.run["pipeline_seconds"] = round(pipeline_seconds, 3)
    return manifest, result


#: Share of a split's document tokens dropped (its last partial chunk) from which the summary warns.
DROPPED_WARNING = 0.05

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


def summary_lines(manifest: Manifest, wall_seconds: float, pipeline_seconds: float | None = None) -> list[str]:
    """Human summary of a finished run: where it went, what was built, the document accounting,
    the splits with their shards, what was added to the tokenizer, the encoder, and the time:
    ``wall_seconds`` the whole command's (the token rate is per that), ``pipeline_seconds`` the
    pipeline's run alone (planning, start-up and the engine's start excluded)."""
    from transforms.writing.write import join_path

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
        if info["document_tokens"] and info["dropped_tokens"] / info["document_tokens"] >= DROPPED_WARNING:
            lines.append(
                f"warning: {split} dropped {info['dropped_tokens'] / info['document_tokens']:.0%} of its document "
                f"tokens ({info['dropped_tokens']:,} of {info['document_tokens']:,}: the last partial chunk of its "
                "examples' length); lower the example length, or --last-chunk pad keeps it as padding"
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
    pipeline = f" (the pipeline {pipeline_seconds:.1f} s)" if pipeline_seconds is not None else ""
    lines.append(f"wall time {wall_seconds:.1f} s{pipeline}, {total_tokens:,} document tokens, {rate:,.0f} tokens/s")
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
    """CLI entry: run and print the summary. An error of lmshards' (a configuration error, 2; a job
    that failed, 1) or an I/O error (1) is one line; any other exception is a bug, printed with its
    traceback (3); 130 interrupted, Ctrl-C (:func:`pipelines.terminal.report_failure`)."""
    try:
        with hidden_stderr(verbose="--verbose" in (sys.argv[1:] if argv is None else argv)):
            manifest = run(argv)
    except SystemExit as exc:  # argparse has printed its one-line error
        return int(exc.code or 0)
    except KeyboardInterrupt:  # the run removed what it wrote, and stopped the engine it started
        print("lmshards materialize: interrupted; no manifest written, what the run wrote is removed",
              file=sys.stderr)
        return 130
    except Exception as exc:  # noqa: BLE001 - one line for lmshards' errors and I/O errors, else a traceback
        return report_failure("materialize", exc)
    finally:
        quiet_exit_on_interrupt()
    if manifest is None:
        print("dry run: the pipeline was built and validated, nothing was submitted")
        return 0
    for line in summary_lines(manifest, command_seconds(), manifest.run.get("pipeline_seconds")):
        print(shown_name(line))  # file names in it are shown escaped
    return 0


def command_seconds() -> float:
    """Seconds since this process started (its start time from ``/proc``; where there is none,
    since this module was imported): what the user waited for, interpreter and imports included."""
    age = process_age(os.getpid())
    return time.monotonic() - _IMPORTED if age is None else age


if __name__ == "__main__":
    sys.exit(main())
