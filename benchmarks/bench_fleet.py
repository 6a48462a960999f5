"""The article's fleet: N TFServing instances deployed v1 -> v2 under steady load, the deploy
machine's cost per host, what the SSH servers saw.

    python benchmarks/bench_fleet.py --instances 3,26 [--bastion] [--rate 4] [--keep]

Run it as root, alone on the testbed (it reshapes the fleet). It brings up hosts beyond the
suite's fleet (tb5 with one simulated GPU, tb6.. with two: one instance per GPU) and leaves
tb1..tb4 exactly as they are:

- ``--bastion``: `scripts/testbed up --bastion --hosts K`: the hosts answer SSH from the
  bastion tbjump alone, whose sshd (and theirs) keeps OpenSSH's defaults, MaxStartups
  10:30:100 and MaxSessions 10; the inventory's ``ssh_proxy_jump`` is the bastion. At the
  end `scripts/testbed down --bastion` removes the bastion and those hosts (``--keep``: not).
- without: `scripts/testbed up --hosts K` (a plain `up`: it also repairs tb1..tb4, and
  restarts an engine started by an older `up`), then `up --hosts` as many as before.

For each size (instances = GPUs of the hosts chosen; an odd size takes tb5), the model
``benchfleet`` (half_plus_two 1 and 2, port offset 4850) is deployed v1 (set-up, not
measured), then v2 with `fab deploy --json` while every host's stable gRPC port gets ``--rate``
requests/s; printed per size:

- wall_s: the v2 deploy, start to exit; the batches (the model's ``serial``: 1, then the rest)
  are what it grows with, not the hosts;
- cpu_s_per_host: the `fab deploy` process's user + system CPU seconds (its rusage, start-up
  included) over the hosts; max_rss_mb: its peak resident memory;
- max_handshakes: the most SSH handshakes at once the bastion's sshd counted (its listener's
  title, "N of 10-100 startups", read every 5 ms: what MaxStartups compares), and
  max_host_handshakes the same for any host's sshd; refused_handshakes: the connections the
  sshds dropped past MaxStartups (their VERBOSE logs: "drop connection #N ... past
  MaxStartups"); max_sessions: the most sessions open at once on one connection (the hosts'
  logs, "Starting session" / "Close session", replayed per connection in order), and
  refused_sessions ("no more sessions");
- failed and sent: the load's requests during the deploy.

The last line is one JSON object: {"sizes": [{"instances", "hosts", "wall_s", ...}, ...]}.
Talks only to 10.87.0.x.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "integration"))
sys.path.insert(0, str(ROOT / "src"))

from deploy_load import SteadyLoad, Target  # noqa: E402 - the test helpers live beside the tests
from deploy_support import GOOD, assemble_source, write_inventory  # noqa: E402
from testbed_support import (  # noqa: E402
    ADDRESSES,
    BASTION_ADDRESS,
    BASTION_HOST,
    KNOWN_HOSTS,
    STATE,
    VENV_BIN,
    fab_env,
)

FIRST = 5  # tb1..tb4 are the suite's: the benchmark's hosts start at tb5
LISTENER = re.compile(rb"\[listener\] (\d+) of \d+-\d+ startups")
SESSION = re.compile(r"^(Starting|Close) session: .* from (\S+) port (\d+) id \d+", re.M)


def testbed(*args: str) -> str:
    proc = subprocess.run(["bash", str(ROOT / "scripts" / "testbed"), *args],
                          capture_output=True, text=True, timeout=1800, cwd=ROOT)
    if proc.returncode != 0:
        sys.exit(f"scripts/testbed {' '.join(args)} failed:\n{proc.stdout}\n{proc.stderr}")
    return proc.stdout


def shape() -> list[dict[str, Any]]:
    return list(json.loads((STATE / "hosts.json").read_text())["hosts"])


def hosts_for(instances: int) -> dict[str, int]:
    """The hosts of a size and their GPUs: tb5 (one GPU) when the size is odd, then tb6..
    (two each)."""
    chosen = {f"tb{FIRST}": 1} if instances % 2 else {}
    chosen.update({f"tb{FIRST + 1 + i}": 2 for i in range(instances // 2)})
    return chosen


def bring_up(largest: int, *, bastion: bool) -> tuple[int, list[str]]:
    """The benchmark's hosts up; returns how many hosts were up before and the `up` argv."""
    before = len(shape())
    if before >= FIRST and not bastion:
        sys.exit(f"{before} hosts are up: the benchmark's start at tb{FIRST}; bring the "
                 "fleet to tb1..tb4 first (scripts/testbed down --bastion, or up --hosts 4)")
    last = FIRST + math.ceil((largest - 1) / 2) if largest > 1 else FIRST
    argv = ["up", "--hosts", str(last), "--gpus", f"tb{FIRST}=1", "--gpus", "2"]
    if bastion:
        argv.append("--bastion")
    print(testbed(*argv).rstrip())
    return before, argv


