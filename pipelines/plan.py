"""Everything ``lmshards materialize`` decides before its pipeline runs: the :class:`Plan`.

Every check that can be made before any work is made here and fails in one line naming the
flag (:class:`schemas.errors.ConfigError`): unknown flags (with a did-you-mean), a bad
objective or parameter, a missing or invalid tokenizer, missing special tokens or sentinels,
inputs that match nothing, a record field the corpus does not have. The first records of the
first input are read once (:func:`sample_records`) for the encoder's parity probe and the
text-field check. The plan also holds what the graph needs up front: the resolved tokenizer,
the objective, the example schema, the splits and the shard sizing.
"""

from __future__ import annotations

import argparse
import datetime
import importlib
import json
import logging
import os
import re
import sys
from typing import Any

from apache_beam.options.pipeline_options import (
    DirectOptions,
    PipelineOptions,
    StandardOptions,
    _BeamArgumentParser,
)

from pipelines import __version__
from pipelines.input_checks import check_text_field, check_text_flags
from pipelines.options import MaterializeOptions
from pipelines.parser import build_parser, did_you_mean, own_flags
from pipelines.runner_tuning import RunnerTuning
from schemas.errors import ConfigError
from schemas.examples import example_schema
from schemas.manifest import LENGTH_PARAMETERS, MAX_EXAMPLE_TOKENS
from transforms.objectives.registry import make_objective
from transforms.packing.group import SUB_BUCKETS
from transforms.reading.flag_files import MAX_TOKENIZER_BYTES, read_flag_file
from transforms.reading.read import file_format, iter_file_records, list_inputs
from transforms.tokenizing.encoder_choice import EncoderChoice, choose_encoder
from transforms.tokenizing.tokenize import needs_full_encodings
from transforms.tokenizing.tokenizer_utils import ResolvedTokenizer, resolve_special_tokens, tokenizer_from_bytes

__all__ = ["DASK_RUNNER", "Plan", "SAMPLE_CHARS", "SAMPLE_RECORDS", "check_beam_args",
           "plan_encoder", "plan_run", "runner_path", "sample_records", "serial_encoder_warning", "shard_sizing",
           "static_manifest"]

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


#: Beam's DaskRunner: Beam ships it but lists it in none of its runner names, so Beam only takes
#: its qualified name; lmshards knows ``--runner DaskRunner`` too, to refuse it (see check_beam_args).
DASK_RUNNER = "apache_beam.runners.dask.dask_runner.DaskRunner"

#: What to install for a runner module that does not import, by a word of its module path.
_RUNNER_EXTRAS = {"dask": "apache-beam[dask]", "dataflow": "lmshards[gcp]", "interactive": "apache-beam[interactive]"}

#: Why ``--runner DaskRunner`` is refused (checked with a plain Beam pipeline on a dask
#: LocalCluster: benchmarks/dask_runner_repro.py).
DASK_REFUSAL = (
    "--runner DaskRunner: not supported: Beam {version}'s DaskRunner hands every output of a multi-output DoFn "
    "(the main one and each TaggedOutput) to the readers of each of them, drops what a DoFn outputs in "
    "finish_bundle, and computes only the last transform of the graph; use --runner PrismRunner, FlinkRunner, "
    "SparkRunner or DataflowRunner"
)


def runner_path(runner: str | None) -> str | None:
    """The qualified class name Beam resolves ``--runner`` to (as ``create_runner`` does: a
    known runner by its class name, case-insensitive, ``Runner`` optional, else a qualified
    name as given), or None for a name Beam does not know (Beam refuses it itself)."""
    known = {path.rsplit(".", 1)[-1].lower(): path for path in (*StandardOptions.ALL_KNOWN_RUNNERS, DASK_RUNNER)}
    name = (runner or StandardOptions.DEFAULT_RUNNER).lower()
    path = known.get(name, known.get(name + "runner", runner or ""))
    return path if "." in path else None


