"""T5 span corruption: random noise spans replaced by sentinels (pure numpy).

Reference: google-research/text-to-text-transfer-transformer ``t5/data/preprocessors.py``
(``random_spans_helper``, ``random_spans_noise_mask``, ``noise_span_to_unique_sentinel``,
``nonnoise_span_to_unique_sentinel``) and its port in huggingface/transformers
``run_t5_mlm_flax.py``. Semantics matched exactly:

- :func:`~transforms.objectives.spans.random_spans_helper` is T5's length helper: the largest raw chunk length ``T``
  whose encoded inputs (EOS included) fit ``inputs_length``, Python ``round`` (half to
  even), and the ``noise_density == 0.5`` "minor hack". (3, .15, 512) -> 568 raw, 114 targets.
- The noise mask: ``n_noise = clip(round(L*r), 1, L-1)``, ``n_spans = max(round(n_noise/mu), 1)``,
  noise and non-noise run lengths are uniformly random compositions (every composition
  equally likely, :func:`transforms.objectives.randoms.compositions`), runs alternate
  non-noise first and noise last; ``r == 0`` gives no noise; lengths below 2 are computed as
  2 and cut back, so a 1-token chunk is never noised.
- Layout: ``inputs = c0 <X0> c1 <X1> ... </s>``, ``targets = <X0> n0 <X1> n1 ... </s>``
  where ``<Xk>`` is ``special.sentinels[k]`` (``<extra_id_k>``) in order of appearance.

Deliberate differences:

- Span cap: ``n_spans = min(n_spans, L - n_noise)`` so that every non-noise run is
  non-empty. T5 has no guard (the shape breaks when spans outnumber non-noise tokens);
  HF caps with ``round(min(n_noise, n_nonnoise)/mu)``, which also changes well-formed
  configurations with ``r > 0.5``. Ours is identical to T5 whenever T5 is well formed.
- The raw length actually used (:func:`~transforms.objectives.spans.fit_raw_length`) is the helper's ``T``, shrunk
  only in degenerate tiny configurations where the mask's clip/max guards would make the
  inputs overflow the budget (the helper has no such guards). All realistic settings,
  and every golden value, are unchanged.
- Rounding: T5's mask computes ``round(L * r)`` and ``round(n_noise / mu)`` in float32
  (``tf.cast(..., tf.float32)``); we use float64. The two differ only where the float32
  product lands on a tie that float64 resolves the other way, e.g. ``L = 190`` at
  ``r = .15, mu = 3``: T5 29 noise tokens in 10 spans, ours 28 in 9 (float32 ``0.15`` is
  slightly above 0.15, so ``190 * r`` is 28.500001). Every full chunk of T5's length table
  (568, 1137, 2274, ... for every UL2 denoiser) gives the same counts in both; only a
  split's short final chunk can hit such a length (``test_span_corruption.py`` lists them).
- Documents: T5 joins documents with no separator before cutting chunks
  (``reduce_concat_tokens``); lmshards' concat packing puts EOS after each document, so EOS
  tokens appear inside inputs and targets (about 0.25 per example of ~60-token documents at
  512 inputs). ``--document-separator none`` joins documents the T5 way.
- Randomness is counter-based (docs/design.md section 3): the noise lengths come from stream
  :data:`~transforms.objectives.spans.NOISE_STREAM`, the non-noise lengths from
  :data:`~transforms.objectives.spans.KEEP_STREAM` of the example's row key, so ids differ
  from T5's bit for bit while the distribution is the same.
- A final chunk shorter than ``T`` is noised at its own length (counts from its length,
  as T5 does for the short tail of ``split_tokens``): inputs and targets come out shorter
  than the budgets, never longer, and are padded with the pad id to the schema lengths.

Assumption: chunks hold no sentinel ids (the tokenizer must not turn literal
``<extra_id_k>`` text into them); otherwise inputs/targets cannot be read back unambiguously.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from transforms.objectives import span_views
from transforms.objectives.base import Block, Built, InspectionContext, Objective, in_block_order, padded_rows
from transforms.objectives.common import SpecialIds
from transforms.objectives.flags import flag
from transforms.objectives.shown import Shown
from transforms.objectives.spans import (
    check_chunks,
    corrupt_rows,
    encoded_lengths,
    fit_raw_length,
    noise_counts,
    random_spans_helper,
    span_histogram,
)
from transforms.objectives.summary import summarize_span_corruption

__all__ = ["SpanCorruption", "SpanCorruptionConfig"]

@dataclass(frozen=True)
class SpanCorruptionConfig:
    """Parameters of T5 span corruption.

    Attributes:
        inputs_length: inputs budget, EOS included (the raw chunk length follows from it).
        noise_density: fraction of raw tokens that become noise.
        mean_noise_span_length: mean length of a noise span.
    """

    inputs_length: int = flag(512, "encoder input tokens")
    noise_density: float = flag(0.15, "share of noised tokens")
    mean_noise_span_length: float = flag(3.0, "mean span length")

    def __post_init__(self) -> None:
        if not isinstance(self.inputs_length, int) or isinstance(self.inputs_length, bool) or self.inputs_length < 3:
            raise ValueError(f"inputs_length must be an int >= 3, got {self.inputs_length!r}")
        if not 0.0 < self.noise_density < 1.0:
            raise ValueError(f"noise_density must be in (0, 1), got {self.noise_density!r}")
        if not self.mean_noise_span_length >= 1.0:
            raise ValueError(f"mean_noise_span_length must be >= 1, got {self.mean_noise_span_length!r}")

    @property
    def raw_length(self) -> int:
        """Raw tokens of a full chunk (568 for the T5 defaults)."""
        return fit_raw_length(self.inputs_length, self.noise_density, self.mean_noise_span_length)

    def full_lengths(self) -> tuple[int, int, int]:
        """``(inputs, targets, spans)`` of an example made from a full raw chunk."""
        raw_length = self.raw_length
        inputs, targets = encoded_lengths(raw_length, self.noise_density, self.mean_noise_span_length)
        return inputs, targets, noise_counts(raw_length, self.noise_density, self.mean_noise_span_length)[1]

    @property
    def targets_length(self) -> int:
        """Targets budget: T5's helper value (114 for the defaults), never below a full chunk's targets.

        The two agree except where T5's r = .5 hack leaves a slot unused, e.g.
        (mu=8, r=.5, inputs 2048) budgets 2048 targets for 2047-token full examples.
        """
        helper_targets = random_spans_helper(self.inputs_length, self.noise_density, self.mean_noise_span_length)[1]
        return max(helper_targets, self.full_lengths()[1])

class SpanCorruption(Objective):
    """T5 span corruption as an :class:`~transforms.objectives.base.Objective`.

    The schema's fixed lengths are the budgets ``config.inputs_length`` and
    ``config.targets_length``. Full chunks fill them exactly (all of T5's table, e.g.
    512/114); an example that comes out shorter (a final partial chunk, or the rare
    one-slot gap of T5's r = .5 hack) is padded with ``special.pad`` up to the schema lengths.

    Args:
        config: span corruption parameters (T5 defaults when omitted).
    """

    name = "span_corruption"
    family = "seq2seq"
    config_class = SpanCorruptionConfig
    required_specials: frozenset[str] = frozenset({"eos", "pad"})  # its sentinels: token_needs
    length_parameter = "inputs_length"
    exact_counters = frozenset({"raw_tokens", "noise_tokens", "noise_spans", "inputs_tokens", "targets_tokens",
                                "span_len_hist_*"})
    summarize = staticmethod(summarize_span_corruption)

    # Inspection hooks (transforms/objectives/base.py): T5's sentinel layout (span_views.py).

    def take_apart(self, ctx: InspectionContext) -> None:
        """The noise spans of T5's sentinel layout."""
        ctx.anatomy.parts = span_views.take_apart_noise(ctx.anatomy, ctx.special, "span")

    def example_problems(self, ctx: InspectionContext) -> list[str]:
        """T5's noise and span counts for the restored chunk length, then the replay."""
        config = self.config
        out = span_views.span_problems(ctx.anatomy, config.noise_density, config.mean_noise_span_length,
                                       self.raw_length)
        return out or span_views.replay_problems(self, ctx)

    def shard_counters(self, ctx: InspectionContext) -> dict[str, int]:
        """Noise tokens, spans and span lengths, and inputs and targets tokens."""
        return span_views.noise_counters(ctx.anatomy)

    def count_measured(self, ctx: InspectionContext) -> None:
        """Noise tokens and span lengths."""
        span_views.count_noise(ctx)

    def measured_summary(self, ctx: InspectionContext) -> dict[str, Any]:
        """Measured noise density and span lengths against the expected composition law."""
        config, noise = self.config, span_views.noise_stats(ctx.stats)
        return {"noise": noise.overall.summary(config.noise_density, config.mean_noise_span_length, True)}

    def measured_lines(self, ctx: InspectionContext) -> list[str]:
        """Noise density and span lengths, measured beside configured and the manifest's density."""
        return [span_views.noise_line(ctx.measured["noise"], ctx.manifest_summary)]

    def measured_charts(self, ctx: InspectionContext) -> list[Any]:
        """Noise span lengths against T5's law."""
        noise = ctx.measured["noise"]
        return [span_views.span_length_chart(f"{ctx.split}: noise span lengths", noise["span_lengths"],
                                             noise["expected_span_lengths"])]

    def example_lines(self, ctx: InspectionContext) -> Shown:
        """Inputs, targets and the restored chunk, each span in its sentinel's colour."""
        return span_views.span_shown(ctx)

    def __init__(self, config: SpanCorruptionConfig | None = None) -> None:
        self.config = config if config is not None else SpanCorruptionConfig()
        self.raw_length = self.fixed_raw_length = self.config.raw_length
        self.inputs_length = self.config.inputs_length
        self.targets_length = self.config.targets_length
        self.num_spans = self.config.full_lengths()[2]

    def build(self, block: Block, special: SpecialIds) -> Built:
        """Span-corrupt every chunk of ``block`` (each at most ``raw_length`` tokens).

        Counters: ``examples``, ``raw_tokens``, ``noise_tokens``, ``noise_spans``,
        ``partial_examples`` (chunks shorter than ``raw_length``), ``inputs_tokens``,
        ``targets_tokens`` (unpadded), ``padding_tokens``, ``span_len_hist_<k>``.

        Raises:
            ValueError: too many tokens or too few sentinels.
        """
        lengths = check_chunks(block, special, self.raw_length, "span_corruption")
        config = self.config
        inputs_of, targets_of, noise_of, rows_of = [], [], [], []
        for length, rows in block.by_length():
            inputs, targets, noise = corrupt_rows(block.matrix(rows, length), block.randoms.rows(rows),
                                                  config.noise_density, config.mean_noise_span_length, special)
            inputs_of.append(inputs)
            targets_of.append(targets)
            noise_of.append(noise)
            rows_of.append(rows)
        arrays, padding, totals = {}, 0, {}
        for name, parts, width in (("inputs", inputs_of, self.inputs_length),
                                   ("targets", targets_of, self.targets_length)):
            values, offsets = in_block_order(block.count, [
                (rows, part.reshape(-1), np.full(rows.shape[0], part.shape[1])) for rows, part in zip(rows_of, parts)])
            totals[name] = int(offsets[-1])
            values, offsets, pads = padded_rows(values, offsets, width, special.pad)
            arrays[name] = (values, offsets)
            padding += pads
        noise_tokens = sum(int(noise.sum()) for noise in noise_of)
        counters = {"examples": block.count, "raw_tokens": int(lengths.sum()), "noise_tokens": noise_tokens,
                    "noise_spans": sum(int(noise.size) for noise in noise_of),
                    "partial_examples": int(np.count_nonzero(lengths < self.raw_length)),
                    "inputs_tokens": totals["inputs"], "targets_tokens": totals["targets"], "padding_tokens": padding}
        for noise in noise_of:
            for name, count in span_histogram(noise).items():
                counters[name] = counters.get(name, 0) + count
        return Built(arrays, {}, {}, counters)

    def schema_kwargs(self) -> dict[str, Any]:
        """Fixed-length ``inputs`` and ``targets`` columns."""
        return {"inputs_length": self.inputs_length, "targets_length": self.targets_length}

    def max_sentinels(self) -> int:
        """Noise spans of a full chunk (the most any example uses)."""
        return self.num_spans

    def params(self) -> dict[str, Any]:
        """Configuration and derived lengths for the manifest."""
        return {
            "reference": "t5.data.preprocessors.span_corruption",
            "inputs_length": self.inputs_length,
            "targets_length": self.targets_length,
            "raw_length": self.raw_length,
            "noise_density": self.config.noise_density,
            "mean_noise_span_length": self.config.mean_noise_span_length,
            "noise_spans": self.num_spans,
        }