def memory_available_mb() -> float:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemAvailable:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def disk_mb(names: list[str]) -> float:
    """The hosts' engine data on disk, each hard-linked layer counted once."""
    dirs = [str(STATE / "hosts" / n / "docker") for n in names]
    out = subprocess.run(["du", "-scm", *dirs], capture_output=True, text=True).stdout
    return float(out.splitlines()[-1].split()[0]) if out else float("nan")


# -- what the SSH servers saw -----------------------------------------------------------------

@dataclass
class Startups:
    """The most handshakes at once each sshd's listener counted (its title), read every
    ``interval`` seconds while running."""

    names: list[str]
    interval: float = 0.005
    peak: dict[str, int] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, daemon=True)

    def _pids(self) -> dict[str, int]:
        found = {}
        for name in self.names:
            with suppress(OSError, ValueError):
                found[name] = int((STATE / "hosts" / name / "run" / "sshd.pid").read_text())
        return found

    def _watch(self) -> None:
        pids = self._pids()
        self.peak = dict.fromkeys(pids, 0)
        while not self._stop.is_set():
            for name, pid in pids.items():
                with suppress(OSError):
                    found = LISTENER.search(Path(f"/proc/{pid}/cmdline").read_bytes())
                    if found:
                        self.peak[name] = max(self.peak[name], int(found[1]))
            time.sleep(self.interval)

    @contextmanager
    def running(self) -> Iterator[Startups]:
        self._thread.start()
        try:
            yield self
        finally:
            self._stop.set()
            self._thread.join()


class SshdLogs:
    """The sshd logs' lines written since made."""

    def __init__(self, names: list[str]) -> None:
        self.paths = {n: STATE / "logs" / f"{n}-sshd.log" for n in names}
        self.marks = {n: p.stat().st_size if p.exists() else 0 for n, p in self.paths.items()}

    def since(self) -> dict[str, str]:
        found = {}
        for name, path in self.paths.items():
            with path.open("rb") as log:
                log.seek(self.marks[name])
                found[name] = log.read().decode(errors="replace")
        return found


def max_sessions(text: str) -> int:
    """The most sessions open at once on one connection: each connection's Starting/Close
    lines, in the order its own process wrote them."""
    open_now: dict[tuple[str, str], int] = {}
    peak = 0
    for what, address, port in SESSION.findall(text):
        key = (address, port)
        open_now[key] = open_now.get(key, 0) + (1 if what == "Starting" else -1)
        peak = max(peak, open_now[key])
    return peak


# -- one size ---------------------------------------------------------------------------------

def clean(model: str, names: list[str]) -> None:
    """Every trace of ``model`` on these hosts, through their engines' sockets and their disks
    (no SSH: behind the bastion they answer it alone)."""
    for name in names:
        sock = STATE / "hosts" / name / "run" / "docker.sock"
        docker = ["docker", "-H", f"unix://{sock}"]
        ids = subprocess.run([*docker, "ps", "-aq", "--filter", f"label=tfsdeploy.model={model}"],
                             capture_output=True, text=True).stdout.split()
        subprocess.run([*docker, "rm", "-f", *ids, f"tfs-proxy-{model}"], capture_output=True)
        srv = STATE / "hosts" / name / "srv"
        subprocess.run(["rm", "-rf", str(srv / model), str(srv / "models" / model)])