def _load_runner(runner: str, path: str) -> None:
    """Import the module of the runner (which registers the options classes it defines, such as
    Beam's DaskOptions), so that its flags are known; a module that does not import fails in one line."""
    module_name, _, class_name = path.rpartition(".")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        extra = next((extra for word, extra in _RUNNER_EXTRAS.items() if word in module_name.split(".")), None)
        raise ConfigError(f"--runner {runner}: cannot import {module_name} ({exc})"
                          + (f"; pip install '{extra}'" if extra else "")) from exc
    if not hasattr(module, class_name):
        raise ConfigError(f"--runner {runner}: {module_name} has no {class_name}")


class _CheckingParser(_BeamArgumentParser):
    """Beam's flag parser, whose errors (a value a flag does not take) are one line, not its usage."""

    def error(self, message):
        raise ConfigError(message)


def _beam_parser() -> argparse.ArgumentParser:
    """A parser of every flag Beam knows now: the options classes defined so far (Beam's own,
    and those of every runner module imported, like the runner's: see :func:`_load_runner`)."""
    parser = _CheckingParser(allow_abbrev=False)
    seen = set()
    for cls in PipelineOptions.__subclasses__():
        if str(cls) not in seen:
            seen.add(str(cls))
            cls._add_argparse_args(parser)
    return parser


def _suggestion(flag: str, beam_flags: list[str]) -> str:
    """``; did you mean --seq-len?`` for a mistyped flag (ours first), else an empty string."""
    return did_you_mean(flag, own_flags(build_parser()), beam_flags)


def check_beam_args(beam_args: list[str]) -> None:
    """Fail on flags neither we nor Beam know (Beam itself only logs and drops them), with a
    suggestion for a typo, and on stray positional arguments (an unquoted glob the shell
    expanded into several file names: only the first would be read). The flags of the chosen
    runner's own options classes (Beam's DaskOptions) count as Beam's: its module is imported
    first, and one that does not import fails here. Runners and modes that lose data are refused."""
    parsed, _ = _beam_parser().parse_known_args(beam_args)
    runner = parsed.runner if isinstance(parsed.runner, str) else None
    path = runner_path(runner)
    if path is not None:
        try:
            _load_runner(runner or StandardOptions.DEFAULT_RUNNER, path)
        except ValueError:
            if path == DASK_RUNNER:  # refused whether dask is installed or not
                raise ConfigError(_dask_refusal()) from None
            raise
    parser = _beam_parser()
    _, unknown = parser.parse_known_args(beam_args)
    flags = [a for a in unknown if a.startswith("-")]
    if flags:
        flag = flags[0].split("=", 1)[0]
        beam_flags = [option for option in parser._option_string_actions if option.startswith("--")]
        raise ConfigError(f"unknown option {flag} (not an lmshards or Apache Beam flag){_suggestion(flag, beam_flags)}")
    if unknown:
        shown = " ".join(unknown[:3]) + (" ..." if len(unknown) > 3 else "")
        raise ConfigError(f"unexpected argument{'s' if len(unknown) > 1 else ''} {shown}: an unquoted glob? The shell "
                          "expands --input data/*.jsonl into several names and only the first is read; quote it "
                          "(--input 'data/*.jsonl') or repeat --input for each file")
    if path == DASK_RUNNER:
        raise ConfigError(_dask_refusal())
    if PipelineOptions(beam_args).view_as(DirectOptions).direct_running_mode == "multi_threading":
        raise ConfigError(
            "--direct_running_mode=multi_threading: not supported: Beam's multi-threading mode drops elements "
            "of long bundles (reproduced with a plain Beam pipeline, Beam 2.77); use in_memory (the default) "
            "or multi_processing"
        )


