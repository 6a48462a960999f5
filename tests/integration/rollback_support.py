"""Helpers for the rollback, guard and convergence tests on the local fleet (scripts/testbed).

Each test module deploys its OWN model (own name, own port offset) so that it never collides
with another module or with the deploy tests running on the same fleet:

    stable gRPC/REST 8500/8501 + offset, slots 8510/8511 and 8520/8521 + offset, admin 8599 + offset

The model is half_plus_two under another name: version v answers y = 0.5 x + v + 1, so a
Predict of x = 2 through a host's stable port says which version serves (y = v + 2).

Everything here talks only to 10.87.0.x (the testbed hosts) and 127.0.0.1.
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
import threading
import time
from collections.abc import Iterator
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
# the testbed contract: tbN is 10.87.0.(10+N), a simulated 16 GiB GPU each
HOSTS = {"tb1": "10.87.0.11", "tb2": "10.87.0.12", "tb3": "10.87.0.13"}
SOURCE_MODEL = MODELS / "half_plus_two"
GOLDEN = SOURCE_MODEL / "catalog.json"


# symptoms of the shared fleet being restarted by another session (not of the toolkit)
FLEET_TROUBLE = ("Cannot connect to the Docker daemon", "HostUnreachable", "Connection refused",
                 "connection lost", "Socket is closed", "Connection reset",
                 "unreachable")


def expected_y(version: int, x: float = 2.0) -> float:
    """What version ``version`` of half_plus_two answers for ``x``."""
    return 0.5 * x + version + 1


# -- the fleet ------------------------------------------------------------------------------

def _testbed(*args: str, timeout: float = 900) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["bash", str(REPO / "scripts" / "testbed"), *args],
                          capture_output=True, text=True, timeout=timeout, cwd=REPO)


def _images_in_registry() -> bool:
    import urllib.request

    try:
        for name, tag in (("tfserving-emulator", "2.21.0"), ("tfsdeploy-proxy", "2.6")):
            with urllib.request.urlopen(f"http://{REGISTRY}/v2/{name}/tags/list",
                                        timeout=5) as reply:
                if tag not in json.loads(reply.read()).get("tags") or []:
                    return False
    except Exception:
        return False
    return True


def fleet_healthy() -> bool:
    """Every host's sshd and dockerd answer, the registry too, with the images in it."""
    return (_testbed("status", "--json", timeout=60).returncode == 0
            and _images_in_registry())


def _someone_else_brings_it_up() -> bool:
    found = subprocess.run(["pgrep", "-f", "testbed.py (up|down)"], capture_output=True,
                           text=True)
    return bool(found.stdout.strip())


def ensure_fleet(attempts: int = 6) -> None:
    """Bring the fleet up (idempotent). Other sessions may be cycling it: wait for them
    first, then retry."""
    if os.geteuid() != 0:
        pytest.skip("the local fleet needs root (namespaces, bridges, dockerd)")
    last = ""
    for attempt in range(attempts):
        end = time.monotonic() + 600
        while _someone_else_brings_it_up() and time.monotonic() < end:
            time.sleep(3)
        if fleet_healthy():
            return
        proc = _testbed("up")
        if proc.returncode == 0 and fleet_healthy():
            return
        last = proc.stdout[-2000:] + proc.stderr[-2000:]
        time.sleep(5 * (attempt + 1))
    raise RuntimeError(f"the testbed does not come up:\n{last}")


def ssh_argv(address: str, command: str, connect_timeout: int = 10) -> list[str]:
    return ["ssh", "-i", str(SSH_KEY), "-o", f"UserKnownHostsFile={KNOWN_HOSTS}",
            "-o", "StrictHostKeyChecking=yes", "-o", "BatchMode=yes", "-o", "IdentitiesOnly=yes",
            "-o", f"ConnectTimeout={connect_timeout}", f"root@{address}", command]


