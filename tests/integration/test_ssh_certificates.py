"""SSH certificate fleets on the local fleet: `fab status` reaches a host whose known_hosts
entry is only a ``@cert-authority`` line, and refuses it once that CA is ``@revoked``; OpenSSH's
own client, given the same file, decides the same, for these and nine more files (another CA,
patterns and negation, a hashed name, @revoked of the host key, broken lines, plain keys).
Then the whole life of a release through such a host: a deploy, a second one, a rollback, the
SLO guard's rollback on an injected error rate; and a deploy to a host whose certificate
another CA signed, refused before anything changes, saying why.

The host is a dedicated sshd started here in tb3's namespaces (``nsenter --target`` its
namespace holder: tb3's network, mounts and Docker engine) on port 2291, with its own host key
and a host certificate signed by a CA made here for 10.87.0.13 and tb3; it is stopped at the
end. The testbed's own sshd is not touched. Model ``itsshcert`` (port offset 3600) is deployed
on tb3 through it, and removed at the end.
"""

from __future__ import annotations

import re
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from deploy_support import GOOD, Fleet, fleet_fixture
from rollback_support import Prober
from testbed_support import ADDRESSES, KNOWN_HOSTS, SSH_KEY, STATE, Run, netns

from tfsdeploy.core.errors import HostUnreachable
from tfsdeploy.core.inventory.fleet import HostVars, ResolvedHost
from tfsdeploy.core.ssh.known_hosts import hash_name
from tfsdeploy.hosts.ssh import SshConnection

pytestmark = pytest.mark.testbed

MODEL, OFFSET = "itsshcert", 3600
HOST, ADDRESS = "tb3", ADDRESSES["tb3"]
SSHD_PORT = 2291


@dataclass(frozen=True)
class CertSshd:
    """The dedicated sshd: its directory (CA, host key, certificate) and process."""

    work: Path
    process: subprocess.Popen[bytes]

    @property
    def ca_line(self) -> str:
        return (self.work / "ca.pub").read_text().strip()



def keygen(*args: str | Path) -> None:
    subprocess.run(["ssh-keygen", "-q", *map(str, args)], check=True, capture_output=True)


def _port_open(address: str, port: int) -> bool:
    try:
        socket.create_connection((address, port), timeout=1).close()
    except OSError:
        return False
    return True


def start_sshd(work: Path) -> subprocess.Popen[bytes]:
    """sshd in tb3's namespaces with ``work``'s host key and certificate, answering on
    SSHD_PORT (the testbed's authorized key logs in)."""
    keygen("-t", "ed25519", "-N", "", "-C", "itsshcert CA", "-f", work / "ca")
    keygen("-t", "ed25519", "-N", "", "-C", "itsshcert host", "-f", work / "host")
    keygen("-s", work / "ca", "-h", "-I", "tb3-itsshcert", "-n", f"{ADDRESS},{HOST}",
           "-V", "-5m:+1h", work / "host.pub")
    config = work / "sshd_config"
    config.write_text("\n".join([
        f"ListenAddress {ADDRESS}", f"Port {SSHD_PORT}",
        f"HostKey {work / 'host'}", f"HostCertificate {work / 'host-cert.pub'}",
        f"PidFile {work / 'sshd.pid'}", f"AuthorizedKeysFile {STATE / 'ssh' / 'authorized_keys'}",
        "PermitRootLogin prohibit-password", "PasswordAuthentication no",
        "KbdInteractiveAuthentication no", "UsePAM no", "PrintMotd no",
        "Subsystem sftp internal-sftp", "AllowTcpForwarding no", "X11Forwarding no", ""]))
    holder = (STATE / "hosts" / HOST / "holder.pid").read_text().strip()
    with (work / "sshd.log").open("wb") as log:
        process = subprocess.Popen(
            ["nsenter", f"--target={holder}", "--mount", "--uts", "--net", "--",
             "/usr/sbin/sshd", "-D", "-e", "-f", str(config)], stdout=log, stderr=log)
    deadline = time.monotonic() + 20
    while not _port_open(ADDRESS, SSHD_PORT):
        if process.poll() is not None or time.monotonic() > deadline:
            process.kill()
            raise AssertionError(f"the test's sshd did not start: "
                                 f"{(work / 'sshd.log').read_text()}")
        time.sleep(0.1)
    return process


@pytest.fixture(scope="module")
def sshd() -> Iterator[CertSshd]:
    listening = subprocess.run(netns(HOST, "ss", "-Hltn", f"sport = :{SSHD_PORT}"),
                               capture_output=True, text=True, check=True).stdout
    assert not listening.strip(), f"port {SSHD_PORT} on {HOST} is taken: {listening}"
    # a directory tb3's mount namespace sees at the same path (its /tmp is its own)
    work = Path(tempfile.mkdtemp(prefix="itsshcert-", dir="/var/tmp"))
    process = start_sshd(work)
    try:
        yield CertSshd(work, process)
    finally:
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=10)
        shutil.rmtree(work, ignore_errors=True)


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory, sshd: CertSshd) -> Iterator[Fleet]:
    yield from fleet_fixture(tmp_path_factory, MODEL, OFFSET, {1: GOOD[1], 2: GOOD[2]},
                             hosts={HOST: ADDRESS}, ssh_port=SSHD_PORT)


