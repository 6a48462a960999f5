"""The canary judge's rates on the local testbed beside a CPU hog (scripts/testbed up first).

Model ``cnrybench`` (port offset 5700) on tb1..tb3, tb1 the canary host; its versions are
the testbed's canary variants (scripts/make-models --only half_plus_two_bad), which all answer
as half_plus_two/2 (the prediction comparison passes) and differ only in the time each request
sleeps in the graph:

  v1 and v2: 40 ms (half_plus_two_bad/22): v2 is a release exactly as fast as v1
  v3: 50 ms (half_plus_two_bad/23): 25 % slower per request
  v4: 42 ms (half_plus_two_bad/24): 5 % slower, below the default +10 % allowed

v1 is deployed, then each canary is `fab deploy --version V --canary-weights 25 --step-s S
--pause` under the DEFAULT judging policy (thresholds, critical metrics, scores, min_requests;
only the weights, the step's length and a 30-request comparison are set), with two
independent clients sending requests to tb1's stable port and ``--hog`` busy processes on
this machine (the testbed's hosts share its cores). A canary that passes pauses (exit 6) and
is aborted; one that fails is restored by the deploy (exit 2). Printed: each canary's verdict,
score and latency effect [98 % interval] p-value, then per release the share that passed,
and whether the expectation holds (v2: 10/10 pass, v3: 10/10 fail in the first step, v4:
pass). The failed-request count of the clients is printed too (must be 0).

    python benchmarks/bench_canary.py [--same 10] [--slower 10]
        [--five 5] [--step-s 20] [--hog 2] [--keep]

Exit 0 when every expectation held, 1 otherwise (the rates are the figures to read).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests" / "integration"))
sys.path.insert(0, str(REPO / "src"))

from deploy_support import (  # noqa: E402
    Fleet,
    Traffic,
    assemble_source,
    assert_ports_free,
    write_inventory,
)
from testbed_support import HOSTS, clean_model, ensure_fleet  # noqa: E402

MODEL, OFFSET = "cnrybench", 5700
VERSIONS = {1: ("half_plus_two_bad", 22), 2: ("half_plus_two_bad", 22),
            3: ("half_plus_two_bad", 23), 4: ("half_plus_two_bad", 24)}
WHAT = {2: "as fast (40 ms)", 3: "25% slower (50 ms)", 4: "5% slower (42 ms)"}
POLICY = ("CanaryPolicy(weights=(25,), step_s={step_s}, "
          "comparison=ComparisonPolicy(samples=30))")


def make_fleet(tmp: Path, step_s: float) -> Fleet:
    """The model's source, golden file and inventory (the default canary policy but for
    the weights, the step and the comparison's sample)."""
    source, golden = assemble_source(tmp, VERSIONS)
    inventory = write_inventory(tmp / "inventory.py", model=MODEL, source=source,
                                golden=golden, offset=OFFSET, serial=(1, "100%"),
                                warmup_p99_ms=5000.0)
    text = inventory.read_text().replace(
        "from tfsdeploy.core.inventory.catalog import",
        "from tfsdeploy.core.inventory.canary_policy import CanaryPolicy, ComparisonPolicy\n"
        "from tfsdeploy.core.inventory.catalog import").replace(
        "Rollout(", "Rollout(canary=" + POLICY.format(step_s=step_s) + ", ", 1)
    inventory.write_text(text)
    return Fleet(model=MODEL, offset=OFFSET, tmp=tmp, source=source, golden=golden,
                 inventory=inventory, hosts=dict(HOSTS))


def hog(count: int) -> list[subprocess.Popen[bytes]]:
    """``count`` processes that keep a core busy each."""
    return [subprocess.Popen([sys.executable, "-c", "while True: pass"])
            for _ in range(count)]