def ssh(host: str, command: str, *, check: bool = True, timeout: float = 120
        ) -> subprocess.CompletedProcess[str]:
    """Run a shell command on a testbed host as root."""
    proc = subprocess.run(ssh_argv(HOSTS[host], command), capture_output=True, text=True,
                          timeout=timeout)
    if check and proc.returncode != 0:
        raise AssertionError(f"ssh {host} {command!r} -> {proc.returncode}\n"
                             f"stdout: {proc.stdout[-2000:]}\nstderr: {proc.stderr[-2000:]}")
    return proc


def clean_model(model: str) -> None:
    """Remove every trace of ``model`` on every host: containers, proxy, releases, versions."""
    script = (f"ids=$(docker ps -aq --filter label=tfsdeploy.model={model}); "
              f"[ -n \"$ids\" ] && docker rm -f $ids >/dev/null; "
              f"docker rm -f tfs-proxy-{model} >/dev/null 2>&1; "
              f"rm -rf /srv/tfsdeploy/{model} /srv/tfsdeploy/models/{model}; true")
    for host in HOSTS:
        with contextlib.suppress(subprocess.TimeoutExpired):
            ssh(host, script, check=False, timeout=120)


def unblock_all_ssh() -> None:
    """Remove the REJECT rules this suite may have left in a host's network namespace."""
    for host in HOSTS:
        while subprocess.run(_iptables(host, "-D"), capture_output=True).returncode == 0:
            pass


def _iptables(host: str, op: str) -> list[str]:
    # NEW connections only: established SSH sessions of other runs keep working
    return ["nsenter", f"--net=/var/run/netns/{host}", "iptables", op, "INPUT", "-p", "tcp",
            "--dport", "22", "-m", "conntrack", "--ctstate", "NEW", "-m", "comment",
            "--comment", "tfsdeploy-rollback-tests", "-j", "REJECT", "--reject-with", "tcp-reset"]


class ssh_blocked:
    """New SSH connections to ``host`` are refused while inside (always restored)."""

    def __init__(self, host: str) -> None:
        self.host = host

    def __enter__(self) -> ssh_blocked:
        subprocess.run(_iptables(self.host, "-I"), check=True, capture_output=True)
        return self

    def __exit__(self, *exc: object) -> None:
        while subprocess.run(_iptables(self.host, "-D"), capture_output=True).returncode == 0:
            pass


# -- the model and its inventory ------------------------------------------------------------