def inventory_trusting(fleet: Fleet, name: str, lines: list[str]) -> Path:
    """The module's inventory with an ssh_known_hosts file holding only ``lines``."""
    known = fleet.tmp / f"known_hosts_{name}"
    known.write_text("".join(f"{line}\n" for line in lines))
    path = fleet.tmp / f"inventory_{name}.py"
    text = fleet.inventory.read_text()
    assert str(KNOWN_HOSTS) in text
    path.write_text(text.replace(str(KNOWN_HOSTS), str(known)))
    return path


def openssh_accepts(known: Path) -> bool:
    """Whether OpenSSH's client, strictly, with only ``known``, logs in to the test sshd."""
    proc = subprocess.run(
        ["ssh", "-F", "/dev/null", "-i", str(SSH_KEY), "-o", "IdentitiesOnly=yes",
         "-o", f"UserKnownHostsFile={known}", "-o", "GlobalKnownHostsFile=/dev/null",
         "-o", "StrictHostKeyChecking=yes", "-o", "BatchMode=yes", "-o", "CheckHostIP=no",
         "-o", "ConnectTimeout=10", "-p", str(SSHD_PORT), f"root@{ADDRESS}", "true"],
        capture_output=True, text=True, timeout=60, check=False)
    return proc.returncode == 0


def status(fleet: Fleet, inventory: Path) -> Run:
    return fleet.fab("status", "--json", inventory=inventory, timeout=120)


def test_a_ca_line_alone_lets_fab_status_reach_the_host(fleet: Fleet, sshd: CertSshd) -> None:
    # `10.87.0.*` does not name `[10.87.0.13]:2291`: the bare-host fallback applies it
    inventory = inventory_trusting(fleet, "ca", [f"@cert-authority 10.87.0.* {sshd.ca_line}"])
    run = status(fleet, inventory)
    assert run.code == 0, run.describe()
    assert "unreachable" not in run.out.lower() and HOST in run.out, run.describe()
    assert openssh_accepts(fleet.tmp / "known_hosts_ca")


def connect(known: Path) -> SshConnection:
    vars_ = HostVars(ssh_port=SSHD_PORT, ssh_key=str(SSH_KEY), ssh_known_hosts=str(known))
    return SshConnection(ResolvedHost(HOST, ADDRESS, (), (), vars_))


def test_the_host_presents_its_certificate_and_a_plain_entry_still_works(
        fleet: Fleet, sshd: CertSshd) -> None:
    ca_only = fleet.tmp / "known_hosts_ca_only"
    ca_only.write_text(f"@cert-authority [10.87.0.*]:* {sshd.ca_line}\n")
    # the plain key listed, no CA: the server still shows its certificate first (OpenSSH's
    # order), which is dropped for the listed plain key, as OpenSSH does
    plain = fleet.tmp / "known_hosts_plain"
    plain.write_text(f"[{ADDRESS}]:{SSHD_PORT} {(sshd.work / 'host.pub').read_text()}")
    for known in (ca_only, plain):
        conn = connect(known)
        try:
            assert conn.transport().host_key_type == "ssh-ed25519-cert-v01@openssh.com"
            assert conn.run(["hostname"]).stdout.strip() == HOST  # tb3's own namespaces
        finally:
            conn.close()
        assert openssh_accepts(known)


def test_a_revoked_ca_makes_the_host_unreachable_with_the_reason(fleet: Fleet,
                                                                 sshd: CertSshd) -> None:
    inventory = inventory_trusting(fleet, "revoked", [
        f"@cert-authority 10.87.0.* {sshd.ca_line}", f"@revoked * {sshd.ca_line}"])
    run = fleet.fab("status", inventory=inventory, timeout=120)  # as a person reads it
    assert run.code == 3, run.describe()
    assert re.search(r"^tb3: UNREACHABLE \(HostUnreachable: tb3 \(10\.87\.0\.13\): "
                     r"HostKeyRefused: the host key of 10\.87\.0\.13 \(SHA256:\S+\) is refused "
                     r"by \S+known_hosts_revoked: "
                     r"its certificate's CA key is marked @revoked for \[10\.87\.0\.13\]:2291 "
                     r"\(line 2\); fix: a revoked key may be in someone else's hands: "
                     r"re-key the host",
                     run.stdout, re.M), run.describe()
    assert not openssh_accepts(fleet.tmp / "known_hosts_revoked")


def toolkit_accepts(known: Path) -> bool:
    conn = connect(known)
    try:
        return conn.run(["true"]).ok
    except HostUnreachable as refused:
        assert "HostKeyRefused" in str(refused), refused
        return False
    finally:
        conn.close()


