"""``lmshards train-tokenizer``: train a HF ``tokenizers`` model on corpus files.

Reads the same inputs as ``materialize`` (same globs, formats, compression, text modes)
and writes a tokenizer.json with the special tokens the objectives need at the lowest ids:
``<pad>`` 0, ``</s>`` 1, ``<s>`` 2, ``<unk>`` 3, ``<mask>`` 4, then ``<extra_id_0..N-1>``
(T5 sentinels), the UL2 mode tokens of both built-in mixtures (``[R]``, ``[S]``, ``[X]``,
``[NLU]``, ``[S2S]``, ``[NLG]``) and any extra tokens. The defaults suffice for every built-in
objective at its default lengths (UL2's X denoisers at 512 inputs need 127 sentinels), so a
tokenizer trained with them never needs ``--add-special-tokens``.

Models: ``bpe`` (byte-level, GPT-2 style; default), ``unigram`` (SentencePiece style,
Metaspace) and ``wordpiece`` (BERT style). Training runs in-process on one machine, so
``--max-documents`` / ``--max-chars`` bound what it reads.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Iterator

from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers

from transforms.read import TEXT_MODES, expand_inputs, iter_file_records
from transforms.tokenizer_utils import sentinel_token

__all__ = ["SPECIAL_TOKENS", "build_parser", "main", "train_tokenizer"]

SPECIAL_TOKENS = ["<pad>", "</s>", "<s>", "<unk>", "<mask>"]
MODELS = ("bpe", "unigram", "wordpiece")
#: Sentinels made by default: enough for every built-in objective at its default lengths (T5 has 100).
DEFAULT_SENTINELS = 128
#: The mode tokens of UL2's default and paper mixtures, made by default (``--no-mode-tokens``: none).
MODE_TOKENS = ("[R]", "[S]", "[X]", "[NLU]", "[S2S]", "[NLG]")


def _texts(files: list[str], text_mode: str, text_field: str, max_documents: int, max_chars: int) -> Iterator[str]:
    documents = chars = 0
    for path in files:
        for record in iter_file_records(path, text_mode=text_mode, text_field=text_field):
            if isinstance(record, dict):
                continue
            text = record[2]
            yield text
            documents += 1
            chars += len(text)
            if documents >= max_documents or chars >= max_chars:
                return


def train_tokenizer(
    texts,
    *,
    model: str = "bpe",
    vocab_size: int = 8000,
    num_sentinels: int = DEFAULT_SENTINELS,
    extra_tokens: tuple[str, ...] = MODE_TOKENS,
    min_frequency: int = 2,
) -> Tokenizer:
    """Train a tokenizer on an iterable of texts.

    Raises:
        ValueError: unknown model or a vocabulary too small for the special tokens.
    """
    if model not in MODELS:
        raise ValueError(f"--model {model}: choose one of {', '.join(MODELS)}")
    special = list(dict.fromkeys(SPECIAL_TOKENS + [sentinel_token(k) for k in range(num_sentinels)]
                                 + list(extra_tokens)))
    if vocab_size <= len(special) + 256 and model == "bpe":
        raise ValueError(f"--vocab-size {vocab_size}: must exceed {len(special) + 256} (special tokens + 256 bytes)")
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


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="lmshards train-tokenizer", description=__doc__.split("\n\n")[0],
                                     allow_abbrev=False)
    parser.add_argument("--input", action="append", required=True, metavar="GLOB")
    parser.add_argument("--output", required=True, metavar="PATH", help="tokenizer.json to write")
    parser.add_argument("--overwrite", action="store_true", help="replace an existing --output file")
    parser.add_argument("--model", choices=MODELS, default="bpe")
    parser.add_argument("--vocab-size", type=int, default=8000)
    parser.add_argument("--num-sentinels", type=int, default=DEFAULT_SENTINELS,
                        help=f"<extra_id_k> tokens (default {DEFAULT_SENTINELS}: enough for every built-in objective "
                        "at its default lengths; T5 has 100)")
    parser.add_argument("--no-mode-tokens", dest="mode_tokens", action="store_false",
                        help=f"leave out the UL2 mode tokens {' '.join(MODE_TOKENS)}")
    parser.add_argument("--extra-token", action="append", default=[], help="additional special token; repeatable")
    parser.add_argument("--min-frequency", type=int, default=2)
    parser.add_argument("--text-mode", choices=TEXT_MODES, default="line")
    parser.add_argument("--text-field", default="text")
    parser.add_argument("--max-documents", type=int, default=10_000_000)
    parser.add_argument("--max-chars", type=int, default=2_000_000_000)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    from apache_beam.io.filesystems import FileSystems

    extra = (*(MODE_TOKENS if args.mode_tokens else ()), *args.extra_token)
    try:
        if FileSystems.exists(args.output) and not args.overwrite:
            raise ValueError(f"--output {args.output}: the file exists (pass --overwrite to replace it)")
        files = [path for path, _ in expand_inputs(args.input)]
        tokenizer = train_tokenizer(
            _texts(files, args.text_mode, args.text_field, args.max_documents, args.max_chars),
            model=args.model,
            vocab_size=args.vocab_size,
            num_sentinels=args.num_sentinels,
            extra_tokens=extra,
            min_frequency=args.min_frequency,
        )
    except ValueError as exc:
        print(f"lmshards train-tokenizer: error: {exc}", file=sys.stderr)
        return 2
    with FileSystems.create(args.output) as handle:
        handle.write(tokenizer.to_str().encode("utf-8"))
    special = sum(1 for token in tokenizer.get_added_tokens_decoder().values() if token.special)
    print(f"wrote {args.output}: {args.model}, vocab {tokenizer.get_vocab_size():,}, {special} special tokens "
          f"({args.num_sentinels:,} sentinel{'' if args.num_sentinels == 1 else 's'}"
          f"{', the UL2 mode tokens' if args.mode_tokens else ''})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