@dataclass
class Fleet:
    """One test module's model on the fleet: its inventory, ports and helpers."""

    model: str
    offset: int
    tmp: Path
    inventory: Path
    source: Path
    fast_playbook: Path
    log: list[str] = field(default_factory=list)

    @property
    def grpc_port(self) -> int:
        return 8500 + self.offset

    @property
    def rest_port(self) -> int:
        return 8501 + self.offset

    def slot_grpc(self, slot: str) -> int:
        return {"blue": 8510, "green": 8520}[slot] + self.offset

    # fab ---------------------------------------------------------------------------------
    def fab(self, *args: str, timeout: float = 600, fast: bool = False) -> Run:
        """``fab <args> --model M --inventory I`` from the repository root."""
        argv = [str(VENV_BIN / "fab"), *args, "--model", self.model,
                "--inventory", str(self.inventory)]
        if fast:
            argv += ["--playbook", str(self.fast_playbook)]
        started = time.monotonic()
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, cwd=REPO,
                              env=fab_env())
        run = Run(argv, proc.returncode, proc.stdout, proc.stderr, time.monotonic() - started)
        self.log.append(run.describe())
        return run

    def deploy(self, version: int, *, fast: bool = True, extra: tuple[str, ...] = ()) -> Run:
        """A deploy that must succeed (set-up)."""
        run = self.fab("deploy", "--version", str(version), *extra, fast=fast)
        if run.code != 0 and any(s in run.out for s in FLEET_TROUBLE):
            ensure_fleet()  # another session cycled the shared fleet under us: once more
            run = self.fab("deploy", "--version", str(version), *extra, fast=fast)
        assert run.code == 0, run.describe()
        return run

    # the hosts ---------------------------------------------------------------------------
    def containers(self, host: str) -> list[dict[str, Any]]:
        """The model's serving containers on ``host`` (docker inspect, running or not)."""
        fmt = ('{"id": "{{.Id}}", "name": "{{.Name}}", "created": "{{.Created}}", '
               '"started": "{{.State.StartedAt}}", "status": "{{.State.Status}}", '
               '"restarts": {{.RestartCount}}, '
               '"release": "{{index .Config.Labels "tfsdeploy.release"}}", '
               '"slot": "{{index .Config.Labels "tfsdeploy.slot"}}", '
               '"version": "{{index .Config.Labels "tfsdeploy.version"}}"}')
        listed = f"ids=$(docker ps -aq --filter label=tfsdeploy.model={self.model}); "
        out = ssh(host, listed + f"[ -z \"$ids\" ] || docker inspect --format "
                                 f"{shlex.quote(fmt)} $ids").stdout
        return sorted((json.loads(line) for line in out.splitlines() if line.strip()),
                      key=lambda c: c["release"])

    def proxy(self, host: str) -> dict[str, Any] | None:
        out = ssh(host, f"docker inspect --format '{{{{.Id}}}} {{{{.State.StartedAt}}}} "
                        f"{{{{.State.Status}}}}' tfs-proxy-{self.model}", check=False).stdout
        if not out.strip():
            return None
        cid, started, status = out.split()
        return {"id": cid, "started": started, "status": status}

    def current(self, host: str) -> dict[str, Any] | None:
        out = ssh(host, f"cat /srv/tfsdeploy/{self.model}/current/manifest.json",
                  check=False).stdout
        return json.loads(out) if out.strip() else None

    def releases(self, host: str) -> dict[str, dict[str, Any]]:
        out = ssh(host, f"for f in /srv/tfsdeploy/{self.model}/releases/*/manifest.json; do "
                        f"[ -f \"$f\" ] && cat \"$f\" && echo; done; true").stdout
        decoder, found, position = json.JSONDecoder(), {}, 0
        while position < len(out.rstrip()):
            while out[position].isspace():
                position += 1
            record, position = decoder.raw_decode(out, position)
            found[record["id"]] = record
        return found

    def audit(self, host: str) -> list[dict[str, Any]]:
        out = ssh(host, f"cat /srv/tfsdeploy/{self.model}/audit.log", check=False).stdout
        return [json.loads(line) for line in out.splitlines() if line.strip()]

    def lock_dir_exists(self) -> bool:
        return any(ssh(h, f"test -d /srv/tfsdeploy/{self.model}/lock", check=False).returncode
                   == 0 for h in HOSTS)

    def served_version(self, host: str, timeout: float = 5.0) -> int:
        """Which version answers on the host's stable gRPC port (by its output)."""
        y = predict(HOSTS[host], self.grpc_port, self.model, 2.0, timeout=timeout)
        version = round(y - 2.0)
        assert abs(y - expected_y(version)) < 1e-5, f"{host}: unexpected output {y}"
        return version

    def assert_serving(self, version: int, hosts: tuple[str, ...] = tuple(HOSTS)) -> None:
        """Every host's stable port answers with ``version``'s golden outputs."""
        for host in hosts:
            for x in (1.0, 2.0, 5.0):
                y = predict(HOSTS[host], self.grpc_port, self.model, x)
                assert abs(y - expected_y(version, x)) < 1e-5, (
                    f"{host}: y({x}) = {y}, version {version} gives {expected_y(version, x)}")

    def dump(self) -> str:
        """Everything useful after a failure: fab runs, containers, their logs, audit tails."""
        parts = ["==== fab runs ====", *self.log[-8:]]
        for host in HOSTS:
            try:
                parts.append(f"==== {host} ====")
                parts.append(ssh(host, "docker ps -a --format '{{.Names}} {{.Status}} "
                                       "{{.Labels}}' | grep -F " + shlex.quote(self.model),
                                 check=False, timeout=30).stdout)
                names = ssh(host, f"docker ps -a --format '{{{{.Names}}}}' | grep -F "
                                  f"{shlex.quote(self.model)}", check=False, timeout=30).stdout
                for name in names.split():
                    logs = ssh(host, f"docker logs --tail 25 {name} 2>&1", check=False,
                               timeout=30).stdout
                    parts.append(f"---- {host} {name} (last 25 lines) ----\n{logs}")
                parts.append(ssh(host, f"tail -n 15 /srv/tfsdeploy/{self.model}/audit.log",
                                 check=False, timeout=30).stdout)
            except Exception as error:  # the dump must never hide the failure
                parts.append(f"({host}: {type(error).__name__}: {error})")
        return "\n".join(parts)


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
        return self.stdout + self.stderr

    def describe(self) -> str:
        cmd = " ".join(shlex.quote(a) for a in self.argv[1:])
        noise = re.compile(r"^(I0000|W0000|E0000|.*cuda).*$", re.M)
        text = noise.sub("", self.out).strip()
        return f"$ fab {cmd}\n-> exit {self.code} in {self.seconds:.1f} s\n{text[-6000:]}"


