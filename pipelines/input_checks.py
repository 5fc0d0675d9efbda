"""Checks of the corpus flags against the inputs, shared by ``materialize`` and ``train-tokenizer``.

Each fails before any work, in one line that says how to proceed (a ``ConfigError``, exit 2):

- ``--text-field`` given, and no input has fields (all are text files): it would be ignored.
- ``--text-mode paragraph`` or ``file`` given, and no input is a text file (JSONL and Parquet
  hold one document per record): it would be ignored.
- A text file whose first lines all parse as JSON objects, with no ``--text-mode`` given: JSONL
  saved as ``.txt``, whose raw JSON lines (keys, quotes, escapes) would be tokenized as text.
  Rename it ``.jsonl``, or pass ``--text-mode line`` to read it as text on purpose.
- No record at the start of the first input has ``--text-field`` (:func:`check_text_field`):
  every document would be rejected, and a job would build nothing (a tokenizer trained on
  nothing).

Only the first text input is sniffed, and only its first :data:`SNIFF_LINES` lines, so the
check costs one small read whatever the corpus.
"""

from __future__ import annotations

import json
from collections.abc import Iterable

from schemas.errors import ConfigError
from transforms.reading.read import file_format, iter_file_records, record_fields

__all__ = ["SNIFF_LINES", "check_text_field", "check_text_flags"]

#: Lines of the first text input read to tell JSONL saved as ``.txt`` from text.
SNIFF_LINES = 8


def _json_object(text: str) -> bool:
    try:
        return isinstance(json.loads(text), dict)
    except ValueError:
        return False


def check_text_flags(files: Iterable[str], *, text_mode: str | None, text_field: str | None) -> None:
    """Refuse corpus flags the inputs would ignore, and JSONL saved as text (see the module docstring).

    Args:
        files: the input files.
        text_mode: ``--text-mode`` as given (None: not given, ``line``).
        text_field: ``--text-field`` as given (None: not given, ``text``).

    Raises:
        ConfigError: one line naming the flag or the file, and what to do.
    """
    files = list(files)
    kinds = {path: file_format(path) for path in files}
    text_files = [path for path in files if kinds[path] == "text"]
    more = " ..." if len(files) > 1 else ""
    if text_field is not None and files and len(text_files) == len(files):  # (else it applies to some)
        raise ConfigError(f"--text-field {text_field}: the inputs are text files ({files[0]}{more}), which have no "
                          "fields; drop --text-field, or rename JSONL files to .jsonl")
    if text_mode not in (None, "line") and files and not text_files:
        raise ConfigError(f"--text-mode {text_mode}: cuts text files (.txt/.md/.rst) into documents, and the inputs "
                          f"are {kinds[files[0]]} ({files[0]}{more}), one document per record; "
                          "drop --text-mode")
    if text_mode is None and text_files:
        path = text_files[0]
        lines = []
        for record in iter_file_records(path, text_mode="line", verify=False):
            if not isinstance(record, dict):
                lines.append(record[2])
            if len(lines) >= SNIFF_LINES:
                break
        if lines and all(_json_object(line) for line in lines):
            raise ConfigError(f"--input {path}: its first {len(lines)} line{'s' if len(lines) > 1 else ''} "
                              f"{'are' if len(lines) > 1 else 'is a'} JSON object{'s' if len(lines) > 1 else ''}: "
                              "JSONL saved as text? Rename it .jsonl (its --text-field is then read), or pass "
                              "--text-mode line to read each line as text")


def check_text_field(text_field: str, path: str, texts: list[str], rejected: list[dict]) -> None:
    """Fail before any work when no record at the start of ``path`` (the first input) has
    ``text_field``, from the records read there (``texts`` with one, ``rejected`` without).

    Raises:
        ConfigError: naming the field, the file and the fields its records have.
    """
    if texts or not rejected or any(r["reason"] != "missing_text_field" for r in rejected):
        return
    fields = record_fields(path)
    seen = f"; fields seen: {', '.join(fields)}" if fields else ""
    raise ConfigError(f"--text-field {text_field}: no record has the field {text_field!r} "
                      f"(the first {len(rejected):,} of {path}){seen}")
