"""BART denoising, after fairseq's ``DenoisingDataset`` with the BART-large recipe as defaults.

Reference: facebookresearch/fairseq ``fairseq/data/denoising_dataset.py`` and the BART-large
command of fairseq issue #1899 (``--mask 0.3 --mask-length span-poisson --poisson-lambda 3.5
--replace-length 1 --mask-random 0.1 --permute-sentences 1 --rotate 0 --insert 0``); see
shared/reference/bart_mlm_megatron.md section 1. ``targets`` is the original framed chunk
``<s> chunk </s>``; ``inputs`` is the same after these steps, in fairseq's order:

1. Sentence permutation (``permute_sentences`` = p): ``ceil(n * p)`` of the ``n`` sentences
   are re-ordered among themselves (all of them, uniformly, for p = 1). Sentences start at
   ``sentence_starts`` (and at token 0).
2. Masking (``mask`` = share of *words*): budget ``ceil(#words * mask)``; span lengths in
   words ~ Poisson(``poisson_lambda``) (categorical cut where p_k < 1e-7), drawn until they
   cover the budget, the last one trimmed to fit; zero-length spans are set aside as
   insertions. Span starts are distinct word starts drawn uniformly; a span covers whole
   words and never runs through ``</s>``; spans may overlap. ``replace_length``: 1 = a span
   becomes one ``<mask>`` (text infilling), 0 = it is deleted, -1 = each of its tokens
   becomes ``<mask>``. ``mask_length`` "word"/"subword" use one-word/one-token spans. A
   span's mask is a random token with probability ``mask_random``. The zero-length spans
   then insert that many ``<mask>`` at uniform interior positions.
3. Token masking (``token_mask``) and token deletion (``token_delete``): the paper's other
   two noises as their own passes (not in fairseq, where one ``mask`` pass does either),
   each over ``ceil(#words * p)`` single words (single tokens when ``mask_length="subword"``)
   not yet noised, like fairseq's ``replace_length`` -1 (with ``mask_random``) and 0.
4. Random insertion (``insert``): ``ceil(len * insert)`` tokens at uniform interior positions.
5. Document rotation (probability ``rotate``): the interior is rotated by an offset in
   [1, len - 1]; ``<s>`` and ``</s>`` stay in place.

Words are fairseq's (``get_whole_word_mask`` with GPT-2's ``is_beginning_of_word``): a word
starts at a token whose text begins with a space (the ``space_starts`` feature of
:mod:`transforms.tokenizing.tokenize`: GPT-2's ``Ġ``, or for other tokenizers a token right after a space
in the text) and at a special token; the framing ``<s>``/``</s>`` never starts a word, so a
chunk's first token starts one only when it begins with a space (fairseq glues a block's
first word to ``<s>``, leaving it unmaskable). ``.``, ``,``, ``'t``, ``)`` or a newline do
not start words, so on English text a word is about three tokens. Without the feature every
token is a word, like fairseq's ``mask_length=subword``.

Deliberate differences from fairseq:

- Sentence boundaries come from the ``sentence_starts`` feature (a text rule of the
  pipeline), not from the GPT-2 id of "." (which is a no-op for other BPEs, fairseq #3803).
- Packed documents keep the EOS between them (fairseq strips it, gluing a line's first word
  to the line before). Special tokens inside a chunk and tokens already noised by an earlier
  pass are never masked, and spans stop at them; the token after an in-chunk special token
  starts a word (fairseq's word would begin at the special token, which lmshards never masks).
- Random tokens are uniform over non-special ids (fairseq: any id in [1, |V|), specials
  included). Each inserted token is random with probability ``mask_random`` (fairseq makes
  exactly ``ceil(n * mask_random)`` random, which turns the usual single zero-length-span
  insertion into a random token nearly always).
- Zero-length-span insertions are capped so that ``inputs`` never exceeds ``seq_len``
  (counted in ``inserts_dropped``); with ``insert > 0`` inputs can reach
  ``seq_len + ceil(seq_len * insert)`` (fairseq issue #2297). Budgets use ``ceil`` on the
  product rounded to 9 decimals (``ceil(10 * 0.3)`` is 3, not 4).
- Randomness is counter-based (:mod:`transforms.objectives.randoms`; each draw has its own
  stream, see the ``*_STREAM`` constants), so examples are a pure function of the example
  key; fairseq mixes torch's global RNG with ``hash(seed, epoch, index) % 1e6``.

A block's rows are noised together, laid end to end: every row ends with ``</s>``, a
barrier no span passes, so positions can be global and every pass is array work over the block
(:mod:`transforms.objectives.bart_passes`). This module holds the configuration and the order
of the passes.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any, NamedTuple

import numpy as np

from transforms.objectives import lines
from transforms.objectives.bart_noise import bart_shown
from transforms.objectives.bart_passes import (
    INSERT_IDS_STREAM,
    INSERT_RANDOM_STREAM,
    INSERT_STREAM,
    ROTATE_STREAM,
    SPAN_IDS_STREAM,
    SPAN_RANDOM_STREAM,
    START_STREAM,
    TOKEN_DELETE_STREAMS,
    TOKEN_MASK_STREAMS,
    ZERO_IDS_STREAM,
    ZERO_INSERT_STREAM,
    ZERO_RANDOM_STREAM,
    _ceil,
    _ceil_all,
    _framed,
    _gather_index,
    _insert,
    _noise_spans,
    _sentence_ordering,
    _Source,
    _span_ends,
    _starts_in_pool,
    _Words,
    poisson_span_cdf,
    sentence_permutation,
    span_lengths,
)
from transforms.objectives.base import Block, Built, InspectionContext, Objective
from transforms.objectives.common import SpecialIds, ids_out_of_range, index_range
from transforms.objectives.flags import flag
from transforms.objectives.randoms import Randoms, random_ids
from transforms.objectives.shown import Shown
from transforms.objectives.summary import ratio, summarize_bart

__all__ = ["MASK_LENGTHS", "Bart", "BartConfig", "BartParts", "poisson_span_cdf", "sentence_permutation",
           "span_lengths"]

MASK_LENGTHS = ("span-poisson", "word", "subword")

_COUNTERS = ("examples", "sentences", "permuted_sentences", "words", "mask_budget", "masked_spans",
             "zero_length_spans", "masked_words", "masked_tokens", "random_tokens", "inserted", "inserts_dropped",
             "rotated")
_HISTOGRAM_NAMES = tuple(f"span_len_hist_{k}" for k in range(129))

@dataclass(frozen=True)
class BartConfig:
    """Parameters of BART denoising (fairseq names; BART-large values).

    Attributes:
        seq_len: length of ``targets`` for a full chunk (``<s>`` and ``</s>`` included).
        mask: share of words masked by the span/word masking pass.
        mask_random: probability that a mask (span or inserted token) is a random token.
        insert: random insertion, as a share of the current length.
        rotate: probability of document rotation.
        permute_sentences: share of sentences permuted.
        replace_length: -1 (mask every token), 0 (delete) or 1 (one mask per span).
        mask_length: ``span-poisson``, ``word`` or ``subword``.
        poisson_lambda: mean span length in words for ``span-poisson``.
        token_mask: share of words whose tokens all become masks (own pass, off by default).
        token_delete: share of words deleted (own pass, off by default).
    """

    seq_len: int = flag(512, "tokens per example")
    mask: float = flag(0.3, "share of words masked by text infilling", name="--bart-mask")
    mask_random: float = flag(0.1, "share of masks that are random tokens", name="--bart-mask-random")
    insert: float = flag(0.0, "random insertion rate", name="--bart-insert")
    rotate: float = flag(0.0, "document rotation probability", name="--bart-rotate")
    permute_sentences: float = flag(1.0, "share of sentences permuted", name="--bart-permute-sentences")
    replace_length: int = flag(1, "-1 keep length, 0 delete, 1 one mask", name="--bart-replace-length")
    mask_length: str = flag("span-poisson", "span-poisson, word or subword", name="--bart-mask-length")
    poisson_lambda: float = flag(3.5, "mean span length", name="--bart-poisson-lambda")
    token_mask: float = flag(0.0, "token masking rate", name="--bart-token-mask")
    token_delete: float = flag(0.0, "token deletion rate", name="--bart-token-delete")

    def __post_init__(self) -> None:
        if not isinstance(self.seq_len, int) or self.seq_len < 3:
            raise ValueError(f"seq_len must be an int >= 3, got {self.seq_len!r}")
        for name in ("mask", "mask_random", "insert", "rotate", "permute_sentences", "token_mask", "token_delete"):
            value = getattr(self, name)
            if not 0.0 <= value <= 1.0:
                raise ValueError(f"{name} must be in [0, 1], got {value!r}")
        if self.replace_length not in (-1, 0, 1):
            raise ValueError(f"replace_length must be -1, 0 or 1, got {self.replace_length!r}")
        if self.mask_length not in MASK_LENGTHS:
            raise ValueError(f"mask_length must be one of {MASK_LENGTHS}, got {self.mask_length!r}")
        if self.mask_length == "subword" and self.replace_length == -1:
            raise ValueError("mask_length='subword' needs replace_length 0 or 1 (as fairseq), got -1")
        if self.mask_length == "span-poisson" and not 0.0 < self.poisson_lambda <= 64.0:
            raise ValueError(f"poisson_lambda must be in (0, 64], got {self.poisson_lambda!r}")

    @property
    def raw_length(self) -> int:
        """Raw chunk length the packer cuts: ``seq_len - 2`` (room for ``<s>`` and ``</s>``)."""
        return self.seq_len - 2

    @property
    def max_inputs_length(self) -> int:
        """Upper bound of ``len(inputs)``: ``seq_len`` plus the random insertions."""
        return self.seq_len + _ceil(self.seq_len * self.insert)

class BartParts(NamedTuple):
    """What taking a stored example apart finds of its noise (``Anatomy.parts``)."""

    mask_tokens: int


class Bart(Objective):
    """The BART objective for the pipeline and the loader (:class:`~transforms.objectives.base.Objective`).

    Both columns are variable-length ``list<int32>``: ``inputs`` because noise changes its
    length, ``targets`` because a final or unpacked (``--packing none``) chunk is shorter
    than ``seq_len`` and targets are never padded (fairseq scores every target token).

    Args:
        config: objective parameters.
    """

    name = "bart"
    family = "seq2seq"
    config_class = BartConfig
    features = frozenset({"space_starts", "sentence_starts"})
    required_specials = frozenset({"bos", "eos", "mask", "pad"})
    decoder_start = "eos"  # fairseq's BART: the decoder starts with </s>
    exact_counters = frozenset({"mask_tokens", "input_tokens", "source_tokens"})
    summarize = staticmethod(summarize_bart)

    # Inspection hooks (transforms/objectives/base.py); the noise is recovered for show in bart_noise.py.

    def take_apart(self, ctx: InspectionContext) -> None:
        """The ``<s> ... </s>`` framing and the ``<mask>`` tokens of the inputs; the chunk is the
        targets inside their framing."""
        a, special = ctx.anatomy, ctx.special
        a.raw_tokens = max(a.targets.size - 2, 0)
        a.parts = BartParts(int((a.inputs == special.mask).sum()))
        for name, ids in (("inputs", a.inputs), ("targets", a.targets)):
            if ids.size < 2 or ids[0] != special.bos or ids[-1] != special.eos:
                a.issues.append(f"{name} are not framed by <s> ... </s>")

    def example_problems(self, ctx: InspectionContext) -> list[str]:
        """Lengths within their budgets and no ``<mask>`` in the targets (the original chunk);
        the noise is not replayed (it needs word and sentence starts the shards do not keep)."""
        config, a, out = self.config, ctx.anatomy, []
        if a.inputs.size > config.max_inputs_length or a.targets.size > config.seq_len:
            out.append(f"lengths {a.inputs.size}/{a.targets.size} exceed {config.max_inputs_length}/{config.seq_len}")
        if (a.targets == ctx.special.mask).any():
            out.append("targets hold a <mask> token (targets are the original chunk)")
        return out

    def shard_counters(self, ctx: InspectionContext) -> dict[str, int]:
        """Mask tokens, and the tokens of the inputs and of the source (targets)."""
        a = ctx.anatomy
        return {"mask_tokens": a.parts.mask_tokens, "input_tokens": int(a.inputs.size),
                "source_tokens": int(a.targets.size)}

    def count_measured(self, ctx: InspectionContext) -> None:
        """Mask tokens, and the tokens of the inputs and targets."""
        a = ctx.anatomy
        ctx.stats.counts.update(mask_tokens=a.parts.mask_tokens, inputs_tokens=a.lengths["inputs"],
                                targets_tokens=a.lengths["targets"])

    def measured_summary(self, ctx: InspectionContext) -> dict[str, Any]:
        """Mask tokens and the inputs/targets length ratio measured on the shards."""
        c = ctx.stats.counts
        return {"bart": {"mask_tokens": c["mask_tokens"], "inputs_tokens": c["inputs_tokens"],
                         "targets_tokens": c["targets_tokens"],
                         "length_ratio": ratio(c["inputs_tokens"], c["targets_tokens"]),
                         "masks_per_example": ratio(c["mask_tokens"], c["examples"])}}

    def measured_lines(self, ctx: InspectionContext) -> list[str]:
        """Length ratio and masks measured, beside the manifest's masked word share and Poisson span."""
        ms = ctx.manifest_summary or {}
        b = ctx.measured["bart"]
        return [f"  inputs/targets length ratio {lines.number(b['length_ratio'])}; <mask> per example "
                f"{lines.number(b['masks_per_example'])}; masked word share (manifest) "
                f"{lines.number(ms.get('masked_word_share'))}"
                f"; mean Poisson span (manifest) {lines.number(ms.get('spans', {}).get('mean_poisson_length'))}"]

    def measured_charts(self, ctx: InspectionContext) -> list[Any]:
        """The span lengths text infilling drew (manifest counters) against its truncated Poisson."""
        drawn = {int(k[len("span_len_hist_"):]): v for k, v in ctx.counters.items() if k.startswith("span_len_hist_")}
        if not drawn:
            return []
        config = self.config
        cdf = poisson_span_cdf(config.poisson_lambda)
        pmf = [cdf[0]] + [cdf[k] - cdf[k - 1] for k in range(1, len(cdf))]
        total = sum(drawn.values())
        lengths = list(range(0, max(max(drawn), min(len(pmf) - 1, 3 * int(config.poisson_lambda) + 6)) + 1))
        return [lines.Chart("span lengths drawn by text infilling (manifest counters); line: Poisson(lambda) "
                            "truncated as fairseq does",
                            f"{ctx.split}: BART span lengths (words), manifest vs Poisson({config.poisson_lambda})",
                            [str(k) for k in lengths], [
                                lines.ChartSeries("drawn (manifest)", [float(drawn.get(k, 0)) for k in lengths]),
                                lines.ChartSeries("expected (configured)",
                                                  [total * (pmf[k] if k < len(pmf) else 0.0) for k in lengths],
                                                  "expected", "line")],
                            x_label="span length (words)", y_label="spans")]

    def example_lines(self, ctx: InspectionContext) -> Shown:
        """Inputs and targets with the sentence order and what each ``<mask>`` hides, recovered."""
        return bart_shown(ctx, self.config)

    def __init__(self, config: BartConfig | None = None) -> None:
        self.config = config or BartConfig()
        self.fixed_raw_length = self.config.raw_length

    def build(self, block: Block, special: SpecialIds) -> Built:
        """Noise every chunk of ``block`` (see the module docstring).

        Counters: ``examples``, ``tokens`` and ``source_tokens`` (both the length of the targets,
        the framed chunks), ``input_tokens``, ``sentences``, ``permuted_sentences`` (sentences
        that moved), ``words`` (maskable words: word starts that are not special tokens),
        ``mask_budget``, ``masked_spans``, ``zero_length_spans``, ``span_len_hist_<k>`` (applied
        span lengths in words, after trimming the last one, zero-length spans as k=0),
        ``masked_words``/``masked_tokens`` (covered by the spans of every masking pass, overlaps
        counted once per pass), ``mask_tokens`` (mask ids in ``inputs``), ``random_tokens``,
        ``inserted``, ``inserts_dropped``, ``deleted`` (tokens removed: targets - inputs +
        inserted), ``rotated``.

        Raises:
            ValueError: a missing special id, a chunk that does not fit, ids out of range.
        """
        config = self.config
        if special.bos is None or special.mask is None:
            raise ValueError(f"bart needs bos and mask ids, got bos={special.bos} mask={special.mask}")
        lengths = block.lengths
        count, randoms = block.count, block.randoms
        if count and (int(lengths.max()) > config.raw_length or int(lengths.min()) < 1):
            raise ValueError(f"bart takes chunks of 1 to {config.raw_length} tokens, got one of "
                             f"{int(lengths.max()) if int(lengths.max()) > config.raw_length else int(lengths.min())}")
        if block.tokens.size and ids_out_of_range(block.tokens, special.vocab_size):
            raise ValueError(f"token ids must be in [0, {special.vocab_size}), got "
                             f"[{block.tokens.min()}, {block.tokens.max()}]")
        counters = dict.fromkeys(_COUNTERS, 0)
        counters["examples"] = count
        targets, offsets = _framed(block.tokens, lengths, special.bos, special.eos, np.int32)

        # Sentence permutation: every row's first token starts a sentence, so the rows' tokens
        # end to end are one sequence of sentences, permuted within rows.
        tokens, space_starts = block.tokens, block.features.get("space_starts")
        if config.mask_length == "subword" or space_starts is None:
            space_starts = np.ones(tokens.shape[0], dtype=bool)
        sentence_flags = block.features.get("sentence_starts")
        sentence_flags = np.zeros(tokens.shape[0], dtype=bool) if sentence_flags is None else sentence_flags.copy()
        sentence_flags[block.offsets[:-1]] = True
        starts = np.flatnonzero(sentence_flags)
        sentences = np.diff(starts.searchsorted(block.offsets))
        counters["sentences"] = int(starts.shape[0])
        ids = targets
        if config.permute_sentences > 0 and int(sentences.max(initial=0)) >= 2:
            ordering = self._sentence_ordering(randoms, sentences)
            counters["permuted_sentences"] = int(np.count_nonzero(ordering != index_range(ordering.shape[0])))
            index = _gather_index(starts, ordering, tokens.shape[0])
            tokens, space_starts = tokens[index], space_starts[index]
            ids, _ = _framed(tokens, lengths, special.bos, special.eos, np.int32)
        else:
            ids = targets.copy()
        word_start, _ = _framed(space_starts, lengths, False, False, bool)
        barrier, _ = _framed(special.special_flags()[tokens], lengths, True, True, bool)
        # the token after an in-chunk special token starts a word (the special one is never masked)
        word_start[1:] |= barrier[:-1]
        word_start[offsets[:-1] + 1] = space_starts[block.offsets[:-1]]  # but not after <s>
        flags = config.token_mask > 0 or config.token_delete > 0
        source = _Source(ids, word_start, barrier, offsets, flags)
        words = source.words()
        counters["words"] = int(words.pool.shape[0])

        if config.mask > 0 and words.pool.size:
            self._mask_pass(source, randoms, words, special, counters)
        for share, replace_length, streams in ((config.token_mask, -1, TOKEN_MASK_STREAMS),
                                               (config.token_delete, 0, TOKEN_DELETE_STREAMS)):
            if share > 0 and counters["words"]:
                now = source.words()
                wanted = np.minimum(now.per_row, _ceil_all(words.per_row * share))
                ones = np.ones(int(wanted.sum()), dtype=np.int64)
                index = _starts_in_pool(randoms, streams[0], now, wanted)
                is_random = self._span_flags(randoms, streams[1], wanted)
                random_values = self._random_values(source, now, randoms, streams[2], index, ones, is_random,
                                                    replace_length, special)
                found = _noise_spans(source, now, index, ones, is_random, replace_length, random_values,
                                     special.mask)
                for name, value in found.items():
                    counters[name] += value
        if config.insert > 0:
            inserted, random = _insert(source, randoms, _ceil_all(source.sizes * config.insert),
                                       (INSERT_STREAM, INSERT_RANDOM_STREAM, INSERT_IDS_STREAM), config.mask_random,
                                       special)
            counters["inserted"] += inserted
            counters["random_tokens"] += random
        if config.rotate > 0:
            counters["rotated"] = self._rotate(source, randoms)

        total = int(offsets[-1])
        counters["tokens"] = counters["source_tokens"] = total
        counters["input_tokens"] = int(source.ids.shape[0])
        counters["mask_tokens"] = int(np.count_nonzero(source.ids == special.mask))
        counters["deleted"] = total - int(source.ids.shape[0]) + counters["inserted"]
        return Built({"inputs": (source.ids, source.offsets), "targets": (targets, offsets)}, {}, {}, counters)

    def _sentence_ordering(self, randoms: Randoms, sentences: np.ndarray) -> np.ndarray:
        return _sentence_ordering(randoms, sentences, self.config.permute_sentences)
    def _span_flags(self, randoms: Randoms, stream: int, counts: np.ndarray) -> np.ndarray:
        """``counts[r]`` flags per row, each True with probability ``mask_random``, rows end to end."""
        most = int(counts.max(initial=0))
        if not most or self.config.mask_random <= 0:
            return np.zeros(int(counts.sum()), dtype=bool)
        flags = randoms.uniforms(stream, most) < self.config.mask_random
        return flags[np.arange(most) < counts[:, None]]

    def _random_values(self, source: _Source, words: _Words, randoms: Randoms, stream: int, index: np.ndarray,
                       lengths: np.ndarray, is_random: np.ndarray, replace_length: int,
                       special: SpecialIds) -> tuple[np.ndarray, np.ndarray]:
        """Each row's random ids for :func:`_noise_spans`, rows end to end, and their offsets:
        replace 1, one per random span; -1, as many as its random spans cover tokens (the
        positions they win are fewer where spans overlap; the first ones are used)."""
        need = np.zeros(source.count, dtype=np.int64)
        if replace_length != 0 and is_random.any():
            starts = words.pool[index[is_random]]
            span_row = source.rows_of(starts)
            if replace_length == 1:
                need = np.bincount(span_row, minlength=source.count)
            else:
                ends, _ = _span_ends(words, index[is_random], lengths[is_random])
                need = np.bincount(span_row, weights=ends - starts, minlength=source.count).astype(np.int64)
        offsets = np.zeros(source.count + 1, dtype=np.int64)
        np.cumsum(need, out=offsets[1:])
        return random_ids(randoms, stream, need, special), offsets

    def _mask_pass(self, source: _Source, randoms: Randoms, words: _Words, special: SpecialIds,
                   counters: dict[str, int]) -> None:
        """Span masking (step 2 of the module docstring), then the zero-length-span insertions."""
        config = self.config
        budgets = _ceil_all(words.per_row * config.mask)
        lengths, length_offsets = span_lengths(randoms, budgets, config)
        histogram = np.bincount(lengths)
        for k, number in enumerate(histogram.tolist()):
            if number:
                counters[_HISTOGRAM_NAMES[k] if k < len(_HISTOGRAM_NAMES) else f"span_len_hist_{k}"] = number
        counters["mask_budget"] = int(lengths.sum())
        span_row = np.repeat(np.arange(source.count), np.diff(length_offsets))
        nonzero = lengths > 0
        zero = np.bincount(span_row[~nonzero], minlength=source.count)
        counters["zero_length_spans"] = int(zero.sum())
        wanted = np.bincount(span_row[nonzero], minlength=source.count)
        counters["masked_spans"] = int(wanted.sum())
        index = _starts_in_pool(randoms, START_STREAM, words, wanted)
        span_lengths_ = lengths[nonzero]
        is_random = self._span_flags(randoms, SPAN_RANDOM_STREAM, wanted)
        random_values = self._random_values(source, words, randoms, SPAN_IDS_STREAM, index, span_lengths_, is_random,
                                            config.replace_length, special)
        found = _noise_spans(source, words, index, span_lengths_, is_random, config.replace_length, random_values,
                             special.mask)
        for name, value in found.items():
            counters[name] += value
        allowed = np.maximum(0, np.minimum(zero, config.seq_len - source.sizes))
        counters["inserts_dropped"] += int((zero - allowed).sum())
        inserted, random = _insert(source, randoms, allowed, (ZERO_INSERT_STREAM, ZERO_RANDOM_STREAM, ZERO_IDS_STREAM),
                                   config.mask_random, special)
        counters["inserted"] += inserted
        counters["random_tokens"] += random

    def _rotate(self, source: _Source, randoms: Randoms) -> int:
        """Rotate the interior of each row with probability ``rotate`` by an offset uniform in
        ``[1, size - 1]`` (fairseq's ``add_rolling_noise``); return the rows rotated."""
        draws = randoms.uniforms(ROTATE_STREAM, 2)
        sizes = source.sizes
        rotated = draws[:, 0] < self.config.rotate
        offset = 1 + np.floor(draws[:, 1] * np.maximum(1, sizes - 1)).astype(np.int64)
        interior = sizes - 2
        row = np.repeat(np.arange(source.count), sizes)
        position = index_range(source.ids.shape[0]) - source.offsets[row]
        inside = (position >= 1) & (position <= interior[row])
        shift = np.where(rotated & (interior > 0), offset - 1, 0)[row]
        local = np.where(inside, 1 + (position - 1 + shift) % np.maximum(interior[row], 1), position)
        source.ids = source.ids[source.offsets[row] + local]
        return int(np.count_nonzero(rotated))

    def schema_kwargs(self) -> dict[str, Any]:
        """Variable-length ``inputs`` and ``targets``."""
        return {"inputs_length": None, "targets_length": None}

    def params(self) -> dict[str, Any]:
        """The configuration, for the manifest."""
        return {"objective": self.name, **asdict(self.config)}
