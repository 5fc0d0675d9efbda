"""UL2 mixture of denoisers (pure numpy).

Reference: the UL2 paper's appendix ``ul2_objective`` (arXiv 2205.05131; reproduced in
google-research/t5x#939): span denoisers are T5 span corruption
(:mod:`transforms.objectives.span_corruption`) with their own (mu, r), the S denoiser is
T5's ``prefix_lm`` (split ~ U[1, L-1]), a mode token is prepended to the inputs, and
the decoder-only layout concatenates inputs and targets as SeqIO's
``PrefixLMFeatureConverter`` does.

Lengths (``I`` = ``inputs_length``, mode token and EOS included in every budget):

- Span denoiser: raw chunk ``T`` = :func:`~transforms.objectives.spans.fit_raw_length`
  at ``I - 1``; inputs ``[mode] c0 <X0> ... </s>`` are exactly ``I`` for a full chunk
  (e.g. R(3, .15) at 512: 567 raw tokens, 114 targets; X(3, .5): 765 raw, 127 spans).
- S denoiser: raw chunk ``I - 1`` tokens; suffix length ~ U[1, min(T - 1, targets_length - 1)],
  i.e. prefix ~ U[1, T - 1] as T5 when no targets budget is set; inputs
  ``[mode] prefix </s>`` (at most ``I``), targets ``suffix </s>``.
- Decoder layout: ``input_ids = inputs + targets``, ``doc_lengths = [len(inputs) + len(targets)]``
  and ``prefix_lengths = [len(inputs)]``: the row is one segment with one prefix, the layout
  of a packed prefix-LM row (:mod:`transforms.objectives.prefix_lm`), padded with ``special.pad`` to ``seq_len``
  = the longest full example over the mixture (positions past ``sum(doc_lengths)`` are
  padding).

Deliberate differences from the appendix code: the mode token is one added special id
and is budgeted inside ``I`` (the appendix prepends text pieces after sizing, so the
final trim cuts the tail); the denoiser is drawn per chunk from the chunk key's own
number (:func:`transforms.objectives.layout.plan_uniforms`) before the chunk is cut, by
inverting the mixture's cumulative weights (no positional ``ds.shard`` round-robin, no stream
drift at epoch end); the default mixture (R .5, S .25, X .25) is our users' choice, the
``paper`` preset samples the seven denoisers uniformly.

Randomness (counter-based, :mod:`transforms.objectives.randoms`): span denoisers draw as
span corruption does (its noise and keep streams); the S denoiser's suffix length is
``1 + floor(u * min(T - 1, max_suffix))`` for the row's first number of
:data:`SUFFIX_STREAM`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from transforms.objectives import span_views
from transforms.objectives.base import Block, Built, InspectionContext, Objective, TokenNeeds, in_block_order
from transforms.objectives.common import SpecialIds
from transforms.objectives.flags import flag
from transforms.objectives.layout import chunk_key_of, plan_uniforms
from transforms.objectives.lines import Chart, ChartSeries, table_rows
from transforms.objectives.shown import Shown
from transforms.objectives.spans import SPAN_LENGTH_HISTOGRAM_CAP, check_chunks, corrupt_rows, span_histogram
from transforms.objectives.summary import ratio, summarize_ul2
from transforms.objectives.ul2_mixture import PRESETS, Denoiser, DenoiserLengths, denoiser_lengths, parse_mixture

__all__ = [
    "SUFFIX_STREAM",
    "DECODER_LAYOUT",
    "ENCODER_DECODER_LAYOUT",
    "PRESETS",
    "UL2",
    "Denoiser",
    "DenoiserLengths",
    "UL2Config",
    "denoiser_lengths",
    "parse_mixture",
]

ENCODER_DECODER_LAYOUT = "encoder_decoder"
#: The fields of a denoiser as the manifest records them (``params()["mixture"]``).
_DENOISER_FIELDS = ("name", "mode_token", "kind", "mean_noise_span_length", "noise_density", "weight")
DECODER_LAYOUT = "decoder"
_LAYOUTS = (ENCODER_DECODER_LAYOUT, DECODER_LAYOUT)

SUFFIX_STREAM = 3  # after span corruption's noise and keep streams

@dataclass(frozen=True)
class UL2Config:
    """Parameters of the UL2 objective.

    Attributes:
        inputs_length: inputs budget, mode token and EOS included.
        targets_length: targets budget; None lets each denoiser use its natural length
            (the S suffix then spans up to the whole chunk). When set, every span
            denoiser must fit it and the S suffix is capped to it.
        mixture: preset name (``"default"``, ``"paper"``) or a list of :class:`Denoiser`
            or dicts; stored as a tuple of :class:`Denoiser`.
        layout: ``"encoder_decoder"`` (``inputs``/``targets``) or ``"decoder"``
            (``input_ids`` + ``prefix_length``).
    """

    inputs_length: int = flag(512, "encoder input tokens")
    targets_length: int | None = flag(None, "ul2 targets budget", shown_default="default: what the mixture needs")
    mixture: Any = flag("default", "denoiser mixture: default or paper", name="--ul2-preset", kind=str,
                        shown_default="custom: --config")
    layout: str = flag(ENCODER_DECODER_LAYOUT, "encoder_decoder or decoder", shown_default=None)

    def __post_init__(self) -> None:
        if not isinstance(self.inputs_length, int) or isinstance(self.inputs_length, bool) or self.inputs_length < 4:
            raise ValueError(f"inputs_length must be an int >= 4, got {self.inputs_length!r}")
        if self.targets_length is not None and (
            not isinstance(self.targets_length, int) or isinstance(self.targets_length, bool) or self.targets_length < 2
        ):
            raise ValueError(f"targets_length must be None or an int >= 2, got {self.targets_length!r}")
        if self.layout not in _LAYOUTS:
            raise ValueError(f"layout must be one of {_LAYOUTS}, got {self.layout!r}")
        object.__setattr__(self, "mixture", parse_mixture(self.mixture))
        if self.targets_length is not None:
            for denoiser in self.mixture:
                needed = denoiser_lengths(denoiser, self.inputs_length, None).max_targets
                if denoiser.kind == "span" and needed > self.targets_length:
                    raise ValueError(
                        f"targets_length {self.targets_length} is too small for denoiser {denoiser.name!r}, "
                        f"which needs {needed} at inputs_length {self.inputs_length}"
                    )


def _mode_id(denoiser: Denoiser, special: SpecialIds) -> int:
    if denoiser.mode_token not in special.mode_tokens:
        raise ValueError(
            f"UL2 denoiser {denoiser.name!r} needs mode token {denoiser.mode_token!r} in the tokenizer; "
            f"known mode tokens: {sorted(special.mode_tokens)}"
        )
    return special.mode_tokens[denoiser.mode_token]


def _prefix_rows(tokens: np.ndarray, suffix: np.ndarray, mode: int, eos: int) -> tuple[np.ndarray, np.ndarray]:
    """S-denoiser rows of one length: ``[mode] prefix </s> suffix </s>``, ``(rows, L + 3)``, and
    the inputs' lengths (``[mode] prefix </s>``)."""
    rows, length = tokens.shape
    split = length - suffix
    positions = np.arange(length + 3)
    # each row becomes [mode] tokens[:split] </s> tokens[split:] </s>: length + 3 slots
    source = np.where(positions <= split[:, None], positions - 1, positions - 2)
    np.clip(source, 0, length - 1, out=source)
    row = tokens[np.arange(rows)[:, None], source]
    row[:, 0] = mode
    row[np.arange(rows), split + 1] = eos
    row[:, -1] = eos
    return row, split + 2


