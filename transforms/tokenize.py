"""Tokenize: texts -> tokenized documents keyed for packing.

The tokenizer.json is loaded once per DoFn instance in ``setup`` (through
``FileSystems``, so gs:// works) and batches of texts go through the Rust batch encoder:
``encode_batch_fast`` (no offsets, word ids or token strings) unless a feature needs what
only ``encode_batch`` computes, which costs about half as much again. Each document gets:

- ``key``: a 16-byte blake2b digest of its text (exact duplicates collide on purpose);
- its split: ``validation`` when a salted digest of the key, as a number in [0, 1), falls
  below ``validation_fraction``, else ``train``;
- its bucket: another salted digest of the key modulo ``num_buckets``;
- optional per-token features: ``word_starts`` (a token whose pre-tokenizer word differs
  from the previous token's) and ``sentence_starts`` (see :mod:`transforms.text_rules`).
  For a lossless byte-level BPE both come from the tokens' byte lengths and the text
  (word starts by the GPT-2 pre-tokenizer's rules, :mod:`transforms.word_starts`), so the
  fast encoder serves; otherwise from the encoder's word ids and offsets. A document the
  fast path cannot map (its tokens do not spell its bytes) is encoded again, alone.

A document longer than :data:`~transforms.long_text.PIECE_CHARS` characters is encoded in
bounded pieces and its ids laid end to end (:mod:`transforms.long_text`), so no document
makes the encoder hold gigabytes. A text that encodes to no token is rejected with reason
``no_tokens``.
"""

from __future__ import annotations

import collections
import gc
import os
import struct
import sys
import time
from concurrent.futures import ThreadPoolExecutor

import apache_beam as beam
import numpy as np
from apache_beam.io.filesystems import FileSystems
from apache_beam.transforms.window import GlobalWindows

from transforms.handoff import wrap
from transforms.long_text import PIECE_CHARS, PiecedEncoding, encode_pieces, pieces_are_exact
from transforms.objectives.common import digest, digest_u64, unit_interval
from transforms.read import rejection
from transforms.text_rules import byte_positions, sentence_start_chars, token_flags
from transforms.tokenizer_utils import byte_level_lengths, tokenizer_from_bytes
from transforms.word_starts import ByteLevelWords, word_start_flags

__all__ = ["BATCH_SIZE", "SDK_WORKER_MAIN", "Tokenize", "assign_split", "bucket_of", "document_key",
           "freeze_worker_heap", "read_tokenizer_bytes"]

BATCH_SIZE = 2048
#: A batch is also sent once its texts hold this many characters (bounds memory for long documents).
BATCH_CHARS = 1 << 23
#: Texts in a bundle's first batch; each next batch doubles, up to the batch size.
FIRST_BATCH = 128
TRAIN, VALIDATION = "train", "validation"
#: The environment variable the Rust encoder's thread pool (rayon) is sized by.
ENCODER_THREADS_ENV = "RAYON_NUM_THREADS"


#: The module a Beam SDK worker process runs as ``__main__`` (the portable runners' subprocess
#: workers, Dataflow's harness).
SDK_WORKER_MAIN = "apache_beam.runners.worker.sdk_worker_main"


def freeze_worker_heap() -> bool:
    """In a Beam SDK worker process, freeze its objects as they are when its first Tokenize
    starts (Beam's modules, the worker's machinery), so that later full garbage collections
    skip them; return whether it froze them.

    Nothing else is touched: the process of a materialize run freezes its own objects for
    as long as its pipeline runs (:func:`pipelines.materialize._frozen_heap`), and any other
    process belongs to somebody else. A worker lives as long as its job, so the freeze is not
    undone. Measured with 2 multi-processing workers on 60 MB: clm 12.1 s -> 11.6 s, bart
    14.6 s -> 14.0 s (two runs each).
    """
    main = sys.modules.get("__main__")
    spec = getattr(main, "__spec__", None)
    if getattr(spec, "name", None) != SDK_WORKER_MAIN or gc.get_freeze_count():
        return False
    gc.freeze()
    return True


