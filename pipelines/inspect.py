"""``lmshards inspect | show | validate | report``: look at a dataset before training on it.

- ``inspect OUT [--json] [--limit N]``: the summary table (manifest numbers, and
  distributions measured on all examples or a uniform sample of N per split).
- ``show OUT [-n N] [--key K ...] [--split S] [--ids] [--width W]``: decoded examples with
  the corruption made visible, after a legend of the markup; colour on a terminal, plain
  when piped or when ``NO_COLOR`` is set; text wrapped to the terminal (100 columns when
  piped) with the text's own line breaks kept. Reads the first shard(s) only, or for
  ``--key`` the one shard the key hashes to.
- ``validate OUT [--sample N] [--json]``: checksums, schemas, objective invariants; exits 1
  with a per-problem report when anything fails.
- ``report OUT -o report.html``: a self-contained HTML page that describes the corpus (run,
  config, input files, document lengths, rejected records, shards) and the noise (plots and
  rendered examples).
- ``diff A B [-d] [--json] [--exit-code]``: two datasets' summaries (from the manifests)
  side by side, the differences marked.

Exit codes: 0 success; 1 validation failed, a key not found, (``diff --exit-code``) the
datasets differ, or a damaged or incomplete dataset (a manifest, shard or tokenizer that
cannot be used: one line naming the file and the problem, never a traceback); 2 bad usage
(flags, a path where nothing exists, or an installed objective plugin that cannot be loaded,
in one line naming it); 3 (:data:`schemas.errors.INTERNAL_ERROR`) an unexpected exception,
outside lmshards' errors (:mod:`schemas.errors`) and I/O errors: a bug, in lmshards or in an
objective's inspection hook, not the dataset's fault, so it prints its traceback
(:func:`pipelines.terminal.report_failure`, as every command).
The logic lives in :mod:`loaders.inspection` (no Beam, no torch).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
from collections.abc import Callable

from pipelines.terminal import report_failure
from schemas.errors import INTERNAL_ERROR, ConfigError, exit_code
from schemas.names import shown_name

__all__ = ["diff_main", "inspect_main", "report_main", "show_main", "show_width", "use_color",
           "validate_main"]

# Each command imports the modules of loaders.inspection it uses once its flags are parsed: --help
# answers without them, and inspect does not load the report's.


def _dataset_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("dataset", help="dataset directory (local path or URL) holding manifest.json")


def _error_line(exc: BaseException) -> str:
    """One line for an error: its message's first line (the readers name the file in it)."""
    text = str(exc).strip()
    first = shown_name(text.splitlines()[0]) if text else ""  # names in it escaped
    if isinstance(exc, (ValueError, FileNotFoundError, KeyError)) and first:
        return first
    return f"{type(exc).__name__}: {first}" if first else type(exc).__name__


def _open_failure_code(path: str, exc: BaseException) -> int:
    """Exit status of a dataset that cannot be opened: 2 for a local path where nothing exists
    (a usage error), else that of the error (2 for a configuration error, such as an objective
    plugin that cannot be loaded; 1 for a damaged or incomplete dataset)."""
    if isinstance(exc, FileNotFoundError):
        local = "://" not in path or path.startswith("file://")
        where = path[len("file://"):] if path.startswith("file://") else path
        if local and not os.path.exists(where):
            return 2
    return exit_code(exc)


def _open(prog: str, path: str, label: str = ""):
    """``(the dataset at path opened for inspection, None)``, or ``(None, exit status)`` once the
    failure is reported: a damaged manifest in one line, a bug with its traceback."""
    from loaders.inspection.source import open_inspected

    try:
        return open_inspected(path), None
    except Exception as exc:  # noqa: BLE001 - reported by its class (pipelines.terminal.report_failure)
        code = report_failure(prog, exc, f"{label}{_error_line(exc)}")
        return None, (_open_failure_code(path, exc) if code != INTERNAL_ERROR else code)


def _run(prog: str, parser: argparse.ArgumentParser, argv: list[str] | None, body: Callable) -> int:
    """Parse, open the dataset, run ``body``; every failure ends in one line, or a bug in its
    traceback (see the module docstring)."""
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:
        return int(exc.code or 0)
    dataset, code = _open(prog, args.dataset)
    if dataset is None:
        return code
    try:
        return body(args, dataset)
    except BrokenPipeError:  # `lmshards show ... | head`
        sys.stderr.close()
        return 0
    except KeyboardInterrupt:
        return 130
    except Exception as exc:  # noqa: BLE001 - a damaged shard or tokenizer in one line naming it; a bug in its traceback
        # validate's hint for a damaged dataset (an objective plugin that cannot be loaded is none)
        damaged = prog != "validate" and not isinstance(exc, ConfigError)
        hint = f" (run 'lmshards validate {shown_name(args.dataset)}')" if damaged else ""
        return report_failure(prog, exc, f"{_error_line(exc)}{hint}",
                              bug=f"a bug in lmshards or in the objective {_objective_name(dataset)!r}, "
                                  "not a damaged dataset")


