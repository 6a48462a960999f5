"""model_transfer pull from a registry with authentication and HTTPS, on the real fleet: the
deploy machine publishes with its own push login, the hosts' engines pull with theirs, and no
login travels anywhere else or shows anywhere.

A second registry is started here beside the testbed's (which is not touched): Debian's
docker-registry (distribution) on 10.87.0.1:5443, TLS with a certificate from a CA made here,
and htpasswd authentication with two accounts: ``deployer`` (this machine's docker login, in a
``DOCKER_CONFIG`` of the test's own) and ``fleetpull`` (the hosts'). Its access log names the
account of every request and where it came from. The CA goes where Docker looks for a
registry's CA, ``/etc/docker/certs.d/10.87.0.1:5443/ca.crt`` (the testbed hosts share /etc,
so every engine trusts it; the deploy machine's registry client reads the same file), and is
removed at the end with the registry, its data and the hosts' logins.

Two hosts, model ``itregauth`` (port offset 5000): a deploy with each host's own docker login,
one with a pull-only credential the inventory names by reference, and one where a host has no
login at all (refused before anything serving changes: the deploy machine's login is not lent).
"""

from __future__ import annotations

import base64
import datetime
import ipaddress
import json
import os
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import bcrypt
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID
from rollback_support import GOLDEN, SOURCE_MODEL, Fleet, write_fast_playbook
from testbed_support import (
    ADDRESSES,
    HOSTS,
    Run,
    copy_version,
    fleet_lifetime,
    inventory_text,
    ssh,
)

pytestmark = pytest.mark.testbed

MODEL, OFFSET = "itregauth", 5000
TWO = {name: HOSTS[name] for name in ("tb1", "tb2")}
ADDRESS, PORT = "10.87.0.1", 5443
REGISTRY = f"{ADDRESS}:{PORT}"
CERTS = Path("/etc/docker/certs.d") / REGISTRY
PUSH = ("deployer", "push-" + base64.b32encode(os.urandom(10)).decode().lower())
PULL = ("fleetpull", "pull-" + base64.b32encode(os.urandom(10)).decode().lower())
HOST_CONFIG = "/root/.docker/config.json"


def _auth(user: str, password: str) -> str:
    return base64.b64encode(f"{user}:{password}".encode()).decode()


# -- the registry ---------------------------------------------------------------------------

def _certificates(work: Path) -> None:
    now = datetime.datetime.now(datetime.UTC)
    ca_key, key = (ec.generate_private_key(ec.SECP256R1()) for _ in range(2))
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "itregauth CA")])

    def signed(subject: x509.Name, public: ec.EllipticCurvePublicKey, *, ca: bool
               ) -> x509.Certificate:
        builder = (x509.CertificateBuilder().subject_name(subject).issuer_name(ca_name)
                   .public_key(public).serial_number(x509.random_serial_number())
                   .not_valid_before(now - datetime.timedelta(minutes=5))
                   .not_valid_after(now + datetime.timedelta(hours=6))
                   .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True))
        if not ca:
            builder = builder.add_extension(x509.SubjectAlternativeName(
                [x509.IPAddress(ipaddress.ip_address(ADDRESS))]), critical=False)
        return builder.sign(ca_key, hashes.SHA256())

    ca = signed(ca_name, ca_key.public_key(), ca=True)
    server = signed(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, ADDRESS)]),
                    key.public_key(), ca=False)
    (work / "ca.crt").write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    (work / "server.crt").write_bytes(server.public_bytes(serialization.Encoding.PEM))
    (work / "server.key").write_bytes(key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption()))


CONFIG = """version: 0.1
log:
  level: debug
  formatter: json
storage:
  filesystem:
    rootdirectory: {work}/data
http:
  addr: {registry}
  tls:
    certificate: {work}/server.crt
    key: {work}/server.key
auth:
  htpasswd:
    realm: itregauth
    path: {work}/htpasswd
"""


@dataclass(frozen=True)
class AuthRegistry:
    """The registry of this module: where its files are, and its access log."""

    work: Path

    def requests(self, since: int = 0) -> list[tuple[str, str, str]]:
        """(client address, account or '', method and path) of every request, from the
        ``since``-th line of the log on. Its handlers' debug lines name the account
        (``auth.user.name``), the request id ties them to the request's address."""
        seen: dict[str, list[str]] = {}
        for line in (self.work / "registry.log").read_text().splitlines()[since:]:
            if not line.startswith("{"):
                continue
            entry = json.loads(line)
            key = entry.get("http.request.id")
            if not key or "http.request.remoteaddr" not in entry:
                continue
            request = seen.setdefault(key, [
                entry["http.request.remoteaddr"].rsplit(":", 1)[0], "",
                f"{entry['http.request.method']} {entry['http.request.uri']}"])
            request[1] = request[1] or entry.get("auth.user.name", "")
        return [(address, user, what) for address, user, what in seen.values()]

    def mark(self) -> int:
        return len((self.work / "registry.log").read_text().splitlines())


