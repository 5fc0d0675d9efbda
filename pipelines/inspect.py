"""``lmshards inspect | show | validate | report``: look at a dataset before training on it.

- ``inspect OUT [--json] [--limit N]``: the summary table (manifest numbers, and
  distributions measured on all examples or a uniform sample of N per split).
- ``show OUT [-n N] [--key K ...] [--split S] [--ids]``: decoded examples with the
  corruption made visible; colour on a terminal, plain when piped or when ``NO_COLOR`` is
  set. Reads the first shard(s) only, or for ``--key`` the one shard the key hashes to.
- ``validate OUT [--sample N] [--json]``: checksums, schemas, objective invariants; exits 1
  with a per-problem report when anything fails.
- ``report OUT -o report.html``: a self-contained HTML page with plots and examples.

Exit codes: 0 success; 1 validation failed, a key not found, or a damaged or incomplete
dataset (a manifest, shard or tokenizer that cannot be used: one line naming the file and
the problem, never a traceback); 2 bad usage (flags, or a path where nothing exists).
The logic lives in :mod:`loaders.inspection` (no Beam, no torch).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Callable

__all__ = ["inspect_main", "report_main", "show_main", "use_color", "validate_main"]


def _dataset_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("dataset", help="dataset directory (local path or URL) holding manifest.json")


def _error_line(exc: BaseException) -> str:
    """One line for an error: its message's first line (the readers name the file in it)."""
    text = str(exc).strip()
    first = text.splitlines()[0] if text else ""
    if isinstance(exc, (ValueError, FileNotFoundError, KeyError)) and first:
        return first
    return f"{type(exc).__name__}: {first}" if first else type(exc).__name__


def _run(prog: str, parser: argparse.ArgumentParser, argv: list[str] | None, body: Callable) -> int:
    """Parse, open the dataset, run ``body``; every failure ends in one line (see the module docstring)."""
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:
        return int(exc.code or 0)
    from loaders.inspection.source import open_inspected

    try:
        dataset = open_inspected(args.dataset)
    except FileNotFoundError as exc:
        local = "://" not in args.dataset or args.dataset.startswith("file://")
        where = args.dataset[len("file://"):] if args.dataset.startswith("file://") else args.dataset
        print(f"lmshards {prog}: error: {_error_line(exc)}", file=sys.stderr)
        return 2 if local and not os.path.exists(where) else 1  # no such path: a usage error
    except Exception as exc:  # noqa: BLE001 - a damaged manifest: one line, never a traceback
        print(f"lmshards {prog}: error: {_error_line(exc)}", file=sys.stderr)
        return 1
    try:
        return body(args, dataset)
    except BrokenPipeError:  # `lmshards show ... | head`
        sys.stderr.close()
        return 0
    except KeyboardInterrupt:
        return 130
    except Exception as exc:  # noqa: BLE001 - a damaged shard or tokenizer: one line naming it
        hint = "" if prog == "validate" else f" (run 'lmshards validate {args.dataset}')"
        print(f"lmshards {prog}: error: {_error_line(exc)}{hint}", file=sys.stderr)
        return 1


def inspect_main(argv: list[str] | None = None) -> int:
    """``lmshards inspect``."""
    parser = argparse.ArgumentParser(prog="lmshards inspect", description="Summary table of a dataset.")
    _dataset_argument(parser)
    parser.add_argument("--json", action="store_true", help="print JSON instead of the table")
    parser.add_argument("--limit", type=int, default=100_000,
                        help="examples measured per split, a uniform sample (0 = all; default 100000)")
    parser.add_argument("--split", action="append", help="only these splits (repeatable)")

    def body(args, dataset) -> int:
        from loaders.inspection.table import format_table, inspect_dataset

        unknown = sorted(set(args.split or []) - set(dataset.splits))
        if unknown:
            print(f"lmshards inspect: error: no split {unknown}; the dataset has {dataset.splits}", file=sys.stderr)
            return 2
        summary = inspect_dataset(dataset, limit=args.limit or None, splits=args.split)
        sys.stdout.write(json.dumps(summary, indent=2, sort_keys=True) + "\n" if args.json else format_table(summary))
        return 0

    return _run("inspect", parser, argv, body)


def use_color(choice: str, stream=None) -> bool:
    """Colour for ``always``; for ``auto`` only on a terminal and without ``NO_COLOR`` (no-color.org)."""
    stream = stream or sys.stdout
    if choice != "auto":
        return choice == "always"
    return not os.environ.get("NO_COLOR") and hasattr(stream, "isatty") and stream.isatty()


