"""Helpers for the rolling-deploy tests on the local fleet; the
fleet, SSH, fab runs and gRPC clients they share with the rollback tests are in testbed_support.

Each test module deploys its OWN model (own name, own port offset) assembled in a temp dir
from the test models (docs/models.md): version N of the assembled model is a copy of one
`half_plus_two` or `half_plus_two_bad` version, with a golden file written for exactly that
assembly. A good version v answers y = 0.5 x + v + 1, so x = 2 tells which one serves.

Ports and the offsets in use by the suites sharing this fleet: see testbed_support; these
deploy tests use 1000-1300 (1400 is benchmarks/bench_deploy.py's). Before a module starts,
nothing else may listen on its ports (``assert_ports_free``): a clash would be silent (HAProxy
binds with SO_REUSEPORT).

Traffic goes only to 10.87.0.x (the testbed hosts) and 127.0.0.1.
"""

from __future__ import annotations

import fcntl
import json
import os
import re
import shlex
import subprocess
import threading
import time
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from testbed_support import (
    ADDRESSES,
    ALT_SSH_PORT,
    HOSTS,
    MODELS,
    STATE,
    ModelFleet,
    Run,
    api,
    copy_version,
    expected_y,
    fleet_lifetime,
    grpc_predict,
    inventory_text,
    netns,
    predict_request,
    ssh,
)

GPU_MIB = 16384

# source versions (docs/models.md)
GOOD = {1: ("half_plus_two", 1), 2: ("half_plus_two", 2), 3: ("half_plus_two", 3)}
CORRUPT = ("half_plus_two_bad", 11)
SLOW = ("half_plus_two_bad", 13)
WRONG_SIGNATURE = ("half_plus_two_bad", 12)


# -- the model, its golden file and inventories ------------------------------------------------

def assemble_source(root: Path, versions: dict[int, tuple[str, int]]) -> tuple[Path, Path]:
    """Copy source versions under new numbers (temp dir + rename), write their golden file.

    Returns (source dir, golden file). The golden file lives outside the source, so the
    source holds numeric directories only.
    """
    source = root / "source"
    source.mkdir(parents=True, exist_ok=True)
    golden: dict[str, Any] = {"catalog_format": 1, "version_details": {}}
    for number, (model, version) in versions.items():
        copy_version(MODELS / model / str(version), source, number)
        catalog = json.loads((MODELS / model / "catalog.json").read_text())
        details = catalog["version_details"][str(version)]
        golden["version_details"][str(number)] = {
            "golden": details.get("golden") or [], "from": f"{model}/{version}"}
    golden_file = root / "golden.json"
    golden_file.write_text(json.dumps(golden, indent=1))
    return source, golden_file


def write_inventory(path: Path, *, model: str, source: Path, golden: Path, offset: int,
                    serial: tuple[int | str, ...] = (1, "100%"), min_healthy_s: float = 1.0,
                    load_timeout_s: float = 120.0, memory_mib: int = 512,
                    warmup_samples: int = 10, warmup_p99_ms: float = 1000.0,
                    keep_releases: int = 3, gpu_mib: int = GPU_MIB,
                    gpus: int | dict[str, int] = 1,
                    hosts: dict[str, str] = HOSTS, ssh_port: int = 22,
                    extra_vars: dict[str, Any] | None = None) -> Path:
    """A test inventory: ``hosts`` (groups canary [the first], main [the others]), the
    assembled model, short gates; ``extra_vars`` more defaults (``ssh_proxy_jump``, ...)."""
    first, *others = hosts
    path.write_text(inventory_text(
        title="the deploy integration tests", model=model, source=source, golden=golden,
        offset=offset, groups=f'{{"canary": Group([{first!r}]), "main": Group({others!r})}}',
        memory_mib=memory_mib, gpu_mib=gpu_mib, gpus=gpus, hosts=hosts, ssh_port=ssh_port,
        extra_vars=extra_vars,
        warmup=f"Warmup(samples={warmup_samples!r}, p99_ms={warmup_p99_ms!r}, timeout_s=60)",
        rollout=f"Rollout(serial={serial!r}, min_healthy_s={min_healthy_s!r}, "
                f"load_timeout_s={load_timeout_s!r}, drain_timeout_s=30, "
                f"keep_releases={keep_releases!r})"))
    return path


# -- one module's model on the fleet ---------------------------------------------------------

