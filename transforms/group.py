"""Between Tokenize and Pack: exact duplicates dropped, documents assigned to pack groups.

DropDuplicates keys every tokenized document by its content key (a digest of its text,
:func:`transforms.tokenize.document_key`) and keeps one per key with a combiner, so Beam
lifts the combine in front of the shuffle: copies of a document met in one bundle
collapse there, and a boilerplate document repeated a million times crosses the shuffle
about once per bundle instead of a million times, and never reaches Pack's shuffle more
than once. The copies are counted (``duplicates``, per split), as Pack counted them before.
Which copy is kept does not matter: equal keys mean equal texts, so equal tokens.
"""

from __future__ import annotations

import apache_beam as beam

from transforms.handoff import unwrap

__all__ = ["DropDuplicates", "KeepOneCombineFn"]


class KeepOneCombineFn(beam.CombineFn):
    """One of the values of a key, and how many there were: ``(value, count)``."""

    def create_accumulator(self):
        return None, 0

    def add_input(self, accumulator, value):
        kept, count = accumulator
        return (value if kept is None else kept), count + 1

    def merge_accumulators(self, accumulators):
        kept, count = None, 0
        for value, n in accumulators:
            if kept is None:
                kept = value
            count += n
        return kept, count

    def extract_output(self, accumulator):
        return accumulator


def _key_by_document(element):
    return unwrap(element[1])[0], element


def _unique(element):
    _, (document, copies) = element
    if copies > 1:
        yield beam.pvalue.TaggedOutput(DropDuplicates.STATS, (document[0][0], {"duplicates": copies - 1}))
    yield document


class DropDuplicates(beam.PTransform):
    """``((split, bucket), (key, ids, features))`` documents -> the same, one per key.

    Returns a ``DoOutputsTuple``: the unique documents as main output, and under
    :attr:`STATS` one ``(split, {"duplicates": n})`` element per key that had ``n`` more
    copies.
    """

    STATS = "stats"

    def expand(self, documents):
        return (
            documents
            | "KeyByDocument" >> beam.Map(_key_by_document)
            | "KeepOnePerKey" >> beam.CombinePerKey(KeepOneCombineFn())
            | "CountDuplicates" >> beam.FlatMap(_unique).with_outputs(self.STATS, main="documents")
        )
