"""Model distribution on the local fleet: push (every host's copy over SSH from the deploy
machine) against pull (published once to the registry, every host's engine pulls by digest).

    python benchmarks/bench_transfer.py [--hosts 3] [--model benchtransfer] [--version-dir DIR]
                                        [--max-pulls 1,8] [--include-reserved] [--keep]

For each mode it removes the model from the hosts, then runs ``fab stage --json`` of resnet50's
version 1 (``--version-dir``, default the test models' resnet50/1, ~200 MB) on the first
``--hosts`` non-reserved testbed hosts and prints, measured on the wire in the root network
namespace (tests/integration/transfer_support.py: the fab process in a cgroup of its own,
iptables counters per host address):

- ssh MB: the bytes the deploy machine sent to each host over SSH (mean and total);
- registry MB: the bytes the registry sent to the hosts (its source port; another session's
  pulls in the same seconds would count too);
- stage s: the slowest host's stage_model step; wall s: the whole `fab stage`;
- publish: what `fab publish` pushed to the registry first (0 when it already holds the
  version: the second and later runs).

Pull runs once per ``--max-pulls`` value. Needs the fleet up (``scripts/testbed up``) and
root; talks only to 10.87.0.x. The model's files are removed from the hosts afterwards unless
``--keep`` (the registry keeps the image: a later run publishes nothing).
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "integration"))
sys.path.insert(0, str(ROOT / "src"))

from testbed_support import (  # noqa: E402 - the test helpers live beside the tests
    ADDRESSES,
    MODELS,
    REGISTRY,
    STATE,
    VENV_BIN,
    clean_model,
    ensure_fleet,
    fab_env,
    inventory_text,
)
from transfer_support import wire_counter  # noqa: E402

MB = 1_000_000


def testbed_hosts(count: int, *, reserved: bool = False) -> dict[str, str]:
    """The first ``count`` hosts of the running testbed (the reserved ones too when
    ``reserved``: staging starts no container and leaves their GPUs alone)."""
    entries = [e for e in json.loads((STATE / "hosts.json").read_text())["hosts"]
               if reserved or not e.get("reserved")]
    if len(entries) < count:
        sys.exit(f"the testbed has {len(entries)} usable host(s), {count} wanted: "
                 f"scripts/testbed up --hosts {count + 1} --reserve tb4 ...")
    return {e["name"]: e["address"] for e in entries[:count]}


def write_inventory(tmp: Path, model: str, source: Path, hosts: dict[str, str],
                    mode: str) -> Path:
    inventory = tmp / f"inventory-{mode}.py"
    inventory.write_text(inventory_text(
        title=f"the transfer benchmark ({mode})", model=model, source=source,
        golden=MODELS / "half_plus_two" / "catalog.json", offset=4500, hosts=hosts,
        warmup="Warmup(samples=5)", rollout="Rollout(serial=('100%',))", memory_mib=3500,
        extra_vars={"model_transfer": mode, "model_registry": f"{REGISTRY}/tfsdeploy-models",
                    "model_registry_insecure": True}))
    return inventory


def fab(*args: str, wrap: Any = None) -> tuple[subprocess.CompletedProcess[str], float]:
    argv = [str(VENV_BIN / "fab"), *args]
    started = time.monotonic()
    proc = subprocess.run(wrap(argv) if wrap else argv, cwd=ROOT, env=fab_env(),
                          capture_output=True, text=True, timeout=1800)
    return proc, time.monotonic() - started


def stage_seconds(result: dict[str, Any]) -> float:
    """The slowest host's stage_model step."""
    return max(s["seconds"] for o in result["hosts"].values() for s in o["steps"]
               if s["step"] == "stage_model")


def measure(model: str, inventory: Path, hosts: dict[str, str],
            max_pulls: int | None) -> dict[str, Any]:
    clean_model(model, hosts)
    extra = ["--max-pulls", str(max_pulls)] if max_pulls else []
    with wire_counter(hosts) as counter:
        proc, wall = fab("stage", "--model", model, "--inventory", str(inventory), "--version",
                         "1", "--json", *extra, wrap=counter.wrap)
        sent = counter.read()
    if proc.returncode != 0:
        sys.exit(f"fab stage failed (exit {proc.returncode}):\n{proc.stderr[-3000:]}\n"
                 f"{proc.stdout[-2000:]}")
    result = json.loads(proc.stdout)
    return {"ssh": sum(sent["ssh"].values()), "registry": sum(sent["registry"].values()),
            "stage_s": stage_seconds(result), "wall_s": wall, "hosts": len(hosts)}


def row(label: str, figures: dict[str, Any]) -> str:
    n = figures["hosts"]
    return (f"  {label:<18}{figures['ssh'] / n / MB:>11.2f}{figures['ssh'] / MB:>11.1f}"
            f"{figures['registry'] / n / MB:>12.1f}{figures['stage_s']:>9.1f}"
            f"{figures['wall_s']:>8.1f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--hosts", type=int, default=3)
    parser.add_argument("--model", default="benchtransfer")
    parser.add_argument("--version-dir", type=Path, default=MODELS / "resnet50" / "1")
    parser.add_argument("--max-pulls", default="8",
                        help="comma-separated --max-pulls values to run pull with")
    parser.add_argument("--keep", action="store_true")
    parser.add_argument("--include-reserved", action="store_true",
                        help="stage on the reserved hosts too (10 hosts with tb4 reserved)")
    args = parser.parse_args()
    ensure_fleet()
    hosts = testbed_hosts(args.hosts, reserved=args.include_reserved)
    assert all(ADDRESSES.get(h) == a for h, a in hosts.items()), hosts
    tmp = Path(tempfile.mkdtemp(prefix="bench-transfer-"))
    source = tmp / "models" / args.model
    source.mkdir(parents=True)
    shutil.copytree(args.version_dir, source / "1")
    size = sum(p.stat().st_size for p in (source / "1").rglob("*") if p.is_file())
    try:
        pull_inventory = write_inventory(tmp, args.model, source, hosts, "pull")
        proc, seconds = fab("publish", "--model", args.model, "--inventory",
                            str(pull_inventory), "--version", "1", "--json")
        if proc.returncode != 0:
            sys.exit(f"fab publish failed:\n{proc.stderr[-3000:]}")
        image = json.loads(proc.stdout)["images"][0]
        rows = [("push", measure(args.model, write_inventory(tmp, args.model, source, hosts,
                                                             "push"), hosts, None))]
        for bound in [int(b) for b in args.max_pulls.split(",")]:
            rows.append((f"pull, max-pulls {bound}",
                         measure(args.model, pull_inventory, hosts, bound)))
        print(f"== {args.model}: {args.version_dir} ({size / MB:.1f} MB) staged on "
              f"{len(hosts)} host(s) ({', '.join(hosts)})")
        print(f"   publish: {image['uploaded_bytes'] / MB:.1f} MB pushed to {REGISTRY} in "
              f"{seconds:.1f} s ({', '.join(image['uploaded']) or 'already there'}); "
              f"digest {image['digest'][:19]}...")
        print(f"  {'mode':<18}{'ssh MB/host':>11}{'ssh MB':>11}{'reg MB/host':>12}"
              f"{'stage s':>9}{'wall s':>8}")
        for label, figures in rows:
            print(row(label, figures))
    finally:
        if not args.keep:
            clean_model(args.model, hosts)
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