# Runs ARGV as a grandchild of this process and writes its rusage (JSON) to a file: a process
# forked from this one (grpc and the load's threads: hundreds of MB) starts with this one's
# resident set as its high-water mark, and Linux keeps that mark across exec (the rusage's
# ru_maxrss of a child is at least its parent's RSS at the fork), so `fab` is forked from this
# small interpreter instead, whose own RSS is a few MB.
_MEASURE = """
import json, os, sys
pid = os.fork()
if pid == 0:
    os.execv(sys.argv[2], sys.argv[2:])
_, status, usage = os.wait4(pid, 0)
with open(sys.argv[1], "w") as out:
    json.dump({"ru_utime": usage.ru_utime, "ru_stime": usage.ru_stime,
               "ru_maxrss": usage.ru_maxrss}, out)
sys.exit(os.waitstatus_to_exitcode(status))
"""


@dataclass(frozen=True)
class Usage:
    """The rusage figures of one `fab` run."""

    ru_utime: float
    ru_stime: float
    ru_maxrss: int  # KiB


def fab(args: list[str]) -> tuple[subprocess.CompletedProcess[str], float, Usage]:
    """A `fab` run: its outcome, wall seconds and rusage (its own: see _MEASURE)."""
    started = time.monotonic()
    with tempfile.NamedTemporaryFile(suffix=".json") as measured:
        done = subprocess.run(["/usr/bin/python3", "-S", "-c", _MEASURE, measured.name,
                               str(VENV_BIN / "fab"), *args], cwd=ROOT, env=fab_env(),
                              capture_output=True, text=True, check=False)
        wall = time.monotonic() - started
        usage = Usage(**json.loads(Path(measured.name).read_text() or "{}"))
    return done, wall, usage


def deploy(model: str, inventory: Path, version: int) -> tuple[float, Any]:
    done, wall, usage = fab(["deploy", "--model", model, "--inventory", str(inventory),
                             "--version", str(version), "--json"])
    if done.returncode != 0:
        sys.exit(f"fab deploy v{version} failed (exit {done.returncode}):\n"
                 f"{done.stderr[-4000:]}\n{done.stdout[-3000:]}")
    return wall, usage


def inventory_for(tmp: Path, model: str, offset: int, chosen: dict[str, int],
                  bastion: bool) -> Path:
    source, golden = assemble_source(tmp, {1: GOOD[1], 2: GOOD[2]})
    extra: dict[str, Any] = {"model_transfer": "push"}
    if bastion:  # the hosts' keys and the jump host's in one file
        known = tmp / "known_hosts"
        pinned = Path(json.loads((STATE / "bastion.json").read_text())["known_hosts"])
        known.write_text(KNOWN_HOSTS.read_text() + pinned.read_text())
        extra.update(ssh_proxy_jump=f"root@{BASTION_ADDRESS}", ssh_known_hosts=str(known))
    return write_inventory(tmp / "inventory.py", model=model, source=source, golden=golden,
                           offset=offset, serial=(1, "100%"), min_healthy_s=1.0,
                           hosts={n: ADDRESSES[n] for n in chosen}, gpus=chosen,
                           extra_vars=extra)


