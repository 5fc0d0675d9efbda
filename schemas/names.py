"""How a name that came from outside (a file name, a path, a field value) is shown to a person.

A file name may hold any character but ``/`` and NUL: an ``ESC ] 0 ; ... BEL`` sequence
retitles a terminal, other escape sequences move its cursor or hide text, a U+202E
RIGHT-TO-LEFT OVERRIDE shows ``evil\u202etxt.exe`` as ``evilexe.txt``, and a line break
splits what must be one line of an error. Every place that shows such a name to a person (the
CLI's summary and error lines, the inspection commands, the HTML report) passes it through
:func:`shown_name`, so none of those characters reaches a terminal or a page raw.

What is escaped: Unicode's control characters (category Cc: C0, DEL, C1), format characters
(Cf: the bidirectional overrides and isolates, zero-width joiners, the BOM), line and paragraph
separators (Zl, Zp), and lone surrogates (Cs: the bytes of a name that is not UTF-8, as
``os.fsdecode`` gives them). Each becomes ``\\xNN``, ``\\uNNNN`` or ``\\UNNNNNNNN``, as
Python's ``repr`` writes it; every other character, letters of every script included, is shown
as it is. A backslash is left as it is (names with one are shown as they are written), so the
escaped form is for reading, not for parsing back.

What is stored (the manifest, rejected records) keeps the name exactly; only its display is
escaped. This module imports only the standard library.
"""

from __future__ import annotations

import unicodedata

__all__ = ["shown_name"]

_ESCAPED_CATEGORIES = frozenset({"Cc", "Cf", "Zl", "Zp", "Cs"})


def _escaped(char: str) -> str:
    code = ord(char)
    if code < 0x100:
        return f"\\x{code:02x}"
    if code < 0x10000:
        return f"\\u{code:04x}"
    return f"\\U{code:08x}"


def shown_name(name: object) -> str:
    """``name`` (``str()`` of it) with every control, format and separator character escaped
    (see the module docstring); a name without one is returned as it is."""
    text = name if isinstance(name, str) else str(name)
    if text.isprintable() and text.isascii():
        return text
    return "".join(_escaped(char) if unicodedata.category(char) in _ESCAPED_CATEGORIES else char for char in text)
