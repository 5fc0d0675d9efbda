"""Tokenize: texts -> tokenized documents keyed for packing.

The tokenizer.json is read once per DoFn instance in ``setup`` (through ``FileSystems``,
so gs:// works) and loaded into the encoder backend the job was planned with
(:mod:`transforms.tokenizing.encoder`: ``fastokens`` or HF ``tokenizers``, which give the same ids);
batches of texts are encoded on a background thread. Each document gets:

- ``key``: a 16-byte blake2b digest of its text (exact duplicates collide on purpose);
- its split: ``validation`` when a salted digest of the key, as a number in [0, 1), falls
  below ``validation_fraction``, else ``train``;
- its bucket: another salted digest of the key modulo ``num_buckets``;
- optional per-token features: ``word_starts`` (a token whose pre-tokenizer word differs
  from the previous token's), ``space_starts`` (a token whose text begins with a space:
  fairseq's word starts, :mod:`transforms.tokenizing.word_starts`) and ``sentence_starts`` (see
  :mod:`transforms.tokenizing.text_rules`). For a lossless byte-level BPE they come from the ids, the
  tokens' byte lengths and the text (word starts by the GPT-2 pre-tokenizer's rules, space
  starts from a table per id), so the ids are all the encoder must give; otherwise they come
  from the word ids and offsets of ``tokenizers``' full encodings (:func:`needs_full_encodings`:
  such a job encodes with ``tokenizers``). A document the byte-level path cannot map (its
  tokens do not spell its bytes) is encoded again, alone, by ``tokenizers``.

A document longer than :data:`~transforms.tokenizing.long_text.PIECE_CHARS` characters is encoded in
bounded pieces and its ids laid end to end (:mod:`transforms.tokenizing.long_text`,
:func:`transforms.tokenizing.encoder.encode_bounded`), so no document makes the encoder hold
gigabytes. A text that encodes to no token is rejected with reason ``no_tokens``.

A text the encoder cannot encode at all is rejected with reason ``encoder_error`` (its
``detail`` the encoder's one-line error), and the run goes on: a tokenizer's Split regex can
exceed its regex engine's backtracking limit on one text (``(a+)+$`` on thirty ``a`` and a
``!``: Oniguruma's ``retry-limit-in-match over``, which HF ``tokenizers`` raises as a Rust panic,
a ``BaseException``; fastokens' PCRE2 ``match limit exceeded``, a ``ValueError``). A batch that
fails is encoded again by the reference, ``tokenizers``; where that fails too, each of its texts
alone, and the texts ``tokenizers`` refuses are rejected. So the rejections and the bytes are the
reference's under either backend. (The engines' limits differ: a text that fastokens encodes and
``tokenizers`` refuses would be kept under fastokens; none is known, as PCRE2's limit is the
lower on the patterns tried.)
"""

from __future__ import annotations

import collections
import logging
import os
from concurrent.futures import ThreadPoolExecutor

import apache_beam as beam
import numpy as np
from apache_beam.transforms.window import GlobalWindows

from schemas.errors import ConfigError, JobFailedError
from transforms.elements import DocumentBatch, narrow_ids
from transforms.objectives.common import digest, digest_u64, unit_interval
from transforms.objectives.counters import length_counters
from transforms.progress import PROGRESS
from transforms.reading.flag_files import MAX_TOKENIZER_BYTES, read_flag_file
from transforms.reading.read import rejection
from transforms.tokenizing.encoder import (
    EncodedBatch,
    EncoderUnavailable,
    encode_bounded,
    error_line,
    full_encoding,
    load_encoder,
    offset_ends,
    pieces_are_exact_for,
)
from transforms.tokenizing.text_rules import byte_positions, sentence_start_chars, token_flags
from transforms.tokenizing.tokenizer_utils import byte_level_lengths, tokenizer_from_bytes
from transforms.tokenizing.word_starts import ByteLevelWords, space_start_flags, space_start_table, word_start_flags

__all__ = ["BATCH_SIZE", "TokenFeatures", "Tokenize", "assign_split", "bucket_of", "document_key",
           "needs_full_encodings", "read_tokenizer_bytes"]

