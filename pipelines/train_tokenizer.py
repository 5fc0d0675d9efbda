"""``lmshards train-tokenizer``: train a HF ``tokenizers`` model on corpus files.

Reads the same inputs as ``materialize`` (same globs, formats, compression, text modes)
and writes a tokenizer.json with the special tokens the objectives need at the lowest ids:
``<pad>`` 0, ``</s>`` 1, ``<s>`` 2, ``<unk>`` 3, ``<mask>`` 4, then ``<extra_id_0..N-1>``
(T5 sentinels) and any extra tokens (e.g. UL2 mode tokens ``[R]``, ``[S]``, ``[X]``).

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
    num_sentinels: int = 100,
    extra_tokens: tuple[str, ...] = (),
    min_frequency: int = 2,
) -> Tokenizer:
    """Train a tokenizer on an iterable of texts.

    Raises:
        ValueError: unknown model or a vocabulary too small for the special tokens.
    """
    if model not in MODELS:
        raise ValueError(f"--model {model}: choose one of {', '.join(MODELS)}")
    special = SPECIAL_TOKENS + [sentinel_token(k) for k in range(num_sentinels)] + list(extra_tokens)
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
    parser = argparse.ArgumentParser(prog="lmshards train-tokenizer", description=__doc__.split("\n\n")[0])
    parser.add_argument("--input", action="append", required=True, metavar="GLOB")
    parser.add_argument("--output", required=True, metavar="PATH", help="tokenizer.json to write")
    parser.add_argument("--model", choices=MODELS, default="bpe")
    parser.add_argument("--vocab-size", type=int, default=8000)
    parser.add_argument("--num-sentinels", type=int, default=100, help="<extra_id_k> tokens (T5 has 100)")
    parser.add_argument("--extra-token", action="append", default=[], help="additional special token; repeatable")
    parser.add_argument("--min-frequency", type=int, default=2)
    parser.add_argument("--text-mode", choices=TEXT_MODES, default="line")
    parser.add_argument("--text-field", default="text")
    parser.add_argument("--max-documents", type=int, default=10_000_000)
    parser.add_argument("--max-chars", type=int, default=2_000_000_000)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        files = [path for path, _ in expand_inputs(args.input)]
        tokenizer = train_tokenizer(
            _texts(files, args.text_mode, args.text_field, args.max_documents, args.max_chars),
            model=args.model,
            vocab_size=args.vocab_size,
            num_sentinels=args.num_sentinels,
            extra_tokens=tuple(args.extra_token),
            min_frequency=args.min_frequency,
        )
    except ValueError as exc:
        print(f"lmshards train-tokenizer: error: {exc}", file=sys.stderr)
        return 2
    from apache_beam.io.filesystems import FileSystems

    with FileSystems.create(args.output) as handle:
        handle.write(tokenizer.to_str().encode("utf-8"))
    print(f"wrote {args.output}: {args.model}, vocab {tokenizer.get_vocab_size():,}, "
          f"{len(SPECIAL_TOKENS) + args.num_sentinels + len(args.extra_token)} special tokens")
    return 0


if __name__ == "__main__":
    sys.exit(main())