def fab_env() -> dict[str, str]:
    env = dict(os.environ)
    env["PATH"] = f"{VENV_BIN}:{env.get('PATH', '')}"
    env["TF_CPP_MIN_LOG_LEVEL"] = "3"
    env.pop("TFSDEPLOY_INVENTORY", None)
    return env


INVENTORY = '''"""Inventory of the rollback tests: model {model!r} on tb1..tb3 (generated)."""
from tfsdeploy.catalog import Batching, Model, Rollout, Signature, TensorSpec, Threads, Warmup
from tfsdeploy.inventory import Gpu, Host

hosts = [Host(name, address, gpus=[Gpu(0, 16384, "Simulated Tesla T4")])
         for name, address in {hosts!r}.items()]
groups = {{}}
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
        memory_mib=512,
        latency_slo_ms=50,
        batching=Batching(max_batch_size=32, batch_timeout_micros=2000, max_enqueued_batches=64,
                          num_batch_threads=2, allowed_batch_sizes=(8, 16, 32)),
        threads=Threads(intra_op=1, inter_op=2),
        warmup=Warmup(samples=20),
        rollout=Rollout(serial={serial!r}, min_healthy_s={min_healthy_s!r},
                        window_s={window_s!r}, keep_releases={keep_releases!r},
                        load_timeout_s=120, health_timeout_s=60),
        golden={golden!r},
        port_offset={offset!r},
    ),
]
'''

FAST_PLAYBOOK = """# set-up deploys of the rollback tests: every host at once
# (the model's serial stays for `fab rollback` and for the deploys under test)
name: deploy-fast
serial: ["100%"]
forks: 10
phases:
  - {name: preflight, mode: parallel, tasks: preflight.yml}
  - {name: stage, mode: parallel, tasks: stage.yml}
  - {name: roll, mode: batches, tasks: roll_host.yml}
  - {name: finalize, mode: parallel, tasks: finalize.yml}
"""


def make_fleet(tmp: Path, model: str, offset: int, *, window_s: float = 600.0,
               serial: tuple[int | str, ...] = (1,), min_healthy_s: float = 1.0,
               versions: tuple[int, ...] = (1, 2, 3), keep_releases: int = 3) -> Fleet:
    """Write the model's version source (copies of half_plus_two), inventory and playbook."""
    source = tmp / "models" / model
    source.mkdir(parents=True, exist_ok=True)
    for version in versions:
        work = tmp / "models" / f".copy-{version}"
        shutil.copytree(SOURCE_MODEL / str(version), work)
        work.rename(source / str(version))  # atomic: never a partial version dir
    inventory = tmp / "inventory.py"
    inventory.write_text(INVENTORY.format(
        model=model, hosts=HOSTS, ssh_key=str(SSH_KEY), known_hosts=str(KNOWN_HOSTS),
        registry=REGISTRY, source=str(source), serial=serial, min_healthy_s=min_healthy_s,
        window_s=window_s, keep_releases=keep_releases, golden=str(GOLDEN), offset=offset))
    (tmp / "playbooks").mkdir(exist_ok=True)
    playbook = tmp / "playbooks" / "deploy-fast.yml"
    playbook.write_text(FAST_PLAYBOOK)
    (tmp / "tasks").symlink_to(REPO / "tasks")  # playbooks find their task lists in ../tasks
    return Fleet(model=model, offset=offset, tmp=tmp, inventory=inventory, source=source,
                 fast_playbook=playbook)