def _port_open() -> bool:
    try:
        socket.create_connection((ADDRESS, PORT), timeout=1).close()
    except OSError:
        return False
    return True


@pytest.fixture(scope="module")
def registry() -> Iterator[AuthRegistry]:
    assert not _port_open(), f"{REGISTRY} is taken"
    work = Path(tempfile.mkdtemp(prefix="itregauth-", dir="/var/tmp"))
    _certificates(work)
    (work / "htpasswd").write_text("".join(
        f"{user}:{bcrypt.hashpw(password.encode(), bcrypt.gensalt(rounds=6)).decode()}\n"
        for user, password in (PUSH, PULL)))
    (work / "config.yml").write_text(CONFIG.format(work=work, registry=REGISTRY))
    made = [p for p in (CERTS.parent.parent, CERTS.parent, CERTS) if not p.exists()]
    CERTS.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(work / "ca.crt", CERTS / "ca.crt")
    with (work / "registry.log").open("wb") as log:
        process = subprocess.Popen(["docker-registry", "serve", str(work / "config.yml")],
                                   stdout=log, stderr=log, stdin=subprocess.DEVNULL,
                                   start_new_session=True)
    try:
        deadline = time.monotonic() + 20
        while not _port_open():
            assert process.poll() is None and time.monotonic() < deadline, \
                (work / "registry.log").read_text()[-2000:]
            time.sleep(0.1)
        yield AuthRegistry(work)
    finally:
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
        (CERTS / "ca.crt").unlink(missing_ok=True)
        for directory in reversed(made):
            directory.rmdir()
        shutil.rmtree(work, ignore_errors=True)


# -- the fleet ------------------------------------------------------------------------------

def _host_login(host: str, login: tuple[str, str] | None) -> None:
    """Give ``host`` the docker login ``login`` to the registry (None: none)."""
    if login is None:  # and the directory, when nothing else is in it
        ssh(host, f"rm -f {HOST_CONFIG}; rmdir /root/.docker 2>/dev/null; true")
        return
    config = json.dumps({"auths": {REGISTRY: {"auth": _auth(*login)}}})
    ssh(host, f"mkdir -p -m 700 /root/.docker && umask 077 && "
              f"printf '%s' '{config}' > {HOST_CONFIG}")


def _make(tmp: Path) -> Fleet:
    source = tmp / "models" / MODEL
    source.mkdir(parents=True)
    for version in (1, 2, 3):
        copy_version(SOURCE_MODEL / str(version), source, version)
    pulling = {"model_transfer": "pull", "model_registry": f"{REGISTRY}/itregauth-models"}
    rollout = ("Rollout(serial=('100%',), min_healthy_s=1.0, window_s=0.0, keep_releases=3, "
               "load_timeout_s=120)")
    inventory = tmp / "inventory.py"
    inventory.write_text(inventory_text(
        title="the registry login tests", model=MODEL, source=source, golden=GOLDEN,
        offset=OFFSET, warmup="Warmup(samples=5)", hosts=TWO, extra_vars=pulling,
        rollout=rollout))
    (tmp / "inventory_logins.py").write_text(inventory_text(
        title="the registry login tests, a pull login named", model=MODEL, source=source,
        golden=GOLDEN, offset=OFFSET, warmup="Warmup(samples=5)", hosts=TWO, rollout=rollout,
        extra_vars={**pulling, "pull_logins": {REGISTRY: "env:ITREGAUTH_PULL_LOGIN"}}))
    return Fleet(model=MODEL, offset=OFFSET, tmp=tmp, source=source, inventory=inventory,
                 fast_playbook=write_fast_playbook(tmp), hosts=TWO)