class UL2(Objective):
    """UL2 as an :class:`~transforms.objectives.base.Objective`.

    :meth:`plan` draws each chunk's denoiser index (its plan) from the mixture weights and asks
    for that denoiser's raw length; :meth:`build` applies it and records its name in the
    ``denoiser`` column.

    Args:
        config: objective parameters (defaults: 512 inputs, default mixture, encoder-decoder).
    """

    name = "ul2"
    config_class = UL2Config
    required_specials: frozenset[str] = frozenset({"eos", "pad"})  # its sentinels and mode tokens: token_needs
    length_parameter = "inputs_length"
    exact_counters = frozenset({"raw_tokens", "noise_tokens", "noise_spans", "inputs_tokens", "targets_tokens",
                                "span_len_hist_*"})
    group_label = "UL2 denoiser"
    summarize = staticmethod(summarize_ul2)

    def __init__(self, config: UL2Config | None = None) -> None:
        self.config = config if config is not None else UL2Config()
        self.denoisers: tuple[Denoiser, ...] = self.config.mixture
        self.lengths = tuple(
            denoiser_lengths(d, self.config.inputs_length, self.config.targets_length) for d in self.denoisers
        )
        self.family = "decoder" if self.config.layout == DECODER_LAYOUT else "seq2seq"
        self.seq_len = max(lengths.max_total for lengths in self.lengths)
        self.targets_length = max(lengths.max_targets for lengths in self.lengths)
        weights = np.array([d.weight for d in self.denoisers], dtype=np.float64)
        self._weights = weights / weights.sum()
        self._cumulative = np.cumsum(self._weights)
        self._raw_lengths = np.array([lengths.raw_length for lengths in self.lengths], dtype=np.int64)
        # One denoiser: every chunk has its length and plan 0; otherwise each chunk is planned.
        self.fixed_raw_length = int(self._raw_lengths[0]) if len(self.denoisers) == 1 else None
        self._counter_names = tuple(
            {key: f"denoiser/{d.name}/{key}" for key in ("examples", "raw_tokens", "noise_tokens", "noise_spans",
                                                          "inputs_tokens", "targets_tokens")}
            for d in self.denoisers)
        self._histogram_names = tuple(
            tuple(f"denoiser/{d.name}/span_len_hist_{k}" for k in range(SPAN_LENGTH_HISTOGRAM_CAP + 1))
            for d in self.denoisers
        )

    @property
    def token_legend(self) -> tuple[str, str]:  # type: ignore[override]
        """This mixture's mode tokens (the paper preset's are ``[NLU] [NLG] [S2S]``)."""
        return " ".join(self.mode_tokens), "the UL2 mode token"

    @property
    def mode_tokens(self) -> tuple[str, ...]:
        """Distinct mode tokens of the mixture, to add to the tokenizer as special tokens."""
        return tuple(dict.fromkeys(d.mode_token for d in self.denoisers))

    def token_needs(self) -> TokenNeeds:
        """The mixture's sentinels and its distinct mode tokens."""
        return TokenNeeds(self.max_sentinels(), self.mode_tokens)

    @classmethod
    def preset_token_needs(cls) -> TokenNeeds:
        """Every preset mixture's needs at the default lengths: the most sentinels, and the mode
        tokens preset by preset, each preset's in the paper's order of paradigms (R, S, X, the
        first letter of its denoisers' names), which gives trained tokenizers the ids they have
        always had: ``[R] [S] [X] [NLU] [S2S] [NLG]``."""
        sentinels, tokens = 0, []
        for preset in PRESETS:
            objective = cls(UL2Config(mixture=preset))
            sentinels = max(sentinels, objective.max_sentinels())
            tokens += [d.mode_token for d in sorted(objective.denoisers, key=lambda d: d.name[:1])]
        return TokenNeeds(sentinels, tuple(dict.fromkeys(tokens)))

    def plan(self, uniforms: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Each chunk's denoiser (the first whose cumulative weight exceeds its number) and raw length."""
        plans = np.minimum(np.searchsorted(self._cumulative, uniforms, side="right"), len(self.denoisers) - 1)
        return self._raw_lengths[plans], plans.astype(np.int64)

    @property
    def raw_lengths(self) -> tuple[int, ...]:
        return tuple(self._raw_lengths.tolist())

    @property
    def mean_raw_length(self) -> float:
        return float(np.dot(self._weights, self._raw_lengths))

    def build(self, block: Block, special: SpecialIds) -> Built:
        """Apply each chunk's denoiser in the configured layout.

        Counters, overall and per denoiser (``denoiser/<name>/<counter>``): examples, raw_tokens,
        noise_tokens (span noise, or the S suffix), noise_spans, inputs_tokens, targets_tokens;
        per span denoiser ``denoiser/<name>/span_len_hist_<k>``; the decoder layout adds
        ``padding_tokens``.

        Raises:
            ValueError: an unknown plan, too many tokens, a missing mode token or sentinels.
        """
        plans = block.plans
        if plans.size and (int(plans.min()) < 0 or int(plans.max()) >= len(self.denoisers)):
            bad = int(plans.min()) if int(plans.min()) < 0 else int(plans.max())
            raise ValueError(f"UL2 plan must be a denoiser index in [0, {len(self.denoisers)}), got {bad}")
        check_chunks(block, special, int(self._raw_lengths.max()), "ul2", least=1)
        counters: dict[str, int] = {}
        parts = []  # (rows, inputs and targets of each row joined: 2-D, inputs lengths, (inputs, targets) or None)
        for plan in np.unique(plans).tolist():
            denoiser, lengths = self.denoisers[plan], self.lengths[plan]
            mode = _mode_id(denoiser, special)
            names = self._counter_names[plan]
            own = dict.fromkeys(names.values(), 0)
            for length, rows in block.by_length(np.flatnonzero(plans == plan)):
                if length > lengths.raw_length:
                    raise ValueError(f"denoiser {denoiser.name!r} takes chunks of 1 to {lengths.raw_length} tokens, "
                                     f"got one of {length}")
                chunk, count = block.matrix(rows, length), rows.shape[0]
                if denoiser.kind == "span":
                    inputs, targets, noise = corrupt_rows(chunk, block.randoms.rows(rows), denoiser.noise_density,
                                                          denoiser.mean_noise_span_length, special, lead=1)
                    inputs[:, 0] = mode
                    split = (inputs, targets)
                    joined = np.concatenate(split, axis=1) if self.config.layout == DECODER_LAYOUT else None
                    inputs_lengths = np.full(count, inputs.shape[1])
                    noise_tokens, spans = int(noise.sum()), int(noise.size)
                    for name, number in span_histogram(noise, self._histogram_names[plan]).items():
                        counters[name] = counters.get(name, 0) + number
                else:  # [mode] prefix </s> | suffix </s>
                    suffix = np.zeros(count, dtype=np.int64)
                    if length >= 2:
                        longest = min(length - 1, lengths.max_suffix)
                        suffix = block.randoms.rows(rows).integers(SUFFIX_STREAM, 1, longest).reshape(-1) + 1
                    joined, inputs_lengths = _prefix_rows(chunk, suffix, mode, special.eos)
                    split = None
                    noise_tokens, spans = int(suffix.sum()), int(np.count_nonzero(suffix))
                parts.append((rows, joined, inputs_lengths, split))
                own[names["examples"]] += count
                own[names["raw_tokens"]] += count * length
                own[names["noise_tokens"]] += noise_tokens
                own[names["noise_spans"]] += spans
                inputs_tokens = int(inputs_lengths.sum())
                own[names["inputs_tokens"]] += inputs_tokens
                own[names["targets_tokens"]] += split[1].size if split is not None else joined.size - inputs_tokens
            for key, name in names.items():
                counters[key] = counters.get(key, 0) + own[name]
            counters.update(own)
        strings = {"denoiser": [self.denoisers[plan].name for plan in plans.tolist()]}
        if self.config.layout == ENCODER_DECODER_LAYOUT:
            inputs, targets = [], []
            for rows, joined, inputs_lengths, split in parts:
                if split is not None:  # span denoisers: the two 2-D parts as they are
                    inputs.append((rows, split[0].reshape(-1), inputs_lengths))
                    targets.append((rows, split[1].reshape(-1), np.full(rows.shape[0], split[1].shape[1])))
                    continue
                is_input = (np.arange(joined.shape[1]) < inputs_lengths[:, None]).reshape(-1)
                flat = joined.reshape(-1)
                inputs.append((rows, flat[is_input], inputs_lengths))
                targets.append((rows, flat[~is_input], joined.shape[1] - inputs_lengths))
            arrays = {"inputs": in_block_order(block.count, inputs), "targets": in_block_order(block.count, targets)}
            return Built(arrays, {}, strings, counters)
        # decoder layout: each part's joined rows go straight into the padded rows
        rows_out = np.full((block.count, self.seq_len), special.pad, dtype=np.int32)
        prefix = np.zeros(block.count, dtype=np.int32)
        totals = np.zeros(block.count, dtype=np.int32)
        for rows, joined, inputs_lengths, _ in parts:
            rows_out[rows, : joined.shape[1]] = joined
            prefix[rows] = inputs_lengths
            totals[rows] = joined.shape[1]
        counters["padding_tokens"] = block.count * self.seq_len - int(totals.sum())
        one_each = np.arange(block.count + 1, dtype=np.int64)
        arrays = {"input_ids": (rows_out.reshape(-1), one_each * self.seq_len),
                  "doc_lengths": (totals, one_each), "prefix_lengths": (prefix, one_each)}
        return Built(arrays, {}, strings, counters)

    @classmethod
    def config_from_params(cls, params: Mapping[str, Any]) -> dict[str, Any]:
        """The config of a manifest's ``params()``: the recorded mixture (its denoisers' fields),
        ``targets_budget`` as ``targets_length``, the layout."""
        return {
            "inputs_length": params["inputs_length"],
            "targets_length": params.get("targets_budget"),
            "layout": params.get("layout", ENCODER_DECODER_LAYOUT),
            "mixture": [
                {k: d[k] for k in _DENOISER_FIELDS if d.get(k) is not None} for d in params.get("mixture", [])
            ] or "default",
        }

    # Inspection hooks (transforms/objectives/base.py): examples are taken apart by their denoiser's
    # layout (T5 spans, or the S prefix and suffix, span_views.py), after the mode token that leads the inputs.

    @property
    def seq2seq_in_decoder_rows(self) -> bool:
        return self.config.layout == DECODER_LAYOUT

    @property
    def example_groups(self) -> tuple[str, ...]:
        return tuple(d.name for d in self.denoisers)

    def example_group(self, ctx: InspectionContext) -> str | None:
        return str(ctx.example.get("denoiser", ""))

    def take_apart(self, ctx: InspectionContext) -> None:
        """The recorded denoiser and the mode token it starts the inputs with, then its layout's parts."""
        a, special = ctx.anatomy, ctx.special
        name = str(ctx.example.get("denoiser", ""))
        names = [d.name for d in self.denoisers]
        if name in names:
            denoiser = self.denoisers[names.index(name)]
            kind, mode = denoiser.kind, denoiser.mode_token
        else:
            a.issues.append(f"unknown denoiser {name!r}; the mixture has {sorted(names)}")
            kind, mode = "span", None
        modes = {int(i): t for t, i in special.mode_tokens.items()}
        first = modes.get(int(a.inputs[0])) if a.inputs.size else None
        if first != mode:
            a.issues.append(f"inputs start with {first or 'no mode token'}, denoiser {name} uses {mode}")
        a.parts = span_views.take_apart_noise(a, special, kind, lead=1, denoiser=name)

    def example_problems(self, ctx: InspectionContext) -> list[str]:
        """The recorded denoiser must be the one the packer planned from the chunk key; then a
        span denoiser's T5 noise and span counts, and the replay."""
        a = ctx.anatomy
        planned = int(self.plan(plan_uniforms(ctx.seed, [chunk_key_of(a.key)]))[1][0])
        denoiser, lengths = self.denoisers[planned], self.lengths[planned]
        if denoiser.name != a.parts.denoiser:
            return [f"denoiser {a.parts.denoiser} recorded, the packer planned {denoiser.name} for this chunk"]
        out = []
        if a.parts.kind == "span":
            out += span_views.span_problems(a, denoiser.noise_density, denoiser.mean_noise_span_length,
                                            lengths.raw_length)
        return out or span_views.replay_problems(self, ctx, planned)

    def shard_counters(self, ctx: InspectionContext) -> dict[str, int]:
        """Noise tokens, spans and span lengths, and inputs and targets tokens (per denoiser too)."""
        return span_views.noise_counters(ctx.anatomy)

    def count_measured(self, ctx: InspectionContext) -> None:
        """Noise tokens and span lengths, overall and per denoiser."""
        span_views.count_noise(ctx)

    def measured_summary(self, ctx: InspectionContext) -> dict[str, Any]:
        """Overall noise, and per denoiser its noise against its configuration, weight and shares."""
        c, noise = ctx.stats.counts, span_views.noise_stats(ctx.stats)
        out: dict[str, Any] = {"noise": noise.overall.summary(None, None, False), "denoisers": {}}
        weights = {d.name: d.weight for d in self.denoisers}
        total_weight = sum(weights.values())
        for d in self.denoisers:
            own = noise.of(d.name)
            entry = own.summary(d.noise_density, d.mean_noise_span_length, d.kind == "span")
            entry.update(kind=d.kind, mode_token=d.mode_token, weight=round(weights[d.name] / total_weight, 6),
                         examples_share=ratio(own.counts["examples"], c["examples"]),
                         tokens_share=ratio(own.counts["raw_tokens"], c["raw_tokens"]))
            out["denoisers"][d.name] = entry
        return out

    def measured_lines(self, ctx: InspectionContext) -> list[str]:
        """Overall noise, then one row per denoiser: weight, shares, density and span length
        measured beside configured."""
        m = ctx.measured
        rows = [[name, d["weight"], d["examples_share"], d["tokens_share"], d["density"], d["configured_density"],
                 d["mean_span_length"], d["configured_mean_span_length"]] for name, d in m["denoisers"].items()]
        return [span_views.noise_line(m["noise"], ctx.manifest_summary),
                *table_rows(["denoiser", "weight", "examples", "tokens", "density", "(cfg)", "mean span", "(cfg)"],
                            rows)]

    def measured_charts(self, ctx: InspectionContext) -> list[Any]:
        """The denoiser mix against the weights, and each span denoiser's span lengths against T5's law."""
        m, split = ctx.measured, ctx.split
        names = list(m["denoisers"])
        out: list[Any] = [Chart("share of examples and of raw tokens per denoiser; dots: the configured weights",
                                f"{split}: UL2 denoiser mix", names, [
                                    ChartSeries("examples share", [m["denoisers"][n]["examples_share"] for n in names],
                                                "measured"),
                                    ChartSeries("tokens share", [m["denoisers"][n]["tokens_share"] for n in names],
                                                "other"),
                                    ChartSeries("configured weight", [m["denoisers"][n]["weight"] for n in names],
                                                "expected", "points"),
                                ], x_label="denoiser", y_label="share", width=1000)]
        for name, d in m["denoisers"].items():
            if d["kind"] == "span" and d["spans"]:
                out.append(span_views.span_length_chart(f"{split}: span lengths of {name}", d["span_lengths"],
                                                        d["expected_span_lengths"]))
        return out

    def example_lines(self, ctx: InspectionContext) -> Shown:
        """The mode token, then a span denoiser's spans and restored chunk, or S's prefix and suffix."""
        return span_views.span_shown(ctx)

    def schema_kwargs(self) -> dict[str, Any]:
        """Variable-length seq2seq columns, or fixed ``seq_len`` decoder rows; plus ``denoiser``."""
        if self.config.layout == DECODER_LAYOUT:
            return {"seq_len": self.seq_len, "prefix_lengths": True, "denoiser": True}
        return {"inputs_length": None, "targets_length": None, "denoiser": True}

    def max_sentinels(self) -> int:
        """Most sentinels any denoiser uses (127 for the default mixture at 512 inputs)."""
        return max(lengths.max_spans for lengths in self.lengths)

    def params(self) -> dict[str, Any]:
        """Configuration and derived lengths for the manifest."""
        params: dict[str, Any] = {
            "reference": "UL2 appendix ul2_objective (arXiv 2205.05131) over t5 span_corruption/prefix_lm",
            "layout": self.config.layout,
            "inputs_length": self.config.inputs_length,
            "targets_length": self.targets_length,
            "targets_budget": self.config.targets_length,
            "mixture": [
                {**d.to_dict(), **asdict(lengths)} for d, lengths in zip(self.denoisers, self.lengths, strict=True)
            ],
        }
        if self.config.layout == DECODER_LAYOUT:
            params["seq_len"] = self.seq_len
        return params
