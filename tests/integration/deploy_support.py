"""Helpers for the rolling-deploy tests on the local fleet (issue 4, items 9 and 10).

Each test module deploys its OWN model (own name, own port offset) assembled in a temp dir
from the test models (docs/models.md): version N of the assembled model is a copy of one
`half_plus_two` or `half_plus_two_bad` version, with a golden file written for exactly that
assembly. A good version v answers y = 0.5 x + v + 1, so x = 2 tells which one serves.

Ports of a model with offset o: stable gRPC/REST 8500/8501 + o, slots 8510/8511 and
8520/8521 + o, proxy admin 8599 + o. Offsets in use by the suites sharing this fleet:
0 is the default inventory's (the demo's half_plus_two and resnet50), 200 hand-run demos,
300-600 the rollback tests, 1000-1400 these deploy tests. Before a module starts, nothing else
may listen on its ports (``assert_ports_free``): a clash would be silent (HAProxy binds with
SO_REUSEPORT).

Traffic goes only to 10.87.0.x (the testbed hosts) and 127.0.0.1.
"""

from __future__ import annotations

import fcntl
import json
import os
import re
import shlex
import shutil
import subprocess
import threading
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[2]
STATE = Path(os.environ.get("TFSDEPLOY_TESTBED_DIR", "/var/lib/tfsdeploy-testbed"))
CACHE = Path(os.environ.get("TFSDEPLOY_CACHE", "/var/cache/tfsdeploy"))
MODELS = CACHE / "models"
VENV_BIN = CACHE / "venv" / "bin"
SSH_KEY = STATE / "ssh" / "id_ed25519"
KNOWN_HOSTS = STATE / "ssh" / "known_hosts"
REGISTRY = "10.87.0.1:5000"
HOSTS = {"tb1": "10.87.0.11", "tb2": "10.87.0.12", "tb3": "10.87.0.13"}
GPU_MIB = 16384

# source versions (docs/models.md)
GOOD = {1: ("half_plus_two", 1), 2: ("half_plus_two", 2), 3: ("half_plus_two", 3)}
CORRUPT = ("half_plus_two_bad", 11)
SLOW = ("half_plus_two_bad", 13)
WRONG_SIGNATURE = ("half_plus_two_bad", 12)


def expected_y(version_b: int, x: float = 2.0) -> float:
    """y of a half_plus_two-family version whose source number is ``version_b``."""
    return 0.5 * x + version_b + 1


# -- the fleet ------------------------------------------------------------------------------

def _testbed(*args: str, timeout: float = 900) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["bash", str(REPO / "scripts" / "testbed"), *args],
                          capture_output=True, text=True, timeout=timeout, cwd=REPO)


def fleet_healthy() -> bool:
    """sshd and dockerd of every host answer, and the registry (scripts/testbed status)."""
    return _testbed("status", "--json", timeout=60).returncode == 0


def _someone_cycles_the_fleet() -> bool:
    found = subprocess.run(["pgrep", "-f", "testbed.py (up|down)"], capture_output=True,
                           text=True)
    return bool(found.stdout.strip())


def ensure_fleet(attempts: int = 4) -> None:
    """The fleet is up (idempotent); waits for another session that is cycling it."""
    if os.geteuid() != 0:
        pytest.skip("the local fleet needs root (namespaces, bridges, dockerd)")
    last = ""
    for attempt in range(attempts):
        end = time.monotonic() + 600
        while _someone_cycles_the_fleet() and time.monotonic() < end:
            time.sleep(3)
        if fleet_healthy():
            return
        proc = _testbed("up")
        if proc.returncode == 0 and fleet_healthy():
            return
        last = proc.stdout[-2000:] + proc.stderr[-2000:]
        time.sleep(5 * (attempt + 1))
    raise RuntimeError(f"the testbed does not come up:\n{last}")


def ssh_argv(address: str, command: str) -> list[str]:
    return ["ssh", "-i", str(SSH_KEY), "-o", f"UserKnownHostsFile={KNOWN_HOSTS}",
            "-o", "StrictHostKeyChecking=yes", "-o", "BatchMode=yes", "-o", "IdentitiesOnly=yes",
            "-o", "ConnectTimeout=10", f"root@{address}", command]


