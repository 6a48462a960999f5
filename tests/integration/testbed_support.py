"""What every integration test module needs of the local fleet (scripts/testbed): the testbed's
hosts, SSH to them, `fab` runs, a test model's place on the fleet, gRPC Predict on its ports.

deploy_support (the rolling-deploy tests) and rollback_support (the rollback, guard and
convergence tests) build on this module.

Each test module deploys its OWN model (own name, own port offset) so that it never collides
with another module or with another session sharing the fleet. Ports of a model with offset o:
stable gRPC/REST 8500/8501 + o, slots 8510/8511 and 8520/8521 + o (the proxy's admin API is
a unix socket on the host, no port).
Offsets in use: 0 is the default inventory's (the demo's half_plus_two and resnet50), 200
hand-run demos, 300-800 the rollback tests, 900 benchmarks/bench_rollback.py, 1000-1300 the
deploy tests, 1400 benchmarks/bench_deploy.py, 4400 the observability test (itobserve), 4500 the
gateway tests (test_gateway.py, on tb1, tb2 and the gateway host tbgw), 4700 test_tune.py, 4750
benchmarks/bench_tune.py, 5200 test_tune_scratch.py (`fab tune`'s scratch instances listen on
free ports above 14000).

The test models are half_plus_two and its relatives (docs/models.md): a good version v answers
y = 0.5 x + v + 1, so a Predict of x = 2 tells which version serves.

Traffic goes only to 10.87.0.x (the testbed hosts) and 127.0.0.1.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import suppress
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, TypeVar

import pytest

from tfsdeploy.core.inventory.layout import HostPaths

REPO = Path(__file__).resolve().parents[2]
STATE = Path(os.environ.get("TFSDEPLOY_TESTBED_DIR", "/var/lib/tfsdeploy-testbed"))
CACHE = Path(os.environ.get("TFSDEPLOY_CACHE", "/var/cache/tfsdeploy"))
MODELS = CACHE / "models"
VENV_BIN = CACHE / "venv" / "bin"
SSH_KEY = STATE / "ssh" / "id_ed25519"
KNOWN_HOSTS = STATE / "ssh" / "known_hosts"
# the master connections of ssh(): a private directory (a socket path must stay short), this
# process's own: a module's end closes its masters (forget_connections), never those of the
# test worker beside it
MUX_DIR = Path(tempfile.gettempdir()) / f"tfsdeploy-tests-ssh-{os.getuid()}-{os.getpid()}"
REGISTRY = "10.87.0.1:5000"
DATA_ROOT = "/srv/tfsdeploy"  # the data root of the suite's inventories, as the hosts see it
# the testbed contract: tbN is 10.87.0.(10+N) up to tb10, then 10.87.0.(100+N) up to tb30,
# a simulated 16 GiB GPU each
ADDRESSES = {f"tb{n}": f"10.87.0.{10 + n if n <= 10 else 100 + n}" for n in range(1, 31)}
# the bastion (`scripts/testbed up --bastion`): OpenSSH's default MaxStartups and MaxSessions
BASTION_HOST, BASTION_ADDRESS = "tbjump", "10.87.0.31"
# the hosts of a test module's model unless it names others
HOSTS = {name: ADDRESSES[name] for name in ("tb1", "tb2", "tb3")}
# the fleet of a module whose cases are per host and need only a first and a second batch
TWO_HOSTS = {name: ADDRESSES[name] for name in ("tb1", "tb2")}
# The suite's fleet (scripts/test brings it up so): tb1..tb3 as the demo's, plus tb4 with two
# GPUs, reserved (left out of inventory/testbed.py), which only the modules of the xdist group
# "gpu-host" use (one at a time): the per-GPU tests and the GPU filler, whose GPU use would
# starve other modules' deploys on a shared host.
GPU_HOST = "tb4"
SUITE_FLEET = ("--hosts", "4", "--reserve", GPU_HOST, "--gpus", f"{GPU_HOST}=2", "--gpu-mib",
               f"{GPU_HOST}=16384")
# the second port of every host's sshd (docs/testbed-contract.md): a test that cuts one run's
# SSH off drops only this port, so the other modules' runs on the fleet keep theirs
ALT_SSH_PORT = 2222
# the images every inventory of the tests names, as the registry must hold them
IMAGES = (("tfserving-emulator", "2.21.0"), ("tfsdeploy-proxy", "2.6"))


def expected_y(version: int, x: float = 2.0) -> float:
    """y of a half_plus_two-family version whose source number is ``version``."""
    return 0.5 * x + version + 1


# -- the fleet ------------------------------------------------------------------------------

def run_testbed(*args: str, timeout: float = 900) -> subprocess.CompletedProcess[str]:
    """`scripts/testbed ARGS` (its output captured)."""
    return subprocess.run(["bash", str(REPO / "scripts" / "testbed"), *args],
                          capture_output=True, text=True, timeout=timeout, cwd=REPO)


def fleet_daemons() -> dict[str, tuple[int, int]]:
    """Each serving host's sshd and dockerd pids (scripts/testbed status)."""
    report = json.loads(run_testbed("status", "--json", timeout=300).stdout)
    return {h["name"]: (h["sshd"], h["dockerd"]) for h in report["hosts"]}