def _objective_name(dataset) -> str:
    """The dataset's objective as its manifest names it (the objective may be what failed)."""
    return str(dataset.manifest.objective.get("name", "?"))


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
        sys.stdout.write(json.dumps(summary, indent=2, sort_keys=True) + "\n" if args.json
                         else format_table(summary, dataset))
        return 0

    return _run("inspect", parser, argv, body)


def use_color(choice: str, stream=None) -> bool:
    """Colour for ``always``; for ``auto`` only on a terminal and without ``NO_COLOR`` (no-color.org)."""
    stream = stream or sys.stdout
    if choice != "auto":
        return choice == "always"
    return not os.environ.get("NO_COLOR") and hasattr(stream, "isatty") and stream.isatty()


def show_width(requested: int | None, stream=None) -> int | None:
    """Columns ``show`` wraps at: as requested (0: none), else the terminal's width, else 100."""
    if requested is not None:
        return requested or None
    stream = stream or sys.stdout
    if hasattr(stream, "isatty") and stream.isatty():
        return shutil.get_terminal_size((100, 24)).columns
    return 100


def _count(text: str) -> int:
    """``-n``: a whole number of examples, 0 or more."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a whole number, got {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, got {value}")
    return value


def show_main(argv: list[str] | None = None) -> int:
    """``lmshards show``."""
    parser = argparse.ArgumentParser(prog="lmshards show", description="Decoded examples, corruption made visible.")
    _dataset_argument(parser)
    parser.add_argument("-n", type=_count, default=3, help="examples to show (default 3)")
    parser.add_argument("--key", action="append", help="show this example key (repeatable); reads one shard per key")
    parser.add_argument("--split", default=None, help="split to read (default: train, or the first split)")
    parser.add_argument("--ids", action="store_true", help="also show token ids")
    parser.add_argument("--format", choices=["arrow", "webdataset"], help="shard format to read")
    parser.add_argument("--color", choices=["auto", "always", "never"], default="auto",
                        help="colour: auto (a terminal without NO_COLOR), always, never")
    parser.add_argument("--width", type=int, default=None,
                        help="wrap lines at this many columns (default: the terminal's width, or 100 when "
                             "piped; 0 = no wrapping)")
    parser.add_argument("--no-legend", action="store_true", help="do not print the legend of the markup first")

    def body(args, dataset) -> int:
        from loaders.inspection.anatomy import take_apart
        from loaders.inspection.decode import RunDecoder
        from loaders.inspection.render import legend_text, render_example, to_text
        from loaders.inspection.table import split_context

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
        view, decoder = dataset.view, RunDecoder(dataset.tokenizer)
        color = use_color(args.color)
        width = show_width(args.width)
        contexts = {name: split_context(dataset, name) for name in {located.split for located in found}}
        rendered = [render_example(located, take_apart(located.example, view, contexts[located.split]), view,
                                   seed=dataset.seed, decoder=decoder, context=contexts[located.split])
                    for located in found]
        if rendered and not args.no_legend:
            sys.stdout.write(legend_text(rendered, color=color) + "\n")
        for example in rendered:
            sys.stdout.write(to_text(example, decoder, color=color, ids=args.ids, width=width) + "\n")
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
        print(f"wrote {shown_name(args.output)} ({len(page.encode('utf-8')):,} bytes)")
        return 0

    return _run("report", parser, argv, body)


def diff_main(argv: list[str] | None = None) -> int:
    """``lmshards diff``."""
    parser = argparse.ArgumentParser(prog="lmshards diff", allow_abbrev=False,
                                     description="Two datasets' summaries side by side, the differences marked.")
    parser.add_argument("a", help="first dataset directory (local path or URL)")
    parser.add_argument("b", help="second dataset directory")
    parser.add_argument("--only-differences", "-d", action="store_true", help="leave out the rows that are equal")
    parser.add_argument("--json", action="store_true", help="print the rows as JSON")
    parser.add_argument("--exit-code", action="store_true",
                        help="exit 1 when the datasets differ outside the run's facts (like git diff --exit-code)")
    parser.add_argument("--width", type=int, default=44, help="columns per value (default 44)")
    parser.add_argument("--color", choices=["auto", "always", "never"], default="auto",
                        help="colour the differences: auto (a terminal without NO_COLOR), always, never")
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:
        return int(exc.code or 0)
    from loaders.inspection.diff import RUN_SECTION, diff_datasets, format_diff

    datasets = []
    for label, path in (("A", args.a), ("B", args.b)):
        dataset, code = _open("diff", path, f"{label}: ")
        if dataset is None:
            return code
        datasets.append(dataset)
    try:
        rows = diff_datasets(*datasets)
    except Exception as exc:  # noqa: BLE001 - an objective plugin that cannot be loaded (one line), or a bug
        return report_failure("diff", exc)
    if args.json:
        sys.stdout.write(json.dumps({"a": args.a, "b": args.b, "rows": [r.to_json() for r in rows]}, indent=2) + "\n")
    else:
        sys.stdout.write(format_diff(rows, args.a, args.b, only_differences=args.only_differences,
                                     width=max(args.width, 8), color=use_color(args.color)))
    differs = any(r.status != "same" and r.section != RUN_SECTION for r in rows)
    return 1 if args.exit_code and differs else 0


if __name__ == "__main__":
    sys.exit(inspect_main())