def document_key(text: str) -> bytes:
    """Stable 16-byte content digest of a document."""
    return digest(text, salt=b"lmshards-doc")


def assign_split(key: bytes, validation_fraction: float) -> str:
    """``validation`` or ``train``, by a salted digest of the document key."""
    return VALIDATION if unit_interval(key, salt=b"lmshards-split") < validation_fraction else TRAIN


def bucket_of(key: bytes, num_buckets: int) -> int:
    """Packing bucket of a document key."""
    return digest_u64(key, salt=b"lmshards-bucket") % num_buckets


def read_tokenizer_bytes(path: str) -> bytes:
    """Bytes of a tokenizer.json on any Beam filesystem."""
    with FileSystems.open(path) as handle:
        return handle.read()


class _Progress:
    """Prints documents, tokens and tokens/s of this worker to stderr every ``seconds`` (0: never).

    Wall-clock time only decides when a line is printed, never what is written.
    """

    def __init__(self, seconds: float):
        self._seconds = seconds
        self._start = self._last = time.monotonic()
        self._documents = self._tokens = 0

    def add(self, documents: int, tokens: int) -> None:
        self._documents += documents
        self._tokens += tokens
        now = time.monotonic()
        if self._seconds and now - self._last >= self._seconds:
            self._last = now
            rate = self._tokens / max(now - self._start, 1e-9)
            print(f"lmshards: tokenized {self._documents:,} documents, {self._tokens:,} tokens, "
                  f"{rate:,.0f} tokens/s (pid {os.getpid()})", file=sys.stderr, flush=True)


