"""The argparse parser of ``lmshards materialize``: its flags, their help and their types.

:func:`build_parser` declares our flags only; :func:`pipelines.options.parse_args` passes
what the parser does not know to Beam. A flag's value is checked where argparse can check
it alone (a type below), with a one-line error naming the flag and exit status 2.
"""

from __future__ import annotations

import argparse
import difflib

from pipelines.runner_tuning import BUILD_STAGES, SEPARATE_BELOW_GROUPS
from schemas.errors import ConfigError
from transforms.building.parallel import BLOCK_ROWS
from transforms.flag_values import DEFAULT_PACK_GROUP_TOKENS, LAST_CHUNK_MODES, REJECTED_PER_SHARD, TEXT_MODES
from transforms.objectives.packing import PACKING_MODES
from transforms.objectives.registry import OBJECTIVES, objective_flags
from transforms.reading.record_policy import (
    INVALID_UTF8_POLICIES,
    LONG_DOC_POLICIES,
    MAX_RECORD_BYTES,
    NUL_POLICIES,
    UNVERIFIED_ZSTD_POLICIES,
)
from transforms.tokenizing.encoder import ENCODER_CHOICES
from transforms.writing.accounting import DEFAULT_MAX_REJECTED_FRACTION

__all__ = ["DOCUMENT_SEPARATORS", "FORMATS", "OneLineParser", "build_parser", "did_you_mean", "own_flags",
           "refuse_mistyped_flags"]

FORMATS = ("arrow", "webdataset")
#: What ends each document in the packed stream (--document-separator).
DOCUMENT_SEPARATORS = ("eos", "none")


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


def own_flags(parser: argparse.ArgumentParser) -> list[str]:
    """The long flags a parser declares."""
    return [option for option in parser._option_string_actions if option.startswith("--")]


def did_you_mean(flag: str, ours: list[str], others: list[str] = ()) -> str:
    """``; did you mean --seq-len?`` for a mistyped flag (``ours`` first, then ``others``, such as
    Beam's), or a prefix of ours (flags are not abbreviated); else an empty string."""
    for candidates in (ours, others):
        close = difflib.get_close_matches(flag, candidates, n=1, cutoff=0.75)
        if close:
            return f"; did you mean {close[0]}?"
    prefixed = sorted(option for option in ours if option.startswith(flag) and len(flag) > 2)
    if prefixed:  # a prefix abbreviation, which lmshards does not accept
        return f"; did you mean {' or '.join(prefixed)}? (flags are not abbreviated)"
    return ""


def refuse_mistyped_flags(unknown: list[str], parser: argparse.ArgumentParser) -> None:
    """Refuse, before Apache Beam is imported, an unknown flag that is a typo of one of ours.

    lmshards' flags are kebab-case and Beam's snake_case (its one hyphenated flag,
    ``--job-server-timeout``, is far from ours; ``tests/pipelines/test_flags_before_beam.py``
    checks every flag of Beam and its runners against this rule), so an unknown flag with a
    hyphen in its name that is close to one of ours is ours mistyped. Every other unknown flag
    is left to :func:`pipelines.plan.check_beam_args`, which knows Beam's and the runner's.

    Raises:
        ConfigError: the flag and the suggestion, in one line.
    """
    ours = own_flags(parser)
    for argument in unknown:
        flag = argument.split("=", 1)[0]
        if not flag.startswith("--") or "-" not in flag[2:]:
            continue
        suggestion = did_you_mean(flag, ours)
        if suggestion:
            raise ConfigError(f"unknown option {flag} (not an lmshards or Apache Beam flag){suggestion}")


class OneLineParser(argparse.ArgumentParser):
    """Errors in one line naming the flag (no usage block), with a suggestion for a mistyped
    flag (:func:`did_you_mean`), exit status 2."""

    def error(self, message):
        prefix = "unrecognized arguments: "
        if message.startswith(prefix):
            unknown = message[len(prefix):].split()
            flags = [a.split("=", 1)[0] for a in unknown if a.startswith("-")]
            if flags:
                message = f"unknown option {flags[0]}{did_you_mean(flags[0], own_flags(self))}"
        self.exit(2, f"{self.prog}: error: {message}\n")


def build_parser() -> argparse.ArgumentParser:
    parser = OneLineParser(
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
    io.add_argument("--text-mode", choices=TEXT_MODES, default=None,
                    help="documents of text files: one per line (default), per blank-line paragraph, or per file")
    io.add_argument("--text-field", default=None,
                    help="JSONL field (dotted path) or Parquet column of the text (default: text)")
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
                     metavar="N", help="about N rejected records per file of OUT/rejected/ (default "
                     f"{REJECTED_PER_SHARD:,}): they are spread over ceil(rejected / N) files by a digest of each")
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
                      "0.1-0.2 GB of a worker; part of the config: changes the bytes)")
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
                     help="add missing special tokens, sentinels and the objective's own tokens to the tokenizer")
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
