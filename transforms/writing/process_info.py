"""When a process started (from /proc), with no Beam import: a lock's staleness and the
command's own wall time both use it."""

from __future__ import annotations

import os

__all__ = ["process_age", "process_start"]


def _started_after_boot(pid: int) -> float:
    """Seconds between boot and the start of process ``pid`` (field 22 of ``/proc/PID/stat``)."""
    with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as handle:
        fields = handle.read().rsplit(")", 1)[1].split()
    return int(fields[19]) / os.sysconf("SC_CLK_TCK")


def process_start(pid: int) -> float | None:
    """Start time (epoch seconds) of a process, from /proc (None where there is no /proc)."""
    try:
        started = _started_after_boot(pid)
        with open("/proc/stat", encoding="ascii") as handle:
            boot = next(float(line.split()[1]) for line in handle if line.startswith("btime "))
        return boot + started
    except (OSError, ValueError, IndexError, StopIteration):
        return None


def process_age(pid: int) -> float | None:
    """Seconds since a process started, on the kernel's own clock (``/proc/uptime`` and the
    process's start in ticks since boot), so that wall-clock steps and a virtual machine's
    pauses, which shift ``btime`` against ``time.time()``, do not enter it; None without /proc."""
    try:
        started = _started_after_boot(pid)
        with open("/proc/uptime", encoding="ascii") as handle:
            uptime = float(handle.read().split()[0])
        return max(0.0, uptime - started)
    except (OSError, ValueError, IndexError):
        return None
