"""Which processes `scripts/testbed` counts as a host's (the ones a stop or a reboot kills),
without the fleet: a host of its own index in a temporary state directory, and processes in
mount namespaces of their own (``unshare --mount``, root)."""

from __future__ import annotations

import json
import os
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from fleet_helpers import fleet_module

hosts = fleet_module("hosts")
common = fleet_module("common")

INDEX = 97  # a host index that no fleet uses: tb97 has no network namespace


@contextmanager
def in_own_mount_namespace(name: str) -> Iterator[int]:
    """A process in a new mount namespace, its command line starting with ``name``."""
    proc = subprocess.Popen(["unshare", "--mount", "bash", "-c", f"exec -a {name} sleep 60"])
    try:
        deadline = time.monotonic() + 10
        while os.readlink(f"/proc/{proc.pid}/ns/mnt") == os.readlink("/proc/self/ns/mnt"):
            assert time.monotonic() < deadline, "unshare did not enter a new mount namespace"
            time.sleep(0.01)
        while not Path(f"/proc/{proc.pid}/cmdline").read_bytes().startswith(name.encode()):
            assert time.monotonic() < deadline, "the process did not take its name"
            time.sleep(0.01)
        yield proc.pid
    finally:
        proc.kill()
        proc.wait()


def _host(tmp_path: Path, holder_pid: int | None, mntns: str) -> object:
    host = hosts.Host(INDEX, common.Places(state=tmp_path, cache=tmp_path))
    host.dir.mkdir(parents=True)
    (host.dir / "holder.json").write_text(json.dumps(
        {"pid": holder_pid, "mntns": mntns, "boot_id": common.boot_id()}) + "\n")
    if holder_pid is not None:
        (host.dir / "holder.pid").write_text(f"{holder_pid}\n")
    return host


def test_a_mount_namespace_that_only_shares_the_saved_number_is_not_the_hosts(
        tmp_path: Path) -> None:
    """The host's holder is gone: the number saved for its mount namespace may already be
    another namespace's (the kernel hands the lowest free number to the next new one). A
    process there (a container being created on another host) is not the host's, and a stop
    of the host must not kill it."""
    with in_own_mount_namespace("someone-else") as other:
        host = _host(tmp_path, None, os.readlink(f"/proc/{other}/ns/mnt"))
        assert other not in hosts.host_pids(host)


def test_the_live_holders_mount_namespace_is_the_hosts(tmp_path: Path) -> None:
    name = hosts.host_name(INDEX)
    with in_own_mount_namespace(f"tfsdeploy-testbed-{name}") as holder:
        host = _host(tmp_path, holder, os.readlink(f"/proc/{holder}/ns/mnt"))
        assert holder in hosts.host_pids(host)


def test_a_state_directory_the_hosts_cannot_use_is_refused(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Each host mounts its own /tmp, /run, /root ... over the machine's: a state directory
    under one of them cannot be found from inside the host (its holder failed with "special
    device .../home does not exist" for TFSDEPLOY_TESTBED_DIR=/tmp/...); under a directory
    others may write (/var/tmp), sshd refused the testbed's keys ("bad ownership or modes")."""
    for inside in ("/tmp/tb-state", "/root/x/y", "/run/tfsdeploy"):
        monkeypatch.setenv("TFSDEPLOY_TESTBED_DIR", inside)
        with pytest.raises(common.TestbedError) as refused:
            common.Places.from_env().check_state_dir()
        assert f"TFSDEPLOY_TESTBED_DIR {inside} is inside " in str(refused.value)
        assert "(/var/lib/tfsdeploy-testbed by default)" in str(refused.value)
    writable = Path("/var/lib") / f"tfsdeploy-test-{os.getpid()}"
    writable.mkdir(mode=0o777)
    try:
        writable.chmod(0o1777)
        monkeypatch.setenv("TFSDEPLOY_TESTBED_DIR", str(writable / "state"))
        with pytest.raises(common.TestbedError) as refused:
            common.Places.from_env().check_state_dir()
        assert f"is under {writable}, which others may write" in str(refused.value)
    finally:
        writable.rmdir()
    for fine in ("/var/lib/tfsdeploy-testbed", "/srv/other"):
        monkeypatch.setenv("TFSDEPLOY_TESTBED_DIR", fine)
        common.Places.from_env().check_state_dir()
