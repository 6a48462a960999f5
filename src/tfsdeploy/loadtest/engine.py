"""The load loop of one worker process (grpc.aio or REST, closed or open loop).

Closed loop (no rate): each of the process's workers sends a request, waits for the answer,
sends the next. Latency is measured from the actual send.

Paced (a rate is set): the schedule gives every request an intended send time; the k-th
request overall is handled by process ``k % procs``. A free worker takes the next due request,
sleeps until its intended time and sends it. In open-loop mode latency is measured from the
intended time, so time spent waiting for a free worker (because the server stalled) is counted;
in ``closed_loop`` pacing it is measured from the actual send, as ghz does.

Several processes start their measured window at the same instant (``start_ns`` from the
parent, on the system-wide monotonic clock), after their own warm-up requests.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import os
import signal
import time
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from tfsdeploy.loadtest import stats
from tfsdeploy.loadtest.schedule import Schedule, split_count, tick_times
from tfsdeploy.loadtest.transport import (
    RestConnection,
    Sender,
    close_grpc_channels,
    describe_error,
    grpc_sender,
    open_grpc_channels,
    split_target,
)

NS = 1_000_000_000
DURATION_STOPS = ("wait", "close", "ignore")
LATE_NS = 10_000_000  # a paced request sent 10 ms late: no worker was free, or the loop lagged


@dataclass(frozen=True)
class ProcPlan:
    """Everything one worker process needs; picklable, built by the parent."""

    targets: tuple[str, ...]
    grpc_bodies: tuple[bytes, ...]
    rest_bodies: tuple[tuple[str, bytes], ...] = ()
    transport: str = "grpc"
    concurrency: Schedule = field(default_factory=lambda: Schedule("const", 50))
    max_workers: int = 50  # global cap of the concurrency schedule
    rate: Schedule | None = None
    open_loop: bool = True
    total: int = 0  # global; 0 = no limit
    duration_s: float = 0.0  # 0 = no limit
    warmup: int = 0  # global
    connections: int = 1  # global
    timeout_s: float = 20.0
    connect_timeout_s: float = 10.0
    duration_stop: str = "wait"
    proc_index: int = 0
    procs: int = 1
    details: int = 0
    max_message_bytes: int = 64 * 1024 * 1024
    interval_histograms: bool = False  # also keep one OK-latency histogram per second

    def local_workers(self) -> list[int]:
        """Global ids of the workers this process runs (worker g lives in process g % procs)."""
        return list(range(self.proc_index, self.max_workers, self.procs))

    def local_connections(self) -> list[str]:
        """Target of each of this process's gRPC connections (every target at least once)."""
        share = math.ceil(self.connections / self.procs)
        count = max(share, len(self.targets))
        return [self.targets[(self.proc_index + j) % len(self.targets)] for j in range(count)]


class _Run:
    """Shared state of the workers of one process during the measured window."""

    def __init__(self, plan: ProcPlan, recorder: stats.Recorder, start_ns: int) -> None:
        self.plan = plan
        self.rec = recorder
        self.start_ns = start_ns
        self.stop_ns = start_ns + int(plan.duration_s * NS) if plan.duration_s > 0 else 0
        self.running = True
        self.cancelled = False
        self.remaining = (split_count(plan.total, plan.procs, plan.proc_index)
                          if plan.total else -1)
        self.ticks = self._local_ticks() if plan.rate is not None else None
        self.late_sends = 0  # paced requests sent more than LATE_NS after their time
        # ... of which a worker was free before the intended time: the loop itself woke late
        # (a saturated or starved client), not a wait for a worker (a slow server)
        self.own_late_sends = 0
        self.max_own_lag_ns = 0

    def _local_ticks(self) -> Iterator[int]:
        """Intended send times (ns) of this process's share of the paced requests."""
        assert self.plan.rate is not None
        for index, t in enumerate(tick_times(self.plan.rate)):
            if self.plan.total and index >= self.plan.total:
                return
            due = self.start_ns + int(t * NS)
            if self.stop_ns and due >= self.stop_ns:
                return
            if index % self.plan.procs == self.plan.proc_index:
                yield due

    def take(self) -> bool:
        """Claim one closed-loop request; False when the run is over."""
        if not self.running or self.remaining == 0:
            return False
        if self.remaining > 0:
            self.remaining -= 1
        return True

    def next_due(self) -> int | None:
        """Intended time of the next paced request, or None when the schedule is done."""
        if not self.running or self.ticks is None:
            return None
        return next(self.ticks, None)

    async def wait_active(self, worker: int) -> bool:
        """Sleep while the concurrency schedule has this worker switched off."""
        sched = self.plan.concurrency
        while self.running:
            now = time.perf_counter_ns()
            if worker < sched.value_at((now - self.start_ns) / NS):
                return True
            await asyncio.sleep(0.05)
        return False