@dataclass(kw_only=True)
class Fleet(ModelFleet):
    """A test module's model: its source, inventories, ports, and what the hosts hold."""

    golden: Path
    ssh_port: int = 22
    gpus: int | dict[str, int] = 1

    def inventory_variant(self, name: str, **kwargs: Any) -> Path:
        """Another inventory for the same model (other gate timings, other footprint)."""
        return write_inventory(self.tmp / f"inventory_{name}.py", model=self.model,
                               source=self.source, golden=self.golden, offset=self.offset,
                               hosts=self.hosts,
                               **{"ssh_port": self.ssh_port, "gpus": self.gpus, **kwargs})

    def lock_free(self) -> tuple[bool, Run]:
        """Whether ``fab lock`` reports the model's lock free (and its output)."""
        run = self.fab("lock")
        free = run.code == 0 and bool(re.search(
            rf"no deploy holds the lock|^{re.escape(self.model)}: free\b", run.out, re.M))
        return free, run

    # what the hosts hold -----------------------------------------------------------------
    def snapshot(self) -> dict[str, Any]:
        """Per host: containers (name, id, status, start time) and the current release."""
        return {h: {"containers": [(c["name"], c["id"], c["status"], c["started"])
                                   for c in self.containers(h)],
                    "current": (self.current(h) or {}).get("id")} for h in self.hosts}

    def current_target(self, host: str) -> str:
        return ssh(host, f"readlink /srv/tfsdeploy/{self.model}/current", check=False
                   ).stdout.strip()

    def served_y(self, host: str, x: float = 2.0) -> float:
        return grpc_predict(ADDRESSES[host], self.grpc_port, self.model, [x])[0]

    def assert_serving(self, source_b: int, hosts: tuple[str, ...] | None = None) -> None:
        """Every host's stable gRPC and REST ports answer with the outputs of the version
        whose half_plus_two number is ``source_b`` (y = 0.5 x + b + 1)."""
        xs = [1.0, 2.0, 5.0]
        want = [expected_y(source_b, x) for x in xs]
        for host in hosts or tuple(self.hosts):
            got = grpc_predict(ADDRESSES[host], self.grpc_port, self.model, xs)
            assert got == pytest.approx(want, abs=1e-5), f"{host} gRPC :{self.grpc_port}"
            rest = rest_predict(ADDRESSES[host], self.rest_port, self.model, xs)
            assert rest == pytest.approx(want, abs=1e-5), f"{host} REST :{self.rest_port}"


def model_ports(offset: int) -> list[int]:
    return [p + offset for p in (8500, 8501, 8510, 8511, 8520, 8521)]


def listeners(host: str, ports: list[int]) -> list[str]:
    """``ss`` lines of the processes listening on ``ports`` on ``host``."""
    out = ssh(host, "ss -ltnpH", timeout=60).stdout
    wanted = {f":{p}" for p in ports}
    return [line for line in out.splitlines()
            if any(line.split()[3].endswith(w) for w in wanted if len(line.split()) > 3)]


def assert_ports_free(offset: int, hosts: dict[str, str] = HOSTS) -> None:
    """Nothing listens on the ports of a model with ``offset`` (call after clean_model)."""
    taken = {h: listeners(h, model_ports(offset)) for h in hosts}
    taken = {h: lines for h, lines in taken.items() if lines}
    if taken:
        raise RuntimeError(f"ports of offset {offset} are taken on the fleet (another model "
                           f"or session?): {taken}")


def fleet_fixture(tmp_path_factory: pytest.TempPathFactory, model: str, offset: int,
                  versions: dict[int, tuple[str, int]], *,
                  tidy: Callable[[], None] | None = None, hosts: dict[str, str] = HOSTS,
                  ssh_port: int = 22, gpus: int | dict[str, int] = 1,
                  **inventory: Any) -> Iterator[Fleet]:
    """Body of a module-scoped fixture: a clean model on a healthy fleet (its ``hosts``),
    cleaned after (``tidy``: see fleet_lifetime)."""
    def make() -> Fleet:
        assert_ports_free(offset, hosts)
        tmp = tmp_path_factory.mktemp(model)
        source, golden = assemble_source(tmp, versions)
        path = write_inventory(tmp / "inventory.py", model=model, source=source,
                               golden=golden, offset=offset, hosts=hosts, ssh_port=ssh_port,
                               gpus=gpus, **inventory)
        return Fleet(model=model, offset=offset, tmp=tmp, source=source, golden=golden,
                     inventory=path, hosts=dict(hosts), ssh_port=ssh_port, gpus=gpus)

    yield from fleet_lifetime(model, make, keep_env="TFSDEPLOY_DEPLOY_TESTS_KEEP", tidy=tidy,
                              hosts=hosts)


