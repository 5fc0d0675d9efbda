"""``lmshards train-tokenizer``: train a HF ``tokenizers`` model on corpus files.

Reads the same inputs as ``materialize`` (same globs, formats, compression, text modes)
and writes a tokenizer.json with the special tokens the objectives need at the lowest ids:
``<pad>`` 0, ``</s>`` 1, ``<s>`` 2, ``<unk>`` 3, ``<mask>`` 4, then ``<extra_id_0..N-1>``
(T5 sentinels), the registered objectives' own tokens and any extra tokens. The objectives'
needs come from the registry (:func:`transforms.objectives.registry.tokens_needed`: every
objective's, under each of its named presets, plugins included): for the built-in ones the
mode tokens of UL2's two mixtures, ``[R]``, ``[S]``, ``[X]``, ``[NLU]``, ``[S2S]``, ``[NLG]``,
and at least 128 sentinels (UL2's X denoisers at 512 inputs need 127). So a tokenizer trained
with the defaults never needs ``--add-special-tokens`` for an objective at its default lengths.

Models: ``bpe`` (byte-level, GPT-2 style; default), ``unigram`` (SentencePiece style,
Metaspace) and ``wordpiece`` (BERT style). Training runs in-process on one machine, so
``--max-documents`` / ``--max-chars`` bound what it reads.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Iterator

from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers

from pipelines.beam_logging import import_beam_quietly
from pipelines.parser import OneLineParser
from pipelines.terminal import report_failure
from schemas.errors import ConfigError
from transforms.flag_values import TEXT_MODES
from transforms.objectives.registry import tokens_needed
from transforms.progress import Progress
from transforms.tokenizing.tokenizer_utils import sentinel_token

__all__ = ["SPECIAL_TOKENS", "build_parser", "main", "train_tokenizer"]

# transforms.reading.read and pipelines.input_checks import Apache Beam: they are imported inside
# the functions, after the flags are parsed, so that a mistyped flag or --help answers at once.

SPECIAL_TOKENS = ["<pad>", "</s>", "<s>", "<unk>", "<mask>"]
MODELS = ("bpe", "unigram", "wordpiece")
#: Sentinels made at least by default: more than every built-in objective uses at its default
#: lengths (T5 has 100); a registered objective that needs more at its defaults raises the default.
DEFAULT_SENTINELS = 128


class _ReadProgress(Progress):
    """materialize's progress (:class:`transforms.progress.Progress`: a bar on a terminal, else a
    line every ``seconds``), counting documents read for training instead of tokens."""

    def _line(self, final: bool = False) -> str:
        elapsed = max(time.monotonic() - self._start, 1e-9)
        read = f"{self.bytes / self.total_bytes:.0%} of " if self.total_bytes else ""
        return (f"lmshards train-tokenizer: reading: {read}{self.total_bytes / 2**20:,.1f} MB, "
                f"{self.documents:,} documents, {self.documents / elapsed:,.0f} documents/s")


def _texts(files: list[str], text_mode: str, text_field: str, max_documents: int, max_chars: int,
           progress: Progress | None = None, seen: dict[str, int] | None = None,
           sizes: dict[str, int] | None = None) -> Iterator[str]:
    """Texts of ``files`` read as ``materialize`` reads them, up to the bounds; ``seen`` counts
    documents and rejected records (by reason) as they go by, ``progress`` the bytes read
    (``sizes``: each file's)."""
    from transforms.reading.read import iter_file_records

    documents = chars = 0
    seen = {} if seen is None else seen
    for path in files:
        size, counted = (sizes or {}).get(path, 0), 0
        for record in iter_file_records(path, text_mode=text_mode, text_field=text_field):
            if isinstance(record, dict):
                seen[record.get("reason", "rejected")] = seen.get(record.get("reason", "rejected"), 0) + 1
                continue
            text = record[2]
            yield text
            documents += 1
            seen["documents"] = documents
            chars += len(text)
            if progress is not None:
                step = max(0, min(len(text) + 1, size - counted))  # (about: a line's bytes and its end)
                counted += step
                progress.add(1, 0)
                progress.add_bytes(step)
            if documents >= max_documents or chars >= max_chars:
                return
        if progress is not None:
            progress.add_bytes(max(0, size - counted))


def train_tokenizer(
    texts,
    *,
    model: str = "bpe",
    vocab_size: int = 8000,
    num_sentinels: int = DEFAULT_SENTINELS,
    extra_tokens: tuple[str, ...] | None = None,
    min_frequency: int = 2,
) -> Tokenizer:
    """Train a tokenizer on an iterable of texts, with the special tokens, ``num_sentinels``
    sentinels and ``extra_tokens`` (None: the registered objectives' own tokens,
    :func:`~transforms.objectives.registry.tokens_needed`) at the lowest ids, in that order.

    Raises:
        ConfigError: unknown model or a vocabulary too small for the special tokens (a ``ValueError``).
    """
    if model not in MODELS:
        raise ConfigError(f"--model {model}: choose one of {', '.join(MODELS)}")
    if extra_tokens is None:
        extra_tokens = tokens_needed().tokens
    special = list(dict.fromkeys(SPECIAL_TOKENS + [sentinel_token(k) for k in range(num_sentinels)]
                                 + list(extra_tokens)))
    if vocab_size <= len(special) + 256 and model == "bpe":
        raise ConfigError(f"--vocab-size {vocab_size}: must exceed {len(special) + 256} (special tokens + 256 "
                          "bytes)")
    if model == "bpe":
        tokenizer = Tokenizer(models.BPE(unk_token=None))
        tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        tokenizer.decoder = decoders.ByteLevel()
        trainer = trainers.BpeTrainer(
            vocab_size=vocab_size,
            min_frequency=min_frequency,
            special_tokens=special,
            initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
            show_progress=False,
        )
    elif model == "unigram":
        tokenizer = Tokenizer(models.Unigram())
        tokenizer.normalizer = normalizers.NFKC()
        tokenizer.pre_tokenizer = pre_tokenizers.Metaspace()
        tokenizer.decoder = decoders.Metaspace()
        trainer = trainers.UnigramTrainer(
            vocab_size=vocab_size, special_tokens=special, unk_token="<unk>", show_progress=False
        )
    else:
        tokenizer = Tokenizer(models.WordPiece(unk_token="<unk>"))
        tokenizer.normalizer = normalizers.BertNormalizer(lowercase=False)
        tokenizer.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
        tokenizer.decoder = decoders.WordPiece()
        trainer = trainers.WordPieceTrainer(
            vocab_size=vocab_size, min_frequency=min_frequency, special_tokens=special, show_progress=False
        )
    tokenizer.train_from_iterator(texts, trainer=trainer)
    return tokenizer


def build_parser() -> OneLineParser:
    """The flags of ``lmshards train-tokenizer`` (errors in one line, a suggestion for a typo).

    Raises:
        ConfigError: an installed objective plugin that cannot be loaded (the help names the
            registered objectives' tokens).
    """
    needs = tokens_needed()
    parser = OneLineParser(
        prog="lmshards train-tokenizer", allow_abbrev=False,
        description="Train a HF tokenizers tokenizer.json on corpus files (the inputs materialize reads), with the "
        "special tokens every registered objective needs at the lowest ids: <pad> 0, </s> 1, <s> 2, <unk> 3, "
        "<mask> 4, then the <extra_id_k> sentinels and the objectives' own tokens.")
    parser.add_argument("--input", action="append", required=True, metavar="GLOB",
                        help="input files (.txt/.jsonl/.parquet, optionally .gz/.zst; local or gs://); repeatable")
    parser.add_argument("--output", required=True, metavar="PATH", help="tokenizer.json to write")
    parser.add_argument("--overwrite", action="store_true", help="replace an existing --output file")
    parser.add_argument("--model", choices=MODELS, default="bpe",
                        help="bpe (byte-level, GPT-2 style; default), unigram (SentencePiece style) or wordpiece "
                        "(BERT style)")
    parser.add_argument("--vocab-size", type=int, default=8000, metavar="N",
                        help="tokens in the vocabulary, special tokens included (default 8000)")
    sentinels = max(DEFAULT_SENTINELS, needs.sentinels)
    parser.add_argument("--num-sentinels", type=int, default=sentinels, metavar="N",
                        help=f"<extra_id_k> tokens (default {sentinels}: enough for every registered objective at its "
                        "default lengths; T5 has 100)")
    own = " ".join(needs.tokens) or "none"
    # --no-mode-tokens: the flag's name from before objectives of any package could have tokens of their own.
    parser.add_argument("--no-objective-tokens", "--no-mode-tokens", dest="objective_tokens", action="store_false",
                        help=f"leave out the registered objectives' own tokens ({own}; made by default)")
    parser.add_argument("--extra-token", action="append", default=[], metavar="TOKEN",
                        help="additional special token; repeatable (default: none)")
    parser.add_argument("--min-frequency", type=int, default=2, metavar="N",
                        help="fewest occurrences of a pair merged (bpe) or a word kept (wordpiece) (default 2)")
    parser.add_argument("--text-mode", choices=TEXT_MODES, default=None,
                        help="documents of text files: one per line (default), per blank-line paragraph, or per file")
    parser.add_argument("--text-field", default=None, metavar="FIELD",
                        help="JSONL field (dotted path) or Parquet column of the text (default: text)")
    parser.add_argument("--max-documents", type=int, default=10_000_000, metavar="N",
                        help="documents read at most (default 10,000,000): training runs in this one process")
    parser.add_argument("--max-chars", type=int, default=2_000_000_000, metavar="N",
                        help="characters read at most (default 2,000,000,000)")
    parser.add_argument("--progress-seconds", type=float, default=10.0, metavar="S",
                        help="print reading progress to stderr this often (0: never; default 10)")
    return parser


def _first_records(path: str, text_mode: str, text_field: str, limit: int = 1000) -> tuple[list[str], list[dict]]:
    """Texts and rejected records among the first ``limit`` records of ``path`` (not verified)."""
    from transforms.reading.read import iter_file_records

    texts: list[str] = []
    rejected: list[dict] = []
    for record in iter_file_records(path, text_mode=text_mode, text_field=text_field, verify=False):
        (rejected if isinstance(record, dict) else texts).append(record if isinstance(record, dict) else record[2])
        if len(texts) + len(rejected) >= limit:
            break
    return texts, rejected


def main(argv: list[str] | None = None) -> int:
    """CLI entry. Flags are parsed before Beam is imported (a typo answers at once); the inputs
    are checked as materialize checks them (:mod:`pipelines.input_checks`) before any reading,
    and a run that read no document writes nothing. Exit status: 2 a configuration error, 1 an
    I/O error, in one line; 3 a bug, with its traceback (:func:`pipelines.terminal.report_failure`)."""
    try:
        args = build_parser().parse_args(argv)
    except SystemExit as exc:  # argparse has printed its one-line error, or the help
        return int(exc.code or 0)
    except Exception as exc:  # noqa: BLE001 - a plugin that cannot be loaded (one line), or a bug in one (its traceback)
        return report_failure("train-tokenizer", exc)
    import_beam_quietly()
    from apache_beam.io.filesystems import FileSystems

    from pipelines.input_checks import check_text_field, check_text_flags
    from transforms.reading.read import expand_inputs

    own = tokens_needed().tokens if args.objective_tokens else ()
    extra = (*own, *args.extra_token)
    text_mode, text_field = args.text_mode or "line", args.text_field or "text"
    seen: dict[str, int] = {}
    progress = _ReadProgress()
    try:
        if FileSystems.exists(args.output) and not args.overwrite:
            raise ConfigError(f"--output {args.output}: the file exists (pass --overwrite to replace it)")
        files = expand_inputs(args.input)
        check_text_flags([path for path, _ in files], text_mode=args.text_mode, text_field=args.text_field)
        texts, rejected = _first_records(files[0][0], text_mode, text_field)
        check_text_field(text_field, files[0][0], texts, rejected)
        progress.configure(sum(size for _, size in files), args.progress_seconds)
        tokenizer = train_tokenizer(
            _texts([path for path, _ in files], text_mode, text_field, args.max_documents, args.max_chars, progress,
                   seen, dict(files)),
            model=args.model,
            vocab_size=args.vocab_size,
            num_sentinels=args.num_sentinels,
            extra_tokens=extra,
            min_frequency=args.min_frequency,
        )
        if not seen.get("documents"):
            reasons = ", ".join(f"{reason} {count:,}" for reason, count in sorted(seen.items()))
            raise ConfigError(f"--input {' '.join(args.input)}: no document to train on"
                              f"{f' (rejected: {reasons})' if reasons else ''}; nothing written")
        with FileSystems.create(args.output) as handle:
            handle.write(tokenizer.to_str().encode("utf-8"))
    except Exception as exc:  # noqa: BLE001 - one line for lmshards' errors and I/O errors, else a traceback
        return report_failure("train-tokenizer", exc)
    finally:
        progress.close()
    special = sum(1 for token in tokenizer.get_added_tokens_decoder().values() if token.special)
    tokens = f", the objectives' own tokens {' '.join(own)}" if own else ""
    size = tokenizer.get_vocab_size()
    short = f" of {args.vocab_size:,} asked (the corpus has no more pieces to merge)" if size < args.vocab_size else ""
    print(f"wrote {args.output}: {args.model}, vocab {size:,}{short}, {special} special tokens "
          f"({args.num_sentinels:,} sentinel{'' if args.num_sentinels == 1 else 's'}"
          f"{tokens}), trained on {seen['documents']:,} documents")
    return 0


if __name__ == "__main__":
    sys.exit(main())
