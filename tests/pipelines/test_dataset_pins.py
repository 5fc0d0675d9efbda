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
             "--validation-fraction", "0.05"], "4adf56065c032dd7536316b2546b094d"),
    "bart": (["--objective", "bart", "--seq-len", "256", "--validation-fraction", "0.1", "--num-shards", "3"],
             "75e474d0ca6cee70fe16c8ab7e964032"),
    "best_fit": (["--objective", "clm", "--seq-len", "256", "--packing", "best_fit",
                  "--validation-fraction", "0.1"], "3db53c05afe8aa4dbbb619c0b7f3468e"),
}
PINNED_FORMAT_VERSION = 2
#: The same datasets as format 1 made them (64 hash buckets, before pack groups were sized in
#: tokens): ``--num-buckets 64`` still makes them byte for byte.
FORMAT_1 = {"clm": "e3301702b9580f9508eb89a1433473d6", "bart": "b4923d7eab1cbfb240d55f80e1911a60",
            "best_fit": "9707fbd676a69a834cb1b774ec466bd5"}


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
@pytest.mark.parametrize("name", sorted(FORMAT_1))
def test_num_buckets_64_makes_the_format_1_dataset(tmp_path, sample_glob, tokenizer_path, name):
    flags, _ = CASES[name]
    materialize(tmp_path / "out", "--input", sample_glob, "--tokenizer", tokenizer_path, *flags, "--num-buckets", "64")
    assert dataset_digest(tmp_path / "out") == FORMAT_1[name]


if __name__ == "__main__":  # print the digests (to pin them on a checkout whose output is the reference)
    import tempfile

    from lmshards_testing import SAMPLE_GLOB, TOKENIZER

    for case, (flags, _) in CASES.items():
        out = tempfile.mkdtemp()
        materialize(f"{out}/out", "--input", SAMPLE_GLOB, "--tokenizer", TOKENIZER, "--progress-seconds", "0", *flags)
        print(f"{case:<10}{dataset_digest(f'{out}/out')}", flush=True)
