"""Between Tokenize and Pack: exact duplicates dropped (combiner-lifted), pack groups planned."""

from __future__ import annotations

import apache_beam as beam
from apache_beam.testing.test_pipeline import TestPipeline
from apache_beam.testing.util import assert_that, equal_to

from transforms.group import DropDuplicates, KeepOneCombineFn


def _document(split, bucket, key, tokens=(5, 6)):
    data = bytes(bytearray(b"".join(t.to_bytes(4, "little") for t in tokens)))
    return (split, bucket), (key, data, {})


def test_keep_one_counts_every_copy_whatever_the_merges():
    fn = KeepOneCombineFn()
    first = fn.add_input(fn.add_input(fn.create_accumulator(), "a"), "a")
    second = fn.add_input(fn.create_accumulator(), "a")
    assert fn.extract_output(fn.merge_accumulators([fn.create_accumulator(), first, second])) == ("a", 3)
    assert fn.extract_output(fn.merge_accumulators([fn.create_accumulator()])) == (None, 0)


def test_drop_duplicates_keeps_one_document_per_key_and_counts_the_rest_per_split():
    documents = ([_document("train", 3, b"k1")] * 5 + [_document("train", 7, b"k2")]
                 + [_document("validation", 1, b"k3")] * 2)
    with TestPipeline(runner="FnApiRunner") as pipeline:
        unique = pipeline | beam.Create(documents) | DropDuplicates()
        assert_that(unique.documents, equal_to([_document("train", 3, b"k1"), _document("train", 7, b"k2"),
                                                _document("validation", 1, b"k3")]), label="unique")
        assert_that(unique[DropDuplicates.STATS], equal_to([("train", {"duplicates": 4}),
                                                            ("validation", {"duplicates": 1})]), label="stats")
