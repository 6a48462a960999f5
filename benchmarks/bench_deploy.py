"""Rolling-deploy speed on the local fleet: the toolkit's own overhead per host.

    python benchmarks/bench_deploy.py [--model benchdeploy] [--offset 1400] [--gpus N] [--keep]
                                      [--check]

Runs real deploys v1 -> v2 -> v1 of a small model (half_plus_two 1 and 2 under the name
``--model``) on the testbed with ``fab deploy --json``, and prints for each deploy and host:

- total: the sum of the host's step times (preflight, stage, roll, finalize);
- waits: time spent waiting on the server or on policy, not on the toolkit: the container
  start (``start_slot``), the model load (``gate_available``), ``gate_warmup``,
  ``gate_health`` (its minimum healthy time is policy) and ``drain_old``;
- overhead = total - waits (target: at most 0.6 s per host; with N instances per host, under 1 s
  per instance);
- with ``--gpus N`` (every host declared with N GPUs: one server per GPU, N instances rolled one
  after another on each host; the fleet needs them: ``scripts/testbed up --gpus N``), also the
  overhead per instance;

then the per-step table (seconds per host). ``retire_old`` (stopping the drained old release and
pruning) counts as the toolkit's own time: the stop has no grace period to wait out (TFServing
ignores SIGTERM, so the slot is drained first and stopped at once).
Needs the fleet up (``scripts/testbed up``) and root; talks only to 10.87.0.x.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "integration"))
sys.path.insert(0, str(ROOT / "src"))

from deploy_support import (  # noqa: E402 - the test helpers live beside the tests
    GOOD,
    assemble_source,
    assert_ports_free,
    write_inventory,
)
from testbed_support import STATE, VENV_BIN, clean_model, ensure_fleet, fab_env  # noqa: E402

WAITS = ("start_slot", "gate_available", "gate_warmup", "gate_health", "drain_old")
TARGET_S = 0.6  # per host of one instance (the toolkit overhead bar: <= 0.6 s per host)
INSTANCE_TARGET_S = 1.0  # per instance, when a host runs several


def deploy(model: str, inventory: Path, version: int) -> tuple[dict[str, Any], float]:
    """One ``fab deploy --json``; returns its result and wall time. Exits on failure."""
    argv = [str(VENV_BIN / "fab"), "deploy", "--model", model, "--inventory", str(inventory),
            "--version", str(version), "--json"]
    started = time.monotonic()
    proc = subprocess.run(argv, cwd=ROOT, env=fab_env(), capture_output=True, text=True,
                          timeout=900)
    wall = time.monotonic() - started
    if proc.returncode != 0:
        sys.exit(f"fab deploy v{version} failed (exit {proc.returncode}):\n"
                 f"{proc.stderr[-4000:]}\n{proc.stdout[-2000:]}")
    return json.loads(proc.stdout), wall


def fleet_short_of(gpus: int) -> str | None:
    """Which testbed hosts have fewer than ``gpus`` GPUs (None: none)."""
    hosts = json.loads((STATE / "hosts.json").read_text())["hosts"]
    short = [f"{h['name']} has {len(h['gpus'])}" for h in hosts if len(h["gpus"]) < gpus]
    return f"{gpus} GPUs per host wanted, but " + ", ".join(short) if short else None


def host_figures(outcome: dict[str, Any]) -> dict[str, float]:
    """total, waits, overhead (seconds) of one host's steps."""
    steps = outcome["steps"]
    total = sum(s["seconds"] for s in steps)
    waits = sum(s["seconds"] for s in steps if s["step"] in WAITS)
    return {"total": total, "waits": waits, "overhead": total - waits}


def host_target(instances: int) -> float:
    """The overhead target of a host running ``instances`` servers."""
    return TARGET_S if instances == 1 else instances * INSTANCE_TARGET_S


def print_deploy(label: str, result: dict[str, Any], wall: float,
                 target_s: float = TARGET_S) -> dict[str, dict[str, float]]:
    figures = {name: host_figures(o) for name, o in result["hosts"].items()}
    print(f"\n== {label}: release {result['release']}, {result['result']}, "
          f"wall {wall:.1f} s (deploy {result['seconds']:.1f} s)")
    print(f"  {'host':<6}{'status':<10}{'total':>8}{'waits':>8}{'overhead':>10}")
    for name, f in figures.items():
        flag = "" if f["overhead"] <= target_s else f"  (> {target_s:g} s target)"
        print(f"  {name:<6}{result['hosts'][name]['status']:<10}{f['total']:>7.2f}s"
              f"{f['waits']:>7.2f}s{f['overhead']:>9.2f}s{flag}")
    steps: list[str] = []
    for outcome in result["hosts"].values():
        for s in outcome["steps"]:
            if s["step"] not in steps:
                steps.append(s["step"])
    names = list(result["hosts"])
    print(f"  {'step':<16}" + "".join(f"{n:>8}" for n in names) + "   kind")
    for step in steps:
        cells = []
        for name in names:
            seconds = sum(s["seconds"] for s in result["hosts"][name]["steps"]
                          if s["step"] == step)
            cells.append(f"{seconds:>7.2f}s")
        kind = "wait" if step in WAITS else "toolkit"
        print(f"  {step:<16}" + "".join(cells) + f"   {kind}")
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="benchdeploy")
    parser.add_argument("--offset", type=int, default=1400,
                        help="port offset of the model (stable ports 8500/8501 + offset)")
    parser.add_argument("--gpus", type=int, default=1,
                        help="GPUs declared per host: one server instance per GPU")
    parser.add_argument("--keep", action="store_true", help="leave the model on the hosts")
    parser.add_argument("--check", action="store_true",
                        help=f"exit 1 when the median overhead per host is above {TARGET_S:g} s")
    args = parser.parse_args()
    ensure_fleet()
    short = fleet_short_of(args.gpus)
    if short:
        sys.exit(f"{short}: run `scripts/testbed up --gpus {args.gpus}` first (and "
                 "`scripts/testbed up --gpus 1` after)")
    clean_model(args.model)
    assert_ports_free(args.offset)
    overheads: list[float] = []
    try:
        with tempfile.TemporaryDirectory() as tmp:
            source, golden = assemble_source(Path(tmp), {1: GOOD[1], 2: GOOD[2]})
            inventory = write_inventory(Path(tmp) / "inventory.py", model=args.model,
                                        source=source, golden=golden, offset=args.offset,
                                        serial=(1, "100%"), min_healthy_s=1.0,
                                        gpus=args.gpus)
            for label, version in (("v1 to an empty fleet", 1), ("v1 -> v2", 2),
                                   ("v2 -> v1", 1)):
                result, wall = deploy(args.model, inventory, version)
                figures = print_deploy(label, result, wall, host_target(args.gpus))
                if version == 2 or label.startswith("v2"):
                    overheads += [f["overhead"] for f in figures.values()]
    finally:
        if not args.keep:
            clean_model(args.model)
    print(f"\ntoolkit overhead per host over the two roll-over deploys: median "
          f"{statistics.median(overheads):.2f} s, max {max(overheads):.2f} s "
          f"(target <= {host_target(args.gpus):g} s)")
    if args.gpus > 1:
        print(f"per instance ({args.gpus} per host): median "
              f"{statistics.median(overheads) / args.gpus:.2f} s "
              f"(target < {INSTANCE_TARGET_S:g} s)")
    if args.check and statistics.median(overheads) > host_target(args.gpus):
        sys.exit(1)


if __name__ == "__main__":
    main()