def _images_in_registry() -> bool:
    try:
        for name, tag in IMAGES:
            with urllib.request.urlopen(f"http://{REGISTRY}/v2/{name}/tags/list",
                                        timeout=5) as reply:
                if tag not in json.loads(reply.read()).get("tags") or []:
                    return False
    except Exception:
        return False
    return True


def fleet_healthy() -> bool:
    """Every host's sshd and dockerd answer, the registry too (scripts/testbed status), with
    the images in it."""
    # status waits while a fleet command (a test's reboot of its host) runs: up to 5 minutes
    return (run_testbed("status", "--json", timeout=300).returncode == 0
            and _images_in_registry())


# set by scripts/test once it has brought the fleet up: from then on the fleet is the suite's,
# and a fleet found unhealthy at a module's start was broken by an earlier test or the product
SUITE_OWNS_FLEET = "TFSDEPLOY_SUITE_OWNS_FLEET"


def ensure_fleet() -> None:
    """A healthy fleet: brought up when it is not (idempotent). A fleet command in progress
    (another session's `up` or `down`, a test's reboot of its host) is waited out by
    `scripts/testbed status`, which answers between such commands, never during one; a fleet
    that `up` leaves unhealthy is an error.

    Under scripts/test (``SUITE_OWNS_FLEET``), which brought the fleet up before any test, a
    fleet found unhealthy is never repaired silently: it is brought back up for the modules
    after this one, and this module fails with what `scripts/testbed status` said."""
    if os.geteuid() != 0:
        pytest.fail("the local fleet needs root (namespaces, bridges, dockerd)", pytrace=False)
    if fleet_healthy():
        return
    owned = os.environ.get(SUITE_OWNS_FLEET) == "1"
    found = run_testbed("status", timeout=300) if owned else None
    proc = run_testbed("up", *SUITE_FLEET)
    if proc.returncode != 0 or not fleet_healthy():
        raise RuntimeError(f"the testbed does not come up (scripts/testbed up exit "
                           f"{proc.returncode}):\n{proc.stdout[-2000:]}{proc.stderr[-2000:]}")
    if found is not None:
        pytest.fail("the suite's fleet was unhealthy at this module's start (an earlier test "
                    "or the product left it so; `scripts/testbed up` has repaired it for the "
                    "modules after this one); `scripts/testbed status` said:\n"
                    f"{found.stdout[-2000:]}{found.stderr[-1000:]}", pytrace=False)


def netns(host: str, *argv: str) -> list[str]:
    """``argv`` run in ``host``'s network namespace (its iptables, its sockets)."""
    return ["nsenter", f"--net=/var/run/netns/{host}", *argv]


# -- SSH to the hosts -----------------------------------------------------------------------

def ssh_argv(address: str, command: str, connect_timeout: int = 10,
             shared: bool = False) -> list[str]:
    """OpenSSH's argv for ``command`` on ``address``; ``shared``: through one master connection
    per host (ControlMaster), kept 30 s after its last use, so that the many short checks of a
    test pay for one key exchange and login, not one each; a master whose host went away is
    given up within 10 s (ServerAlive) and the next call connects anew."""
    mux = ["-o", "ControlMaster=auto", "-o", f"ControlPath={MUX_DIR}/%C",
           "-o", "ControlPersist=30", "-o", "ServerAliveInterval=5",
           "-o", "ServerAliveCountMax=2"] if shared else []
    return ["ssh", "-i", str(SSH_KEY), "-o", f"UserKnownHostsFile={KNOWN_HOSTS}",
            "-o", "StrictHostKeyChecking=yes", "-o", "BatchMode=yes", "-o", "IdentitiesOnly=yes",
            "-o", f"ConnectTimeout={connect_timeout}", *mux, f"root@{address}", command]


_SHARED: set[str] = set()  # the hosts whose shared master this process may have started


