"""Running the load from several worker processes and merging their results.

Each process runs its own asyncio loop and gRPC channels (Python's GIL caps one process at
about one core). Protocol over a pipe per child: the child connects and warms up, sends
``ready``; when all are ready the parent sends one common start instant (CLOCK_MONOTONIC is
system wide, so ``perf_counter_ns`` agrees across processes); each child returns a
``ProcResult`` with its encoded histograms, which the parent merges exactly.

Several generators on several machines (``fab accept``) start together at a wall-clock instant
given to each one (``start_at_ns``): each machine turns it into its own monotonic clock. A
generator not ready by then fails (``LateStart``) rather than start with a backlog of overdue
requests, which would count its own lateness as the fleet's latency.
"""

from __future__ import annotations

import asyncio
import multiprocessing
import multiprocessing.connection
import os
import signal
import time
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from tfsdeploy.loadtest import stats
from tfsdeploy.loadtest.engine import ProcPlan, run_process

START_DELAY_NS = 50_000_000  # slack between "all ready" and the common start


class WorkerFailed(RuntimeError):
    """A worker process could not run (bad target, crash)."""


class LateStart(WorkerFailed):
    """The generator was ready only after the common start instant it was given."""


def start_instant(start_at_ns: int | None, default_delay_ns: int) -> int:
    """The measured window's start on this machine's monotonic clock.

    ``start_at_ns`` is a wall-clock instant (ns since the epoch) shared by every generator;
    without it the window starts ``default_delay_ns`` from now.
    """
    now = time.perf_counter_ns()
    if start_at_ns is None:
        return now + default_delay_ns
    start = now + (start_at_ns - time.time_ns())
    if start < now:
        raise LateStart(f"ready {(now - start) / 1e9:.2f} s after the common start time "
                        "(--start-at): start the generators earlier")
    return start


def _child_main(conn: multiprocessing.connection.Connection, plan: ProcPlan) -> None:
    """Entry point of a worker process."""
    # Ctrl-C reaches the children through the parent (or the terminal's process group); it
    # only ends the measured window (engine), never kills a child before it reports
    signal.signal(signal.SIGINT, signal.SIG_IGN)

    async def ready() -> int:
        conn.send(("ready", None))
        loop = asyncio.get_running_loop()
        start_ns: int = await loop.run_in_executor(None, conn.recv)
        return start_ns

    try:
        result = asyncio.run(run_process(plan, ready))
    except KeyboardInterrupt:
        return
    except Exception as err:  # reported to the parent, which decides the exit code
        conn.send(("error", f"{type(err).__name__}: {err}"))
        return
    conn.send(("result", result))


def run_inline(plan: ProcPlan, start_at_ns: int | None = None) -> stats.ProcResult:
    """One process: run in this one (no fork, no pickling)."""

    async def ready() -> int:
        return start_instant(start_at_ns, START_DELAY_NS // 5)

    return asyncio.run(run_process(plan, ready))


def _receive(conns: Sequence[multiprocessing.connection.Connection], kind: str,
             procs: Sequence[multiprocessing.process.BaseProcess]) -> list[Any]:
    """One message of ``kind`` from every child, in order; raise on an error or a death."""
    out: list[Any] = [None] * len(conns)
    pending = set(range(len(conns)))
    while pending:
        ready = multiprocessing.connection.wait([conns[i] for i in pending], timeout=1.0)
        for item in ready:
            i = next(j for j in pending if conns[j] is item)
            try:
                tag, payload = conns[i].recv()
            except EOFError as err:
                raise WorkerFailed(f"worker {i} exited (code {procs[i].exitcode})") from err
            if tag == "error":
                raise WorkerFailed(f"worker {i}: {payload}")
            out[i] = payload
            pending.discard(i)
        for i in list(pending):
            if not procs[i].is_alive() and not conns[i].poll():
                raise WorkerFailed(f"worker {i} exited (code {procs[i].exitcode})")
    return out


def run_processes(plan: ProcPlan, procs: int,
                  start_at_ns: int | None = None) -> list[stats.ProcResult]:
    """Run ``plan`` split over ``procs`` worker processes; return each one's result.

    ``start_at_ns``: the wall-clock instant (ns since the epoch) the window starts at.
    """
    if procs <= 1:
        return [run_inline(replace(plan, proc_index=0, procs=1), start_at_ns)]
    ctx = multiprocessing.get_context("spawn")  # gRPC's core does not survive fork
    pipes = [ctx.Pipe() for _ in range(procs)]
    children = [ctx.Process(target=_child_main,
                            args=(child, replace(plan, proc_index=i, procs=procs)),
                            daemon=True, name=f"loadtest-{i}")
                for i, (_, child) in enumerate(pipes)]
    parents = [parent for parent, _ in pipes]
    for child in children:
        child.start()
    try:
        _receive(parents, "ready", children)
        start_ns = start_instant(start_at_ns, START_DELAY_NS)
        for conn in parents:
            conn.send(start_ns)
        try:
            results: list[stats.ProcResult] = _receive(parents, "result", children)
        except KeyboardInterrupt:
            # end the children's windows (they may have had the terminal's Ctrl-C already:
            # a second one is harmless) and report what they measured
            for child in children:
                if child.pid is not None and child.is_alive():
                    os.kill(child.pid, signal.SIGINT)
            results = _receive(parents, "result", children)
        return results
    finally:
        for child in children:
            child.join(timeout=5)
            if child.is_alive():
                child.terminate()
