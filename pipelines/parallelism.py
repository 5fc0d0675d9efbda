"""The runner a materialize job uses, read once from Beam's flags, and ``--workers N`` in its flags.

:class:`RunnerSetup` is what the runner is (its name, its local worker processes, its
experiments); :func:`worker_flags` writes ``--workers N`` as the runner's own flags. What
lmshards does differently for the runner is chosen from the :class:`RunnerSetup` in one place,
:mod:`pipelines.runner_tuning`.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from pipelines.beam_logging import import_beam_quietly
from schemas.errors import ConfigError

__all__ = ["RunnerSetup", "usable_cores", "worker_flags"]


def usable_cores() -> int:
    """The cores this process may run on."""
    affinity = getattr(os, "sched_getaffinity", None)  # Linux; elsewhere every core counts
    return len(affinity(0)) if affinity else os.cpu_count() or 1


@dataclass(frozen=True)
class RunnerSetup:
    """The runner of a job and the settings of it that lmshards reads, from the Beam flags once."""

    runner: str  #: the runner's class name (``FnApiRunner``, ``DataflowRunner``, ...)
    multi_processing: bool  #: ``--direct_running_mode=multi_processing``
    num_workers: int  #: ``--direct_num_workers`` (0: one per core)
    experiments: tuple[str, ...]  #: ``--experiments``
    #: SDK worker processes side by side on Flink and Spark here (0: one per core, their default)
    engine_workers: int = 0
    #: the runner replays bundles (``--direct_runner_bundle_repeat`` above 0)
    replays_bundles: bool = False

    @property
    def in_one_process(self) -> bool:
        """The runner runs every stage in this process: FnApiRunner, not multi_processing."""
        return self.runner == "FnApiRunner" and not self.multi_processing

    @property
    def local_workers(self) -> bool:
        """The runner runs the stages in SDK worker processes of this machine that it starts itself:
        FnApiRunner with multi_processing."""
        return self.runner == "FnApiRunner" and self.multi_processing

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
                   engine_workers=_engine_workers(runner, beam_args),
                   replays_bundles=(direct.direct_runner_bundle_repeat or 0) > 0)


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