def ssh(host: str, command: str, *, check: bool = True, timeout: float = 120
        ) -> subprocess.CompletedProcess[str]:
    """A shell command on a testbed host, as root, once.

    Nothing cuts the tests' own connections (port 22: the modules that cut a host off cut
    its second sshd port, ALT_SSH_PORT, which their inventories use), so ssh's own failure
    (exit 255) is a failure like any other; a test that reboots a host says so
    (``forget_connection``).
    """
    MUX_DIR.mkdir(mode=0o700, exist_ok=True)
    _SHARED.add(host)
    proc = subprocess.run(ssh_argv(ADDRESSES[host], command, shared=True),
                          capture_output=True, text=True, timeout=timeout)
    if check and proc.returncode != 0:
        raise AssertionError(f"ssh {host} {command!r} -> {proc.returncode}\n"
                             f"stdout: {proc.stdout[-2000:]}\nstderr: {proc.stderr[-2000:]}")
    return proc


def proxy_stat(host: str, model: str, *, check: bool = False, timeout: float = 120) -> str:
    """``show stat`` (CSV) of ``model``'s proxy on ``host``, read from its admin socket on the
    host; with ``check`` False, "" when the socket does not answer."""
    socket = HostPaths(root=DATA_ROOT, model=model).admin_socket
    return ssh(host, f"echo 'show stat' | socat -t 2 - UNIX-CONNECT:{socket}", check=check,
               timeout=timeout).stdout


def forget_connection(host: str) -> None:
    """Close the shared master connection to ``host`` (ssh_argv's ``shared``): a test that
    rebooted the host or restarted its sshd calls this, so that the next command connects anew
    instead of waiting on a connection the reboot cut (ServerAlive would give it up only
    after 10 s, and the command would fail)."""
    subprocess.run(["ssh", "-o", f"ControlPath={MUX_DIR}/%C", "-O", "exit",
                    f"root@{ADDRESSES[host]}"], capture_output=True, timeout=30)


def forget_connections() -> None:
    """Close every shared master connection (``ssh``'s): a module's masters end with it
    instead of persisting 30 s into the next module, which may stop the whole fleet and then
    count the processes left behind (tests/testbed/test_fleet_lifecycle.py)."""
    while _SHARED:
        forget_connection(_SHARED.pop())
    with contextlib.suppress(OSError):  # gone, or a master still removing its socket
        MUX_DIR.rmdir()


def clean_model(model: str, hosts: dict[str, str] = HOSTS) -> None:
    """Every trace of ``model`` on ``hosts``: containers (`fab tune`'s scratch instances too),
    proxy, releases, versions, locks."""
    # two lists: docker ps ANDs its label filters
    script = (f"ids=$(docker ps -aq --filter label=tfsdeploy.model={model}; "
              f"docker ps -aq --filter label=tfsdeploy.tune={model}); "
              f"[ -n \"$ids\" ] && docker rm -f $ids >/dev/null; "
              f"docker rm -f tfs-proxy-{model} >/dev/null 2>&1; "
              f"rm -rf /srv/tfsdeploy/{model} /srv/tfsdeploy/models/{model}; "
              f"rm -f /srv/tfsdeploy/gpu/overhead/*.{model}.json "
              f"/srv/tfsdeploy/gpu/reservations/*.{model}.*.json; true")
    for host in hosts:
        with suppress(subprocess.TimeoutExpired):
            ssh(host, script, check=False, timeout=120)


# -- a model's versions ------------------------------------------------------------------------

def copy_version(origin: Path, source: Path, number: int) -> None:
    """Copy the version directory ``origin`` into the model source ``source`` as version
    ``number``: a copy beside ``source``, then a rename (never a partial version dir)."""
    work = source.parent / f".copy-{number}"
    shutil.copytree(origin, work)
    work.rename(source / str(number))


# -- a test inventory ------------------------------------------------------------------------

INVENTORY = '''"""Inventory of {title}: model {model!r} on tb1..tb3 (generated)."""
from tfsdeploy.core.inventory.catalog import (Batching, Model, Rollout, Signature, TensorSpec,
                                              Threads, Warmup)
from tfsdeploy.core.inventory.fleet import Gpu, Group, Host

hosts = [Host(name, address,
              gpus=[Gpu(i, {gpu_mib!r}, "Simulated Tesla T4") for i in range({gpus})])
         for name, address in {hosts!r}.items()]
groups = {groups}
defaults = {{
    "ssh_user": "root",
    "ssh_key": {ssh_key!r},
    "ssh_known_hosts": {known_hosts!r},
    "data_root": "{data_root}",
    "image": "{registry}/tfserving-emulator:2.21.0",
    "tfserving_version": "2.21.0",
    "proxy_image": "{registry}/tfsdeploy-proxy:2.6",
    "docker_gpus": "all",{extra_defaults}
}}
models = [
    Model(
        name={model!r},
        source={source!r},
        signature=Signature(inputs={{"x": TensorSpec("DT_FLOAT", (-1, 1))}},
                            outputs={{"y": TensorSpec("DT_FLOAT", (-1, 1))}}),
        memory_mib={memory_mib!r},
        latency_slo_ms={slo_ms!r},
        batching=Batching(max_batch_size=32, batch_timeout_micros=2000, max_enqueued_batches=64,
                          num_batch_threads=2, allowed_batch_sizes=(8, 16, 32)),
        threads=Threads(intra_op=1, inter_op=2, grpc_max_threads=256),
        warmup={warmup},
        rollout={rollout},
        golden={golden!r},
        port_offset={offset!r},
    ),
]
'''


