"""Speed of the load generator: client cost per request, and scaling over processes.

Server: ``tfsdeploy.loadtest.fakeserver`` (a grpc.aio PredictionService answering a fixed
PredictResponse with no protobuf work and no delay) in its own process(es), so the figures are
about the client. Measures, each for ``--seconds``:

1. a bare grpc.aio loop (``c`` coroutines awaiting the same pre-serialized Predict request on
   one channel) in its own process: requests per client CPU-second;
2. the load generator, 1 process, same concurrency and request: requests per client
   CPU-second; target >= 90% of (1);
3. the load generator with 2 processes: wall throughput relative to 1 process (target >= 1.8x
   when the machine has cores to spare) and per-core efficiency relative to 1 process.

Run: ``/var/cache/tfsdeploy/venv/bin/python benchmarks/bench_loadtest.py [--seconds 3]``.
On a machine where client and server share 2 cores, the wall-clock scaling is bounded by the
server and the shared cores; the per-core figure then shows whether a second process costs
extra CPU per request.
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from tfsdeploy.core.tfserving.api import PREDICT_METHOD
from tfsdeploy.loadtest import engine, payloads, stats
from tfsdeploy.loadtest.engine import ProcPlan
from tfsdeploy.loadtest.parallel import run_processes
from tfsdeploy.loadtest.schedule import Schedule


def request_body() -> bytes:
    """The Predict request every client sends (half_plus_two, x = [[1.0], [2.0]])."""
    request = payloads.request_from_json({"inputs": {"x": [[1.0], [2.0]]}}, {})
    return payloads.build_payloads([request], payloads.RequestSpec(model="half_plus_two"),
                                   rest=False).grpc[0]


def start_servers(count: int) -> tuple[list[subprocess.Popen[str]], list[str]]:
    """``count`` fake servers (separate processes, separate ports)."""
    procs, targets = [], []
    for _ in range(count):
        proc = subprocess.Popen([sys.executable, "-m", "tfsdeploy.loadtest.fakeserver"],
                                stdout=subprocess.PIPE, text=True)
        assert proc.stdout is not None
        line = proc.stdout.readline()
        procs.append(proc)
        targets.append("127.0.0.1:" + line.split()[1].split("=")[1])
    return procs, targets


async def _bare_loop(target: str, body: bytes, concurrency: int, seconds: float) -> int:
    import grpc.aio

    async with grpc.aio.insecure_channel(target) as channel:
        call = channel.unary_unary(PREDICT_METHOD)
        await channel.channel_ready()
        end = time.perf_counter() + seconds
        count = 0

        async def worker() -> None:
            nonlocal count
            while time.perf_counter() < end:
                await call(body, timeout=20)
                count += 1

        await asyncio.gather(*(worker() for _ in range(concurrency)))
        return count


def _bare_child(target: str, body: bytes, concurrency: int, seconds: float,
                out: Any) -> None:
    t0, c0 = time.perf_counter(), os.times()
    count = asyncio.run(_bare_loop(target, body, concurrency, seconds))
    c1 = os.times()
    out.send((count, time.perf_counter() - t0, (c1.user - c0.user) + (c1.system - c0.system)))


def bare(target: str, body: bytes, concurrency: int, seconds: float) -> tuple[float, float]:
    """(requests/s, requests per CPU-second) of the bare loop, run in its own process."""
    ctx = multiprocessing.get_context("spawn")
    parent, child = ctx.Pipe()
    proc = ctx.Process(target=_bare_child, args=(target, body, concurrency, seconds, child))
    proc.start()
    count, wall, cpu = parent.recv()
    proc.join()
    return count / wall, count / cpu


def _ours_child(targets: list[str], body: bytes, concurrency: int, seconds: float,
                procs: int, out: Any) -> None:
    plan = ProcPlan(targets=tuple(targets), grpc_bodies=(body,),
                    concurrency=Schedule("const", concurrency), max_workers=concurrency,
                    duration_s=seconds, connections=max(procs, len(targets)))
    merged = stats.merge_results(run_processes(plan, procs))
    cpu = merged.cpu_user_s + merged.cpu_system_s
    out.send((merged.count / merged.wall_s, merged.count / cpu))


def ours(targets: list[str], body: bytes, concurrency: int, seconds: float,
         procs: int) -> tuple[float, float]:
    """(requests/s, requests per CPU-second) of the load generator, from a fresh process like
    the bare loop (with procs > 1 that process starts the worker processes)."""
    ctx = multiprocessing.get_context("spawn")
    parent, child = ctx.Pipe()
    proc = ctx.Process(target=_ours_child,
                       args=(targets, body, concurrency, seconds, procs, child))
    proc.start()
    result: tuple[float, float] = parent.recv()
    proc.join()
    return result


def bookkeeping_us(requests: int = 200_000, concurrency: int = 32) -> float:
    """CPU microseconds the load generator adds per request beyond a bare await loop.

    Both loops await a no-op "send" (no network), so the difference is the generator's own
    work (request accounting, clock reads, HdrHistogram record, counters). Deterministic
    enough to read on a busy machine, unlike the end-to-end ratio.
    """

    async def noop(body: bytes) -> bytes:
        return body

    async def bare_loop() -> float:
        count = 0

        async def worker() -> None:
            nonlocal count
            while count < requests:
                count += 1
                await noop(b"x")

        start = time.process_time()
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        return time.process_time() - start

    async def our_loop() -> float:
        plan = ProcPlan(targets=("127.0.0.1:1",), grpc_bodies=(b"x",), total=requests,
                        max_workers=concurrency, concurrency=Schedule("const", concurrency))
        run = engine._Run(plan, stats.Recorder(keep_service_time=False), time.perf_counter_ns())
        start = time.process_time()
        await asyncio.gather(*(engine._send_closed(run, g, noop, (b"x",))
                               for g in range(concurrency)))
        return time.process_time() - start

    return (asyncio.run(our_loop()) - asyncio.run(bare_loop())) / requests * 1e6


def _median(pairs: list[tuple[float, float]]) -> tuple[float, float]:
    """Median of each figure over the repeats."""
    return (statistics.median(p[0] for p in pairs), statistics.median(p[1] for p in pairs))


def _ratios(top: list[tuple[float, float]], bottom: list[tuple[float, float]],
            index: int) -> str:
    """Median (min-max) of the pairwise ratios top/bottom of one figure, in percent."""
    values = sorted(t[index] / b[index] * 100 for t, b in zip(top, bottom, strict=True))
    return f"{statistics.median(values):5.1f}% (range {values[0]:.0f}-{values[-1]:.0f}%)"


def _print(args: argparse.Namespace, runs: dict[str, list[tuple[float, float]]]) -> None:
    (b_rps, b_core), (o_rps, o_core), (t_rps, t_core) = (
        _median(runs[k]) for k in ("bare", "one", "two"))
    print(f"machine: {os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f}; server: "
          f"{args.servers} fake server process(es); concurrency {args.concurrency}; "
          f"median of {args.repeat} x {args.seconds:g} s")
    print(f"bare grpc.aio loop     : {b_rps:8.0f} req/s  {b_core:8.0f} req per client CPU-s")
    print(f"loadtest, 1 process    : {o_rps:8.0f} req/s  {o_core:8.0f} req per client CPU-s")
    print(f"loadtest, 2 processes  : {t_rps:8.0f} req/s  {t_core:8.0f} req per client CPU-s")
    print(f"per client core, loadtest / bare      : {_ratios(runs['one'], runs['bare'], 1)}"
          "  (target >= 90%)")
    print(f"wall throughput, 2 procs / 1 proc     : {_ratios(runs['two'], runs['one'], 0)}"
          "  (target >= 180%)")
    print(f"per client core, 2 procs / 1 proc     : {_ratios(runs['two'], runs['one'], 1)}")
    cores = os.cpu_count() or 1
    if cores < 4:
        print(f"  note: {cores} cores; two client processes plus a server that needs about a core "
              "of its own cannot show the 1 -> 2 process scaling here (needs >= 4 cores)")
    extra = bookkeeping_us()
    per_request = 1e6 / b_core
    print(f"bookkeeping added per request (no network): {extra:.2f} us of CPU; with the bare "
          f"loop's {per_request:.0f} us per request that bounds loadtest/bare per core at "
          f"{per_request / (per_request + extra) * 100:.1f}%")


def main() -> int:
    """Run the three measurements and print them."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--servers", type=int, default=1,
                        help="fake server processes (load spread over them)")
    args = parser.parse_args()
    servers, targets = start_servers(args.servers)
    body = request_body()
    runs: dict[str, list[tuple[float, float]]] = {"bare": [], "one": [], "two": []}
    try:
        ours(targets, body, 4, 0.5, 1)  # warm the server
        for i in range(args.repeat):
            # pairs back to back, order alternating, so drifting background load hits both
            order = ["bare", "one", "two"] if i % 2 == 0 else ["two", "one", "bare"]
            for kind in order:
                runs[kind].append(
                    bare(targets[0], body, args.concurrency, args.seconds) if kind == "bare"
                    else ours(targets if kind == "two" else targets[:1], body,
                              args.concurrency, args.seconds, 2 if kind == "two" else 1))
    finally:
        for proc in servers:
            proc.terminate()
            proc.wait(timeout=5)
    _print(args, runs)
    return 0


if __name__ == "__main__":
    sys.exit(main())