class _TokenizeBatch(beam.DoFn):
    """Buffers texts into batches and encodes them on a background thread.

    The Rust encoder releases the GIL, so while batch ``i`` is encoded the Python side
    keeps reading and parsing input and emits the documents of batch ``i - 1``. At most
    two batches are in flight; ``finish_bundle`` drains them.
    """

    def __init__(self, tokenizer_path, features, validation_fraction, num_buckets, batch_size, progress_seconds,
                 encoder_threads=None, handoff_scope=None):
        self._handoff_scope = handoff_scope
        self._tokenizer_path = tokenizer_path
        self._features = frozenset(features)
        self._validation_fraction = validation_fraction
        self._num_buckets = num_buckets
        self._batch_size = batch_size
        self._progress_seconds = progress_seconds
        self._encoder_threads = encoder_threads

    def setup(self):
        freeze_worker_heap()
        if self._encoder_threads and ENCODER_THREADS_ENV not in os.environ:
            # The Rust encoder sizes its thread pool from this on its first batch in the process
            # (a Beam worker process is fresh); a value the user set wins.
            os.environ[ENCODER_THREADS_ENV] = str(self._encoder_threads)
        self._tokenizer = tokenizer_from_bytes(read_tokenizer_bytes(self._tokenizer_path), self._tokenizer_path)
        # Text that spells a special token ("<extra_id_0>", "</s>") is text, not a control id.
        self._tokenizer.encode_special_tokens = True
        # Byte-level BPE: tokens' byte spans follow from their ids (no offsets to convert), and
        # for the GPT-2 regex pre-tokenizer word starts follow from the text (no word ids).
        self._byte_lengths = byte_level_lengths(self._tokenizer) if self._features else None
        self._words = None
        if "word_starts" in self._features:
            self._words = ByteLevelWords.of(self._tokenizer, self._byte_lengths)
        # Offsets and word ids cost the encoder about half as much again; skip them unless some
        # feature cannot do without (a document the fast path cannot handle is encoded again).
        self._fast = not self._features or (
            self._byte_lengths is not None and ("word_starts" not in self._features or self._words is not None))
        # Long documents go in pieces only where that gives the ids of the whole (see transforms/long_text.py).
        self._pieces = pieces_are_exact(
            lambda texts: [e.ids for e in self._tokenizer.encode_batch_fast(texts, add_special_tokens=False)])
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="lmshards-encode")
        self._documents = beam.metrics.Metrics.counter("lmshards", "documents_tokenized")
        self._tokens = beam.metrics.Metrics.counter("lmshards", "tokens")
        self._progress = _Progress(self._progress_seconds)

    def teardown(self):
        pool = getattr(self, "_pool", None)
        if pool is not None:
            pool.shutdown(wait=True)

    def start_bundle(self):
        self._buffer = []
        self._buffer_chars = 0
        self._pending = collections.deque()
        # Batches ramp up (128, 256, ... texts) so the encoder starts while the first full batch
        # would still be read; batching never changes an encoding.
        self._limit = min(self._batch_size, FIRST_BATCH)

    def _encode_batch(self, texts, full=False):
        if self._fast and not full:
            return self._tokenizer.encode_batch_fast(texts, add_special_tokens=False)
        return self._tokenizer.encode_batch(texts, add_special_tokens=False)

    def _encode(self, texts):
        if not self._pieces or all(len(text) <= PIECE_CHARS for text in texts):
            return self._encode_batch(texts)
        short = iter(self._encode_batch([text for text in texts if len(text) <= PIECE_CHARS]))
        return [next(short) if len(text) <= PIECE_CHARS else
                encode_pieces(self._encode_batch, text, full=not self._fast) for text in texts]

    def _encode_full(self, text):
        """One text's encoding with word ids and offsets (in pieces when long)."""
        if self._pieces and len(text) > PIECE_CHARS:
            return encode_pieces(lambda texts: self._encode_batch(texts, full=True), text, full=True)
        return self._tokenizer.encode(text, add_special_tokens=False)

    def _submit(self):
        texts, self._buffer, self._buffer_chars = self._buffer, [], 0
        self._queue(texts)

    def _queue(self, texts):
        self._pending.append((texts, self._pool.submit(self._encode, texts)))

    def _emit(self, texts, future):
        tokens = 0
        for text, encoding in zip(texts, future.result()):
            ids = encoding.ids
            # int32 bytes of the id list: struct packs a list about twice as fast as np.fromiter
            # (14 against 26 us for 1,800 ids) and gives the bytes the shuffle carries.
            # A document encoded in pieces has its ids as an int32 array already.
            data = ids.tobytes() if isinstance(ids, np.ndarray) else struct.pack(f"={len(ids)}i", *ids)
            ids = np.frombuffer(data, dtype=np.int32)
            if ids.size == 0:
                beam.metrics.Metrics.counter("lmshards", "rejected_no_tokens").inc()
                yield beam.pvalue.TaggedOutput(Tokenize.REJECTED, rejection("<tokenizer>", 0, "no_tokens", text))
                continue
            features = self._token_features(text, ids, encoding) if self._features else {}
            key = document_key(text)
            split = assign_split(key, self._validation_fraction)
            tokens += ids.size
            # Raw bytes cross the shuffle far cheaper than pickled arrays (see Pack).
            yield (split, bucket_of(key, self._num_buckets)), wrap((key, data, features), self._handoff_scope)
        self._documents.inc(len(texts))
        self._tokens.inc(tokens)
        self._progress.add(len(texts), tokens)

    def _token_features(self, text, ids, encoding):
        """Per-token word and sentence starts, from the tokens' byte spans where they spell the
        text's bytes, else from the encoder's word ids and offsets."""
        spelled = False
        if self._byte_lengths is not None:
            ends = np.cumsum(self._byte_lengths[ids])
            encoded = text.encode("utf-8")
            spelled = bool(ends[-1] == len(encoded))
        full = None if self._fast else encoding  # an encoding with word ids and offsets
        features = {}
        if "word_starts" in self._features:
            flags = self._words.token_flags(text, encoded, ends) if spelled and self._words is not None else None
            if flags is None:
                if full is None:  # a rare text the fast path cannot handle: encode it again
                    full = self._encode_full(text)
                flags = word_start_flags(full.word_ids)
            features["word_starts"] = flags
        if "sentence_starts" in self._features:
            chars = sentence_start_chars(text)
            if spelled:
                features["sentence_starts"] = token_flags(ends, byte_positions(text, encoded, chars))
            else:
                if full is None:
                    full = self._encode_full(text)
                ends_of = full.offset_ends if isinstance(full, PiecedEncoding) else \
                    np.array([end for _, end in full.offsets], dtype=np.int64)
                offset_ends = np.maximum.accumulate(ends_of)
                features["sentence_starts"] = token_flags(offset_ends, chars)
        return features

    def process(self, text):
        self._buffer.append(text)
        self._buffer_chars += len(text)
        if len(self._buffer) >= self._limit or self._buffer_chars >= BATCH_CHARS:
            self._submit()
            self._limit = min(self._batch_size, 2 * self._limit)
            while len(self._pending) > 1:
                yield from self._emit(*self._pending.popleft())

    def finish_bundle(self):
        # The last texts go out in shrinking batches (halves, down to at most two first batches):
        # the encoder works on the next while this thread emits the one before, and the batch
        # this thread handles alone at the very end is small.
        texts, self._buffer, self._buffer_chars = self._buffer, [], 0
        for batch in _tail_batches(texts):
            self._queue(batch)
            while len(self._pending) > 1:
                yield from _windowed(self._emit(*self._pending.popleft()))
        while self._pending:
            yield from _windowed(self._emit(*self._pending.popleft()))