RESNET50_INVENTORY = '''"""The testbed's resnet50 as {model!r} on {host} (generated)."""
from tfsdeploy.core.inventory.catalog import (Batching, Model, Rollout, Signature, TensorSpec,
                                              Threads, Warmup)
from tfsdeploy.core.inventory.fleet import Gpu, Host

hosts = [Host({host!r}, {address!r}, gpus=[Gpu(0, 16384, "Simulated Tesla T4")])]
defaults = {{
    "ssh_user": "root", "ssh_key": {ssh_key!r}, "ssh_known_hosts": {known_hosts!r},
    "data_root": "{data_root}", "image": "{registry}/tfserving-emulator:2.21.0",
    "tfserving_version": "2.21.0", "proxy_image": "{registry}/tfsdeploy-proxy:2.6",
    "docker_gpus": "all", "gpu_safety_margin": 1.2, "gpu_headroom": 0.1,
}}
models = [
    Model(
        name={model!r},
        source={source!r},
        signature=Signature(inputs={{"inputs": TensorSpec("DT_FLOAT", (-1, 224, 224, 3))}},
                            outputs={{"predictions": TensorSpec("DT_FLOAT", (-1, 1000))}}),
        memory_mib=2048,
        latency_slo_ms=1500,
        batching=Batching(max_batch_size=8, batch_timeout_micros={batch_timeout_micros!r},
                          max_enqueued_batches=32, num_batch_threads=1,
                          allowed_batch_sizes=(1, 2, 4, 8)),
        threads={threads},
        warmup=Warmup(samples=20, p99_ms=1500),
        rollout=Rollout(serial=("100%",), min_healthy_s=1),
        golden={golden!r},
        port_offset={offset!r},
    ),
]
'''


def resnet50_inventory(path: Path, *, model: str, host: str, offset: int,
                       threads: str = "Threads(intra_op=2, inter_op=2, grpc_max_threads=256)",
                       batch_timeout_micros: int = 20000) -> Path:
    """An inventory of one testbed host with the testbed's resnet50 (inventory/testbed.py's
    catalog entry, pushed over SSH) under the name ``model``, its ``threads`` and batch
    timeout as given."""
    path.write_text(RESNET50_INVENTORY.format(
        model=model, host=host, address=ADDRESSES[host], ssh_key=str(SSH_KEY),
        known_hosts=str(KNOWN_HOSTS), data_root=DATA_ROOT, registry=REGISTRY,
        source=str(MODELS / "resnet50"),
        golden=str(MODELS / "resnet50" / "catalog.json"), offset=offset, threads=threads,
        batch_timeout_micros=batch_timeout_micros))
    return path


def inventory_text(*, title: str, model: str, source: Path, golden: Path, offset: int,
                   warmup: str, rollout: str, groups: str = "{}", memory_mib: int = 512,
                   gpu_mib: int = 16384, gpus: int | dict[str, int] = 1, slo_ms: int = 50,
                   hosts: dict[str, str] = HOSTS, ssh_port: int = 22,
                   extra_vars: dict[str, Any] | None = None) -> str:
    """A test inventory (Python): ``hosts`` (``gpus`` GPUs of ``gpu_mib`` each) with
    ``groups``, and one model of the half_plus_two signature whose ``warmup`` and ``rollout``
    are the Warmup(...) and Rollout(...) expressions given; ``gpus`` per host name (default
    1) when a dict; ``ssh_port`` ALT_SSH_PORT for a module that cuts its own runs' SSH off;
    ``extra_vars`` more defaults (``model_transfer``, ...)."""
    extra = f'\n    "ssh_port": {ssh_port!r},' if ssh_port != 22 else ""
    extra += "".join(f"\n    {k!r}: {v!r}," for k, v in (extra_vars or {}).items())
    gpus_expr = f"{gpus!r}.get(name, 1)" if isinstance(gpus, dict) else repr(gpus)
    return INVENTORY.format(
        title=title, model=model, hosts=hosts, ssh_key=str(SSH_KEY), extra_defaults=extra,
        known_hosts=str(KNOWN_HOSTS), data_root=DATA_ROOT, registry=REGISTRY,
        source=str(source),
        golden=str(golden), offset=offset, warmup=warmup, rollout=rollout, groups=groups,
        slo_ms=slo_ms, memory_mib=memory_mib, gpu_mib=gpu_mib, gpus=gpus_expr)


