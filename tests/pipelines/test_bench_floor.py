"""benchmarks/bench_floor.py: the floor pipeline mirrors materialize's graph and moves its tokens.

The benchmark's figures mean something only while the floor holds the same primitive
transforms as :func:`pipelines.materialize.build_pipeline` (so that a stage added there and
not here shows) and sees the same documents and tokens as a real run.
"""

from __future__ import annotations

import glob
import json
import shutil

import pytest
from lmshards_testing import SAMPLE_GLOB, TOKENIZER, materialize

from benchmarks.bench_floor import compare_graphs, run_floor


@pytest.mark.parametrize(("objective", "mode"), [("clm", "in_process"), ("bart", "multi_processing")])
def test_the_floor_graph_holds_materializes_primitive_transforms(objective, mode):
    differences = compare_graphs(SAMPLE_GLOB, TOKENIZER, objective, 128, mode)
    assert len(differences) == 1 and differences[0].startswith("same primitives: "), differences
    assert "'group_by_key': " in differences[0] and "'side input': " in differences[0]


@pytest.mark.e2e
def test_the_floor_sees_materializes_documents_and_tokens(tmp_path):
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    for path in glob.glob(SAMPLE_GLOB):
        shutil.copy(path, corpus)
    (corpus / "nul.jsonl").write_text(json.dumps({"text": "a NUL \x00 byte"}) + "\n"
                                      + json.dumps({"text": "kept text"}) + "\n", encoding="utf-8")
    pattern = str(corpus / "*.jsonl")
    manifest = materialize(tmp_path / "real", "--input", pattern, "--tokenizer", TOKENIZER, "--objective", "clm",
                           "--seq-len", "128", "--validation-fraction", "0.01")
    floor = run_floor({"kind": "bare", "corpus": pattern, "tokenizer": TOKENIZER, "objective": "clm",
                       "seq_len": 128, "mode": "in_process", "output": str(tmp_path / "floor"),
                       "cache_dir": str(tmp_path / "cache")})
    real_tokens = sum(split["document_tokens"] for split in manifest.splits.values())
    assert floor["tokens"] == real_tokens - manifest.counts["documents_written"] > 0
    with open(tmp_path / "floor" / "manifest.json", encoding="utf-8") as handle:
        written = json.load(handle)
    assert written["documents"] == manifest.counts["documents_written"]
    assert written["rejected"] == manifest.counts["rejected"] == 1