def ssh(host: str, command: str, *, check: bool = True, timeout: float = 120,
        connect_retry_s: float = 90) -> subprocess.CompletedProcess[str]:
    """A shell command on a testbed host, as root.

    ssh's own failures (exit 255: connection refused or reset) are retried for up to
    ``connect_retry_s``: other sessions sharing the fleet block new SSH connections to a host
    for a while to simulate an unreachable host.
    """
    end = time.monotonic() + connect_retry_s
    while True:
        proc = subprocess.run(ssh_argv(HOSTS[host], command), capture_output=True, text=True,
                              timeout=timeout)
        if proc.returncode != 255 or time.monotonic() > end:
            break
        time.sleep(2)
    if check and proc.returncode != 0:
        raise AssertionError(f"ssh {host} {command!r} -> {proc.returncode}\n"
                             f"stdout: {proc.stdout[-2000:]}\nstderr: {proc.stderr[-2000:]}")
    return proc


def clean_model(model: str) -> None:
    """Every trace of ``model`` on every host: containers, proxy, releases, versions, lock."""
    script = (f"ids=$(docker ps -aq --filter label=tfsdeploy.model={model}); "
              f"[ -n \"$ids\" ] && docker rm -f $ids >/dev/null; "
              f"docker rm -f tfs-proxy-{model} >/dev/null 2>&1; "
              f"rm -rf /srv/tfsdeploy/{model} /srv/tfsdeploy/models/{model}; true")
    for host in HOSTS:
        with suppress(subprocess.TimeoutExpired):
            ssh(host, script, check=False, timeout=120)


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
        work = root / f".copy-{number}"
        shutil.copytree(MODELS / model / str(version), work)
        work.rename(source / str(number))
        catalog = json.loads((MODELS / model / "catalog.json").read_text())
        details = catalog["version_details"][str(version)]
        golden["version_details"][str(number)] = {
            "golden": details.get("golden") or [], "from": f"{model}/{version}"}
    golden_file = root / "golden.json"
    golden_file.write_text(json.dumps(golden, indent=1))
    return source, golden_file


INVENTORY = '''"""Inventory of the deploy integration tests: model {model!r} (generated)."""
from tfsdeploy.catalog import Batching, Model, Rollout, Signature, TensorSpec, Threads, Warmup
from tfsdeploy.inventory import Gpu, Group, Host

hosts = [Host(name, address, gpus=[Gpu(0, {gpu_mib}, "Simulated Tesla T4")])
         for name, address in {hosts!r}.items()]
groups = {{"canary": Group(["tb1"]), "main": Group(["tb2", "tb3"])}}
defaults = {{
    "ssh_user": "root",
    "ssh_key": {ssh_key!r},
    "ssh_known_hosts": {known_hosts!r},
    "data_root": "/srv/tfsdeploy",
    "image": "{registry}/tfserving-emulator:2.21.0",
    "tfserving_version": "2.21.0",
    "proxy_image": "{registry}/tfsdeploy-proxy:2.6",
}}
models = [
    Model(
        name={model!r},
        source={source!r},
        signature=Signature(inputs={{"x": TensorSpec("DT_FLOAT", (-1, 1))}},
                            outputs={{"y": TensorSpec("DT_FLOAT", (-1, 1))}}),
        memory_mib={memory_mib!r},
        latency_slo_ms=50,
        batching=Batching(max_batch_size=32, batch_timeout_micros=2000, max_enqueued_batches=64,
                          num_batch_threads=2, allowed_batch_sizes=(8, 16, 32)),
        threads=Threads(intra_op=1, inter_op=2),
        warmup=Warmup(samples={warmup_samples!r}, p99_ms={warmup_p99_ms!r}, timeout_s=60),
        rollout=Rollout(serial={serial!r}, min_healthy_s={min_healthy_s!r},
                        load_timeout_s={load_timeout_s!r}, drain_timeout_s=30,
                        keep_releases={keep_releases!r}),
        golden={golden!r},
        port_offset={offset!r},
    ),
]
'''


