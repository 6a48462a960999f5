"""How busy the generator's machine was during the measured window (Linux ``/proc/stat``).

A generator whose machine has no idle CPU left sends late, and in open loop its lateness shows
as latency: this figure, beside the generator's own CPU and its late sends, tells a saturated
client from a slow fleet. Elsewhere than Linux the figure is simply absent.
"""

from __future__ import annotations

import os
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

PROC_STAT = Path("/proc/stat")


@dataclass(frozen=True)
class CpuTicks:
    """The machine's CPU time so far, in clock ticks: busy and total (busy + idle + iowait)."""

    busy: int
    total: int


def parse_proc_stat(text: str) -> CpuTicks | None:
    """The aggregate ``cpu`` line of /proc/stat (None if there is none).

    Fields: user nice system idle iowait irq softirq steal (guest time is already inside
    user and nice, so it is not added again).
    """
    for line in text.splitlines():
        fields = line.split()
        if fields and fields[0] == "cpu":
            values = [int(v) for v in fields[1:9]]
            values += [0] * (8 - len(values))
            idle = values[3] + values[4]
            total = sum(values)
            return CpuTicks(busy=total - idle, total=total)
    return None


def read_ticks() -> CpuTicks | None:
    """The machine's CPU ticks now (None where /proc/stat cannot be read)."""
    try:
        return parse_proc_stat(PROC_STAT.read_text(encoding="ascii"))
    except OSError:
        return None


def busy_share(before: CpuTicks, after: CpuTicks) -> float | None:
    """Fraction (0-1) of the machine's CPU time that was busy between two readings."""
    total = after.total - before.total
    if total <= 0:
        return None
    return (after.busy - before.busy) / total


class HostCpuMeter:
    """Reads the machine's CPU ticks at a wall-clock instant (the window's start) and at
    ``stop()`` (its end), from a timer thread so that the caller is free meanwhile."""

    def __init__(self) -> None:
        self._before: CpuTicks | None = None
        self._timer: threading.Timer | None = None

    def start_at(self, wall_ns: int | None) -> None:
        """Take the first reading at ``wall_ns`` (ns since the epoch; None: now)."""
        delay = 0.0 if wall_ns is None else max((wall_ns - time.time_ns()) / 1e9, 0.0)
        self._timer = threading.Timer(delay, self._read_start)
        self._timer.daemon = True
        self._timer.start()

    def _read_start(self) -> None:
        self._before = read_ticks()

    def stop(self) -> dict[str, Any] | None:
        """``{"busyPct", "cores"}`` over the window, or None when it cannot be told."""
        if self._timer is not None:
            self._timer.cancel()
        after = read_ticks()
        if self._before is None or after is None:
            return None
        share = busy_share(self._before, after)
        if share is None:
            return None
        return {"busyPct": round(share * 100, 1), "cores": os.cpu_count() or 1}
