"""lmshards' own flags are parsed and checked before Apache Beam is imported: a typo (with its
"did you mean"), ``--help`` and ``lmshards --help`` answer without importing Beam; Beam's and the
runners' flags are still checked after (pipelines.plan.check_beam_args). Whether Beam was
imported is read from ``sys.modules`` in a fresh interpreter, never from a clock.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from lmshards_testing import ROOT, SAMPLE_GLOB, TOKENIZER, materialize_command

from pipelines.parser import build_parser, refuse_mistyped_flags

_PROBE = ("import json, sys\n"
          "from {module} import main\n"
          "code = main({argv!r})\n"
          "print(json.dumps({{'code': code, 'beam': 'apache_beam' in sys.modules}}))\n")


def _run(module: str, argv: list[str]) -> tuple[dict, str, str]:
    done = subprocess.run([sys.executable, "-c", _PROBE.format(module=module, argv=argv)], capture_output=True,
                          text=True, cwd=ROOT, timeout=300)
    result = json.loads(done.stdout.strip().splitlines()[-1])
    return result, done.stdout, done.stderr


MATERIALIZE = ["--input", SAMPLE_GLOB, "--tokenizer", TOKENIZER, "--output", "/nonexistent/out"]


@pytest.mark.parametrize("module, argv, message", [
    ("pipelines.materialize", [*MATERIALIZE, "--seq-lenn", "64"],
     "lmshards materialize: error: unknown option --seq-lenn (not an lmshards or Apache Beam flag); did you mean "
     "--seq-len?"),
    ("pipelines.materialize", [*MATERIALIZE, "--max-doc", "5"],
     "lmshards materialize: error: unknown option --max-doc (not an lmshards or Apache Beam flag); did you mean "
     "--max-doc-chars?"),
    ("pipelines.materialize", [*MATERIALIZE, "--seq-len", "many"],
     "lmshards materialize: error: argument --seq-len: --seq-len many: not an integer"),
    ("pipelines.train_tokenizer", ["--input", SAMPLE_GLOB, "--output", "/nonexistent/t.json", "--vocab-sise", "9"],
     "lmshards train-tokenizer: error: unknown option --vocab-sise; did you mean --vocab-size?"),
])
def test_a_mistyped_flag_is_one_line_before_beam_is_imported(module, argv, message):
    result, _, err = _run(module, argv)
    assert result == {"code": 2, "beam": False}
    assert err.strip() == message


@pytest.mark.parametrize("module, argv", [("pipelines.cli", ["--help"]), ("pipelines.cli", ["materialize", "--help"]),
                                          ("pipelines.cli", ["train-tokenizer", "--help"]),
                                          ("pipelines.cli", ["inspect", "--help"])])
def test_help_does_not_import_beam(module, argv):
    result, out, _ = _run(module, argv)
    assert result == {"code": 0, "beam": False} and "usage" in out.lower()


def test_a_mistyped_beam_flag_still_gets_beams_suggestion():
    # in this process: the suggestion comes from Beam's own parser, so Beam is imported for it anyway
    done = materialize_command(*MATERIALIZE, "--runer", "FnApiRunner")
    assert done.returncode == 2
    assert done.stderr.strip() == ("lmshards materialize: error: unknown option --runer (not an lmshards or Apache "
                                   "Beam flag); did you mean --runner?")


def test_no_flag_of_beam_or_its_runners_is_taken_for_a_typo_of_ours():
    """The rule refuse_mistyped_flags relies on: Beam's flags are snake_case, or far from ours."""
    import importlib

    from pipelines.plan import _beam_parser

    for module in ("apache_beam.runners.portability.flink_runner", "apache_beam.runners.portability.spark_runner",
                   "apache_beam.runners.portability.prism_runner", "apache_beam.runners.dataflow.dataflow_runner"):
        try:
            importlib.import_module(module)
        except ImportError:
            continue
    beam_flags = [option for option in _beam_parser()._option_string_actions
                  if option.startswith("--") and option != "--help"]
    assert "--job-server-timeout" in beam_flags and len(beam_flags) > 100
    refuse_mistyped_flags([f"{flag}=1" for flag in beam_flags], build_parser())
    refuse_mistyped_flags(beam_flags, build_parser())


def test_train_tokenizer_help_is_plain_text_with_every_default():
    from pipelines.train_tokenizer import build_parser as tokenizer_parser

    parser = tokenizer_parser()
    text = parser.format_help()
    assert "``" not in text and ":mod:" not in text
    for action in parser._actions:
        if action.dest == "help":
            continue
        assert action.help, action.option_strings
        if action.option_strings[0] not in ("--input", "--output", "--overwrite"):
            assert "default" in action.help, action.option_strings