def write_inventory(path: Path, *, model: str, source: Path, golden: Path, offset: int,
                    serial: tuple[int | str, ...] = (1, "100%"), min_healthy_s: float = 1.0,
                    load_timeout_s: float = 120.0, memory_mib: int = 512,
                    warmup_samples: int = 10, warmup_p99_ms: float = 1000.0,
                    keep_releases: int = 3, gpu_mib: int = GPU_MIB) -> Path:
    """A test inventory: tb1..tb3, the assembled model, short gates."""
    path.write_text(INVENTORY.format(
        model=model, hosts=HOSTS, ssh_key=str(SSH_KEY), known_hosts=str(KNOWN_HOSTS),
        registry=REGISTRY, source=str(source), golden=str(golden), offset=offset,
        serial=serial, min_healthy_s=min_healthy_s, load_timeout_s=load_timeout_s,
        memory_mib=memory_mib, warmup_samples=warmup_samples, warmup_p99_ms=warmup_p99_ms,
        keep_releases=keep_releases, gpu_mib=gpu_mib))
    return path


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
    (stderr merged into stdout) so that a test can act on a given progress line."""

    def __init__(self, argv: list[str], log: list[str]) -> None:
        self.argv = argv
        self.lines: list[str] = []
        self._log = log
        self._cond = threading.Condition()
        self.started = time.monotonic()
        self.proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                     text=True, cwd=REPO, env=fab_env(), bufsize=1)
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            with self._cond:
                self.lines.append(line.rstrip("\n"))
                self._cond.notify_all()
        with self._cond:
            self._cond.notify_all()

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

    def send(self, sig: int) -> None:
        self.proc.send_signal(sig)

    def finish(self, timeout: float = 300) -> Run:
        """Wait for the exit (kill -9 and fail after ``timeout``)."""
        try:
            self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(timeout=30)
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
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=30)

    def text(self) -> str:
        return NOISE.sub("", "\n".join(self.lines) + "\n")

    def describe(self, why: str) -> str:
        return f"$ fab {' '.join(self.argv[1:])}\n-> {why}\n{self.text()[-6000:]}"


# -- one module's model on the fleet ---------------------------------------------------------

@dataclass
class Fleet:
    """A test module's model: its source, inventories, ports, and what the hosts hold."""

    model: str
    offset: int
    tmp: Path
    source: Path
    golden: Path
    inventory: Path
    log: list[str] = field(default_factory=list)

    @property
    def grpc_port(self) -> int:
        return 8500 + self.offset

    @property
    def rest_port(self) -> int:
        return 8501 + self.offset

    def inventory_variant(self, name: str, **kwargs: Any) -> Path:
        """Another inventory for the same model (other gate timings, other footprint)."""
        return write_inventory(self.tmp / f"inventory_{name}.py", model=self.model,
                               source=self.source, golden=self.golden, offset=self.offset,
                               **kwargs)

    def argv(self, *args: str, inventory: Path | None = None, model: str | None = None
             ) -> list[str]:
        return [str(VENV_BIN / "fab"), *args, "--model", model or self.model,
                "--inventory", str(inventory or self.inventory)]

    def fab(self, *args: str, inventory: Path | None = None, model: str | None = None,
            timeout: float = 600) -> Run:
        """``fab <args> --model M --inventory I`` from the repository root."""
        argv = self.argv(*args, inventory=inventory, model=model)
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

    def lock_free(self) -> tuple[bool, Run]:
        """Whether ``fab lock`` reports the model's lock free (and its output)."""
        run = self.fab("lock")
        free = run.code == 0 and bool(re.search(
            rf"no deploy holds the lock|^{re.escape(self.model)}: free\b", run.out, re.M))
        return free, run

    def background(self, *args: str, inventory: Path | None = None) -> Watched:
        return Watched(self.argv(*args, inventory=inventory), self.log)

    def deploy(self, version: int, *args: str, inventory: Path | None = None) -> Run:
        """A deploy that must succeed (set-up)."""
        run = self.fab("deploy", "--version", str(version), *args, inventory=inventory)
        assert run.code == 0, run.describe()
        return run

    # what the hosts hold -----------------------------------------------------------------
    def containers(self, host: str) -> list[dict[str, str]]:
        """The model's serving containers on ``host``, running or not, oldest release first."""
        fmt = ('{"name": "{{.Name}}", "id": "{{.Id}}", "status": "{{.State.Status}}", '
               '"started": "{{.State.StartedAt}}", '
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

    def snapshot(self) -> dict[str, Any]:
        """Per host: containers (name, id, status, start time) and the current release."""
        return {h: {"containers": [(c["name"], c["id"], c["status"], c["started"])
                                   for c in self.containers(h)],
                    "current": (self.current(h) or {}).get("id")} for h in HOSTS}

    def current(self, host: str) -> dict[str, Any] | None:
        """The current release's manifest on ``host`` (None when there is none)."""
        path = f"/srv/tfsdeploy/{self.model}/current/manifest.json"
        out = ssh(host, f"if [ -e {path} ]; then cat {path}; else echo null; fi").stdout
        return json.loads(out)  # type: ignore[no-any-return]

    def current_target(self, host: str) -> str:
        return ssh(host, f"readlink /srv/tfsdeploy/{self.model}/current", check=False
                   ).stdout.strip()

    def audit(self, host: str) -> list[dict[str, Any]]:
        out = ssh(host, f"cat /srv/tfsdeploy/{self.model}/audit.log 2>/dev/null; true").stdout
        return [json.loads(line) for line in out.splitlines() if line.strip()]

    def served_y(self, host: str, x: float = 2.0) -> float:
        return grpc_predict(HOSTS[host], self.grpc_port, self.model, [x])[0]

    def assert_serving(self, source_b: int, hosts: tuple[str, ...] = tuple(HOSTS)) -> None:
        """Every host's stable gRPC and REST ports answer with the outputs of the version
        whose half_plus_two number is ``source_b`` (y = 0.5 x + b + 1)."""
        xs = [1.0, 2.0, 5.0]
        want = [expected_y(source_b, x) for x in xs]
        for host in hosts:
            got = grpc_predict(HOSTS[host], self.grpc_port, self.model, xs)
            assert got == pytest.approx(want, abs=1e-5), f"{host} gRPC :{self.grpc_port}"
            rest = rest_predict(HOSTS[host], self.rest_port, self.model, xs)
            assert rest == pytest.approx(want, abs=1e-5), f"{host} REST :{self.rest_port}"

    def dump(self) -> str:
        """Everything useful after a failure: fab runs, containers, their logs, audit tails."""
        parts = ["==== fab runs (last 6) ====", *self.log[-6:]]
        for host in HOSTS:
            try:
                parts.append(f"==== {host} ====")
                names = ssh(host, "docker ps -a --format '{{.Names}} {{.Status}}' | grep -F "
                            + shlex.quote(self.model), check=False, timeout=30).stdout
                parts.append(names)
                for name in (line.split()[0] for line in names.splitlines() if line.strip()):
                    logs = ssh(host, f"docker logs --tail 25 {name} 2>&1", check=False,
                               timeout=30).stdout
                    parts.append(f"---- {host} docker logs {name} (last 25 lines) ----\n{logs}")
                parts.append("---- audit.log (tail) ----\n" + ssh(
                    host, f"tail -n 12 /srv/tfsdeploy/{self.model}/audit.log", check=False,
                    timeout=30).stdout)
            except Exception as error:  # the dump must never hide the failure
                parts.append(f"({host}: {type(error).__name__}: {error})")
        return "\n".join(parts)


def model_ports(offset: int) -> list[int]:
    return [p + offset for p in (8500, 8501, 8510, 8511, 8520, 8521, 8599)]


def listeners(host: str, ports: list[int]) -> list[str]:
    """``ss`` lines of the processes listening on ``ports`` on ``host``."""
    out = ssh(host, "ss -ltnpH", timeout=60).stdout
    wanted = {f":{p}" for p in ports}
    return [line for line in out.splitlines()
            if any(line.split()[3].endswith(w) for w in wanted if len(line.split()) > 3)]


def assert_ports_free(offset: int) -> None:
    """Nothing listens on the ports of a model with ``offset`` (call after clean_model)."""
    taken = {h: listeners(h, model_ports(offset)) for h in HOSTS}
    taken = {h: lines for h, lines in taken.items() if lines}
    if taken:
        raise RuntimeError(f"ports of offset {offset} are taken on the fleet (another model "
                           f"or session?): {taken}")


def fleet_fixture(tmp_path_factory: pytest.TempPathFactory, model: str, offset: int,
                  versions: dict[int, tuple[str, int]], **inventory: Any) -> Iterator[Fleet]:
    """Body of a module-scoped fixture: a clean model on a healthy fleet, cleaned after."""
    ensure_fleet()
    clean_model(model)
    assert_ports_free(offset)
    tmp = tmp_path_factory.mktemp(model)
    source, golden = assemble_source(tmp, versions)
    path = write_inventory(tmp / "inventory.py", model=model, source=source, golden=golden,
                           offset=offset, **inventory)
    fleet = Fleet(model=model, offset=offset, tmp=tmp, source=source, golden=golden,
                  inventory=path)
    try:
        yield fleet
    finally:
        if os.environ.get("TFSDEPLOY_DEPLOY_TESTS_KEEP") != "1":
            clean_model(model)


def dump_on_failure(request: pytest.FixtureRequest, fleet: Fleet) -> Iterator[None]:
    """Body of an autouse fixture: print containers, docker logs and fab output on failure."""
    before = request.session.testsfailed
    yield
    if request.session.testsfailed > before:
        print(fleet.dump())


# -- clients of the stable ports ------------------------------------------------------------

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


def predict_request(model: str, xs: list[float]) -> Any:
    """A PredictRequest of ``serving_default`` with x = [[x0], [x1], ...] (DT_FLOAT)."""
    request = api()["predict"].PredictRequest()
    request.model_spec.name = model
    request.model_spec.signature_name = "serving_default"
    tensor = request.inputs["x"]
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

def _netns(host: str, *argv: str) -> list[str]:
    return ["nsenter", f"--net=/var/run/netns/{host}", *argv]


class Partition:
    """Cut ``host`` off from one deploy process, silently (DROP, no RST), like a network
    failure: its established SSH connection(s) to the host, new SSH connections to the host,
    and the model's own ports there. Other sessions' established SSH connections keep working.
    Always undone on exit."""

    COMMENT = "tfsdeploy-deploy-tests"

    def __init__(self, host: str, pid: int | None, ports: tuple[int, int] | None) -> None:
        """``pid`` None: only NEW connections are cut (established ones keep working);
        ``ports`` None: the model's ports stay reachable."""
        self.host, self.pid, self.ports = host, pid, ports
        self.rules: list[list[str]] = []

    def _ssh_source_ports(self) -> list[int]:
        out = subprocess.run(["ss", "-tnpH", "state", "established", "dst",
                              f"{HOSTS[self.host]}:22"], capture_output=True, text=True).stdout
        found = []
        for line in out.splitlines():
            if f"pid={self.pid}," in line:  # Recv-Q Send-Q Local:Port Peer:Port Process
                found.append(int(line.split()[2].rsplit(":", 1)[1]))
        return found

    def __enter__(self) -> Partition:
        base = ["-m", "comment", "--comment", self.COMMENT, "-j", "DROP"]
        for port in self._ssh_source_ports() if self.pid else []:
            self.rules.append(["INPUT", "-p", "tcp", "--dport", "22", "--sport", str(port),
                               *base])
        self.rules.append(["INPUT", "-p", "tcp", "--dport", "22", "-m", "conntrack",
                           "--ctstate", "NEW", *base])
        if self.ports:
            low, high = self.ports
            self.rules.append(["INPUT", "-p", "tcp", "--dport", f"{low}:{high}", *base])
        for rule in self.rules:
            subprocess.run(_netns(self.host, "iptables", "-I", *rule), check=True,
                           capture_output=True)
        return self

    def __exit__(self, *exc: object) -> None:
        for rule in self.rules:
            subprocess.run(_netns(self.host, "iptables", "-D", *rule), capture_output=True)


def remove_partition_rules() -> None:
    """Leftover DROP rules of an interrupted run."""
    for host in HOSTS:
        out = subprocess.run(_netns(host, "iptables", "-S", "INPUT"), capture_output=True,
                             text=True).stdout
        for line in out.splitlines():
            if Partition.COMMENT in line and line.startswith("-A "):
                subprocess.run(_netns(host, "iptables", "-D", *shlex.split(line[3:])),
                               capture_output=True)
