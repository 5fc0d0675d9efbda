"""Runner tuning: every choice of the materialize job that depends on its runner, made in one place.

The graph and the options are the same on every runner but for the fields of a
:class:`RunnerTuning`. :func:`choose_tuning` makes it from the runner (read once from Beam's
flags: :class:`~pipelines.parallelism.RunnerSetup`), when the pipeline is built
(:func:`pipelines.materialize.run_job`, through :func:`tuning_for`), and
:func:`pipelines.materialize.build_pipeline` applies it (:class:`pipelines.tuned_run.TunedRun`).
No transform takes an argument for a runner, no other module of the job looks at the runner to
change the graph or an option, and nothing patches a library. No field changes the output
bytes: the tests compare them across runners, worker counts and both build stages.

The fields, where each is on and why:

- ``encoder_threads`` (``--encoder-threads auto``; every runner): threads of each worker's
  Rust encoder. Each worker's encoder would start a thread per core, and the workers' threads
  would contend for the cores; so the cores are shared among the local SDK workers of
  ``multi_processing`` and of Flink and Spark here, and Dataflow, whose workers run one SDK
  process per core, gets 1 (unless the ``no_use_multiple_sdk_containers`` experiment makes it
  one process). In one process: the tokenizer's default, every core.
- ``build_stage`` (``--build-stage auto``; distributed runners): ``separate`` runs the objective
  in a stage of its own, spread over every worker, where the corpus makes fewer than
  :data:`SEPARATE_BELOW_GROUPS` pack groups (estimated from the input sizes): fused, building has
  only as many workers as there are groups. Not for an objective whose examples are copies of
  its chunks (a copy is not worth a shuffle), and never on Beam's local runners, where spreading
  the chunks over the workers cost more than the building it spread (README, Runners).
- ``build_apart`` (FnApiRunner, in-process or with local workers): the objective applied to
  each of Pack's two chunk outputs apart, not to their ``Flatten``. FnApiRunner materializes a
  ``Flatten``: every chunk would be encoded into a buffer and decoded out of it, which between
  worker processes is slow, and in one process that buffer holds every chunk of the corpus
  until the whole Pack stage has run. Apart, a chunk lives only until its block is built; the
  two example streams meet in the writers' shuffle, which exists anyway. On a runner that fuses
  a ``Flatten`` (Dataflow), the plain graph is the same work.
- ``by_reference`` (FnApiRunner in-process): documents and example batches cross the runner's
  shuffles by reference instead of as encoded bytes, each stored once and let go of by the
  transform that reads it last (:mod:`pipelines.reference_handoff`), so a run holds about one
  form of the corpus at a time. ``keep_references``: the runner replays bundles
  (``--direct_runner_bundle_repeat``), so values stay until the run ends.
- ``through_files`` (FnApiRunner with local workers): documents, their blocks and example
  batches are written once to a file of the run by the worker that made them, and only their
  place crosses the runner (:mod:`pipelines.file_handoff`): that runner's data streams drop
  parts of a large stage input written during their timed flush.
- ``freeze_workers`` (FnApiRunner with local workers): each worker process freezes its heap
  (:func:`gc.freeze`) before its first Tokenize, so full garbage collections no longer walk
  Beam's hundreds of thousands of objects (:mod:`pipelines.tuned_run`). Not on Dataflow, where
  it was not measured.
- ``freeze_run`` (FnApiRunner in-process): the objects that exist when the pipeline starts stay
  out of the garbage collector's full passes until it ends; the runner holds its stages' data in
  this process, so full collections come during the run, and each walked Beam and the graph.

Each of the last five was measured to pay at least 5 % of a whole run on the benchmark corpus,
as the median of at least five interleaved pairs of runs with and without it, on the runner it
is on for (``benchmarks/bench_tuning.py``; the figures are in ``benchmarks/README.md``, "Runner
tuning, measured"); every other runner gets the plain graph (:data:`PLAIN`). A dry run
(``--dry_run``: built and validated, never run) in one process is built without the in-process
pieces (``build_apart``, ``by_reference``, ``freeze_run``).

What the run's processes do around the pipeline (progress counted here or relayed from local
workers, Ctrl-C passed on to them) follows from where the runner runs the stages
(:class:`pipelines.options.MaterializeOptions`' ``in_one_process`` and ``local_workers``), not from
a choice; the local engines (:mod:`pipelines.engines`), Dataflow's staging
(:mod:`pipelines.dataflow`), ``--workers`` in each runner's flags
(:func:`pipelines.parallelism.worker_flags`) and the runners refused (:mod:`pipelines.plan`) set
the runner up and change nothing of the graph.

Nothing here imports Beam (the parser reads :data:`BUILD_STAGES` and :data:`SEPARATE_BELOW_GROUPS`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from pipelines.parallelism import RunnerSetup, usable_cores
from transforms.objectives.registry import OBJECTIVES

if TYPE_CHECKING:
    from pipelines.options import MaterializeOptions

__all__ = ["BUILD_STAGES", "PLAIN", "SEPARATE_BELOW_GROUPS", "RunnerTuning", "choose_tuning", "estimated_groups",
           "tuning_for"]

#: Values of ``--build-stage``.
BUILD_STAGES = ("auto", "fused", "separate")
#: ``--build-stage auto`` on a distributed runner builds in a stage of its own below this many
#: estimated pack groups: fused, building has only as many workers as there are groups.
SEPARATE_BELOW_GROUPS = 64
#: Bytes of text per token, and of text per byte of a compressed file, to estimate groups with.
_TEXT_BYTES_PER_TOKEN, _COMPRESSION_RATIO = 4, 4
#: Beam's local runners: ``--build-stage auto`` builds where it packs on them.
_LOCAL_BEAM_RUNNERS = ("FnApiRunner", "DirectRunner", "SwitchingDirectRunner", "BundleBasedDirectRunner")


@dataclass(frozen=True)
class RunnerTuning:
    """What the materialize job does for its runner (the module docstring says why each field is
    where it is); the defaults are the plain graph of every other runner."""

    #: threads of each worker's Rust encoder (None: the tokenizer's default, every core)
    encoder_threads: int | None = None
    #: where the objective runs: ``fused`` (where the chunks are packed) or ``separate``
    build_stage: str = "fused"
    #: the objective applied to each of Pack's chunk outputs apart, not to their ``Flatten``
    build_apart: bool = False
    #: documents and example batches cross the shuffles by reference (one process only)
    by_reference: bool = False
    #: values handed over by reference stay until the run ends (the runner replays bundles)
    keep_references: bool = False
    #: documents and example batches cross between worker processes through files of the run
    through_files: bool = False
    #: local worker processes freeze their heap before their first Tokenize
    freeze_workers: bool = False
    #: the run's own heap is frozen while the pipeline runs
    freeze_run: bool = False


#: The plain graph: every runner but Beam's FnApiRunner, the tokenizer's own encoder threads.
PLAIN = RunnerTuning()


def choose_tuning(setup: RunnerSetup, *, encoder_threads: int | str = "auto", build_stage: str = "auto",
                  objective: str | None = None, groups: int = 0, dry_run: bool = False) -> RunnerTuning:
    """The tuning of a run on ``setup``'s runner. ``encoder_threads`` and ``build_stage`` are the
    flags as given (``auto`` is decided here, a value is taken as it is); ``objective`` and
    ``groups`` (the pack groups the inputs make, :func:`estimated_groups`) decide ``auto``'s build
    stage; ``dry_run``: the pipeline is built and never run."""
    in_process = setup.in_one_process and not dry_run
    local_workers = setup.local_workers
    return RunnerTuning(
        encoder_threads=_encoder_threads(encoder_threads, setup),
        build_stage=_build_stage(build_stage, setup, objective, groups),
        build_apart=in_process or local_workers,
        by_reference=in_process,
        keep_references=in_process and setup.replays_bundles,
        through_files=local_workers,
        freeze_workers=local_workers,
        freeze_run=in_process,
    )


def tuning_for(options: MaterializeOptions, files: list[tuple[str, int]], *, dry_run: bool = False) -> RunnerTuning:
    """:func:`choose_tuning` for a materialize run: its runner (``options.beam_args``), its flags,
    and the pack groups its input files (``(path, bytes)``) make."""
    return choose_tuning(RunnerSetup.from_beam_args(options.beam_args), encoder_threads=options.encoder_threads,
                         build_stage=options.build_stage, objective=options.objective,
                         groups=estimated_groups(files, options.pack_group_tokens, options.num_buckets),
                         dry_run=dry_run)


def _encoder_threads(value: int | str, setup: RunnerSetup) -> int | None:
    if value != "auto":
        return int(value)
    if setup.runner == "DataflowRunner":
        return None if "no_use_multiple_sdk_containers" in setup.experiments else 1
    if setup.runner in ("FlinkRunner", "SparkRunner"):  # their SDK workers share the cores, as local ones do
        cores = usable_cores()
        return max(1, cores // (setup.engine_workers or cores))
    if not setup.multi_processing:
        return None
    cores = usable_cores()
    return max(1, cores // (setup.num_workers or cores))  # Beam: 0 workers means one per core


def _copies_chunks(objective: str | None) -> bool:
    """The objective's examples are copies of its chunks (``Objective.copies_chunks``: sending a
    chunk to a build worker and its example back costs as much as building it)."""
    return objective in OBJECTIVES and OBJECTIVES[objective].copies_chunks


def _build_stage(value: str, setup: RunnerSetup, objective: str | None, groups: int) -> str:
    if value != "auto":
        return value
    if _copies_chunks(objective) or setup.runner in _LOCAL_BEAM_RUNNERS:
        return "fused"
    return "separate" if groups < SEPARATE_BELOW_GROUPS else "fused"


def estimated_groups(files: list[tuple[str, int]], pack_group_tokens: int | None, num_buckets: int | None) -> int:
    """About how many pack groups per split the inputs make (from their sizes alone)."""
    if num_buckets:
        return num_buckets
    text_bytes = sum(size * (_COMPRESSION_RATIO if path.lower().endswith((".gz", ".zst", ".zstd", ".gzip")) else 1)
                     for path, size in files)
    return -(-text_bytes // (_TEXT_BYTES_PER_TOKEN * (pack_group_tokens or 1)))
