"""What the model-transfer tests and benchmarks/bench_transfer.py measure on the wire: the bytes
one fab process sends to each testbed host over SSH, and the bytes the registry sends.

A fab run is started inside a cgroup v2 group of its own (``/sys/fs/cgroup/unified/<name>``)
and an iptables rule in the root namespace's OUTPUT chain counts, per host address, the IP
bytes of packets from that group's sockets to port 22 (``-m cgroup --path``): other sessions'
SSH traffic to the same hosts is not counted. The registry (Debian's docker-registry in the
root namespace, 10.87.0.1:5000) is counted by the source port of what it sends to the hosts.
Every rule carries the counter's name as its comment and is removed at the end.
"""

from __future__ import annotations

import os
import re
import subprocess
import uuid
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from pathlib import Path

CGROUP_ROOT = Path("/sys/fs/cgroup/unified")
REGISTRY_PORT = 5000


def _iptables(*args: str) -> str:
    return subprocess.run(["iptables", "-w", "5", *args], capture_output=True, text=True,
                          check=True, timeout=30).stdout


@dataclass
class WireCounter:
    """Counting rules for one measured run; ``wrap`` puts a command into its cgroup."""

    addresses: dict[str, str]  # host -> address
    name: str = field(default_factory=lambda: f"tfsdeploy-wire-{uuid.uuid4().hex[:10]}")
    count_registry: bool = True

    @property
    def group(self) -> Path:
        return CGROUP_ROOT / self.name

    def _rules(self) -> list[list[str]]:
        rules = [["-d", address, "-p", "tcp", "--dport", "22", "-m", "cgroup", "--path",
                  self.name, "-m", "comment", "--comment", f"{self.name}:ssh:{host}"]
                 for host, address in self.addresses.items()]
        if self.count_registry:
            rules += [["-d", address, "-p", "tcp", "--sport", str(REGISTRY_PORT), "-m",
                       "comment", "--comment", f"{self.name}:registry:{host}"]
                      for host, address in self.addresses.items()]
        return rules

    def start(self) -> None:
        self.group.mkdir()
        for rule in self._rules():
            _iptables("-I", "OUTPUT", *rule)

    def stop(self) -> None:
        for rule in self._rules():
            with suppress(subprocess.CalledProcessError):
                _iptables("-D", "OUTPUT", *rule)
        with suppress(OSError):
            self.group.rmdir()

    def wrap(self, argv: list[str]) -> list[str]:
        """``argv`` run inside the counter's cgroup (its children too)."""
        procs = self.group / "cgroup.procs"
        return ["sh", "-c", f'echo $$ > {procs} && exec "$@"', "sh", *argv]

    def read(self) -> dict[str, dict[str, int]]:
        """{"ssh": {host: bytes}, "registry": {host: bytes}} counted so far."""
        counts: dict[str, dict[str, int]] = {"ssh": {}, "registry": {}}
        for line in _iptables("-L", "OUTPUT", "-v", "-x", "-n").splitlines():
            found = re.search(rf"/\* {re.escape(self.name)}:(ssh|registry):(\S+) \*/", line)
            if found:
                counts[found[1]][found[2]] = int(line.split()[1])
        return counts


@contextmanager
def wire_counter(addresses: dict[str, str], *, count_registry: bool = True
                 ) -> Iterator[WireCounter]:
    """A started WireCounter, stopped (its rules and cgroup removed) at the end."""
    assert os.geteuid() == 0, "counting packets needs root"
    counter = WireCounter(addresses, count_registry=count_registry)
    counter.start()
    try:
        yield counter
    finally:
        counter.stop()


def pad_version(version_dir: Path, size: int, tag: str) -> None:
    """A file of ``size`` random bytes in the version's assets.extra (which TFServing reads
    only for warmup records): every run of a test gets versions no registry or host has yet,
    and versions big enough that a copy per host shows on the counters. ``tag`` names it."""
    target = version_dir / "assets.extra" / f"padding-{tag}.bin"
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_bytes(os.urandom(size))


def registry_blob(state: Path, digest: str) -> Path:
    """Where the testbed registry (filesystem driver) keeps a blob's bytes."""
    hexa = digest.split(":", 1)[1]
    return (state / "registry" / "data" / "docker" / "registry" / "v2" / "blobs" / "sha256"
            / hexa[:2] / hexa / "data")
