"""Why ``lmshards materialize --runner DaskRunner`` is refused: Beam's DaskRunner, shown with
plain Beam pipelines (no lmshards code) on a dask ``distributed`` LocalCluster.

Each pipeline's sinks write one empty file per element they receive (``<sink>-<element>``)
into a fresh directory; what the directory holds afterwards is what the sinks received.
Three pipelines, each one defect of ``apache_beam/runners/dask/`` (read in Beam 2.77):

- ``tagged_outputs``: a DoFn with a main output (even numbers) and a TaggedOutput (odd ones);
  the reader of the main output receives the odd numbers too. The runner's graph visitor
  gives every consumer the bag of the producing transform (``self.bags[input.producer]``),
  whichever output it reads, and that bag holds every output of the DoFn, tagged or not
  (``apply_dofn_to_bundle``). In lmshards, ReadCorpus' statistics dicts and rejected records
  reached Tokenize as texts ("TextEncodeInput must be Union[...]").
- ``finish_bundle``: what a DoFn outputs in ``finish_bundle`` is lost:
  ``apply_dofn_to_bundle`` takes the bundle's results before it calls ``invoke_finish_bundle``.
  lmshards' Tokenize and BuildExamples emit their last batches and statistics there.
- ``two_sinks``: of two independent branches only the one applied last runs: the runner
  computes the bag of the last transform visited (``dask.optimize(list(...bags.values())[-1])``)
  and nothing that does not lead to it. lmshards writes shards, rejected records and the
  manifest from separate branches.

    python -m benchmarks.dask_runner_repro     # needs pip install 'apache-beam[dask]'

Prints, per pipeline, what each sink should receive and what it received; exit status 1 when
the DaskRunner lost or misdelivered elements in any of them, 0 when it ran all three right.
"""

from __future__ import annotations

import os
import sys
import tempfile

import apache_beam as beam
from apache_beam.options.pipeline_options import PipelineOptions
from apache_beam.transforms.window import GlobalWindows

__all__ = ["EXPECTED", "run_all", "run_case"]


class _Mark(beam.DoFn):
    """A sink: one empty file ``<name>-<element>`` per element received."""

    def __init__(self, directory: str, name: str):
        self._directory, self._name = directory, name

    def process(self, element):
        open(os.path.join(self._directory, f"{self._name}-{element}"), "w").close()


class _EvenAndOdd(beam.DoFn):
    def process(self, n):
        yield n if n % 2 == 0 else beam.pvalue.TaggedOutput("odd", n)


class _LastInFinishBundle(beam.DoFn):
    def process(self, n):
        yield n

    def finish_bundle(self):
        yield GlobalWindows.windowed_value(100)


def _tagged_outputs(p, directory):
    outputs = p | beam.Create([1, 2, 3, 4]) | beam.ParDo(_EvenAndOdd()).with_outputs("odd", main="even")
    outputs.even | "Even" >> beam.ParDo(_Mark(directory, "even"))


def _finish_bundle(p, directory):
    p | beam.Create([1, 2]) | beam.ParDo(_LastInFinishBundle()) | beam.ParDo(_Mark(directory, "out"))


def _two_sinks(p, directory):
    p | "CreateA" >> beam.Create([1]) | "A" >> beam.ParDo(_Mark(directory, "a"))
    p | "CreateB" >> beam.Create([2]) | "B" >> beam.ParDo(_Mark(directory, "b"))


CASES = {"tagged_outputs": _tagged_outputs, "finish_bundle": _finish_bundle, "two_sinks": _two_sinks}
#: What the sinks of each pipeline receive on a correct runner (checked on FnApiRunner by the test).
EXPECTED = {"tagged_outputs": ["even-2", "even-4"], "finish_bundle": ["out-1", "out-100", "out-2"],
            "two_sinks": ["a-1", "b-2"]}


def run_case(case: str, runner, beam_args: list[str]) -> list[str]:
    """Run pipeline ``case`` on ``runner`` (a PipelineRunner instance); what its sinks received."""
    with tempfile.TemporaryDirectory() as directory:
        pipeline = beam.Pipeline(runner=runner, options=PipelineOptions(beam_args))
        CASES[case](pipeline, directory)
        result = pipeline.run()
        result.wait_until_finish()
        client = getattr(result, "client", None)  # DaskRunnerResult's client, which the runner never closes
        if client is not None:
            client.close()
        return sorted(os.listdir(directory))


def run_all(scheduler_address: str) -> dict[str, list[str]]:
    """What the sinks of every pipeline received on Beam's DaskRunner, on the dask scheduler at that address."""
    from apache_beam.runners.dask.dask_runner import DaskRunner

    return {case: run_case(case, DaskRunner(), [f"--dask_client_address={scheduler_address}"]) for case in CASES}


def main() -> int:
    from apache_beam.version import __version__ as beam_version
    from dask import __version__ as dask_version
    from distributed import LocalCluster
    from distributed import __version__ as distributed_version

    print(f"apache-beam {beam_version}, dask {dask_version}, distributed {distributed_version}")
    with LocalCluster(n_workers=2, processes=True, threads_per_worker=1, dashboard_address=None) as cluster:
        received = run_all(cluster.scheduler_address)
    wrong = 0
    for case, got in received.items():
        ok = got == EXPECTED[case]
        wrong += not ok
        print(f"{case:<15} expected {EXPECTED[case]}, DaskRunner gave {got}{'' if ok else '  <- wrong'}")
    return 1 if wrong else 0


if __name__ == "__main__":
    sys.exit(main())
