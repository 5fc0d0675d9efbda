"""Rebuild data/sample/*.jsonl from Debian's python3.11-doc package.

Usage (after ``apt-get install python3.11-doc``): ``python data/make_sample.py``.
Each reStructuredText source of the tutorial, HOWTOs and FAQ is split at its section
headings; each section becomes one JSON line ``{"text": ..., "source": ..., "section": n}``.
"""

import json
import pathlib
import re

SOURCES = pathlib.Path("/usr/share/doc/python3.11/html/_sources")
OUT = pathlib.Path(__file__).resolve().parent / "sample"
HEADING = re.compile(r"^([=\-~^*#\"'+`])\1{2,}\s*$")


def sections(text: str):
    lines = text.splitlines()
    starts = [0]
    for i in range(1, len(lines)):
        if HEADING.match(lines[i]) and lines[i - 1].strip() and not HEADING.match(lines[i - 1]):
            starts.append(i - 1)
    starts.append(len(lines))
    for a, b in zip(starts, starts[1:]):
        chunk = "\n".join(lines[a:b]).strip()
        if len(chunk) >= 80:
            yield chunk


def main():
    OUT.mkdir(exist_ok=True)
    for group in ("tutorial", "howto", "faq"):
        with open(OUT / f"{group}.jsonl", "w", encoding="utf-8") as out:
            for path in sorted((SOURCES / group).glob("*.rst.txt")):
                for n, chunk in enumerate(sections(path.read_text(encoding="utf-8"))):
                    record = {"text": chunk, "source": f"{group}/{path.name[:-8]}", "section": n}
                    out.write(json.dumps(record, ensure_ascii=False) + "\n")


if __name__ == "__main__":
    main()