# -- fab ------------------------------------------------------------------------------------

def fab_env() -> dict[str, str]:
    env = dict(os.environ)
    env["PATH"] = f"{VENV_BIN}:{env.get('PATH', '')}"
    env["TF_CPP_MIN_LOG_LEVEL"] = "3"
    env["COLUMNS"] = "200"  # rich tables: keep error cells on one line
    env.pop("TFSDEPLOY_INVENTORY", None)
    return env


NOISE = re.compile(r"^(I0000|W0000|E0000|WARNING: All log messages|.*cuda|.*oneDNN).*$\n?", re.M)


@dataclass
class Run:
    """One finished fab command."""

    argv: list[str]
    code: int
    stdout: str
    stderr: str
    seconds: float

    @property
    def out(self) -> str:
        return NOISE.sub("", self.stdout + self.stderr)

    def json(self) -> dict[str, Any]:
        return json.loads(self.stdout)  # type: ignore[no-any-return]

    def describe(self) -> str:
        cmd = " ".join(shlex.quote(a) for a in self.argv[1:])
        return f"$ fab {cmd}\n-> exit {self.code} in {self.seconds:.1f} s\n{self.out[-8000:]}"


class Watched:
    """A fab command running in the background; its output lines are collected as they come
    (stderr merged into stdout) so that a test can act on a given progress line.

    With ``own_session`` it leads a process group of its own (its ssh children with it), which
    ``kill_when`` kills with SIGKILL on cue."""

    # every one started and not yet seen to exit: ``stop_left_running`` ends them after each
    # test, so that a test failing mid-way leaves no deploy holding the model's lock for the
    # next test (a failed reboot once left one, and the next test got exit 4, lock held)
    started_ones: ClassVar[list[Watched]] = []

    def __init__(self, argv: list[str], log: list[str], *, own_session: bool = False) -> None:
        Watched.started_ones.append(self)
        self.argv = argv
        self.lines: list[str] = []
        self.killed_on: str | None = None  # the line on which kill_when killed it
        self._kill_on: re.Pattern[str] | None = None
        self._own_session = own_session
        self._log = log
        self._cond = threading.Condition()
        self.started = time.monotonic()
        self.proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                     text=True, cwd=REPO, env=fab_env(), bufsize=1,
                                     start_new_session=own_session)
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            with self._cond:
                self.lines.append(line.rstrip("\n"))
                self._kill_if_cued(self.lines[-1])
                self._cond.notify_all()
        with self._cond:
            self._cond.notify_all()

    def _kill_if_cued(self, line: str) -> None:
        """(holding ``_cond``) SIGKILL to the process group on the first line matching the
        pattern of ``kill_when``: right when the line is read, without waiting for a waiter."""
        if self._kill_on is None or self.killed_on is not None or not self._kill_on.search(line):
            return
        self.killed_on = line
        with suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGKILL)

    def wait_for(self, pattern: str, timeout: float = 300) -> str:
        """Block until a line matches ``pattern``; returns it (fails on exit or timeout)."""
        regex = re.compile(pattern)
        end = time.monotonic() + timeout
        seen = 0
        with self._cond:
            while True:
                for line in self.lines[seen:]:
                    if regex.search(line):
                        return line
                seen = len(self.lines)
                if self.proc.poll() is not None and not self._reader.is_alive():
                    raise AssertionError(f"fab exited {self.proc.returncode} before a line "
                                         f"matched {pattern!r}:\n{self.text()[-6000:]}")
                if time.monotonic() > end:
                    raise AssertionError(f"no line matched {pattern!r} in {timeout} s:\n"
                                         f"{self.text()[-6000:]}")
                self._cond.wait(timeout=0.5)

    def kill_when(self, pattern: str, timeout: float = 300) -> str:
        """kill -9 of the whole process group on the first line matching ``pattern`` (needs
        ``own_session``); returns that line. Fails when none comes (fab is killed then too)."""
        assert self._own_session, "kill_when kills a process group: start with own_session"
        with self._cond:
            self._kill_on = re.compile(pattern)
            for line in self.lines:  # the lines read before this call
                self._kill_if_cued(line)
        try:
            self.wait_for(pattern, timeout)
        except AssertionError:
            self.kill()
            self._log.append(self.describe("killed: no line matched the cue"))
            raise
        self.proc.wait(timeout=30)
        self._reader.join(timeout=10)
        self._log.append(self.describe())
        assert self.killed_on is not None
        return self.killed_on

    def kill_if(self, cue: Callable[[], bool], what: str, timeout: float = 300,
                poll_s: float = 0.005) -> None:
        """kill -9 of the whole process group as soon as ``cue()`` holds (polled every
        ``poll_s``; needs ``own_session``): for a point between two of its lines, seen on the
        hosts. Fails when it exits first or nothing comes (it is killed then too)."""
        assert self._own_session, "kill_if kills a process group: start with own_session"
        end = time.monotonic() + timeout
        while not cue():
            if self.proc.poll() is not None or time.monotonic() > end:
                self.kill()
                self._log.append(self.describe(f"killed: never saw {what}"))
                raise AssertionError(f"fab exited {self.proc.returncode} or ran {timeout} s "
                                     f"before {what}:\n{self.text()[-6000:]}")
            time.sleep(poll_s)
        with self._cond:
            self.killed_on = what
        with suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait(timeout=30)
        self._reader.join(timeout=10)
        self._log.append(self.describe())

    def kill_on_change(self, cue: FileCue, what: str, timeout: float = 300) -> None:
        """kill -9 of the whole process group the moment the file ``cue`` watches changes
        (needs ``own_session``). Fails when it exits first or nothing comes (it is killed
        then too)."""
        assert self._own_session, "a cue kills a process group: start with own_session"
        cue.watch(self.proc.pid)
        try:
            self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.kill()
        said = cue.outcome()
        self._reader.join(timeout=10)
        if said != "killed":
            self._log.append(self.describe(f"killed: never saw {what}"))
            raise AssertionError(f"fab exited {self.proc.returncode} before {what}:\n"
                                 f"{self.text()[-6000:]}")
        self.killed_on = what
        self._log.append(self.describe())

    def send(self, sig: int) -> None:
        self.proc.send_signal(sig)


    def finish(self, timeout: float = 300) -> Run:
        """Wait for the exit (kill -9 and fail after ``timeout``)."""
        try:
            self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            self._reader.join(timeout=10)
            self._log.append(self.describe("KILLED after timeout"))
            raise AssertionError(f"fab did not finish within {timeout} s (killed):\n"
                                 f"{self.text()[-6000:]}") from None
        self._reader.join(timeout=10)
        run = Run(self.argv, self.proc.returncode, "\n".join(self.lines), "",
                  time.monotonic() - self.started)
        self._log.append(run.describe())
        return run

    def kill(self) -> None:
        """kill -9 (of its process group with ``own_session``) unless it has exited."""
        if self.proc.poll() is None:
            if self._own_session:
                with suppress(ProcessLookupError):
                    os.killpg(self.proc.pid, signal.SIGKILL)
            else:
                self.proc.kill()
            self.proc.wait(timeout=30)

    def text(self) -> str:
        return NOISE.sub("", "\n".join(self.lines) + "\n")

    @classmethod
    def stop_left_running(cls) -> list[Watched]:
        """kill -9 every command started by a test that is still running when the test has
        ended (a test that failed before it waited for one); returns those killed."""
        left = [w for w in cls.started_ones if w.proc.poll() is None]
        cls.started_ones.clear()
        for watched in left:
            watched.kill()
            watched._reader.join(timeout=10)
            watched._log.append(watched.describe("killed: still running when its test ended"))
        return left

    def describe(self, why: str | None = None) -> str:
        if why is None:
            done = "killed on cue" if self.killed_on is not None else "exit"
            why = f"{done} (rc {self.proc.returncode})"
        return f"$ fab {' '.join(self.argv[1:])}\n-> {why}\n{self.text()[-6000:]}"

