"""Human-meaningful summaries of an objective's integer counters (pure: stdlib and numpy only).

The pipeline sums exact integer counters per split (:mod:`transforms.objectives.counters`:
the counters each objective's ``build`` returns for its blocks, plus ``chunk_tokens`` of
BuildExamples). This module turns such a dict into the shares and means a person checks
before spending GPU hours: measured noise density, number and mean length of noise spans
and their histogram, the MLM replacement split, the BART masked share and mean Poisson
span length, the UL2 denoiser mix by examples and by raw tokens. The manifest stores the
result next to the counters (``stats[split]["objective_summary"]``); loaders and
inspection tools can recompute it from the counters alone. Each objective class declares
its summary (``Objective.summarize``: the built-in ones are the functions here, built from
the shared helpers a new objective can use too);
:func:`transforms.objectives.registry.summarizer` finds it by name.

Every ratio is ``round(numerator / denominator, 6)`` of two exact integers, so summaries
are byte-identical whatever the runner; a ratio with a zero denominator is ``None``.
Histograms map zero-padded lengths to counts (``{"01": 988, "02": 727, ..., ">=64": 3}``)
so that the manifest's sorted JSON keys keep them in length order; span corruption and
UL2 put every span of 64 tokens or more in the open bin ``">=64"``, BART's (in words)
are exact and include the zero-length spans. ``params`` (the objective's ``params()`` as
recorded in the manifest), when given, adds the configured ``target`` values beside the
measured ones.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from transforms.objectives.counters import SPAN_LENGTH_HISTOGRAM_CAP

__all__ = [
    "DENOISER_PREFIX",
    "ROUND_DIGITS",
    "SPAN_HISTOGRAM_PREFIX",
    "common_summary",
    "counter_histogram",
    "denoiser_counters",
    "histogram_table",
    "ratio",
    "summarize_bart",
    "summarize_clm",
    "summarize_mlm",
    "summarize_prefix_lm",
    "summarize_span_corruption",
    "summarize_ul2",
]

ROUND_DIGITS = 6
SPAN_HISTOGRAM_PREFIX = "span_len_hist_"
DENOISER_PREFIX = "denoiser/"

Counters = Mapping[str, int]
Params = Mapping[str, Any]


def ratio(numerator: int, denominator: int) -> float | None:
    """``numerator / denominator`` rounded to :data:`ROUND_DIGITS` decimals; None if the denominator is 0."""
    if not denominator:
        return None
    return round(numerator / denominator, ROUND_DIGITS)


def counter_histogram(counters: Counters, prefix: str = SPAN_HISTOGRAM_PREFIX) -> list[list[int]]:
    """``[[k, count], ...]`` of the ``<prefix><k>`` counters, sorted by ``k``."""
    bins = [(int(name[len(prefix) :]), int(count)) for name, count in counters.items() if name.startswith(prefix)]
    return [[k, count] for k, count in sorted(bins)]


def histogram_table(histogram: list[list[int]], open_bin: int | None = None) -> dict[str, int]:
    """``{length: count}`` with zero-padded keys, so JSON's sorted keys keep length order.

    ``open_bin`` names the bin that holds every length >= it (shown as ``">=64"``).
    """
    width = max([2, *(len(str(k)) for k, _ in histogram)])
    return {(f">={k}" if k == open_bin else f"{k:0{width}d}"): count for k, count in histogram}


def denoiser_counters(counters: Counters) -> dict[str, dict[str, int]]:
    """UL2's ``denoiser/<name>/<counter>`` entries regrouped as ``{name: {counter: value}}``."""
    out: dict[str, dict[str, int]] = {}
    for key, value in counters.items():
        if key.startswith(DENOISER_PREFIX):
            name, _, counter = key[len(DENOISER_PREFIX) :].rpartition("/")
            out.setdefault(name, {})[counter] = int(value)
    return dict(sorted(out.items()))


def _get(counters: Counters, name: str) -> int:
    return int(counters.get(name, 0))


def _histogram_mean(histogram: list[list[int]]) -> float | None:
    return ratio(sum(k * n for k, n in histogram), sum(n for _, n in histogram))


