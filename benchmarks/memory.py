"""Peak resident memory of a command and all its descendants, sampled from /proc.

    python -m benchmarks.memory -- python -m pipelines.materialize ...
"""

from __future__ import annotations

import os
import subprocess
import sys
import time

__all__ = ["run_and_measure", "tree_rss_bytes"]


def _children() -> dict[int, list[int]]:
    tree: dict[int, list[int]] = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as handle:
                fields = handle.read().rsplit(b")", 1)[1].split()
        except OSError:
            continue
        tree.setdefault(int(fields[1]), []).append(int(name))
    return tree


def tree_rss_bytes(pid: int) -> int:
    """Sum of VmRSS over ``pid`` and its descendants (0 for processes that vanished)."""
    tree = _children()
    total = 0
    stack = [pid]
    page = os.sysconf("SC_PAGE_SIZE")
    while stack:
        current = stack.pop()
        try:
            with open(f"/proc/{current}/statm") as handle:
                total += int(handle.read().split()[1]) * page
        except OSError:
            pass
        stack.extend(tree.get(current, []))
    return total


def run_and_measure(command: list[str], interval: float = 0.1, **kwargs) -> tuple[int, float, int]:
    """Run ``command``; return (exit code, wall seconds, peak tree RSS in bytes)."""
    start = time.perf_counter()
    process = subprocess.Popen(command, **kwargs)
    peak = 0
    while process.poll() is None:
        peak = max(peak, tree_rss_bytes(process.pid))
        time.sleep(interval)
    return process.returncode, time.perf_counter() - start, peak


if __name__ == "__main__":
    args = sys.argv[1:]
    if args and args[0] == "--":
        args = args[1:]
    code, wall, peak = run_and_measure(args)
    print(f"exit {code}, {wall:.1f} s, peak RSS {peak / 2**20:.0f} MiB", file=sys.stderr)
    sys.exit(code)
