"""The HF ``datasets`` idiom users run today, as the baseline of the benchmarks.

``load_dataset("json")`` -> ``map(tokenize, batched=True, num_proc=N)`` ->
``map(group_texts, batched=True, num_proc=N)`` -> ``save_to_disk``, as in HF's
``run_clm.py`` (EOS appended to each document, blocks of ``block_size``, the remainder of
each map batch dropped). The tokenizer is the same tokenizer.json through the Rust
``tokenizers`` library (what ``PreTrainedTokenizerFast`` wraps). A fresh cache directory
per run keeps HF from reusing earlier work.
"""

from __future__ import annotations

import glob
import os
import tempfile
import time

__all__ = ["run_hf_idiom"]


def run_hf_idiom(pattern: str, tokenizer_path: str, block_size: int, num_proc: int = 2) -> tuple[float, int]:
    """Return (wall seconds, tokens tokenized) of the idiom on the files of ``pattern``."""
    import datasets
    from tokenizers import Tokenizer

    files = sorted(glob.glob(pattern))
    eos = Tokenizer.from_file(tokenizer_path).token_to_id("</s>")

    def tokenize(batch):
        tokenizer = Tokenizer.from_file(tokenizer_path)
        tokenizer.encode_special_tokens = True
        encodings = tokenizer.encode_batch_fast(batch["text"], add_special_tokens=False)
        return {"input_ids": [e.ids + [eos] for e in encodings]}

    def group_texts(batch):
        concatenated = [token for ids in batch["input_ids"] for token in ids]
        total = (len(concatenated) // block_size) * block_size
        return {"input_ids": [concatenated[i : i + block_size] for i in range(0, total, block_size)]}

    with tempfile.TemporaryDirectory(prefix="lmshards-hf-") as cache:
        start = time.perf_counter()
        raw = datasets.load_dataset("json", data_files=files, split="train", cache_dir=os.path.join(cache, "c"))
        tokenized = raw.map(tokenize, batched=True, num_proc=num_proc, remove_columns=raw.column_names)
        tokens = sum(len(ids) - 1 for ids in tokenized["input_ids"])
        grouped = tokenized.map(group_texts, batched=True, num_proc=num_proc)
        grouped.save_to_disk(os.path.join(cache, "out"))
        wall = time.perf_counter() - start
    return wall, tokens
