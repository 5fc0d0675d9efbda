"""Tests of transforms/objectives/summary.py: manifest summaries of summed counters."""

from __future__ import annotations

import json
import random

from transforms.objectives.registry import OBJECTIVES, summarize_objective
from transforms.objectives.summary import (
    counter_histogram,
    denoiser_counters,
    histogram_table,
    ratio,
)


def test_ratio_rounds_and_refuses_zero_denominators():
    assert ratio(1, 3) == 0.333333 and ratio(2, 3) == 0.666667 and ratio(0, 5) == 0.0
    assert ratio(3, 0) is None


def test_histograms_keep_length_order_under_sorted_json_keys():
    counters = {"span_len_hist_10": 2, "span_len_hist_2": 5, "span_len_hist_64": 1, "examples": 3}
    histogram = counter_histogram(counters)
    assert histogram == [[2, 5], [10, 2], [64, 1]]
    table = histogram_table(histogram, open_bin=64)
    assert table == {"02": 5, "10": 2, ">=64": 1}
    assert list(json.loads(json.dumps(table, sort_keys=True))) == ["02", "10", ">=64"]
    assert list(histogram_table([[0, 1], [5, 2], [120, 1]])) == ["000", "005", "120"]


def test_span_corruption_summary():
    counters = {"examples": 2, "raw_tokens": 280, "noise_tokens": 42, "noise_spans": 14, "inputs_tokens": 256,
                "targets_tokens": 58, "chunk_tokens": 280, "span_len_hist_1": 6, "span_len_hist_3": 8}
    params = {"noise_density": 0.15, "mean_noise_span_length": 3.0}
    summary = summarize_objective("span_corruption", counters, params)
    assert summary["noise_density"] == 0.15 and summary["partial_examples"] == 0
    assert summary["spans"] == {"count": 14, "mean_length": 3.0, "per_example": 7.0, "histogram": {"01": 6, "03": 8}}
    assert summary["mean_inputs_length"] == 128.0 and summary["target"]["mean_span_length"] == 3.0


def test_mlm_summary_replacement_split():
    counters = {"examples": 1, "tokens": 20, "maskable_tokens": 18, "selected": 10, "masked": 8, "random": 1, "kept": 1}
    summary = summarize_objective("mlm", counters, {"mlm_probability": 0.15})
    assert summary["replacement"] == {"mask": 0.8, "random": 0.1, "keep": 0.1}
    assert summary["noise_density"] == 0.555556 and summary["selected_share_of_tokens"] == 0.5
    assert summary["target"] == {"noise_density": 0.15}
    assert summarize_objective("mlm", {"examples": 0})["replacement"] == {"mask": None, "random": None, "keep": None}


def test_bart_poisson_mean_counts_zero_length_spans():
    counters = {"examples": 1, "words": 10, "mask_budget": 3, "masked_words": 3, "masked_tokens": 4,
                "source_tokens": 14, "input_tokens": 12, "masked_spans": 1, "zero_length_spans": 1,
                "span_len_hist_0": 1, "span_len_hist_3": 1, "mask_tokens": 2, "random_tokens": 0}
    summary = summarize_objective("bart", counters)
    assert summary["spans"]["mean_poisson_length"] == 1.5 and summary["spans"]["mean_nonzero_length"] == 3.0
    assert summary["spans"]["histogram"] == {"00": 1, "03": 1}
    assert summary["masked_word_share"] == 0.3 and summary["noise_tokens"]["random_share"] == 0.0


def test_ul2_mix_by_examples_tokens_and_mode_token():
    counters = {"examples": 4, "raw_tokens": 400, "noise_tokens": 100, "noise_spans": 9}
    for name, examples, raw, noise, spans in (("R(mu=3,r=0.15)", 3, 300, 45, 8), ("S", 1, 100, 55, 1)):
        counters.update({f"denoiser/{name}/examples": examples, f"denoiser/{name}/raw_tokens": raw,
                         f"denoiser/{name}/noise_tokens": noise, f"denoiser/{name}/noise_spans": spans})
    counters["denoiser/R(mu=3,r=0.15)/span_len_hist_2"] = 8
    assert set(denoiser_counters(counters)) == {"R(mu=3,r=0.15)", "S"}
    params = {"mixture": [{"name": "R(mu=3,r=0.15)", "mode_token": "[R]", "weight": 3.0},
                          {"name": "S", "mode_token": "[S]", "weight": 1.0}]}
    summary = summarize_objective("ul2", counters, params)
    assert summary["mix"]["by_examples"] == {"R(mu=3,r=0.15)": 0.75, "S": 0.25}
    assert summary["mix"]["by_raw_tokens"] == {"R(mu=3,r=0.15)": 0.75, "S": 0.25}
    assert summary["mix"]["weights"] == {"R(mu=3,r=0.15)": 0.75, "S": 0.25}
    assert summary["mix"]["by_mode_token"]["[S]"] == {"examples": 0.25, "raw_tokens": 0.25}
    r = summary["denoisers"]["R(mu=3,r=0.15)"]
    assert (r["noise_density"], r["spans"]["mean_length"], r["spans"]["histogram"]) == (0.15, 5.625, {"02": 8})
    assert "histogram" not in summary["denoisers"]["S"]["spans"] and "by_mode_token" not in summarize_objective(
        "ul2", counters)["mix"]


def test_summaries_are_json_and_independent_of_counter_order():
    counters = {"examples": 3, "tokens": 384, "padding_tokens": 0, "documents_segments": 5, "chunk_tokens": 384}
    for name in (*OBJECTIVES, "unknown"):  # every registered objective, and one that is not
        shuffled = list(counters.items())
        random.Random(0).shuffle(shuffled)
        first = json.dumps(summarize_objective(name, counters), sort_keys=True)
        assert first == json.dumps(summarize_objective(name, dict(shuffled)), sort_keys=True)
    assert summarize_objective("unknown", counters) == {
        "examples": 3, "chunk_tokens": 384, "mean_chunk_tokens": 128.0, "padding_tokens": 0}