BATCH_SIZE = 2048
#: A batch is also sent once its texts hold this many characters (bounds memory for long documents).
BATCH_CHARS = 1 << 23
#: Texts in a bundle's first batch; each next batch doubles, up to the batch size.
FIRST_BATCH = 128
TRAIN, VALIDATION = "train", "validation"
_LOG = logging.getLogger("lmshards")
#: The environment variables the Rust encoders' thread pools are sized by: ``tokenizers``' (rayon)
#: and fastokens' (its own pool; the count includes the calling thread).
ENCODER_THREADS_ENV = ("RAYON_NUM_THREADS", "FASTOKENS_BPE_THREADS")


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
    """Bytes of a tokenizer.json on any Beam filesystem (a regular file, at most
    :data:`~transforms.reading.flag_files.MAX_TOKENIZER_BYTES`)."""
    return read_flag_file("--tokenizer", path, MAX_TOKENIZER_BYTES)


class TokenFeatures:
    """Per-token word and sentence starts of documents, for one tokenizer.

    For a lossless byte-level BPE they follow from the ids and the text (:attr:`ids_suffice`);
    otherwise from the word ids and offsets of ``tokenizers``' full encodings.

    Args:
        tokenizer: the HF tokenizer of the job (it encodes special-token text as text).
        features: the features to compute (``word_starts``, ``space_starts``, ``sentence_starts``).
    """

    def __init__(self, tokenizer, features):
        self.features = frozenset(features)
        tokenizer.encode_special_tokens = True
        self.tokenizer = tokenizer
        #: long texts encoded again are encoded in pieces (set by the DoFn when that is exact)
        self.pieces = False
        # Byte-level BPE: tokens' byte spans follow from their ids (no offsets to convert), and
        # for the GPT-2 regex pre-tokenizer word starts follow from the text (no word ids).
        self.byte_lengths = byte_level_lengths(tokenizer) if self.features else None
        self.words = None
        if "word_starts" in self.features:
            self.words = ByteLevelWords.of(tokenizer, self.byte_lengths)
        self.spaces = space_start_table(tokenizer, self.byte_lengths) if "space_starts" in self.features else None
        self.ids_suffice = not self.features or (
            self.byte_lengths is not None and ("word_starts" not in self.features or self.words is not None))

    def of(self, text: str, ids: np.ndarray, encoding=None) -> dict[str, np.ndarray]:
        """The features of one document from its ids (and its full encoding, where one is needed:
        without it a document the byte-level path cannot map is encoded again here)."""
        spelled = False
        if self.byte_lengths is not None:
            ends = np.cumsum(self.byte_lengths[ids])
            encoded = text.encode("utf-8")
            spelled = bool(ends[-1] == len(encoded))
        full = encoding
        features = {}
        if "word_starts" in self.features:
            flags = self.words.token_flags(text, encoded, ends) if spelled and self.words is not None else None
            if flags is None:
                if full is None:  # a rare text the byte-level path cannot handle: encode it again
                    full = full_encoding(self.tokenizer, text, self.pieces)
                flags = word_start_flags(full.word_ids)
            features["word_starts"] = flags
        if "space_starts" in self.features:
            if self.spaces is not None:
                features["space_starts"] = self.spaces[ids]
            else:
                if full is None:
                    full = self.tokenizer.encode(text, add_special_tokens=False)
                features["space_starts"] = space_start_flags(text, full.offsets, full.special_tokens_mask)
        if "sentence_starts" in self.features:
            chars = sentence_start_chars(text)
            if spelled:
                features["sentence_starts"] = token_flags(ends, byte_positions(text, encoded, chars))
            else:
                if full is None:
                    full = full_encoding(self.tokenizer, text, self.pieces)
                features["sentence_starts"] = token_flags(np.maximum.accumulate(offset_ends(full)), chars)
        return features


def needs_full_encodings(tokenizer, features) -> bool:
    """Whether a job's features need the offsets and word ids of ``tokenizers``' full encodings
    (so it must encode with ``tokenizers``), rather than the ids alone."""
    return not TokenFeatures(tokenizer, features).ids_suffice