async def _send_closed(run: _Run, worker: int, send: Sender, bodies: tuple[Any, ...]) -> None:
    """Closed-loop worker: send, wait, repeat."""
    rec = run.rec
    clock = time.perf_counter_ns
    dynamic = run.plan.concurrency.kind != "const"
    i = worker
    n = len(bodies)
    while True:
        if dynamic and not await run.wait_active(worker):
            return
        if not run.take():
            return
        body = bodies[i % n]
        i += 1
        sent = clock()
        try:
            await send(body)
        except asyncio.CancelledError:
            _record_cancelled(run, clock() - sent, clock())
            raise
        except Exception as err:  # every failure is a result, not a crash
            done = clock()
            rec.record_error(done - sent, done, *describe_error(err))
            continue
        done = clock()
        rec.record_ok(done - sent, done)


async def _send_paced(run: _Run, worker: int, send: Sender, bodies: tuple[Any, ...]) -> None:
    """Paced worker: take the next due request, wait for its time, send it."""
    rec = run.rec
    clock = time.perf_counter_ns
    dynamic = run.plan.concurrency.kind != "const"
    open_loop = run.plan.open_loop
    i = worker
    n = len(bodies)
    while True:
        if dynamic and not await run.wait_active(worker):
            return
        due = run.next_due()
        if due is None:
            return
        taken = clock()
        delay = due - taken
        if delay > 0:
            await asyncio.sleep(delay / NS)
        body = bodies[i % n]
        i += 1
        sent = clock()
        lag = sent - due
        if lag > LATE_NS:
            run.late_sends += 1
            if delay >= 0:  # free in time, yet sent late: this client's own lag
                run.own_late_sends += 1
                run.max_own_lag_ns = max(run.max_own_lag_ns, lag)
        origin = due if open_loop else sent
        try:
            await send(body)
        except asyncio.CancelledError:
            _record_cancelled(run, clock() - origin, clock())
            raise
        except Exception as err:
            done = clock()
            rec.record_error(done - origin, done, *describe_error(err))
            continue
        done = clock()
        rec.record_ok(done - origin, done)
        if open_loop:
            rec.record_service_time(done - sent)


def _record_cancelled(run: _Run, latency_ns: int, done_ns: int) -> None:
    """A request cut at the end of the run: an error with ``close`` (as ghz), else dropped."""
    if run.plan.duration_stop == "close":
        run.rec.record_error(latency_ns, done_ns, *describe_error(asyncio.CancelledError()))


# -- per-process driver -------------------------------------------------------------------------

@dataclass
class _Senders:
    """One sender per local worker, plus what must be closed afterwards."""

    per_worker: list[Sender]
    bodies: tuple[Any, ...]
    close: Callable[[], Awaitable[None]]


async def _grpc_senders(plan: ProcPlan, workers: list[int]) -> _Senders:
    channels = await open_grpc_channels(
        plan.local_connections(), max_message_bytes=plan.max_message_bytes,
        connect_timeout_s=plan.connect_timeout_s)
    calls = [grpc_sender(c, plan.timeout_s) for c in channels]
    per_worker = [calls[j % len(calls)] for j in range(len(workers))]
    return _Senders(per_worker, plan.grpc_bodies, lambda: close_grpc_channels(channels))


async def _rest_senders(plan: ProcPlan, workers: list[int]) -> _Senders:
    conns = []
    for g in workers:
        host, port = split_target(plan.targets[g % len(plan.targets)])
        conns.append(RestConnection(host, port, plan.timeout_s))

    def bind(conn: RestConnection) -> Sender:
        return lambda item: conn.post(*item)

    async def close() -> None:
        for conn in conns:
            conn.close()

    # connect all first so that an unreachable target fails before the run, as with gRPC
    await asyncio.wait_for(asyncio.gather(*(c._connect() for c in conns)),
                           plan.connect_timeout_s)
    return _Senders([bind(c) for c in conns], plan.rest_bodies, close)