def _dask_refusal() -> str:
    from apache_beam.version import __version__ as beam_version

    return DASK_REFUSAL.format(version=".".join(beam_version.split(".")[:2]))


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
    for name in LENGTH_PARAMETERS:
        value = options.objective_params.get(name)
        if isinstance(value, int) and not isinstance(value, bool) and value > MAX_EXAMPLE_TOKENS:
            raise ConfigError(_naming_the_flag(f"{name} {value} is more than {MAX_EXAMPLE_TOKENS:,} tokens per "
                                               "example", options))
    try:
        objective = make_objective(options.objective, options.objective_params)
    except ValueError as exc:
        raise ConfigError(_naming_the_flag(str(exc), options)) from exc
    if options.seed < 0:
        raise ConfigError(f"--seed {options.seed}: must be >= 0")
    if options.packing != "concat" and objective.fixed_raw_length is None:
        raise ConfigError(f"--packing {options.packing}: needs a fixed chunk length, and {objective.name} varies it "
                          "from example to example; use --packing concat")
    try:
        data = read_flag_file("--tokenizer", options.tokenizer, MAX_TOKENIZER_BYTES)
    except ValueError as exc:
        if "://" in options.tokenizer or os.path.lexists(options.tokenizer):
            raise
        # a hub name, most likely: say that it is not fetched, and how to get the file
        raise ConfigError(f"{exc}; names on the Hugging Face hub (gpt2, t5-base) are not fetched: pass a "
                          "tokenizer.json file, trained with python -m pipelines.train_tokenizer or saved from HF "
                          "(AutoTokenizer.from_pretrained(NAME).save_pretrained(DIR) writes DIR/tokenizer.json)"
                          ) from None
    tokenizer = tokenizer_from_bytes(data, options.tokenizer)
    dropout = json.loads(tokenizer.to_str()).get("model", {}).get("dropout")
    if dropout:
        raise ConfigError(f"--tokenizer {options.tokenizer}: BPE dropout (model.dropout {dropout}) makes every "
                          "encoding random, so the dataset could not be reproduced; remove it from the tokenizer.json")
    required = set(objective.required_specials)
    if options.packing != "concat" or options.last_chunk == "pad":
        required.add("pad")
    try:
        resolved = resolve_special_tokens(
            tokenizer,
            required=required,
            overrides=options.special_tokens,
            num_sentinels=objective.token_needs().sentinels,
            mode_tokens=objective.token_needs().tokens,
            add_missing=options.add_special_tokens,
        )
    except ValueError as exc:
        message = str(exc)
        raise ConfigError(message if message.startswith("-")
                          else f"--tokenizer {options.tokenizer}: {message}") from exc
    listing = list_inputs(options.inputs, file_format)
    schema = example_schema(objective.family, **objective.schema_kwargs())
    files = [(f.path, f.size) for f in listing.files]
    text_mode, text_field = options.text_flags_given
    check_text_flags([path for path, _ in files], text_mode=text_mode, text_field=text_field)
    texts, rejected = sample_records(options, files)
    if files:
        check_text_field(options.text_field, files[0][0], texts, rejected)
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


def plan_encoder(options: MaterializeOptions, resolved: ResolvedTokenizer, features,
                 documents: list[str]) -> EncoderChoice:
    """``--encoder``: the backend the workers use; ``auto`` falls back to tokenizers with a
    one-line warning when fastokens is not importable or its parity probe fails.

    Raises:
        ConfigError: ``--encoder fastokens`` where it cannot be used (:func:`choose_encoder`).
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


#: Values of ``TOKENIZERS_PARALLELISM`` with which the Rust tokenizer encodes a batch on one thread.
_SERIAL_TOKENIZERS = frozenset({"", "off", "false", "f", "no", "n", "0"})


def serial_encoder_warning(options: MaterializeOptions, tuning: RunnerTuning, environ=None) -> str | None:
    """The warning to give when ``TOKENIZERS_PARALLELISM`` keeps the encoder on one thread
    where it would use several (set by training scripts to quiet the tokenizer's fork warning,
    and by the tokenizer itself in a process that forked after encoding in parallel); else None.
    ``tuning``: the run's, which says how many threads each worker's encoder gets."""
    environ = os.environ if environ is None else environ
    value = environ.get("TOKENIZERS_PARALLELISM")
    if value is None or value.strip().lower() not in _SERIAL_TOKENIZERS:
        return None
    if not options.in_one_process and (tuning.encoder_threads or 1) <= 1:
        return None  # workers of one encoder thread each: nothing is lost
    return (f"TOKENIZERS_PARALLELISM={value} in the environment: the Rust encoder runs on one thread "
            "(unset it to encode on every core)")


def static_manifest(plan: Plan, argv: list[str] | None) -> dict[str, Any]:
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
