"""A real English corpus of any size from what every Python install has on disk.

Documents are the docstrings of the Python modules under the standard library and, when
more text is wanted, under site-packages: one document per module, its docstrings joined
by blank lines, in sorted path order (so the same machine always gives the same corpus).
Written as JSONL.gz files of ``{"text": ..., "source": ...}``.

    python -m benchmarks.corpus --output /tmp/corpus --megabytes 60
"""

from __future__ import annotations

import argparse
import ast
import gzip
import json
import os
import sys
import sysconfig
from collections.abc import Iterator

__all__ = ["iter_documents", "write_corpus"]


def _roots() -> list[str]:
    paths = sysconfig.get_paths()
    roots = [paths["stdlib"], paths["purelib"]]
    roots += [p for p in sys.path if p.endswith("site-packages") and p not in roots]
    return list(dict.fromkeys(r for r in roots if os.path.isdir(r)))


def iter_documents(min_chars: int = 200) -> Iterator[tuple[str, str]]:
    """``(source, text)`` for every module with at least ``min_chars`` of docstrings."""
    for root in _roots():
        files = []
        for dirpath, dirnames, names in os.walk(root):
            dirnames[:] = sorted(d for d in dirnames if d not in ("__pycache__", "test", "tests"))
            files.extend(os.path.join(dirpath, n) for n in names if n.endswith(".py"))
        for path in sorted(files):
            try:
                with open(path, encoding="utf-8") as handle:
                    tree = ast.parse(handle.read())
            except (SyntaxError, UnicodeDecodeError, ValueError, OSError, RecursionError):
                continue
            parts = []
            for node in ast.walk(tree):
                if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
                    doc = ast.get_docstring(node)
                    if doc:
                        parts.append(doc)
            text = "\n\n".join(parts)
            if len(text) >= min_chars:
                yield os.path.relpath(path, root), text


def write_corpus(output: str, megabytes: float, files: int = 8) -> list[str]:
    """Write about ``megabytes`` of documents round-robin into ``files`` JSONL.gz files.

    When the installed modules hold less text than asked for, the documents are used
    again with a ``(pass N)`` line appended, so they are distinct documents (not exact
    duplicates) of the same language and length distribution.
    """
    os.makedirs(output, exist_ok=True)
    paths = [os.path.join(output, f"docstrings-{i:02d}.jsonl.gz") for i in range(files)]
    handles = [gzip.open(p, "wt", encoding="utf-8", compresslevel=1) for p in paths]
    budget = int(megabytes * 2**20)
    written = n = 0
    documents: list[tuple[str, str]] = []
    seen = set()
    try:
        for source, text in iter_documents():
            if text not in seen:
                seen.add(text)
                documents.append((source, text))
        for repeat in range(1_000_000):
            for source, text in documents:
                if repeat:
                    text = f"{text}\n\n(pass {repeat})"
                handles[n % files].write(json.dumps({"text": text, "source": source}, ensure_ascii=False) + "\n")
                n += 1
                written += len(text.encode("utf-8"))
                if written >= budget:
                    return paths
    finally:
        for handle in handles:
            handle.close()
    return paths


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--output", required=True)
    parser.add_argument("--megabytes", type=float, default=50)
    parser.add_argument("--files", type=int, default=8)
    args = parser.parse_args()
    write_corpus(args.output, args.megabytes, args.files)


if __name__ == "__main__":
    main()
