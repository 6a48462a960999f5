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

from tfsdeploy.loadtest import payloads, stats
from tfsdeploy.loadtest.engine import ProcPlan
from tfsdeploy.loadtest.parallel import run_processes
from tfsdeploy.loadtest.protos import PREDICT_METHOD
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


def ours(targets: list[str], body: bytes, concurrency: int, seconds: float,
         procs: int) -> tuple[float, float]:
    """(requests/s, requests per CPU-second) of the load generator."""
    plan = ProcPlan(targets=tuple(targets), grpc_bodies=(body,),
                    concurrency=Schedule("const", concurrency), max_workers=concurrency,
                    duration_s=seconds, connections=max(procs, len(targets)))
    merged = stats.merge_results(run_processes(plan, procs))
    cpu = merged.cpu_user_s + merged.cpu_system_s
    return merged.count / merged.wall_s, merged.count / cpu


def _median(pairs: list[tuple[float, float]]) -> tuple[float, float]:
    """Median of each figure over the repeats."""
    return (statistics.median(p[0] for p in pairs), statistics.median(p[1] for p in pairs))


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
        for _ in range(args.repeat):  # interleaved, so drifting background load hits all three
            runs["bare"].append(bare(targets[0], body, args.concurrency, args.seconds))
            runs["one"].append(ours(targets[:1], body, args.concurrency, args.seconds, 1))
            runs["two"].append(ours(targets, body, args.concurrency, args.seconds, 2))
    finally:
        for proc in servers:
            proc.terminate()
            proc.wait(timeout=5)
    (b_rps, b_core), (o_rps, o_core), (t_rps, t_core) = (
        _median(runs[k]) for k in ("bare", "one", "two"))
    print(f"machine: {os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f}; server: "
          f"{args.servers} fake server process(es); concurrency {args.concurrency}; "
          f"median of {args.repeat} x {args.seconds:g} s")
    print(f"bare grpc.aio loop     : {b_rps:8.0f} req/s  {b_core:8.0f} req per client CPU-s")
    print(f"loadtest, 1 process    : {o_rps:8.0f} req/s  {o_core:8.0f} req per client CPU-s"
          f"  -> {o_core / b_core * 100:5.1f}% of bare per core (target >= 90%)")
    print(f"loadtest, 2 processes  : {t_rps:8.0f} req/s  {t_core:8.0f} req per client CPU-s"
          f"  -> wall {t_rps / o_rps:4.2f}x of 1 process (target >= 1.8x), "
          f"per-core {t_core / o_core * 100:5.1f}% of 1 process")
    return 0


if __name__ == "__main__":
    sys.exit(main())