def _tidy() -> None:
    for host in TWO:
        _host_login(host, None)


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory, registry: AuthRegistry
          ) -> Iterator[Fleet]:
    for host in TWO:  # a host's own login is this module's to give: none may be there
        found = ssh(host, f"test -e {HOST_CONFIG}", check=False).returncode == 0
        assert not found, f"{host} has a docker config already: this test would replace it"
    here = tmp_path_factory.mktemp("deploy-machine-docker")
    (here / "config.json").write_text(json.dumps({"auths": {REGISTRY: {"auth": _auth(*PUSH)}}}))
    saved = {k: os.environ.get(k) for k in ("DOCKER_CONFIG", "ITREGAUTH_PULL_LOGIN")}
    os.environ["DOCKER_CONFIG"] = str(here)  # what every fab run of this module sees
    try:
        yield from fleet_lifetime(MODEL, lambda: _make(tmp_path_factory.mktemp(MODEL)),
                                  keep_env="TFSDEPLOY_REGAUTH_TESTS_KEEP", hosts=TWO,
                                  tidy=_tidy)
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def _accounts(registry: AuthRegistry, since: int) -> dict[str, set[str]]:
    """Who each client was at the registry since the mark: address -> the accounts it logged
    in with (its requests before a login, answered 401, name none)."""
    found: dict[str, set[str]] = {}
    for address, user, _ in registry.requests(since):
        found.setdefault(address, set()).update({user} - {""})
    return found


def _no_secret_shown(fleet: Fleet, run: Run) -> None:
    """Neither password in fab's output (its JSON included) nor in the hosts' audit logs."""
    audits = "".join(json.dumps(fleet.audit(host)) for host in fleet.hosts)
    for password in (PUSH[1], PULL[1]):
        assert password not in run.stdout + run.stderr, "a password in fab's output"
        assert password not in audits, "a password in an audit log"


def _pulled(run: Run) -> dict[str, str]:
    return {h: next(s["detail"] for s in o["steps"] if s["step"] == "stage_model")
            for h, o in run.json()["hosts"].items()}


def test_the_hosts_pull_with_their_own_login_never_the_deploy_machine_s(
        fleet: Fleet, registry: AuthRegistry) -> None:
    for host in fleet.hosts:
        _host_login(host, PULL)
    since = registry.mark()
    run = fleet.fab("deploy", "--version", "1", "--json", playbook=fleet.fast_playbook)
    assert run.code == 0, run.describe()
    assert all(f"pulled {REGISTRY}/itregauth-models/{MODEL}@sha256:" in d
               for d in _pulled(run).values()), _pulled(run)
    accounts = _accounts(registry, since)
    assert accounts[ADDRESS] == {"deployer"}, accounts  # published over HTTPS, its login
    for host in fleet.hosts:
        assert accounts[ADDRESSES[host]] == {"fleetpull"}, (host, accounts)
    _no_secret_shown(fleet, run)
    fleet.assert_serving(1)


def test_a_pull_login_the_inventory_names_by_reference(fleet: Fleet,
                                                       registry: AuthRegistry) -> None:
    for host in fleet.hosts:
        _host_login(host, None)
    os.environ["ITREGAUTH_PULL_LOGIN"] = ":".join(PULL)
    try:
        since = registry.mark()
        run = fleet.fab("deploy", "--version", "2", "--json", playbook=fleet.fast_playbook,
                        inventory=fleet.tmp / "inventory_logins.py")
    finally:
        os.environ.pop("ITREGAUTH_PULL_LOGIN")
    assert run.code == 0, run.describe()
    accounts = _accounts(registry, since)
    for host in fleet.hosts:
        assert accounts[ADDRESSES[host]] == {"fleetpull"}, (host, accounts)
    _no_secret_shown(fleet, run)
    fleet.assert_serving(2)
    unset = fleet.fab("deploy", "--version", "3", inventory=fleet.tmp / "inventory_logins.py")
    assert unset.code == 1, unset.describe()  # the reference cannot be read: no host touched
    assert "field pull_logins.10.87.0.1:5443] the pull login env:ITREGAUTH_PULL_LOGIN for " \
           "10.87.0.1:5443 is not set in this environment" in unset.out, unset.describe()


def test_a_host_without_a_login_is_refused_and_nothing_serving_changes(
        fleet: Fleet, registry: AuthRegistry) -> None:
    _host_login("tb1", PULL)
    _host_login("tb2", None)
    since = registry.mark()
    run = fleet.fab("deploy", "--version", "3", "--json", playbook=fleet.fast_playbook)
    assert run.code == 1, run.describe()  # the stage failed: nothing serving changed
    error = run.json()["hosts"]["tb2"]["error"]
    assert f"pull of {REGISTRY}/itregauth-models/{MODEL}@sha256:" in error, error
    assert "no basic auth credentials" in error or "unauthorized" in error, error
    assert "the host's own `docker login`, or pull_logins in the inventory" in error, error
    accounts = _accounts(registry, since)
    assert accounts[ADDRESSES["tb2"]] == set(), accounts  # anonymous: refused, not lent one
    assert "deployer" not in accounts.get(ADDRESSES["tb1"], set()), accounts
    _no_secret_shown(fleet, run)
    fleet.assert_serving(2)