class FileCue:
    """A watcher of one file in its own process (file_cue.py), armed before the run it will
    kill starts: a test busy with its clients may not poll in time, an inotify wake-up in a
    process of its own does."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.proc = subprocess.Popen(
            [sys.executable, str(Path(__file__).with_name("file_cue.py")), str(path)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        assert self.proc.stdout is not None
        armed = self.proc.stdout.readline().strip()
        assert armed == "armed", f"the watcher of {path} did not start: {armed!r}"

    def watch(self, group: int) -> None:
        """Kill process group ``group`` when the file changes."""
        assert self.proc.stdin is not None
        self.proc.stdin.write(f"{group}\n")
        self.proc.stdin.flush()

    def outcome(self) -> str:
        """``killed`` or ``gone`` (the group ended first), once the watcher has ended."""
        assert self.proc.stdout is not None
        try:
            said = self.proc.stdout.readline().strip()
            self.proc.wait(timeout=10)
        finally:
            if self.proc.poll() is None:
                self.proc.kill()
        return said



# -- one test module's model on the fleet ----------------------------------------------------

@dataclass(kw_only=True)
class ModelFleet:
    """A test module's model on the fleet: its source and inventory, its ports, the fab runs
    made for it (``log``) and what the hosts hold of it."""

    model: str
    offset: int
    tmp: Path
    source: Path
    inventory: Path
    hosts: dict[str, str] = field(default_factory=lambda: dict(HOSTS))
    log: list[str] = field(default_factory=list)

    @property
    def grpc_port(self) -> int:
        return 8500 + self.offset

    @property
    def rest_port(self) -> int:
        return 8501 + self.offset

    # fab ---------------------------------------------------------------------------------
    def argv(self, *args: str, inventory: Path | None = None, model: str | None = None,
             playbook: Path | None = None) -> list[str]:
        argv = [str(VENV_BIN / "fab"), *args, "--model", model or self.model,
                "--inventory", str(inventory or self.inventory)]
        if playbook is not None:
            argv += ["--playbook", str(playbook)]
        return argv

    def fab(self, *args: str, inventory: Path | None = None, model: str | None = None,
            playbook: Path | None = None, timeout: float = 600) -> Run:
        """``fab <args> --model M --inventory I`` from the repository root."""
        argv = self.argv(*args, inventory=inventory, model=model, playbook=playbook)
        started = time.monotonic()
        try:
            proc = subprocess.run(argv, capture_output=True, text=True, timeout=timeout,
                                  cwd=REPO, env=fab_env())
        except subprocess.TimeoutExpired as error:
            out = (error.stdout or b"").decode() if isinstance(error.stdout, bytes) else \
                (error.stdout or "")
            self.log.append(f"$ {' '.join(argv)}\n-> TIMEOUT after {timeout} s\n{out[-6000:]}")
            raise AssertionError(f"fab {' '.join(args)} did not finish within {timeout} s:\n"
                                 f"{out[-4000:]}") from None
        run = Run(argv, proc.returncode, proc.stdout, proc.stderr, time.monotonic() - started)
        self.log.append(run.describe())
        return run

    def background(self, *args: str, inventory: Path | None = None,
                   own_session: bool = False) -> Watched:
        """``fab <args> ...`` started in the background (see Watched)."""
        return Watched(self.argv(*args, inventory=inventory), self.log,
                       own_session=own_session)

    def deploy(self, version: int, *args: str, inventory: Path | None = None,
               playbook: Path | None = None) -> Run:
        """A deploy that must succeed (set-up), once: a failure here, a lost connection
        included, is the toolkit's."""
        run = self.fab("deploy", "--version", str(version), *args, inventory=inventory,
                       playbook=playbook)
        assert run.code == 0, run.describe()
        return run

    # what the hosts hold -----------------------------------------------------------------
    def containers(self, host: str) -> list[dict[str, Any]]:
        """The model's serving containers on ``host`` (docker inspect), running or not, oldest
        release first."""
        fmt = ('{"id": "{{.Id}}", "name": "{{.Name}}", "created": "{{.Created}}", '
               '"started": "{{.State.StartedAt}}", "status": "{{.State.Status}}", '
               '"restarts": {{.RestartCount}}, '
               '"release": "{{index .Config.Labels "tfsdeploy.release"}}", '
               '"slot": "{{index .Config.Labels "tfsdeploy.slot"}}", '
               '"version": "{{index .Config.Labels "tfsdeploy.version"}}"}')
        out = ssh(host, f"ids=$(docker ps -aq --filter label=tfsdeploy.model={self.model}); "
                        f"[ -z \"$ids\" ] || docker inspect --format {shlex.quote(fmt)} $ids"
                  ).stdout
        found = [json.loads(line) for line in out.splitlines() if line.strip()]
        for c in found:
            c["name"] = c["name"].lstrip("/")
        return sorted(found, key=lambda c: c["release"])

    def current(self, host: str) -> dict[str, Any] | None:
        """The current release's manifest on ``host`` (None when there is none)."""
        path = f"/srv/tfsdeploy/{self.model}/current/manifest.json"
        out = ssh(host, f"if [ -e {path} ]; then cat {path}; else echo null; fi").stdout
        return json.loads(out)  # type: ignore[no-any-return]

    def records(self, host: str) -> list[dict[str, Any]]:
        """Every release record of the model on ``host``, oldest first."""
        out = ssh(host, f"cat /srv/tfsdeploy/{self.model}/releases/*/manifest.json "
                        "2>/dev/null; true").stdout
        decoder, found, at = json.JSONDecoder(), [], 0
        while at < len(out.rstrip()):
            record, at = decoder.raw_decode(out, at)
            found.append(record)
            while at < len(out) and out[at].isspace():
                at += 1
        return sorted(found, key=lambda r: r["id"])

    def audit(self, host: str) -> list[dict[str, Any]]:
        out = ssh(host, f"cat /srv/tfsdeploy/{self.model}/audit.log 2>/dev/null; true").stdout
        return [json.loads(line) for line in out.splitlines() if line.strip()]

    def dump(self) -> str:
        """Everything useful after a failure: fab runs, containers, their logs, audit tails."""
        parts = ["==== fab runs (last 8) ====", *self.log[-8:]]
        for host in self.hosts:
            try:
                parts.append(f"==== {host} ====")
                listed = ssh(host, "docker ps -a --format '{{.Names}} {{.Status}} {{.Labels}}' "
                                   "| grep -F " + shlex.quote(self.model),
                             check=False, timeout=30).stdout
                parts.append(listed)
                for name in (line.split()[0] for line in listed.splitlines() if line.strip()):
                    logs = ssh(host, f"docker logs --tail 25 {name} 2>&1", check=False,
                               timeout=30).stdout
                    parts.append(f"---- {host} docker logs {name} (last 25 lines) ----\n{logs}")
                parts.append("---- audit.log (tail) ----\n" + ssh(
                    host, f"tail -n 15 /srv/tfsdeploy/{self.model}/audit.log", check=False,
                    timeout=30).stdout)
            except Exception as error:  # the dump must never hide the failure
                parts.append(f"({host}: {type(error).__name__}: {error})")
        return "\n".join(parts)


