"""The acceptance run's generators and merge: each generator's throughput and CPU, the merged
figure, and the checks that the merge loses nothing and counts nothing twice.

Server: ``tfsdeploy.loadtest.fakeserver`` (no protobuf work per request; it counts every request
it receives and prints the count when it stops). Generators: ``fab accept``'s own, started the
way ``fab accept`` starts them (this machine's runner, the same argument lists, a common start
instant, per-second histograms, raw results), 1 then 2 (``--generators``) at once, each closed
loop (as fast as its workers go) unless ``--rate`` gives each an open-loop rate. Results are
merged with ``tfsdeploy.accept.merge`` and checked:

- merged count == sum of the generators' counts;
- requests the server received == merged count + the generators' warm-up requests;
- sum of the per-second counts == merged count; the per-second histograms add up to the
  merged histogram, bucket for bucket.

Run: ``/var/cache/tfsdeploy/venv/bin/python benchmarks/bench_accept.py [--seconds 5]``. On a
machine with free cores the per-generator figures show how the load scales with generators
(each generator process is one asyncio loop, about one core at most); on a busy 2-core machine
only the checks are meaningful. Exits 1 when a check fails.
"""

from __future__ import annotations

import argparse
import os
import re
import signal
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from tfsdeploy.accept import commands, loadgen
from tfsdeploy.accept.merge import FleetMerge, GeneratorOutcome, merge_fleet
from tfsdeploy.accept.plan import GeneratorSpec
from tfsdeploy.core.tfserving import tfrecord
from tfsdeploy.loadtest import payloads, stats

SRC = str(Path(__file__).resolve().parents[1] / "src")


def request_file() -> bytes:
    """The Predict request every generator sends (half_plus_two, x = [[1.0], [2.0]])."""
    request = payloads.request_from_json({"inputs": {"x": [[1.0], [2.0]]}}, {})
    body = payloads.build_payloads([request], payloads.RequestSpec(model="half_plus_two"),
                                   rest=False).grpc[0]
    return tfrecord.frame_record(body)


def start_server() -> tuple[subprocess.Popen[str], str]:
    proc = subprocess.Popen([sys.executable, "-m", "tfsdeploy.loadtest.fakeserver"],
                            stdout=subprocess.PIPE, text=True,
                            env={**os.environ, "PYTHONPATH": SRC})
    assert proc.stdout is not None
    port = re.search(r"grpc=(\d+)", proc.stdout.readline())
    assert port, "the fake server did not start"
    return proc, f"127.0.0.1:{port.group(1)}"


def stop_server(proc: subprocess.Popen[str]) -> int:
    """Stop it; the number of requests it received."""
    proc.send_signal(signal.SIGTERM)
    out, _ = proc.communicate(timeout=30)
    found = re.search(r"served=(\d+)", out)
    assert found, out
    return int(found.group(1))


def run_generators(count: int, args: argparse.Namespace
                   ) -> tuple[list[GeneratorOutcome], int]:
    """``count`` generators at once against a fresh server; their outcomes and the server's
    count of requests received."""
    server, target = start_server()
    gens = [loadgen.prepare_local(GeneratorSpec(f"gen{i + 1}", None, args.rate), request_file())
            for i in range(count)]
    start_at = time.time() + 3.0
    loads = [commands.LoadSpec(share_qps=args.rate, duration_s=args.seconds,
                               start_at_s=start_at, targets=(target,),
                               workers=args.concurrency, procs=1, connections=1,
                               timeout_s=10.0, warmup=args.warmup, name=g.name)
             for g in gens]
    try:
        with ThreadPoolExecutor(max_workers=count) as pool:
            futures = [pool.submit(loadgen.run_generator, g,
                                   commands.generator(sys.executable, g.files, load),
                                   timeout_s=args.seconds + 60, start_at_s=start_at)
                       for g, load in zip(gens, loads, strict=True)]
            outcomes = [f.result() for f in futures]
    finally:
        for gen in gens:
            loadgen.cleanup(gen)
        served = stop_server(server)
    for outcome, load in zip(outcomes, loads, strict=True):
        outcome.procs, outcome.warmup = 1, load.warmup
    return outcomes, served


def checks(merged: FleetMerge, outcomes: list[GeneratorOutcome], served: int) -> list[str]:
    """Every way the merge could lose or double-count a request; the failures."""
    fleet = merged.fleet
    if fleet is None or any(not o.measured for o in outcomes):
        return ["a generator returned no results: " + "; ".join(o.error for o in outcomes)]
    warmups = sum(o.warmup for o in outcomes)
    failed = []
    if merged.count != merged.generator_count_sum:
        failed.append(f"merged {merged.count} != sum of generators {merged.generator_count_sum}")
    if served != merged.count + warmups:
        failed.append(f"server received {served} != merged {merged.count} + warm-up {warmups}")
    if sum(c for c, _ in fleet.per_second.values()) != merged.count:
        failed.append("per-second counts do not add up to the merged count")
    seconds = stats.merge_histograms(fleet.interval_hists.values())
    if list(seconds.counts) != list(fleet.ok_hist.counts):
        failed.append("per-second histograms do not add up to the merged histogram")
    return failed


def report(count: int, outcomes: list[GeneratorOutcome], merged: FleetMerge,
           served: int) -> list[str]:
    """Print one block of figures; return the failed checks."""
    print(f"-- {count} generator(s) at once")
    for outcome in outcomes:
        own = merged.generators.get(outcome.name)
        if own is None:
            print(f"  {outcome.name}: {outcome.status}: {outcome.error}")
            continue
        cpu = own.cpu_user_s + own.cpu_system_s
        print(f"  {outcome.name}: {own.count:7d} requests, {own.count / own.wall_s:7.0f} req/s, "
              f"CPU {cpu:5.2f} s ({cpu / own.wall_s:4.2f} cores, "
              f"{own.count / max(cpu, 1e-9):6.0f} req per CPU-s), late sends {own.late_sends} "
              f"(own lag {own.own_late_sends}, worst {own.max_send_lag_ns / 1e6:.0f} ms)")
    fleet = merged.fleet
    if fleet is not None:
        print(f"  merged: {merged.count:7d} requests, {merged.count / fleet.wall_s:7.0f} req/s, "
              f"p50 {stats.percentile_ns(fleet.ok_hist, 50) / 1e6:.2f} ms, "
              f"p99 {stats.percentile_ns(fleet.ok_hist, 99) / 1e6:.2f} ms; server received "
              f"{served} (warm-up {sum(o.warmup for o in outcomes)})")
    failed = checks(merged, outcomes, served)
    for line in failed:
        print(f"  CHECK FAILED: {line}")
    if not failed:
        print("  checks: merged = sum of generators = server's count - warm-up; per-second "
              "counts and histograms add up to the merge")
    return failed


def main() -> int:
    """Run each generator count once and print the figures."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--generators", default="1,2", help="counts to run, e.g. 1,2,4")
    parser.add_argument("--rate", type=float, default=0.0,
                        help="open-loop rate per generator (0: closed loop, as fast as it goes)")
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--warmup", type=int, default=10)
    args = parser.parse_args()
    print(f"machine: {os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f}; "
          f"{args.seconds:g} s per run, concurrency {args.concurrency} per generator, "
          + (f"{args.rate:g} req/s each (open loop)" if args.rate else "closed loop"))
    failed = []
    for count in (int(c) for c in args.generators.split(",")):
        outcomes, served = run_generators(count, args)
        failed += report(count, outcomes, merge_fleet(outcomes), served)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