def _spans(counters: Counters) -> dict[str, Any]:
    """Noise span count, mean length, spans per example and (when counted) length histogram."""
    spans = _get(counters, "noise_spans")
    out: dict[str, Any] = {
        "count": spans,
        "mean_length": ratio(_get(counters, "noise_tokens"), spans),
        "per_example": ratio(spans, _get(counters, "examples")),
    }
    histogram = counter_histogram(counters)
    if histogram:
        out["histogram"] = histogram_table(histogram, SPAN_LENGTH_HISTOGRAM_CAP)
    return out


def _targets(params: Params | None, **names: str) -> dict[str, Any]:
    """``{label: params[name]}`` for the configured values present in ``params``."""
    if not params:
        return {}
    found = {label: params[name] for label, name in names.items() if name in params}
    return {"target": found} if found else {}


def common_summary(counters: Counters) -> dict[str, Any]:
    """What every objective's summary starts with: examples, chunk tokens and their mean, padding."""
    examples = _get(counters, "examples")
    return {
        "examples": examples,
        "chunk_tokens": _get(counters, "chunk_tokens"),
        "mean_chunk_tokens": ratio(_get(counters, "chunk_tokens"), examples),
        "padding_tokens": _get(counters, "padding_tokens"),
    }


def summarize_clm(counters: Counters, params: Params | None = None) -> dict[str, Any]:
    """Tokens, padding share and documents per example of causal LM examples."""
    tokens, padding = _get(counters, "tokens"), _get(counters, "padding_tokens")
    return {
        **common_summary(counters),
        "padding_share": ratio(padding, tokens + padding),
        "mean_documents_per_example": ratio(_get(counters, "documents_segments"), _get(counters, "examples")),
    }


def summarize_prefix_lm(counters: Counters, params: Params | None = None) -> dict[str, Any]:
    """Mean prefix length and the shares of prefix (bidirectional) and suffix (loss) tokens."""
    tokens = _get(counters, "tokens")
    return {
        **common_summary(counters),
        "mean_prefix_length": ratio(_get(counters, "prefix_tokens"), _get(counters, "examples")),
        "prefix_share": ratio(_get(counters, "prefix_tokens"), tokens),
        "loss_share": ratio(_get(counters, "suffix_tokens"), tokens),
    }


def summarize_mlm(counters: Counters, params: Params | None = None) -> dict[str, Any]:
    """Measured selection density and the mask/random/keep split of the selected tokens."""
    selected = _get(counters, "selected")
    return {
        **common_summary(counters),
        "selected": selected,
        "noise_density": ratio(selected, _get(counters, "maskable_tokens")),
        "selected_share_of_tokens": ratio(selected, _get(counters, "tokens")),
        "mean_selected_per_example": ratio(selected, _get(counters, "examples")),
        "replacement": {
            "mask": ratio(_get(counters, "masked"), selected),
            "random": ratio(_get(counters, "random"), selected),
            "keep": ratio(_get(counters, "kept"), selected),
        },
        **_targets(
            params, noise_density="mlm_probability", mask="mask_ratio", random="random_ratio", keep="keep_ratio"
        ),
    }


def summarize_span_corruption(counters: Counters, params: Params | None = None) -> dict[str, Any]:
    """Measured noise density, noise spans (count, mean length, histogram) and encoded lengths."""
    examples = _get(counters, "examples")
    return {
        **common_summary(counters),
        "raw_tokens": _get(counters, "raw_tokens"),
        "noise_density": ratio(_get(counters, "noise_tokens"), _get(counters, "raw_tokens")),
        "spans": _spans(counters),
        "mean_inputs_length": ratio(_get(counters, "inputs_tokens"), examples),
        "mean_targets_length": ratio(_get(counters, "targets_tokens"), examples),
        "partial_examples": _get(counters, "partial_examples"),
        **_targets(params, noise_density="noise_density", mean_span_length="mean_noise_span_length"),
    }