def fleet_fixture(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory,
                  model: str, offset: int, **kwargs: Any) -> Iterator[Fleet]:
    """Body of a module-scoped fixture: clean model on a healthy fleet, cleaned after."""
    ensure_fleet()
    unblock_all_ssh()
    clean_model(model)
    fleet = make_fleet(tmp_path_factory.mktemp(model), model, offset, **kwargs)
    try:
        yield fleet
    finally:
        unblock_all_ssh()
        if os.environ.get("TFSDEPLOY_ROLLBACK_TESTS_KEEP") != "1":
            clean_model(model)


def dump_on_failure(request: pytest.FixtureRequest, fleet: Fleet) -> Iterator[None]:
    """Body of an autouse fixture: print the fleet's containers and logs when a test failed
    (the call's report is logged before teardown, so ``testsfailed`` already counts it)."""
    before = request.session.testsfailed
    yield
    if request.session.testsfailed > before:
        print(fleet.dump())


# -- gRPC through the stable ports ----------------------------------------------------------

_API: dict[str, Any] = {}
_API_LOCK = threading.Lock()


def _api() -> dict[str, Any]:
    with _API_LOCK:
        if not _API:
            os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
            import grpc
            from tensorflow_serving.apis import predict_pb2, prediction_service_pb2_grpc

            _API.update(grpc=grpc, predict=predict_pb2, service=prediction_service_pb2_grpc)
    return _API


def predict_request(model: str, x: float, input_name: str = "x") -> Any:
    """A PredictRequest of one float x (shape [1, 1]) on serving_default."""
    request = _api()["predict"].PredictRequest()
    request.model_spec.name = model
    request.model_spec.signature_name = "serving_default"
    tensor = request.inputs[input_name]
    tensor.dtype = 1  # DT_FLOAT
    tensor.tensor_shape.dim.add(size=1)
    tensor.tensor_shape.dim.add(size=1)
    tensor.float_val.append(x)
    return request


def first_float(tensor: Any) -> float:
    """The first value of a DT_FLOAT TensorProto (float_val or tensor_content)."""
    import struct

    if tensor.float_val:
        return float(tensor.float_val[0])
    return float(struct.unpack_from("<f", tensor.tensor_content)[0])


def predict(address: str, port: int, model: str, x: float, *, timeout: float = 5.0) -> float:
    """y of one Predict through ``address:port`` (a new channel each time)."""
    api = _api()
    with api["grpc"].insecure_channel(f"{address}:{port}") as channel:
        stub = api["service"].PredictionServiceStub(channel)
        reply = stub.Predict(predict_request(model, x), timeout=timeout)
    return first_float(reply.outputs["y"])


@dataclass
class Sample:
    when: float
    host: str
    ok: bool
    version: int | None
    error: str = ""