async def _warm_up(plan: ProcPlan, senders: _Senders, workers: list[int]) -> None:
    """Send this process's share of warm-up requests, closed loop, unrecorded."""
    share = split_count(plan.warmup, plan.procs, plan.proc_index)
    if share <= 0:
        return
    left = [share]

    async def one(send: Sender, offset: int) -> None:
        while left[0] > 0:
            left[0] -= 1
            # warm-up failures are not part of the results
            with contextlib.suppress(Exception):
                await send(senders.bodies[(offset + left[0]) % len(senders.bodies)])

    await asyncio.gather(*(one(s, j) for j, s in enumerate(senders.per_worker[:share])))


async def _measured(plan: ProcPlan, senders: _Senders, workers: list[int],
                    start_ns: int) -> stats.ProcResult:
    """The measured window: from ``start_ns`` until the schedule, count or duration ends."""
    rec = stats.Recorder(keep_service_time=plan.rate is not None and plan.open_loop,
                         keep_details=plan.details, intervals=plan.interval_histograms)
    rec.origin_ns = start_ns
    run = _Run(plan, rec, start_ns)
    loop_fn = _send_paced if plan.rate is not None else _send_closed
    delay = start_ns - time.perf_counter_ns()
    if delay > 0:
        await asyncio.sleep(delay / NS)
    cpu0 = os.times()
    tasks = [asyncio.create_task(loop_fn(run, g, s, senders.bodies))
             for g, s in zip(workers, senders.per_worker, strict=True)]
    with _cancel_on_sigint(run, tasks):
        reason = await _wait_end(run, tasks)
    if run.cancelled:
        reason = "cancel"
    end_ns = time.perf_counter_ns()
    if run.stop_ns and plan.duration_stop != "wait":
        end_ns = min(end_ns, max(run.stop_ns, start_ns))
    cpu1 = os.times()
    return stats.finish(rec, start_ns=start_ns, end_ns=end_ns,
                        cpu_user_s=cpu1.user - cpu0.user, cpu_system_s=cpu1.system - cpu0.system,
                        end_reason=reason, late_sends=run.late_sends,
                        own_late_sends=run.own_late_sends, max_send_lag_ns=run.max_own_lag_ns)


@contextlib.contextmanager
def _cancel_on_sigint(run: _Run, tasks: list[asyncio.Task[None]]) -> Iterator[None]:
    """Ctrl-C ends the measured window early; what was measured is still reported."""

    def cancel() -> None:
        run.cancelled = True
        run.running = False
        for task in tasks:
            task.cancel()

    loop = asyncio.get_running_loop()
    previous = signal.getsignal(signal.SIGINT)
    try:
        loop.add_signal_handler(signal.SIGINT, cancel)
    except (NotImplementedError, RuntimeError, ValueError):  # not the main thread
        yield
        return
    try:
        yield
    finally:
        loop.remove_signal_handler(signal.SIGINT)
        signal.signal(signal.SIGINT, previous)


async def _wait_end(run: _Run, tasks: list[asyncio.Task[None]]) -> str:
    """Wait until the workers finish or the duration ends; apply the duration-stop rule."""
    timeout = None
    if run.stop_ns:
        timeout = max(run.stop_ns - time.perf_counter_ns(), 0) / NS
    _, pending = await asyncio.wait(tasks, timeout=timeout)
    if not pending:
        return "normal"
    run.running = False
    if run.plan.duration_stop != "wait":
        for task in pending:
            task.cancel()
    await asyncio.gather(*pending, return_exceptions=True)
    return "timeout"


async def run_process(plan: ProcPlan, ready: Callable[[], Awaitable[int]]) -> stats.ProcResult:
    """Connect, warm up, wait for the common start (``ready()`` returns it), run, report."""
    workers = plan.local_workers()
    make = _rest_senders if plan.transport == "rest" else _grpc_senders
    senders = await make(plan, workers)
    try:
        await _warm_up(plan, senders, workers)
        start_ns = await ready()
        return await _measured(plan, senders, workers, start_ns)
    finally:
        await senders.close()
