"""Reading: raw corpus files -> text records, bad records -> rejected entries (``ReadCorpus``).

Holds the input listing and its change check (``inputs``), read tasks below the file level
(``splits``), the formats of records (``record_formats``, ``line_reader``), what happens to
imperfect records (``record_policy``), compressed inputs (``archives``), the reading of one
file (``file_records``), the Beam stage (``read``) and the reading of files that flags name
(``flag_files``).

May import: the standard library, Beam (its transforms in ``read`` and ``splits``, its file
systems wherever a file is opened), pyarrow, zstandard, :mod:`schemas` and the loose modules of
:mod:`transforms`; never another stage's subpackage, never torch.
"""
