"""Speed of `fab rollback` on the local testbed (scripts/testbed up first).

Deploys half_plus_two (as model `rbkbench`, port offset 900, its own copy of the versions)
v1 then v2 on tb1..tb3 with Rollout(serial=(1,), window_s=600), times `fab rollback` within
the window, then does the same with window_s=0 (the old release stopped) for a rollback beyond
the window. Prints, per rollback: total seconds (wall clock of the fab process and the
command's own figure), seconds in gates (sum of the gate_* steps over the hosts), and total
minus gates. Target: within the window, under 5 s for 3 hosts with serial 1, plus
gate time.

    python benchmarks/bench_rollback.py [--repeat N] [--keep]

Exit 0 when every rollback succeeded (the speed target is reported, not enforced); 1 when a
deploy or rollback failed.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests" / "integration"))
sys.path.insert(0, str(REPO / "src"))

from rollback_support import make_fleet, step_seconds  # noqa: E402
from testbed_support import HOSTS, clean_model, ensure_fleet  # noqa: E402

MODEL, OFFSET = "rbkbench", 900
TARGET_S = 5.0


def figures(fleet, run) -> dict[str, float]:  # type: ignore[no-untyped-def]
    result = json.loads((fleet.tmp / "rollback.json").read_text())
    gates = step_seconds(result)
    steps = {}
    for host in result["hosts"].values():
        for step in host["steps"]:
            steps[step["step"]] = steps.get(step["step"], 0.0) + step["seconds"]
    return {"wall": run.seconds, "total": result["seconds"], "gates": gates,
            "rest": result["seconds"] - gates, "steps": steps, "exit": result["exit_code"]}


def one(window_s: float, repeat: int, keep: bool) -> list[dict[str, float]]:
    clean_model(MODEL)
    fleet = make_fleet(Path(tempfile.mkdtemp(prefix="bench-rollback-")), MODEL, OFFSET,
                       window_s=window_s, serial=(1,), keep_releases=3 + 2 * repeat)
    rows = []
    try:
        fleet.deploy(1, fast=False)
        for _ in range(repeat):
            fleet.deploy(2, fast=False)
            run = fleet.fab("rollback", "--json-file", str(fleet.tmp / "rollback.json"))
            if run.code != 0:
                print(run.describe(), file=sys.stderr)
                raise SystemExit(1)
            fleet.assert_serving(1)
            rows.append(figures(fleet, run))
    finally:
        if not keep:
            clean_model(MODEL)
    return rows


def report(title: str, rows: list[dict[str, float]], target: bool) -> None:
    print(f"\n{title} (3 hosts {', '.join(HOSTS)}, serial 1)")
    print(f"  {'run':>3} {'wall s':>8} {'total s':>8} {'gates s':>8} {'total-gates s':>14}")
    for index, row in enumerate(rows, start=1):
        print(f"  {index:>3} {row['wall']:8.2f} {row['total']:8.2f} {row['gates']:8.2f} "
              f"{row['rest']:14.2f}")
    steps: dict[str, float] = {}
    for row in rows:
        for name, seconds in row["steps"].items():  # type: ignore[attr-defined]
            steps[name] = steps.get(name, 0.0) + seconds / len(rows)
    print("  mean seconds per step, summed over the hosts: " + ", ".join(
        f"{name} {seconds:.2f}" for name, seconds in sorted(steps.items(),
                                                             key=lambda kv: -kv[1])))
    if target:
        worst = max(row["rest"] for row in rows)
        verdict = "MET" if worst < TARGET_S else "MISSED"
        print(f"  target: total - gates < {TARGET_S:g} s -> {verdict} (worst {worst:.2f} s)")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeat", type=int, default=1, help="rollbacks timed per case")
    parser.add_argument("--keep", action="store_true", help="leave the model deployed")
    args = parser.parse_args()
    ensure_fleet()
    within = one(600.0, args.repeat, args.keep)
    report("rollback within the window (window_s=600: v1 still running)", within, True)
    beyond = one(0.0, args.repeat, args.keep)
    report("rollback beyond the window (window_s=0: v1 stopped, started again)", beyond,
           False)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