# -- REST clients of the stable ports ---------------------------------------------------------

def rest_json(url: str, body: dict[str, Any] | None = None, timeout: float = 10.0) -> Any:
    data = json.dumps(body).encode() if body is not None else None
    request = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=timeout) as reply:
        return json.loads(reply.read())


def rest_predict(address: str, port: int, model: str, xs: list[float]) -> list[float]:
    reply = rest_json(f"http://{address}:{port}/v1/models/{model}:predict",
                      {"instances": [[x] for x in xs]})
    return [float(row[0]) for row in reply["predictions"]]


def rest_status(address: str, port: int, model: str) -> list[dict[str, Any]]:
    return rest_json(f"http://{address}:{port}/v1/models/{model}")["model_version_status"]  # type: ignore[no-any-return]


# -- steady traffic on one host's stable ports ---------------------------------------------

@dataclass
class Traffic:
    """Predict on one host's stable ports until stopped: gRPC over one long-lived channel
    (the proxy balances each request, HTTP/2 stream by stream), and REST in turn when
    ``rest`` is set. Keeps (time, answering version) of each gRPC answer and every failure.

    ``per_second``: rounds a second (one gRPC request, and one REST request with ``rest``); a
    round late on its schedule starts at once, and the rounds it missed are not made up.
    40 by default, twice the fault tests' clients (test_host_faults.py): an outage longer
    than 25 ms is always sampled. Unpaced (one round after another, 5 ms apart), on an idle
    machine, a client made 65 rounds a second and the server it loaded spent 0.14 of a core
    on them; with REST 145 requests a second, 0.23 of a core in the server and 0.11 in the
    client (10 s of each, the server's /proc/PID/stat and the client's getrusage): a load the
    three other modules of the parallel tier shared the 2 cores with. ``None``: unpaced, for
    a test that counts answers (a canary's shares, its judge's ``min_requests`` in a step)."""

    fleet: ModelFleet
    host: str
    rest: bool = False
    per_second: float | None = 40.0
    answers: list[tuple[float, int]] = field(default_factory=list)
    rest_answers: int = 0
    failures: list[str] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)

    @property
    def ok(self) -> int:
        """Requests answered (both protocols)."""
        return len(self.answers) + self.rest_answers

    def __enter__(self) -> Traffic:
        self._thread = threading.Thread(target=self._loop, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=30)

    def _loop(self) -> None:
        grpc = api()["grpc"]
        address, model = ADDRESSES[self.host], self.fleet.model
        request = predict_request(model, [2.0])
        period = 0.005 if self.per_second is None else 1.0 / self.per_second
        with grpc.insecure_channel(f"{address}:{self.fleet.grpc_port}") as channel:
            stub = api()["service"].PredictionServiceStub(channel)
            due = time.monotonic()
            while not self._stop.is_set():
                try:
                    reply = stub.Predict(request, timeout=10)
                    self.answers.append((time.monotonic(), int(reply.model_spec.version.value)))
                except grpc.RpcError as error:
                    self.failures.append(f"gRPC {error.code().name}: {error.details()}")
                if self.rest:
                    try:
                        rest_predict(address, self.fleet.rest_port, model, [2.0])
                        self.rest_answers += 1
                    except OSError as error:
                        self.failures.append(f"REST {error}")
                now = time.monotonic()
                due = now + period if self.per_second is None else max(due + period, now)
                self._stop.wait(due - now)

    def share_since(self, since: float, version: int, count: int = 1000) -> tuple[float, int]:
        """(share of ``version`` among the next ``count`` gRPC answers after ``since``,
        answers)."""
        deadline = time.monotonic() + 120
        while len([a for a in self.answers if a[0] >= since]) < count:
            assert time.monotonic() < deadline, f"only {len(self.answers)} answers"
            time.sleep(0.5)
        window = [v for t, v in self.answers if t >= since][:count]
        return sum(1 for v in window if v == version) / len(window), len(window)


# -- the simulated GPU ------------------------------------------------------------------------

