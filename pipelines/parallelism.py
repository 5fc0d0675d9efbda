"""What ``lmshards materialize``'s parallelism flags resolve to on the runner the job uses.

The Beam flags are read once (:class:`RunnerSetup`); from them come the Beam flags of
``--workers N`` (:func:`worker_flags`), the threads of each worker's encoder
(:func:`resolve_encoder_threads`) and where the objective runs (:func:`resolve_build_stage`).
None of these choices changes the output bytes.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from pipelines.beam_logging import import_beam_quietly
from schemas.errors import ConfigError
from transforms.objectives.registry import OBJECTIVES

__all__ = ["BUILD_STAGES", "IN_PROCESS_RUNNERS", "SEPARATE_BELOW_GROUPS", "RunnerSetup", "estimated_groups",
           "resolve_build_stage", "resolve_encoder_threads", "worker_flags"]

#: Runners that run the pipeline in this process (unless --direct_running_mode=multi_processing).
IN_PROCESS_RUNNERS = ("FnApiRunner", "DirectRunner", "SwitchingDirectRunner", "BundleBasedDirectRunner")


def _usable_cores() -> int:
    affinity = getattr(os, "sched_getaffinity", None)  # Linux; elsewhere every core counts
    return len(affinity(0)) if affinity else os.cpu_count() or 1


def _copies_chunks(objective: str | None) -> bool:
    """The objective's examples are copies of its chunks (``Objective.copies_chunks``: sending a
    chunk to a build worker and its example back costs as much as building it)."""
    return objective in OBJECTIVES and OBJECTIVES[objective].copies_chunks


@dataclass(frozen=True)
class RunnerSetup:
    """What the parallelism defaults depend on, read once from the Beam flags."""

    runner: str  #: the runner's class name (``FnApiRunner``, ``DataflowRunner``, ...)
    multi_processing: bool  #: ``--direct_running_mode=multi_processing``
    num_workers: int  #: ``--direct_num_workers`` (0: one per core)
    experiments: tuple[str, ...]  #: ``--experiments``
    #: SDK worker processes side by side on Flink and Spark here (0: one per core, their default)
    engine_workers: int = 0

    @property
    def in_one_process(self) -> bool:
        """The runner runs every stage in this process: FnApiRunner, not multi_processing."""
        return self.runner == "FnApiRunner" and not self.multi_processing

    @classmethod
    def from_beam_args(cls, beam_args: list[str]) -> RunnerSetup:
        import_beam_quietly()  # the first import of Beam in a materialize run: its warnings stay unseen
        from apache_beam.options.pipeline_options import (
            DebugOptions,
            DirectOptions,
            PipelineOptions,
            StandardOptions,
        )

        options = PipelineOptions(beam_args)
        runner = options.view_as(StandardOptions).runner or "DirectRunner"
        direct = options.view_as(DirectOptions)
        runner = (runner if isinstance(runner, str) else type(runner).__name__).rsplit(".", 1)[-1]
        return cls(runner=runner,
                   multi_processing=direct.direct_running_mode == "multi_processing",
                   num_workers=direct.direct_num_workers or 0,
                   experiments=tuple(options.view_as(DebugOptions).experiments or ()),
                   engine_workers=_engine_workers(runner, beam_args))


def _engine_workers(runner: str, beam_args: list[str]) -> int:
    """The SDK worker processes that Flink or Spark runs side by side (:mod:`pipelines.engine_run`
    makes them as many as the parallelism); 0 for one per core, or another runner."""
    if runner not in ("FlinkRunner", "SparkRunner"):
        return 0
    values = {a.split("=", 1)[0]: a.split("=", 1)[1] for a in beam_args if "=" in a}
    explicit = values.get("--sdk_worker_parallelism") or values.get("--parallelism")
    if runner == "SparkRunner" and not values.get("--sdk_worker_parallelism"):
        explicit = "".join(ch for ch in values.get("--spark_master_url", "") if ch.isdigit()) or None
    return int(explicit) if explicit and explicit.isdigit() and int(explicit) > 0 else 0


def resolve_encoder_threads(value: int | str, setup: RunnerSetup) -> int | None:
    """``--encoder-threads``: ``auto`` shares the cores among the worker processes of
    ``--direct_running_mode=multi_processing`` (each worker's encoder would otherwise start a
    thread per core, and the workers' threads would contend for the cores), and so among Flink's and
    Spark's SDK workers (:mod:`pipelines.engines`), and is 1 on Dataflow,
    whose workers run one SDK process per core (unless the ``no_use_multiple_sdk_containers``
    experiment makes it one process); elsewhere None, the tokenizer's own default (every
    core; one in-process encoder). A number is taken as given."""
    if value != "auto":
        return int(value)
    if setup.runner == "DataflowRunner":
        return None if "no_use_multiple_sdk_containers" in setup.experiments else 1
    if setup.runner in ("FlinkRunner", "SparkRunner"):  # their SDK workers share the cores, as local ones do
        cores = _usable_cores()
        return max(1, cores // (setup.engine_workers or cores))
    if not setup.multi_processing:
        return None
    cores = _usable_cores()
    return max(1, cores // (setup.num_workers or cores))  # Beam: 0 workers means one per core


#: Beam flags that --workers sets, which the user must not also give.
_WORKER_FLAGS = ("--direct_running_mode", "--direct_num_workers", "--num_workers", "--parallelism",
                 "--spark_master_url", "--sdk_worker_parallelism")


def worker_flags(workers: int, beam_args: list[str]) -> list[str]:
    """The Beam flags of ``--workers N`` for the runner in ``beam_args``: the local runner's worker
    processes, Dataflow's workers, Flink's parallelism (an SDK worker process per task slot,
    :mod:`pipelines.engines`), Spark's ``local[N]`` master; Prism runs one SDK worker process, so
    only ``--workers 1``.

    Raises:
        ConfigError: the user also gave one of those flags, or the runner has no such setting.
    """
    given = [a.split("=", 1)[0] for a in beam_args if a.split("=", 1)[0] in _WORKER_FLAGS]
    if given:
        raise ConfigError(f"--workers {workers}: also given {given[0]}; use one or the other")
    runner = RunnerSetup.from_beam_args(beam_args).runner
    if runner in ("FnApiRunner", "DirectRunner", "SwitchingDirectRunner"):
        if workers == 1:
            return ["--direct_running_mode=in_memory"]
        return ["--direct_running_mode=multi_processing", f"--direct_num_workers={workers}"]
    if runner == "DataflowRunner":
        return [f"--num_workers={workers}"]
    if runner == "FlinkRunner":
        return [f"--parallelism={workers}", f"--sdk_worker_parallelism={workers}"]
    if runner == "SparkRunner":
        return [f"--spark_master_url=local[{workers}]", f"--sdk_worker_parallelism={workers}"]
    if runner == "PrismRunner":
        if workers == 1:
            return []
        raise ConfigError(f"--workers {workers}: PrismRunner runs one SDK worker process (it runs bundles on "
                          "threads inside it); leave --workers out")
    raise ConfigError(f"--workers {workers}: not supported with --runner {runner}; use that runner's own flag for "
                      "its parallelism")


#: Values of ``--build-stage``.
BUILD_STAGES = ("auto", "fused", "separate")
#: ``--build-stage auto`` on a distributed runner builds in a stage of its own below this many
#: estimated pack groups: fused, building has only as many workers as there are groups.
SEPARATE_BELOW_GROUPS = 64
#: Bytes of text per token, and of text per byte of a compressed file, to estimate groups with.
_TEXT_BYTES_PER_TOKEN, _COMPRESSION_RATIO = 4, 4


def estimated_groups(files: list[tuple[str, int]], pack_group_tokens: int | None, num_buckets: int | None) -> int:
    """About how many pack groups per split the inputs make (from their sizes alone)."""
    if num_buckets:
        return num_buckets
    text_bytes = sum(size * (_COMPRESSION_RATIO if path.lower().endswith((".gz", ".zst", ".zstd", ".gzip")) else 1)
                     for path, size in files)
    return -(-text_bytes // (_TEXT_BYTES_PER_TOKEN * (pack_group_tokens or 1)))


def resolve_build_stage(value: str, setup: RunnerSetup, objective: str | None = None, groups: int = 0) -> str:
    """``--build-stage``: ``auto`` runs the objective in a stage of its own (``separate``) only
    where that buys parallelism: on a distributed runner (Dataflow, ...) when the corpus makes
    fewer than :data:`SEPARATE_BELOW_GROUPS` pack groups (``groups``, estimated from the input
    sizes), so that building is spread over every worker instead of one per group; not for clm
    (its examples are copies of its chunks). Everywhere else it runs where the chunks are packed
    (``fused``): on Beam's local multi-processing runner, spreading the chunks over its workers
    cost more than the building it spread (README, Runners). Either way the output is the same;
    the choice depends on file sizes and the runner, never the bytes."""
    if value != "auto":
        return value
    if _copies_chunks(objective) or setup.runner in IN_PROCESS_RUNNERS:
        return "fused"
    return "separate" if groups < SEPARATE_BELOW_GROUPS else "fused"

