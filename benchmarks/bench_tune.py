"""`fab tune` on resnet50: what the recommended configuration gains over the catalog's.

    python benchmarks/bench_tune.py [--host tb1] [--model benchtune] [--offset 4750]
                                    [--budget 10m] [--step 8s] [--keep]

Deploys the testbed's resnet50 (its catalog entry of inventory/testbed.py, under the name
``--model`` and the port offset ``--offset``) on one testbed host, runs
``fab tune --model M --host H --budget B --step S --out DIR``, and prints each trial and the
recommended trial's QPS at the SLO against the catalog configuration's, both measured in the
same run (the catalog's is always the first trial). The recommendation is never worse than the
catalog's configuration (it is the catalog's unless another trial beats it by more than 5%).
The testbed's hosts share the machine's CPUs: the figures are this machine's, under whatever
else runs on it. Needs the fleet up (``scripts/testbed up``) and root; talks only to 10.87.0.x.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "integration"))

from deploy_support import assert_ports_free  # noqa: E402 - the test helpers live beside the tests
from testbed_support import (  # noqa: E402
    ADDRESSES,
    VENV_BIN,
    clean_model,
    ensure_fleet,
    fab_env,
    resnet50_inventory,
)


def fab(*args: str, timeout: float) -> subprocess.CompletedProcess[str]:
    """One fab command from the repository root (exits on failure)."""
    proc = subprocess.run([str(VENV_BIN / "fab"), *args], cwd=ROOT, env=fab_env(),
                          capture_output=True, text=True, timeout=timeout)
    if proc.returncode != 0:
        sys.exit(f"fab {' '.join(args[:1])} failed (exit {proc.returncode}):\n"
                 f"{proc.stdout[-4000:]}\n{proc.stderr[-3000:]}")
    return proc


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--host", default="tb1", choices=["tb1", "tb2", "tb3"])
    parser.add_argument("--model", default="benchtune")
    parser.add_argument("--offset", type=int, default=4750,
                        help="port offset of the model (stable ports 8500/8501 + offset)")
    parser.add_argument("--budget", default="10m", help="fab tune --budget")
    parser.add_argument("--step", default="8s", help="fab tune --step")
    parser.add_argument("--keep", action="store_true", help="leave the model on the host")
    args = parser.parse_args()
    hosts = {args.host: ADDRESSES[args.host]}
    ensure_fleet()
    clean_model(args.model, hosts)
    assert_ports_free(args.offset, hosts)
    try:
        with tempfile.TemporaryDirectory() as tmp:
            inventory = resnet50_inventory(Path(tmp) / "inventory.py", model=args.model,
                                           host=args.host, offset=args.offset)
            common = ("--model", args.model, "--inventory", str(inventory))
            fab("deploy", *common, "--version", "1", timeout=900)
            out = Path(tmp) / "tune"
            started = time.monotonic()
            run = fab("tune", *common, "--host", args.host, "--budget", args.budget,
                      "--step", args.step, "--out", str(out), timeout=7200)
            wall = time.monotonic() - started
            print(run.stdout)
            report(json.loads((out / "tune.json").read_text()), wall)
    finally:
        if not args.keep:
            clean_model(args.model, hosts)


def report(data: dict[str, object], wall: float) -> None:
    """The recommended trial's QPS at the SLO against the catalog configuration's."""
    trials = data["trials"]
    assert isinstance(trials, list)
    index = data["recommended"]
    current = trials[0]
    print(f"fab tune: {len(trials)} trials in {wall:.0f} s on {data['host']} "
          f"({data['host_cpus']} CPUs), SLO P99 {data['slo_p99_ms']} ms")
    if not isinstance(index, int):
        print("no trial met the SLO: nothing recommended")
        return
    best = trials[index]
    gain = best["qps"] / current["qps"] - 1 if current["meets_slo"] and current["qps"] else None
    print(f"catalog configuration (trial 0): {current['qps'] if current['meets_slo'] else 0:.1f}"
          f" QPS at the SLO, P99 {current['p99_ms']} ms ({current['label']})")
    print(f"recommended (trial {index}): {best['qps']:.1f} QPS at the SLO, P99 "
          f"{best['p99_ms']} ms ({best['label']})"
          + (f": {gain:+.0%} over the catalog's" if gain is not None else ""))


if __name__ == "__main__":
    main()