AnyFleet = TypeVar("AnyFleet", bound=ModelFleet)


def fleet_lifetime(model: str, make: Callable[[], AnyFleet], *, keep_env: str,
                   tidy: Callable[[], None] | None = None,
                   hosts: dict[str, str] = HOSTS) -> Iterator[AnyFleet]:
    """Body of a module-scoped fixture: a healthy fleet with no trace of ``model``, then the
    Fleet ``make`` returns; ``model`` is cleaned off again after (unless the environment
    variable ``keep_env`` is 1). ``tidy`` undoes what an interrupted run may have left behind
    (network rules); it runs first and again after."""
    if tidy is not None:
        tidy()
    ensure_fleet()
    clean_model(model, hosts)
    fleet = make()
    try:
        yield fleet
    finally:
        if tidy is not None:
            tidy()
        if os.environ.get(keep_env) != "1":
            clean_model(model, hosts)


# -- gRPC through the stable ports ----------------------------------------------------------

_API: dict[str, Any] = {}
_API_LOCK = threading.Lock()


def api() -> dict[str, Any]:
    """gRPC and TFServing's own API modules (imported once: they pull TensorFlow's protos)."""
    with _API_LOCK:
        if not _API:
            os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
            import grpc
            from tensorflow_serving.apis import predict_pb2, prediction_service_pb2_grpc

            _API.update(grpc=grpc, predict=predict_pb2, service=prediction_service_pb2_grpc)
    return _API


