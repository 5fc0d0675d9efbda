"""The ``lmshards`` console script: ``lmshards <command> [flags]``."""

from __future__ import annotations

import importlib
import sys

from pipelines import __version__

__all__ = ["main"]

COMMANDS = {
    "materialize": ("pipelines.materialize", "turn a raw corpus into sharded pretraining examples"),
    "train-tokenizer": ("pipelines.train_tokenizer", "train a tokenizer.json on corpus files"),
    "inspect": ("pipelines.inspect:inspect_main", "summary table of a dataset (--json for machines)"),
    "show": ("pipelines.inspect:show_main", "decoded examples with the corruption made visible"),
    "validate": ("pipelines.inspect:validate_main", "checksums, schemas and objective invariants"),
    "report": ("pipelines.inspect:report_main", "self-contained HTML report with plots"),
    "diff": ("pipelines.inspect:diff_main", "two datasets' summaries side by side, differences marked"),
}


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help"):
        print("usage: lmshards <command> [flags]\n\ncommands:")
        for name, (_, help_text) in COMMANDS.items():
            print(f"  {name:<16} {help_text}")
        print("\nrun 'lmshards <command> --help' for the flags of a command")
        return 0 if argv else 2
    command, rest = argv[0], argv[1:]
    if command in ("--version", "version"):
        print(f"lmshards {__version__}")
        return 0
    if command not in COMMANDS:
        print(f"lmshards: unknown command {command!r}; choose one of {', '.join(COMMANDS)}", file=sys.stderr)
        return 2
    module_name, _, function = COMMANDS[command][0].partition(":")
    module = importlib.import_module(module_name)
    return getattr(module, function or "main")(rest)


if __name__ == "__main__":
    sys.exit(main())