class _TokenizeBatch(beam.DoFn):
    """Buffers texts into batches and encodes them on a background thread.

    The Rust encoders release the GIL, so while batch ``i`` is encoded the Python side
    keeps reading and parsing input and emits the documents of batch ``i - 1``. At most
    two batches are in flight; ``finish_bundle`` drains them.
    """

    def __init__(self, tokenizer_path, features, validation_fraction, num_buckets, batch_size, progress_seconds,
                 encoder_threads=None, encoder="tokenizers"):
        self._tokenizer_path = tokenizer_path
        self._features = frozenset(features)
        self._validation_fraction = validation_fraction
        self._num_buckets = num_buckets
        self._batch_size = batch_size
        self._progress_seconds = progress_seconds
        self._encoder_threads = encoder_threads
        self._backend = encoder

    def setup(self):
        if self._encoder_threads:
            for name in ENCODER_THREADS_ENV:
                # The Rust encoders size their thread pools from these on their first batch in the
                # process (a Beam worker process is fresh); a value the user set wins.
                os.environ.setdefault(name, str(self._encoder_threads))
        data = read_tokenizer_bytes(self._tokenizer_path)
        self._token_features = None
        full = False
        if self._features:
            self._token_features = TokenFeatures(tokenizer_from_bytes(data, self._tokenizer_path), self._features)
            full = not self._token_features.ids_suffice
        self._tokenizer_bytes = data
        self._reference = None
        self.fallback_batches = 0  #: batches fastokens refused and tokenizers encoded (also a Beam counter)
        try:
            self._encoder = load_encoder(self._backend, data.decode("utf-8"), full=full)
        except EncoderUnavailable as exc:
            raise JobFailedError(
                f"lmshards: the job was planned to encode with {self._backend}, which cannot be used in this worker "
                f"(pid {os.getpid()}): {exc}; install the same lmshards dependencies on the workers, "
                "or run with --encoder tokenizers") from None
        # Long documents go in pieces only where that gives the ids of the whole (transforms/tokenizing/long_text.py).
        self._pieces = pieces_are_exact_for(self._encoder, data.decode("utf-8"))
        if self._token_features is not None:
            self._token_features.pieces = self._pieces
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="lmshards-encode")
        self._documents = beam.metrics.Metrics.counter("lmshards", "documents_tokenized")
        self._tokens = beam.metrics.Metrics.counter("lmshards", "tokens")
        self._fallback_batches = beam.metrics.Metrics.counter("lmshards", "encoder_fallback_batches")
        # A worker process counts for the run (the process that planned the run configured its own).
        PROGRESS.join_run(self._progress_seconds)

    def teardown(self):
        pool = getattr(self, "_pool", None)
        if pool is not None:
            pool.shutdown(wait=True)

    def start_bundle(self):
        self._buffer = []
        self._buffer_sources = []  # the texts' sources (``--source-field``), or empty
        self._source_lengths = collections.defaultdict(list)  # (split, source) -> document lengths
        self._buffer_chars = 0
        self._pending = collections.deque()
        # Batches ramp up (128, 256, ... texts) so the encoder starts while the first full batch
        # would still be read; batching never changes an encoding.
        self._limit = min(self._batch_size, FIRST_BATCH)

    def _submit(self):
        texts, sources = self._buffer, self._buffer_sources
        self._buffer, self._buffer_sources, self._buffer_chars = [], [], 0
        self._queue(texts, sources)

    def _queue(self, texts, sources=()):
        self._pending.append((texts, sources, self._pool.submit(self._encode_and_key, texts)))

    def _encode_and_key(self, texts):
        """:meth:`_encode`'s result and the texts' keys (hashing long texts releases the GIL, so
        on this thread it runs beside the main one)."""
        return self._encode(texts), [document_key(text) for text in texts]

    def _encode(self, texts):
        """``(the batch's ids, whether tokenizers encoded it instead of fastokens, {index: the
        error of each text tokenizers refuses}``) (see the module docstring)."""
        try:
            return encode_bounded(self._encoder, texts, self._pieces), False, {}
        except BaseException as exc:  # a Rust panic is a BaseException (pyo3's PanicException)
            if isinstance(exc, (KeyboardInterrupt, SystemExit)):
                raise
            failure = exc
        fell_back = self._encoder.name != "tokenizers"
        if fell_back:
            # fastokens refused a text the parity probe did not cover (e.g. a byte its vocabulary
            # lacks, which tokenizers maps to the unknown token): the reference encodes the batch.
            if self._reference is None:
                _LOG.warning("lmshards: fastokens failed on a batch (%s); tokenizers encodes the batches it "
                             "refuses (same ids, slower)", error_line(failure))
                self._reference = load_encoder("tokenizers", self._tokenizer_bytes.decode("utf-8"),
                                               full=self._encoder_full())
            try:
                return encode_bounded(self._reference, texts, self._pieces), True, {}
            except BaseException as exc:
                if isinstance(exc, (KeyboardInterrupt, SystemExit)):
                    raise
        batch, refused = self._encode_each(self._reference if fell_back else self._encoder, texts)
        return batch, fell_back, refused

    def _encoder_full(self) -> bool:
        return self._token_features is not None and not self._token_features.ids_suffice

    def _encode_each(self, encoder, texts):
        """``(batch, {index: error})``: each text encoded alone; one that fails gets no ids."""
        ids, encodings, refused = [], [], {}
        for index, text in enumerate(texts):
            try:
                one = encode_bounded(encoder, [text], self._pieces)
            except BaseException as exc:
                if isinstance(exc, (KeyboardInterrupt, SystemExit)):
                    raise
                refused[index] = error_line(exc)
                ids.append(np.zeros(0, np.int32))
                encodings.append(None)
                continue
            ids.append(one.ids_of(0))
            encodings.append(one.encodings[0] if one.encodings is not None else None)
        offsets = np.zeros(len(texts) + 1, dtype=np.int64)
        np.cumsum([len(row) for row in ids], out=offsets[1:])
        full = any(encoding is not None for encoding in encodings)
        batch = EncodedBatch(np.concatenate(ids).astype(np.int32, copy=False) if ids else np.zeros(0, np.int32),
                             offsets, encodings if full else None)
        return batch, refused

    def _emit(self, texts, sources, future):
        """The batch's documents as one :class:`DocumentBatch` per split (its rejections one by one)."""
        (batch, fell_back, refused), keys = future.result()
        if fell_back:
            self._fallback_batches.inc()
            self.fallback_batches += 1
        lengths = np.diff(batch.offsets)
        kept = lengths > 0
        for index in refused:
            kept[index] = False
        for index in np.flatnonzero(~kept).tolist():
            if index in refused:
                beam.metrics.Metrics.counter("lmshards", "rejected_encoder_error").inc()
                entry = rejection("<tokenizer>", 0, "encoder_error", texts[index])
                entry["detail"] = refused[index]
                yield beam.pvalue.TaggedOutput(Tokenize.REJECTED, entry)
            else:
                beam.metrics.Metrics.counter("lmshards", "rejected_no_tokens").inc()
                entry = rejection("<tokenizer>", 0, "no_tokens", texts[index])
                yield beam.pvalue.TaggedOutput(Tokenize.REJECTED, entry)
        # the ids the shuffles carry, as narrow as the batch's ids allow (uint16 for vocabularies
        # of up to 65,536 entries: half the bytes to send and to hold until Pack)
        carried, _ = narrow_ids(batch.ids)
        features: dict[str, list] = {name: [] for name in sorted(self._features)}
        if self._token_features is not None:
            offsets = batch.offsets.tolist()
            for index in np.flatnonzero(kept).tolist():
                encoding = batch.encodings[index] if batch.encodings is not None else None
                made = self._token_features.of(texts[index], batch.ids[offsets[index]:offsets[index + 1]], encoding)
                for name in features:
                    features[name].append(made[name])
        splits = [assign_split(key, self._validation_fraction) for key in keys]
        buckets = np.fromiter((bucket_of(key, self._num_buckets) for key in keys), dtype=np.uint64, count=len(keys))
        all_keys = np.frombuffer(b"".join(keys), dtype=np.uint8).reshape(-1, 16)
        if features and features[next(iter(features))]:
            # flags of the kept documents end to end; as long as the ids (a rejected document has none)
            flat = {name: np.concatenate(parts).astype(np.bool_, copy=False) for name, parts in features.items()}
        else:
            flat = {name: np.zeros(0, np.bool_) for name in features}
        kept_indices = np.flatnonzero(kept)
        whole = DocumentBatch(all_keys[kept_indices], buckets[kept_indices], _kept_offsets(lengths, kept_indices),
                              _kept_ids(carried, batch.offsets, kept, kept_indices), flat)
        split_of = np.array([splits[index] == VALIDATION for index in kept_indices.tolist()], dtype=bool)
        for split, mask in ((TRAIN, ~split_of), (VALIDATION, split_of)):
            if not mask.any():
                continue
            part = whole if mask.all() else whole.take(np.flatnonzero(mask))
            yield split, part.encode()
        tokens = int(lengths[kept].sum())
        if sources:
            for index in kept_indices.tolist():
                self._source_lengths[splits[index], sources[index]].append(int(lengths[index]))
        self._documents.inc(len(texts))
        self._tokens.inc(tokens)
        PROGRESS.add(len(texts), tokens)

    def process(self, element):
        if isinstance(element, tuple):  # (text, source) with --source-field
            text, source = element
            self._buffer_sources.append(source)
        else:
            text = element
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
        texts, sources = self._buffer, self._buffer_sources
        self._buffer, self._buffer_sources, self._buffer_chars = [], [], 0
        done = 0
        for batch in _tail_batches(texts):
            self._queue(batch, sources[done:done + len(batch)])
            done += len(batch)
            while len(self._pending) > 1:
                yield from _windowed(self._emit(*self._pending.popleft()))
        while self._pending:
            yield from _windowed(self._emit(*self._pending.popleft()))
        for (split, source), lengths in sorted(self._source_lengths.items()):
            counters = {"documents": len(lengths), **length_counters("doc_tokens", np.array(lengths))}
            yield beam.pvalue.TaggedOutput(Tokenize.SOURCES, GlobalWindows.windowed_value(((split, source), counters)))
        self._source_lengths.clear()
        # A worker's last counts of the bundle reach the relay now, not within its report period:
        # the later stages start only once every Tokenize bundle is done, and the line that ends
        # the reading (its "tokenized: 100%") is the sum of the reports then.
        PROGRESS.report_now()