def canary(fleet: Fleet, version: int, step_s: float) -> dict[str, Any]:
    """One canary of ``version`` against v1: its verdict, score, latency and seconds; a
    paused (passing) one is aborted."""
    started = time.monotonic()
    run = fleet.fab("deploy", "--version", str(version), "--pause", "--json", timeout=900)
    seconds = time.monotonic() - started
    result = json.loads(run.stdout) if run.stdout.strip().startswith("{") else {}
    steps = ((result.get("hosts", {}).get("tb1") or {}).get("canary") or {}).get("steps") or []
    if run.code == 6:
        aborted = fleet.fab("abort")
        if aborted.code != 0:
            raise SystemExit(f"abort failed:\n{aborted.describe()}")
    elif run.code != 2:
        raise SystemExit(f"canary of v{version} ended in {run.code}:\n{run.describe()}")
    last = steps[-1] if steps else {}
    metrics = {m["metric"]: m for m in last.get("metrics") or []}
    return {"version": version, "passed": run.code == 6, "seconds": seconds,
            "verdict": last.get("verdict", "?"), "score": last.get("score"),
            "steps": len(steps), "latency": metrics.get("latency"),
            "p99": metrics.get("p99"), "failed": [m for m, d in metrics.items()
                                                  if d["classification"] == "high"]}


def percent(value: float | None) -> str:
    return "   n/a" if value is None else f"{value * 100:+6.1f}%"


def line(row: dict[str, Any]) -> str:
    latency = row["latency"] or {}
    interval = f"[{percent(latency.get('low'))}, {percent(latency.get('high'))}]"
    p_value = latency.get("p_value")
    p_text = "-" if p_value is None else f"{p_value:.2g}" if p_value else "0"
    score = "-" if row["score"] is None else f"{row['score']:g}"
    return (f"  v{row['version']} {'pass' if row['passed'] else 'FAIL':4} "
            f"{row['verdict']:<12} score {score:>6}"
            f"  latency {percent(latency.get('effect'))} {interval} p={p_text:<8}"
            f"  high: {','.join(row['failed']) or '-':<16} {row['seconds']:5.1f} s")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--same", type=int, default=10, help="canaries of an as-fast release")
    parser.add_argument("--slower", type=int, default=10, help="canaries 25%% slower")
    parser.add_argument("--five", type=int, default=5, help="canaries 5%% slower")
    parser.add_argument("--step-s", type=float, default=20.0)
    parser.add_argument("--hog", type=int, default=2, help="busy processes beside the fleet")
    parser.add_argument("--keep", action="store_true", help="leave the model on the fleet")
    args = parser.parse_args()
    ensure_fleet()
    clean_model(MODEL)
    assert_ports_free(OFFSET)
    fleet = make_fleet(Path(tempfile.mkdtemp(prefix="bench-canary-")), args.step_s)
    plan = [2] * args.same + [3] * args.slower + [4] * args.five
    rows: list[dict[str, Any]] = []
    hogs: list[subprocess.Popen[bytes]] = []
    failures: list[str] = []
    try:
        fleet.deploy(1)
        hogs = hog(args.hog)
        with Traffic(fleet, "tb1") as first, Traffic(fleet, "tb1") as second:
            print(f"canaries of {MODEL} on tb1 at 25% for {args.step_s:g} s, v1 = 40 ms, "
                  f"{args.hog} CPU hog(s), 2 clients")
            for version in plan:
                rows.append(canary(fleet, version, args.step_s))
                print(line(rows[-1]), flush=True)
            failures = first.failures + second.failures
            answered = first.ok + second.ok
    finally:
        for process in hogs:
            process.kill()
            process.wait()
        if not args.keep:
            clean_model(MODEL)
    print(f"\nclients: {answered} requests answered, {len(failures)} failed"
          + (f" (first: {failures[0]})" if failures else ""))
    ok = not failures
    for version, expected in ((2, "pass"), (3, "fail"), (4, "pass")):
        chosen = [r for r in rows if r["version"] == version]
        if not chosen:
            continue
        passed = sum(r["passed"] for r in chosen)
        rate = f"{passed}/{len(chosen)} passed"
        held = passed == len(chosen) if expected == "pass" else (
            passed == 0 and all(r["steps"] == 1 and "latency" in r["failed"] for r in chosen))
        ok &= held
        print(f"v{version} {WHAT[version]:<20} {rate:<12} expected: every one "
              f"{'passes' if expected == 'pass' else 'fails on latency in its first step'}"
              f" -> {'held' if held else 'NOT HELD'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
