"""Flex attention (compiled on CPU) keeps packed documents apart, in a child process per layout
(tests/loaders/flex_worker.py): a mask torch's CPU flex compiler cannot take aborts the process
(a double free or SIGSEGV, as a 4-D tensor mask does), which must fail a test, not kill the run.

clm's default batch needs nothing more: transformers builds the per-document BlockMask from the
restarting positions. Prefix-LM and UL2 decoder rows need a bidirectional prefix, which a collator
told the model (``make_dataloader(..., model=model)``, ``LMShardsTrainer``) sends as a BlockMask.
"""

from __future__ import annotations

import os
import pathlib
import subprocess
import sys

import numpy as np
import pytest
import torch

HERE = pathlib.Path(__file__).resolve().parent
ROOT = HERE.parents[1]


@pytest.mark.e2e
@pytest.mark.parametrize("layout", ["clm", "prefix_lm", "ul2_decoder"])
def test_documents_stay_apart_under_flex_attention(layout):
    # the worker imports test_document_isolation, whose conftest imports tests/lmshards_testing.py
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), str(HERE), str(HERE.parent)]), HF_HUB_OFFLINE="1")
    done = subprocess.run([sys.executable, str(HERE / "flex_worker.py"), layout], cwd=HERE, env=env,
                          capture_output=True, text=True, timeout=1500)
    lines = done.stdout.splitlines()
    assert done.returncode == 0, (done.returncode, lines, done.stderr[-3000:])
    assert lines == [f"{layout} eval", f"{layout} train", "ok"]


def test_a_collator_told_a_flex_model_sends_a_block_mask():
    """No compile here: the options a flex model gives (BlockMask, stored width) and the mask's
    pattern, which equals the tensor mask's."""
    from torch.nn.attention.flex_attention import BlockMask

    from loaders.collation.collate import model_mask_options
    from loaders.collation.collate_decoder import PrefixLMCollator

    class Config:
        _attn_implementation = "flex_attention"

    class Model:
        dtype, config = torch.bfloat16, Config()

    options = model_mask_options(Model())
    assert options == {"mask_dtype": torch.bfloat16, "attn_implementation": "flex_attention", "trim_padding": False}
    rows = [{"input_ids": np.arange(10, 22, dtype=np.int32), "doc_lengths": np.array([4, 6], np.int32),
             "prefix_lengths": np.array([2, 3], np.int32)}]
    block = PrefixLMCollator(0, **options)(rows)["attention_mask"]
    dense = PrefixLMCollator(0, trim_padding=False)(rows)["attention_mask"][0, 0] == 0
    assert isinstance(block, BlockMask) and block.shape == (1, 1, 12, 12)
    q, k = torch.meshgrid(torch.arange(12), torch.arange(12), indexing="ij")
    zero = torch.zeros((), dtype=torch.long)
    assert torch.equal(block.mask_mod(zero, zero, q, k), dense)