def show_main(argv: list[str] | None = None) -> int:
    """``lmshards show``."""
    parser = argparse.ArgumentParser(prog="lmshards show", description="Decoded examples, corruption made visible.")
    _dataset_argument(parser)
    parser.add_argument("-n", type=int, default=3, help="examples to show (default 3)")
    parser.add_argument("--key", action="append", help="show this example key (repeatable); reads one shard per key")
    parser.add_argument("--split", default=None, help="split to read (default: train, or the first split)")
    parser.add_argument("--ids", action="store_true", help="also show token ids")
    parser.add_argument("--format", choices=["arrow", "webdataset"], help="shard format to read")
    parser.add_argument("--color", choices=["auto", "always", "never"], default="auto",
                        help="colour: auto (a terminal without NO_COLOR), always, never")

    def body(args, dataset) -> int:
        from loaders.inspection.anatomy import take_apart
        from loaders.inspection.render import render_example, to_text

        fmt = args.format
        if fmt and fmt not in dataset.formats:
            print(f"lmshards show: error: format {fmt} was not written; the dataset has {dataset.formats}",
                  file=sys.stderr)
            return 2
        split = args.split or ("train" if "train" in dataset.splits else dataset.splits[0])
        if split not in dataset.splits:
            print(f"lmshards show: error: no split {split!r}; the dataset has {dataset.splits}", file=sys.stderr)
            return 2
        missing = []
        if args.key:
            found = []
            for key in args.key:
                located = dataset.find(key, fmt)
                found += [located] if located else []
                missing += [] if located else [key]
        else:
            found = dataset.head(split, args.n, fmt)
        view = dataset.view
        color = use_color(args.color)
        for located in found:
            rendered = render_example(located, take_apart(located.example, view), view)
            sys.stdout.write(to_text(rendered, dataset.tokenizer, color=color, ids=args.ids) + "\n")
        sys.stdout.flush()
        for key in missing:
            print(f"lmshards show: key {key!r} not found (looked in shard(s) "
                  f"{', '.join(f'{s}/{i}' for s, i in dataset.locate_key(key))})", file=sys.stderr)
        return 1 if missing else 0

    return _run("show", parser, argv, body)


def validate_main(argv: list[str] | None = None) -> int:
    """``lmshards validate``."""
    parser = argparse.ArgumentParser(prog="lmshards validate",
                                     description="Checksums, schemas and objective invariants of a dataset.")
    _dataset_argument(parser)
    parser.add_argument("--sample", type=int, default=0, help="check about N examples per split (default: all)")
    parser.add_argument("--json", action="store_true", help="print the report as JSON")
    parser.add_argument("--max-problems", type=int, default=50, help="problems listed in the text report")
    parser.add_argument("--quiet", action="store_true", help="no progress on stderr")

    def body(args, dataset) -> int:
        from loaders.inspection.validate import validate_dataset

        def progress(message: str) -> None:
            if not args.quiet and sys.stderr.isatty():
                print(f"\r\x1b[Kvalidating {message}", end="", file=sys.stderr, flush=True)

        report = validate_dataset(dataset, sample=args.sample or None, progress=progress)
        progress("")
        if args.json:
            sys.stdout.write(json.dumps(report.to_json(), indent=2) + "\n")
        else:
            sys.stdout.write(report.format(args.max_problems))
        return 0 if report.ok else 1

    return _run("validate", parser, argv, body)


def report_main(argv: list[str] | None = None) -> int:
    """``lmshards report``."""
    parser = argparse.ArgumentParser(prog="lmshards report", description="Self-contained HTML report with plots.")
    _dataset_argument(parser)
    parser.add_argument("-o", "--output", required=True, help="HTML file to write")
    parser.add_argument("--limit", type=int, default=100_000, help="examples measured per split (0 = all)")
    parser.add_argument("--examples", type=int, default=4, help="rendered examples (default 4)")

    def body(args, dataset) -> int:
        from loaders.inspection.report import build_report

        page = build_report(dataset, limit=args.limit or None, examples=args.examples)
        try:
            with open(args.output, "w", encoding="utf-8") as handle:
                handle.write(page)
        except OSError as exc:
            print(f"lmshards report: error: cannot write {args.output} ({exc.strerror or exc})", file=sys.stderr)
            return 2
        print(f"wrote {args.output} ({len(page.encode('utf-8')):,} bytes)")
        return 0

    return _run("report", parser, argv, body)


if __name__ == "__main__":
    sys.exit(inspect_main())
