"""Pinned digests of whole datasets made from the bundled sample corpus.

The objectives' own outputs are pinned chunk by chunk (tests/transforms/objectives/
test_stream_pins.py); these pins cover everything around them: which documents are packed
together, chunk keys, shard placement and row order, and the file formats. A change that
moves one token of a dataset fails here; a change that means to (a new format version)
re-pins them in the same commit. Each pin is a digest of the sorted ``(path, sha256)`` of
every file but ``manifest.json``.
"""

from __future__ import annotations

import hashlib

import pytest
from lmshards_testing import file_digests, materialize

from schemas.manifest import MANIFEST_VERSION

#: name: (extra flags, pinned digest of the dataset's files)
CASES = {
    "clm": (["--objective", "clm", "--seq-len", "512", "--formats", "arrow,webdataset",
             "--validation-fraction", "0.05"], "a42fb4c012ae24824207448f72a7793b"),
    "bart": (["--objective", "bart", "--seq-len", "256", "--validation-fraction", "0.1", "--num-shards", "3"],
             "283ddf227518378c2440e5aa7cc7142a"),
    "best_fit": (["--objective", "clm", "--seq-len", "256", "--packing", "best_fit",
                  "--validation-fraction", "0.1"], "92888f27eb08ce3b7c837e7d08d032cd"),
}
PINNED_FORMAT_VERSION = 3
#: The same datasets packed in format 1's grouping (``--num-buckets 64``: 64 hash buckets per
#: split instead of token-sized pack groups); their noise and row order are format 2's.
NUM_BUCKETS_64 = {"clm": "8f3f6f71cbb5a7bbff8f9c223c2de052", "bart": "ccb7afa72cfc7ad4888263f9c9887e8b",
                  "best_fit": "ac47803310edc2b5753830786ee85280"}


def dataset_digest(root) -> str:
    listing = "".join(f"{path}\t{digest}\n" for path, digest in sorted(file_digests(root).items()))
    return hashlib.sha256(listing.encode()).hexdigest()[:32]


def test_pins_are_for_this_format_version():
    assert MANIFEST_VERSION == PINNED_FORMAT_VERSION


@pytest.mark.e2e
@pytest.mark.parametrize("name", sorted(CASES))
def test_sample_dataset_matches_pinned_digest(tmp_path, sample_glob, tokenizer_path, name):
    flags, pinned = CASES[name]
    materialize(tmp_path / "out", "--input", sample_glob, "--tokenizer", tokenizer_path, *flags)
    assert dataset_digest(tmp_path / "out") == pinned


@pytest.mark.e2e
@pytest.mark.parametrize("name", sorted(NUM_BUCKETS_64))
def test_num_buckets_64_matches_its_pinned_digest(tmp_path, sample_glob, tokenizer_path, name):
    flags, _ = CASES[name]
    materialize(tmp_path / "out", "--input", sample_glob, "--tokenizer", tokenizer_path, *flags, "--num-buckets", "64")
    assert dataset_digest(tmp_path / "out") == NUM_BUCKETS_64[name]


if __name__ == "__main__":  # print the digests (to pin them on a checkout whose output is the reference)
    # run from the repository root: PYTHONPATH=.:tests python tests/pipelines/test_dataset_pins.py
    import tempfile

    from lmshards_testing import SAMPLE_GLOB, TOKENIZER

    for extra in ([], ["--num-buckets", "64"]):
        for case, (flags, _) in CASES.items():
            out = tempfile.mkdtemp()
            materialize(f"{out}/out", "--input", SAMPLE_GLOB, "--tokenizer", TOKENIZER, "--progress-seconds", "0",
                        *flags, *extra)
            print(f"{' '.join(extra) or 'default':<16}{case:<10}{dataset_digest(f'{out}/out')}", flush=True)