def measure(size: int, *, model: str, offset: int, rate: float, bastion: bool) -> dict[str, Any]:
    chosen = hosts_for(size)
    names = list(chosen)
    clean(model, names)
    with tempfile.TemporaryDirectory() as tmp:
        inventory = inventory_for(Path(tmp), model, offset, chosen, bastion)
        deploy(model, inventory, 1)  # set-up
        targets = [Target(n, ADDRESSES[n], 8500 + offset, "grpc") for n in names]
        servers = [BASTION_HOST, *names] if bastion else names
        logs = SshdLogs(servers)
        load = SteadyLoad(model, targets, rate=rate, workers=2).start()
        time.sleep(2.0)
        with Startups(servers).running() as startups:
            wall, usage = deploy(model, inventory, 2)
        time.sleep(1.0)
        load.stop()
        seen = logs.since()
    samples = load.samples
    text = "\n".join(seen.values())
    hosts_peak = max((startups.peak.get(n, 0) for n in names), default=0)
    figures = {
        "instances": size, "hosts": len(names), "wall_s": round(wall, 1),
        "cpu_s_per_host": round((usage.ru_utime + usage.ru_stime) / len(names), 3),
        "max_rss_mb": round(usage.ru_maxrss / 1024, 1),
        "max_handshakes": startups.peak.get(BASTION_HOST, hosts_peak),
        "max_host_handshakes": hosts_peak,
        "refused_handshakes": len(re.findall(r"drop connection #\d+ .*past MaxStartups",
                                             text)),
        "max_sessions": max(max_sessions(t) for t in seen.values()),
        "refused_sessions": text.count("no more sessions"),
        "bastion_logins": seen.get(BASTION_HOST, "").count("Accepted publickey"),
        "failed": sum(not s.ok for s in samples), "sent": len(samples),
    }
    errors = sorted({s.error for s in samples if not s.ok})[:3]
    if errors:
        figures["errors"] = errors
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--instances", default="3,26",
                        help="fleet sizes in TFServing instances, comma-separated (max 51)")
    parser.add_argument("--bastion", action="store_true",
                        help="the hosts behind the bastion tbjump, reached through it alone")
    parser.add_argument("--rate", type=float, default=4.0,
                        help="gRPC requests/s to each host's stable port during the deploy")
    parser.add_argument("--model", default="benchfleet")
    parser.add_argument("--offset", type=int, default=4850)
    parser.add_argument("--keep", action="store_true",
                        help="leave the hosts and the model up after")
    args = parser.parse_args()
    if os.geteuid() != 0:
        sys.exit("the testbed needs root")
    sizes = sorted({int(n) for n in args.instances.split(",")})
    if not sizes or sizes[0] < 1 or sizes[-1] > 51:
        sys.exit("--instances: sizes 1..51 (tb5 with one GPU, tb6..tb30 with two)")
    free_before = memory_available_mb()
    before, _ = bring_up(sizes[-1], bastion=args.bastion)
    names = sorted({n for size in sizes for n in hosts_for(size)},
                   key=lambda n: int(n[2:]))
    where = f"behind {BASTION_HOST}" if args.bastion else "direct"
    print(f"hosts {names[0]}..{names[-1]} up ({where}): "
          f"{memory_available_mb() - free_before:+.0f} MB available, engines' data "
          f"{disk_mb(names):.0f} MB on disk")
    results = []
    try:
        for size in sizes:
            figures = measure(size, model=args.model, offset=args.offset, rate=args.rate,
                              bastion=args.bastion)
            results.append(figures)
            print(f"\n== {size} instances on {figures['hosts']} hosts"
                  f"{' through ' + BASTION_HOST if args.bastion else ''}: v1 -> v2 in "
                  f"{figures['wall_s']} s; fab deploy {figures['cpu_s_per_host']} CPU-s per "
                  f"host, peak RSS {figures['max_rss_mb']} MB")
            print(f"   SSH: at most {figures['max_handshakes']} handshakes at once on the "
                  f"{'bastion' if args.bastion else 'hosts'} ({figures['max_host_handshakes']} "
                  f"on a host), {figures['refused_handshakes']} refused; at most "
                  f"{figures['max_sessions']} sessions at once on a connection, "
                  f"{figures['refused_sessions']} refused; bastion logins "
                  f"{figures['bastion_logins']}")
            print(f"   load: {figures['sent']} requests, {figures['failed']} failed"
                  f"{' ' + str(figures['errors']) if 'errors' in figures else ''}; "
                  f"{memory_available_mb():.0f} MB available now")
    finally:
        if not args.keep:
            clean(args.model, names)
            if args.bastion:
                print(testbed("down", "--bastion").rstrip())
            else:
                print(testbed("up", "--hosts", str(before)).splitlines()[0])
    print(json.dumps({"sizes": results}))


if __name__ == "__main__":
    main()