class Prober:
    """Predict on every host's stable port, over long-lived channels, every ``interval_s``,
    from a background thread per host; records every answer and every failure.

    ``bad_ratio`` > 0 sends that share of requests with a wrong input name (INVALID_ARGUMENT
    from the server: counted as an error by TFServing's metrics, not by this prober)."""

    def __init__(self, fleet: Fleet, hosts: tuple[str, ...] = tuple(HOSTS),
                 interval_s: float = 0.05, bad_ratio: float = 0.0) -> None:
        self.fleet, self.hosts, self.interval_s, self.bad_ratio = fleet, hosts, interval_s, \
            bad_ratio
        self.samples: list[Sample] = []
        self.bad_sent = 0
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._loop, args=(h,), daemon=True)
                         for h in hosts]
        self._lock = threading.Lock()

    def __enter__(self) -> Prober:
        _api()
        for thread in self._threads:
            thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def stop(self) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(timeout=30)

    def _loop(self, host: str) -> None:
        api = _api()
        grpc = api["grpc"]

        channel = grpc.insecure_channel(f"{HOSTS[host]}:{self.fleet.grpc_port}")
        stub = api["service"].PredictionServiceStub(channel)
        good = predict_request(self.fleet.model, 2.0)
        bad = predict_request(self.fleet.model, 2.0, input_name="not_x")
        count = 0
        try:
            while not self._stop.is_set():
                count += 1
                send_bad = self.bad_ratio > 0 and (count % round(1 / self.bad_ratio)) == 0
                now = time.monotonic()
                try:
                    reply = stub.Predict(bad if send_bad else good, timeout=5)
                    if send_bad:
                        sample = Sample(now, host, False, None, "bad request answered OK")
                    else:
                        y = first_float(reply.outputs["y"])
                        sample = Sample(now, host, True, round(y - 2.0))
                except grpc.RpcError as error:
                    if send_bad and error.code() == grpc.StatusCode.INVALID_ARGUMENT:
                        with self._lock:
                            self.bad_sent += 1
                        self._stop.wait(self.interval_s)
                        continue
                    sample = Sample(now, host, False, None,
                                    f"{error.code().name}: {error.details()}")
                with self._lock:
                    self.samples.append(sample)
                self._stop.wait(self.interval_s)
        finally:
            channel.close()

    def failures(self) -> list[Sample]:
        with self._lock:
            return [s for s in self.samples if not s.ok]

    def versions(self, host: str) -> list[int | None]:
        with self._lock:
            return [s.version for s in self.samples if s.host == host and s.ok]

    def count(self) -> int:
        with self._lock:
            return len(self.samples)

    def summary(self) -> str:
        with self._lock:
            failed = [s for s in self.samples if not s.ok]
        first = failed[:5]
        return (f"{self.count()} probes, {len(failed)} failed; first failures: "
                + "; ".join(f"{s.host} {s.error}" for s in first))


# -- a fab process killed on cue -------------------------------------------------------------

class Watched:
    """A fab command whose progress lines are read as they come; ``kill_when`` kills it with
    SIGKILL (the whole process group) on the first line matching a pattern."""

    def __init__(self, fleet: Fleet, *args: str) -> None:
        self.argv = [str(VENV_BIN / "fab"), *args, "--model", fleet.model,
                     "--inventory", str(fleet.inventory)]
        self.lines: list[str] = []
        self.proc = subprocess.Popen(self.argv, stdout=subprocess.PIPE,
                                     stderr=subprocess.STDOUT, text=True, cwd=REPO,
                                     env=fab_env(), start_new_session=True, bufsize=1)
        self.fleet = fleet

    def kill_when(self, pattern: str, timeout: float = 300) -> str:
        """Read lines until one matches ``pattern``, then kill -9; returns that line."""
        regex = re.compile(pattern)
        end = time.monotonic() + timeout
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.append(line.rstrip("\n"))
            if regex.search(line):
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(timeout=30)
                self.proc.stdout.close()
                self.fleet.log.append(self.describe())
                return line
            if time.monotonic() > end:
                break
        self.proc.kill()
        self.proc.wait(timeout=30)
        self.fleet.log.append(self.describe())
        raise AssertionError(f"no line matched {pattern!r}; fab said:\n"
                             + "\n".join(self.lines[-40:]))

    def describe(self) -> str:
        return (f"$ fab {' '.join(self.argv[1:])}\n-> killed (rc {self.proc.returncode})\n"
                + "\n".join(line for line in self.lines if "cuda" not in line)[-4000:])


def step_seconds(result_json: dict[str, Any], prefix: str = "gate_") -> float:
    """Sum over hosts of the seconds of the steps whose name starts with ``prefix``."""
    return sum(step["seconds"] for host in result_json["hosts"].values()
               for step in host.get("steps", []) if step["step"].startswith(prefix))


def json_from(stdout: str) -> Any:
    """The JSON document `--json` printed on stdout."""
    starts = [i for i in (stdout.find("{"), stdout.find("[")) if i >= 0]
    assert starts, f"no JSON on stdout: {stdout[-3000:]!r}"
    return json.JSONDecoder().raw_decode(stdout, min(starts))[0]


if str(REPO / "src") not in sys.path:
    sys.path.insert(0, str(REPO / "src"))