def predict_request(model: str, xs: list[float], input_name: str = "x") -> Any:
    """A PredictRequest of ``serving_default`` with x = [[x0], [x1], ...] (DT_FLOAT) as the
    input ``input_name``."""
    request = api()["predict"].PredictRequest()
    request.model_spec.name = model
    request.model_spec.signature_name = "serving_default"
    tensor = request.inputs[input_name]
    tensor.dtype = 1  # DT_FLOAT
    tensor.tensor_shape.dim.add(size=len(xs))
    tensor.tensor_shape.dim.add(size=1)
    tensor.float_val.extend(xs)
    return request


def outputs_y(reply: Any) -> list[float]:
    """The ``y`` output of a PredictResponse as a flat list."""
    import numpy as np

    tensor = reply.outputs["y"]
    if tensor.tensor_content:
        return [float(v) for v in np.frombuffer(tensor.tensor_content, dtype="<f4")]
    return [float(v) for v in tensor.float_val]


def grpc_predict(address: str, port: int, model: str, xs: list[float], *,
                 timeout: float = 10.0) -> list[float]:
    """One Predict through ``address:port`` on a fresh channel."""
    grpc = api()["grpc"]
    with grpc.insecure_channel(f"{address}:{port}") as channel:
        stub = api()["service"].PredictionServiceStub(channel)
        return outputs_y(stub.Predict(predict_request(model, xs), timeout=timeout))