def summarize_bart(counters: Counters, params: Params | None = None) -> dict[str, Any]:
    """Masked shares, Poisson span lengths (zero-length spans included), noise mix and lengths.

    ``mean_poisson_length`` is the mean over every drawn span, zero-length ones included,
    after the last span of an example is trimmed to the budget (slightly below lambda on
    short chunks); ``histogram`` counts span lengths in words.
    """
    source, masks = _get(counters, "source_tokens"), _get(counters, "mask_tokens")
    random = _get(counters, "random_tokens")
    words, examples = _get(counters, "words"), _get(counters, "examples")
    histogram = counter_histogram(counters)
    return {
        **common_summary(counters),
        "source_tokens": source,
        "input_tokens": _get(counters, "input_tokens"),
        "length_ratio": ratio(_get(counters, "input_tokens"), source),
        "masked_word_share": ratio(_get(counters, "masked_words"), words),
        "masked_token_share": ratio(_get(counters, "masked_tokens"), source),
        "mask_budget_share": ratio(_get(counters, "mask_budget"), words),
        "spans": {
            "count": _get(counters, "masked_spans"),
            "zero_length": _get(counters, "zero_length_spans"),
            "per_example": ratio(_get(counters, "masked_spans") + _get(counters, "zero_length_spans"), examples),
            "mean_poisson_length": _histogram_mean(histogram),
            "mean_nonzero_length": _histogram_mean([pair for pair in histogram if pair[0] > 0]),
            "histogram": histogram_table(histogram),
        },
        "noise_tokens": {
            "mask": masks,
            "random": random,
            "random_share": ratio(random, masks + random),
            "inserted": _get(counters, "inserted"),
            "inserts_dropped": _get(counters, "inserts_dropped"),
            "deleted": _get(counters, "deleted"),
        },
        "sentences": {
            "count": _get(counters, "sentences"),
            "permuted_share": ratio(_get(counters, "permuted_sentences"), _get(counters, "sentences")),
        },
        "rotated_share": ratio(_get(counters, "rotated"), examples),
        **_targets(
            params, masked_word_share="mask", mean_poisson_length="poisson_lambda", random_share="mask_random"
        ),
    }


def _mixture_weights(params: Params | None) -> dict[str, tuple[str, float]]:
    """``{denoiser name: (mode token, normalised weight)}`` from UL2 params, if recorded."""
    mixture = (params or {}).get("mixture")
    if not isinstance(mixture, list) or not mixture:
        return {}
    total = sum(float(d["weight"]) for d in mixture)
    return {d["name"]: (d["mode_token"], round(float(d["weight"]) / total, ROUND_DIGITS)) for d in mixture}


def summarize_ul2(counters: Counters, params: Params | None = None) -> dict[str, Any]:
    """Denoiser mix by examples and by raw tokens, plus each denoiser's own noise statistics.

    The S denoiser's noise is its suffix (one span per example). With ``params``, each
    denoiser also shows its configured ``weight`` and the mix is grouped by mode token.
    """
    examples, raw = _get(counters, "examples"), _get(counters, "raw_tokens")
    per_denoiser = denoiser_counters(counters)
    weights = _mixture_weights(params)
    denoisers: dict[str, Any] = {}
    for name, own in per_denoiser.items():
        own_examples = own.get("examples", 0)
        entry: dict[str, Any] = {
            "examples": own_examples,
            "raw_tokens": own.get("raw_tokens", 0),
            "noise_density": ratio(own.get("noise_tokens", 0), own.get("raw_tokens", 0)),
            "spans": _spans(own),
            "mean_inputs_length": ratio(own.get("inputs_tokens", 0), own_examples),
            "mean_targets_length": ratio(own.get("targets_tokens", 0), own_examples),
        }
        if name in weights:
            entry["mode_token"], entry["weight"] = weights[name]
        denoisers[name] = entry
    summary: dict[str, Any] = {
        **common_summary(counters),
        "raw_tokens": raw,
        "noise_density": ratio(_get(counters, "noise_tokens"), raw),
        "mix": {
            "by_examples": {name: ratio(d["examples"], examples) for name, d in denoisers.items()},
            "by_raw_tokens": {name: ratio(d["raw_tokens"], raw) for name, d in denoisers.items()},
        },
        "denoisers": denoisers,
    }
    if weights:
        modes: dict[str, dict[str, int]] = {}
        for name, d in denoisers.items():
            mode = modes.setdefault(weights.get(name, (name, 0.0))[0], {"examples": 0, "raw_tokens": 0})
            mode["examples"] += d["examples"]
            mode["raw_tokens"] += d["raw_tokens"]
        summary["mix"]["by_mode_token"] = {
            mode: {"examples": ratio(m["examples"], examples), "raw_tokens": ratio(m["raw_tokens"], raw)}
            for mode, m in sorted(modes.items())
        }
        summary["mix"]["weights"] = {name: weight for name, (_, weight) in weights.items()}
    return summary