def gpu_used_mib(host: str) -> tuple[int, int]:
    """(total, used) MiB of GPU 0 as the host's nvidia-smi reports them."""
    out = ssh(host, "nvidia-smi --query-gpu=memory.total,memory.used "
                    "--format=csv,noheader,nounits").stdout
    total, used = (int(float(v)) for v in out.splitlines()[0].split(","))
    return total, used


@contextmanager
def gpu_reservation(host: str, used_mib: int) -> Iterator[str]:
    """Hold ``used_mib`` of the host's simulated GPU like a live process does
    (docs/testbed-contract.md: a procs file with an exclusive flock for its lifetime)."""
    token = f"deploytest-{uuid.uuid4().hex}"
    path = STATE / "hosts" / host / "run" / "simgpu" / "procs" / f"{token}.json"
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        os.write(fd, json.dumps({"gpu": 0, "used_mib": used_mib, "pid": 4343,
                                 "process_name": "tensorflow_model_server",
                                 "container": "deploy-test-filler"}).encode())
        yield token
    finally:
        os.close(fd)
        path.unlink(missing_ok=True)


# -- network trouble for one deploy ------------------------------------------------------------

class Partition:
    """Cut ``host`` off from one deploy process, silently (DROP, no RST), like a network
    failure: its established SSH connection(s) to the host, new SSH connections to the host,
    and the model's own ports there from the network. Always undone on exit.

    Only the hosts' second sshd port (ALT_SSH_PORT) is cut: the module's inventory reaches the
    hosts there (``fleet_fixture(..., ssh_port=ALT_SSH_PORT)``), so every other run sharing
    the fleet keeps port 22."""

    COMMENT = "tfsdeploy-deploy-tests"

    def __init__(self, host: str, pid: int | None, ports: tuple[int, int] | None) -> None:
        """``pid`` None: only NEW connections are cut (established ones keep working);
        ``ports`` None: the model's ports stay reachable."""
        self.host, self.pid, self.ports = host, pid, ports
        self.rules: list[list[str]] = []

    def _ssh_source_ports(self) -> list[int]:
        out = subprocess.run(["ss", "-tnpH", "state", "established", "dst",
                              f"{ADDRESSES[self.host]}:{ALT_SSH_PORT}"], capture_output=True,
                             text=True).stdout
        found = []
        for line in out.splitlines():
            if f"pid={self.pid}," in line:  # Recv-Q Send-Q Local:Port Peer:Port Process
                found.append(int(line.split()[2].rsplit(":", 1)[1]))
        return found

    def __enter__(self) -> Partition:
        base = ["-m", "comment", "--comment", self.COMMENT, "-j", "DROP"]
        ssh_port = str(ALT_SSH_PORT)
        for port in self._ssh_source_ports() if self.pid else []:
            self.rules.append(["INPUT", "-p", "tcp", "--dport", ssh_port, "--sport",
                               str(port), *base])
        # new connections only: their SYN (matching conntrack's NEW would also drop the first
        # packet of an established connection that conntrack had not tracked before: it
        # starts tracking a namespace's connections only once a rule there needs it)
        self.rules.append(["INPUT", "-p", "tcp", "--dport", ssh_port, "--syn", *base])
        if self.ports:
            # from the network only: a cut network leaves the host's loopback, over which its
            # own proxy health-checks the model's servers (a check cut too would mark the old
            # slot down and the host would answer 503 after the cut)
            low, high = self.ports
            self.rules.append(["INPUT", "!", "-i", "lo", "-p", "tcp", "--dport", f"{low}:{high}",
                               *base])
        for rule in self.rules:
            subprocess.run(netns(self.host, "iptables", "-I", *rule), check=True,
                           capture_output=True)
        return self

    def __exit__(self, *exc: object) -> None:
        for rule in self.rules:
            subprocess.run(netns(self.host, "iptables", "-D", *rule), capture_output=True)


def remove_partition_rules() -> None:
    """Leftover DROP rules of an interrupted run."""
    for host in HOSTS:
        out = subprocess.run(netns(host, "iptables", "-S", "INPUT"), capture_output=True,
                             text=True).stdout
        for line in out.splitlines():
            if Partition.COMMENT in line and line.startswith("-A "):
                subprocess.run(netns(host, "iptables", "-D", *shlex.split(line[3:])),
                               capture_output=True)
