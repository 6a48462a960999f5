"""What a new SSH connection costs before its first command: the login and the first command
(`true`) on a fresh SshConnection, over the socket the toolkit dials (tfsdeploy.hosts.hops
``dial``: Nagle off from the first byte, each read acknowledged at once) against paramiko's own
socket (made inside SSHClient.connect, Nagle on until the login is done).

    python benchmarks/bench_ssh_connect.py [--host tb1] [--samples 30]

Every run's first step on every host is such a connection (``read_facts``), so the difference
is toolkit overhead per host and per run. Prints the median and 90th percentile (ms) of each
way, the two interleaved. Needs the fleet up (``scripts/testbed up``) and root; talks only to
10.87.0.x.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from unittest import mock

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "integration"))
sys.path.insert(0, str(ROOT / "src"))

from testbed_support import HOSTS, KNOWN_HOSTS, SSH_KEY, ensure_fleet  # noqa: E402

from tfsdeploy.core.inventory.fleet import HostVars, ResolvedHost  # noqa: E402
from tfsdeploy.hosts import ssh  # noqa: E402
from tfsdeploy.hosts.ssh import SshConnection  # noqa: E402


def first_command(host: str) -> float:
    """Seconds from a new SshConnection to its first command's end."""
    vars_ = HostVars(ssh_key=str(SSH_KEY), ssh_known_hosts=str(KNOWN_HOSTS))
    started = time.monotonic()
    conn = SshConnection(ResolvedHost(host, HOSTS[host], (), (), vars_))
    try:
        if not conn.run(["true"]).ok:
            raise SystemExit(f"{host}: `true` failed")
        return time.monotonic() - started
    finally:
        conn.close()


def with_paramikos_socket(host: str) -> float:
    """The same, the connection opened by Fabric and paramiko alone (their own socket)."""
    def plain(conn: object) -> None:
        conn.open()  # type: ignore[attr-defined]
    with mock.patch.object(ssh, "open_connection", plain):
        return first_command(host)


def line(what: str, samples: list[float]) -> str:
    ms = sorted(s * 1000 for s in samples)
    p90 = ms[min(len(ms) - 1, int(0.9 * len(ms)))]
    return f"  {what:<44}median {statistics.median(ms):6.1f} ms   p90 {p90:6.1f} ms"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--host", default="tb1", choices=sorted(HOSTS))
    parser.add_argument("--samples", type=int, default=30)
    args = parser.parse_args()
    ensure_fleet()
    ways: dict[str, Callable[[str], float]] = {
        "the toolkit's socket (dial)": first_command,
        "paramiko's own socket": with_paramikos_socket,
    }
    for way in ways.values():  # warm both: imports, the host's page cache
        way(args.host)
    samples: dict[str, list[float]] = {what: [] for what in ways}
    for _ in range(args.samples):
        for what, way in ways.items():
            samples[what].append(way(args.host))
    print(f"host {args.host}: a new connection and its first command, {args.samples} samples "
          "each, interleaved")
    for what, taken in samples.items():
        print(line(what, taken))
    return 0


if __name__ == "__main__":
    sys.exit(main())