def _kept_offsets(lengths: np.ndarray, kept_indices: np.ndarray) -> np.ndarray:
    offsets = np.zeros(kept_indices.shape[0] + 1, dtype=np.int64)
    np.cumsum(lengths[kept_indices], out=offsets[1:])
    return offsets


def _kept_ids(carried: np.ndarray, offsets: np.ndarray, kept: np.ndarray, kept_indices: np.ndarray) -> np.ndarray:
    """The ids of the kept documents end to end (the batch's own when every document is kept)."""
    if kept.all():
        return carried
    starts, ends = offsets[kept_indices], offsets[kept_indices + 1]
    return np.concatenate([carried[start:end] for start, end in zip(starts.tolist(), ends.tolist())]
                          or [carried[:0]])


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
    """Encode texts in batches; emit ``(split, encoded DocumentBatch)``: per encoding batch,
    one :class:`~transforms.elements.DocumentBatch` of each split's documents, as its
    :meth:`~transforms.elements.DocumentBatch.encode` tuple (ids uint16 when the batch's ids
    all fit, else int32).

    Args:
        tokenizer_path: tokenizer.json on any Beam filesystem.
        features: per-token features to compute (``word_starts``, ``sentence_starts``).
        validation_fraction: share of documents (by key hash) in the validation split.
        num_buckets: packing buckets per split.
        batch_size: texts per ``encode_batch`` call (at most; also capped at ``BATCH_CHARS`` characters).
        progress_seconds: interval of progress lines on stderr (0 turns them off).
        encoder_threads: threads of the Rust encoder in each worker process (sets
            ``RAYON_NUM_THREADS`` and ``FASTOKENS_BPE_THREADS`` there where unset; None leaves
            the encoders' defaults, every core).
        encoder: the backend, ``fastokens`` or ``tokenizers`` (the reference; the default),
            as :func:`transforms.tokenizing.encoder_choice.choose_encoder` decided for the job. A worker where it
            cannot load fails.

    Texts that encode to nothing go to the :attr:`REJECTED` output.
    """

    REJECTED = "rejected"
    #: per (split, source) document counters of ``(text, source)`` inputs (``--source-field``)
    SOURCES = "sources"

    def __init__(self, tokenizer_path, *, features=frozenset(), validation_fraction=0.0, num_buckets=64,
                 batch_size=BATCH_SIZE, progress_seconds=10.0, encoder_threads=None, encoder="tokenizers"):
        super().__init__()
        if batch_size < 1:
            raise ConfigError(f"--batch-size {batch_size}: must be >= 1")
        if encoder not in ("fastokens", "tokenizers"):
            raise ConfigError(f"encoder {encoder!r}: expected fastokens or tokenizers")
        self._fn = _TokenizeBatch(tokenizer_path, features, validation_fraction, num_buckets, batch_size,
                                  progress_seconds, encoder_threads, encoder)

    def expand(self, texts):
        return texts | "Encode" >> beam.ParDo(self._fn).with_outputs(self.REJECTED, self.SOURCES, main="documents")