def _tail_batches(texts: list) -> list[list]:
    """``texts`` cut into batches that halve in size, the last of at most ``2 * FIRST_BATCH``."""
    batches = []
    while len(texts) > 2 * FIRST_BATCH:
        half = len(texts) // 2
        batches.append(texts[:half])
        texts = texts[half:]
    if texts:
        batches.append(texts)
    return batches


def _windowed(outputs):
    """``finish_bundle`` outputs must carry their window."""
    for output in outputs:
        if isinstance(output, beam.pvalue.TaggedOutput):
            yield beam.pvalue.TaggedOutput(output.tag, GlobalWindows.windowed_value(output.value))
        else:
            yield GlobalWindows.windowed_value(output)


class Tokenize(beam.PTransform):
    """Encode texts in batches; emit ``((split, bucket), (key, ids_bytes, features))``.

    ``ids_bytes`` is the int32 token array as raw bytes (``np.frombuffer(b, np.int32)``).

    Args:
        tokenizer_path: tokenizer.json on any Beam filesystem.
        features: per-token features to compute (``word_starts``, ``sentence_starts``).
        validation_fraction: share of documents (by key hash) in the validation split.
        num_buckets: packing buckets per split.
        batch_size: texts per ``encode_batch`` call (at most; also capped at ``BATCH_CHARS`` characters).
        progress_seconds: interval of progress lines on stderr (0 turns them off).
        encoder_threads: threads of the Rust encoder in each worker process (sets
            ``RAYON_NUM_THREADS`` there when unset; None leaves the tokenizer's default).
        handoff_scope: wrap each value in a :class:`~transforms.handoff.ByReference` of this
            scope (only where every stage runs in this process); None emits it as it is.

    Texts that encode to nothing go to the :attr:`REJECTED` output.
    """

    REJECTED = "rejected"

    def __init__(self, tokenizer_path, *, features=frozenset(), validation_fraction=0.0, num_buckets=64,
                 batch_size=BATCH_SIZE, progress_seconds=10.0, encoder_threads=None, handoff_scope=None):
        super().__init__()
        if batch_size < 1:
            raise ValueError(f"--batch-size {batch_size}: must be >= 1")
        self._fn = _TokenizeBatch(tokenizer_path, features, validation_fraction, num_buckets, batch_size,
                                  progress_seconds, encoder_threads, handoff_scope)

    def expand(self, texts):
        return texts | "Encode" >> beam.ParDo(self._fn).with_outputs(self.REJECTED, main="documents")