# known_hosts variants: {ca} is the CA's public key, {key} the host's, {other} another key
VARIANTS = {
    "another CA": (["@cert-authority * {other}"], False),
    "the CA for other hosts": (["@cert-authority *.example.com,!10.87.0.13 {ca}"], False),
    "the CA negated for the host": (["@cert-authority 10.87.0.*,!10.87.0.13 {ca}"], False),
    "the CA under the hashed name": (["@cert-authority {hashed} {ca}"], True),
    "the host key revoked": (["@cert-authority * {ca}", "@revoked * {key}"], False),
    "the CA revoked for other hosts": (["@cert-authority * {ca}", "@revoked tb9 {ca}"], True),
    "the CA listed as a plain key": (["[10.87.0.13]:2291 {ca}"], False),
    "another plain key": (["[10.87.0.13]:2291 {other}"], False),
    "a broken line, then the CA": (["@cert-authority", "@bogus * {ca}", "* {ca}x",
                                    "@cert-authority [10.87.0.13]:* {ca}"], True),
}


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_the_toolkit_decides_as_openssh_does(fleet: Fleet, sshd: CertSshd, variant: str) -> None:
    lines, trusted = VARIANTS[variant]
    other = fleet.tmp / "other"
    if not other.exists():
        keygen("-t", "ed25519", "-N", "", "-f", other)
    values = {"ca": sshd.ca_line, "key": (sshd.work / "host.pub").read_text().strip(),
              "other": (fleet.tmp / "other.pub").read_text().strip(),
              "hashed": hash_name(f"[{ADDRESS}]:{SSHD_PORT}", bytes(range(20)))}
    known = fleet.tmp / f"known_hosts_{variant.replace(' ', '_')}"
    known.write_text("".join(line.format(**values) + "\n" for line in lines))
    assert openssh_accepts(known) is trusted
    assert toolkit_accepts(known) is trusted


# -- a release's whole life through a host trusted by its CA only ----------------------------

GUARD = ("--for-s", "3", "--interval-s", "1", "--max-error-rate", "0.05", "--min-requests", "5",
         "--count-client-errors", "--duration-s", "60")


def _trusted_by_ca(fleet: Fleet, sshd: CertSshd) -> Path:
    return inventory_trusting(fleet, "ca_fleet", [f"@cert-authority 10.87.0.* {sshd.ca_line}"])


def _serving(fleet: Fleet) -> str:
    return (fleet.current(HOST) or {}).get("id", "")


def test_a_deploy_a_rollback_and_the_guard_through_a_certificate(fleet: Fleet,
                                                                   sshd: CertSshd) -> None:
    inventory = _trusted_by_ca(fleet, sshd)
    first = fleet.fab("deploy", "--version", "1", "--json", inventory=inventory)
    assert first.code == 0, first.describe()
    fleet.assert_serving(1)
    second = fleet.fab("deploy", "--version", "2", "--json", inventory=inventory)
    assert second.code == 0, second.describe()
    fleet.assert_serving(2)
    back = fleet.fab("rollback", "--json", inventory=inventory)
    assert back.code == 0, back.describe()
    fleet.assert_serving(1)
    assert _serving(fleet) == first.json()["release"], back.describe()
    again = fleet.fab("deploy", "--version", "2", "--json", inventory=inventory)
    assert again.code == 0, again.describe()
    with Prober(fleet, bad_ratio=0.25) as prober:  # type: ignore[arg-type]
        guarded = fleet.fab("guard", *GUARD, inventory=inventory, timeout=300)
    assert guarded.code == 2, guarded.describe()  # the SLO broke: rolled back
    assert re.search(r"error rate \d+\.\d+% > 5\.00%", guarded.stdout), guarded.describe()
    assert "rolled back to r" in guarded.stdout, guarded.describe()
    assert not prober.failures(), prober.summary()
    fleet.assert_serving(1)


def test_a_host_certified_by_another_ca_is_refused_before_anything_changes(
        fleet: Fleet, sshd: CertSshd) -> None:
    other = fleet.tmp / "other_ca"
    if not other.exists():
        keygen("-t", "ed25519", "-N", "", "-C", "another CA", "-f", other)
    before = (_serving(fleet), fleet.containers(HOST), fleet.audit(HOST))
    inventory = inventory_trusting(fleet, "other_ca", [
        f"@cert-authority 10.87.0.* {(fleet.tmp / 'other_ca.pub').read_text().strip()}"])
    run = fleet.fab("deploy", "--version", "2", inventory=inventory)
    assert run.code == 1, run.describe()  # nothing changed anywhere
    assert re.search(r"tb3 \(10\.87\.0\.13\): HostKeyRefused: the host key of 10\.87\.0\.13 "
                     r"\(SHA256:\S+\) is refused by \S+known_hosts_other_ca: its certificate "
                     r"was signed by the CA SHA256:\S+, which no @cert-authority line for "
                     r"\[10\.87\.0\.13\]:2291 or 10\.87\.0\.13 trusts \(they trust SHA256:\S+ "
                     r"\(line 1\)\); fix: if the host was certified by another CA on purpose",
                     run.out), run.describe()
    assert (_serving(fleet), fleet.containers(HOST), fleet.audit(HOST)) == before
