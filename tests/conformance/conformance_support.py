"""The conformance tier: TFServing's own test artifacts served by the emulator image.

Where things come from (environment variables, with their defaults):
- TFServing's test artifacts are in the repository: ``tests/conformance/tfserving-testdata``
  (unmodified files of tensorflow/serving at a named commit, Apache 2.0: its README.md). Their
  testdata/ is copied into the run's scratch directory and mounted from there, so the checkout
  may live anywhere on this machine, even under a directory that is private to each testbed
  host (/tmp, /root, /run, /srv/tfsdeploy, /var/lib/docker).
- TFSDEPLOY_CONFORMANCE_IMAGE: the image under test, default
  ``10.87.0.1:5000/tfserving-emulator:2.21.0`` (what ``scripts/testbed up`` builds from this
  checkout).
- TFSDEPLOY_CONFORMANCE_HOST: the testbed host whose Docker engine runs the containers,
  default tb3. Containers are named ``tfsconf-*`` and use host ports 9740-9759.
- TFSDEPLOY_CACHE: scratch files (the test data's copy, configs, exported models, a gRPC
  socket) go to ``$TFSDEPLOY_CACHE/conformance/<run>/`` (default /var/cache/tfsdeploy),
  visible to the host; everything a container mounts comes from there.

The tier needs the local fleet up (``scripts/testbed up``, as root): a host whose sshd or
Docker engine does not answer is an error of every case, never a skip (``fleet_problem``).

Every container is started as ``tensorflow/serving`` is: ``docker run [-v ...] [-e ...]
IMAGE [flags...]``, the flags appended to the image's entrypoint. Tests talk to it with the
unmodified tensorflow_serving.apis stubs and plain HTTP, on 10.87.0.x only.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import json
import os
import pathlib
import shlex
import shutil
import socket
import subprocess
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator, Sequence
from typing import Any

import grpc
import pytest
from google.protobuf import text_format
from tensorflow_serving.config import model_server_config_pb2

REPO = pathlib.Path(__file__).resolve().parents[2]


# unmodified files of tensorflow/serving (tfserving-testdata/README.md: commit, license)
TESTDATA_ROOT = pathlib.Path(__file__).resolve().parent / "tfserving-testdata"
TESTDATA = TESTDATA_ROOT / "testdata"
IMAGE = os.environ.get("TFSDEPLOY_CONFORMANCE_IMAGE", "10.87.0.1:5000/tfserving-emulator:2.21.0")
HOST = os.environ.get("TFSDEPLOY_CONFORMANCE_HOST", "tb3")
HOSTS = {"tb1": "10.87.0.11", "tb2": "10.87.0.12", "tb3": "10.87.0.13"}
ADDRESS = HOSTS.get(HOST, HOST)
STATE = pathlib.Path(os.environ.get("TFSDEPLOY_TESTBED_DIR", "/var/lib/tfsdeploy-testbed"))
CACHE = pathlib.Path(os.environ.get("TFSDEPLOY_CACHE", "/var/cache/tfsdeploy"))
RPC_TIMEOUT = 20.0
# Every module that uses the containers runs in one pytest-xdist worker (scripts/test runs
# the tiers with --dist loadgroup, a group per module unless it names one): the containers
# are a session fixture, and a second worker's would take the same names and ports.
SHARED_CONTAINERS = pytest.mark.xdist_group("conformance")


def fleet_problem() -> str | None:
    """Why the tier cannot run its containers on the fleet, or None: an error for every
    case (a broken fleet is never a pass or a skip)."""
    if os.geteuid() != 0 or not (STATE / "ssh" / "id_ed25519").exists():
        return f"the local fleet is not set up ({STATE}): run scripts/testbed up as root"
    engine = ssh("docker info --format '{{.ServerVersion}}'", check=False)
    if engine.returncode != 0:
        return (f"{HOST}'s Docker engine does not answer (ssh {HOST} docker info: exit "
                f"{engine.returncode}: {(engine.stderr or engine.stdout).strip()[-500:]}); "
                "see `scripts/testbed status`")
    return None


def ssh(command: str, *, check: bool = True, timeout: float = 120
        ) -> subprocess.CompletedProcess[str]:
    """A shell command on the host, as root. Nothing cuts this host's SSH in this tier: a
    failed connection (ssh's exit 255) is a failure like any other."""
    key = STATE / "ssh" / "id_ed25519"
    argv = ["ssh", "-i", str(key), "-o", f"UserKnownHostsFile={STATE / 'ssh' / 'known_hosts'}",
            "-o", "StrictHostKeyChecking=yes", "-o", "BatchMode=yes", "-o", "IdentitiesOnly=yes",
            "-o", "ConnectTimeout=10", f"root@{ADDRESS}", command]
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=timeout)
    if check and proc.returncode != 0:
        raise AssertionError(f"ssh {HOST} {command!r} -> {proc.returncode}\n{proc.stderr[-2000:]}")
    return proc


@dataclasses.dataclass(frozen=True)
class Spec:
    """How one container is started: ``docker run <options> IMAGE <flags>``."""

    key: str
    flags: tuple[str, ...] = ()
    volumes: tuple[tuple[pathlib.Path, str], ...] = ()
    env: tuple[tuple[str, str], ...] = ()
    entrypoint: str | None = None
    grpc_port: int | None = None
    rest_port: int | None = None
    exits: bool = False  # the server is expected to end by itself
    ready_log: str | None = None  # ready once its log shows this (for servers that never open)

    @property
    def name(self) -> str:
        """The container's name."""
        return f"tfsconf-{self.key}"

    def run_command(self) -> str:
        """The docker run command line, on the host."""
        options = ["docker", "run", "-d", "--name", self.name, "--network", "host"]
        for source, target in self.volumes:
            options += ["-v", f"{source}:{target}"]
        for key, value in self.env:
            options += ["-e", f"{key}={value}"]
        if self.entrypoint:
            options += ["--entrypoint", self.entrypoint]
        return shlex.join([*options, IMAGE, *self.flags])


@dataclasses.dataclass
class Container:
    """A started container: its spec, and once settled, its logs (and exit code)."""

    spec: Spec
    exit_code: int | None = None
    output: str = ""

    def logs(self) -> str:
        """Everything the container printed so far."""
        proc = ssh(f"docker logs {self.spec.name}", check=False)
        return proc.stdout + proc.stderr

    @property
    def grpc_target(self) -> str:
        """host:port of its gRPC server."""
        return f"{ADDRESS}:{self.spec.grpc_port}"

    @property
    def rest(self) -> str:
        """Base URL of its REST server."""
        return f"http://{ADDRESS}:{self.spec.rest_port}"

    def stubs(self) -> tuple[Any, Any]:
        """(PredictionService, ModelService) stubs over a fresh channel."""
        from tensorflow_serving.apis import model_service_pb2_grpc, prediction_service_pb2_grpc

        channel = grpc.insecure_channel(self.grpc_target)
        return (prediction_service_pb2_grpc.PredictionServiceStub(channel),
                model_service_pb2_grpc.ModelServiceStub(channel))


def port_open(port: int) -> bool:
    """True when the host accepts TCP connections on ``port``."""
    with socket.socket() as sock:
        sock.settimeout(0.5)
        return sock.connect_ex((ADDRESS, port)) == 0


def _state(name: str) -> tuple[bool, int]:
    proc = ssh(f"docker inspect -f '{{{{.State.Running}}}} {{{{.State.ExitCode}}}}' {name}",
               check=False)
    running, _, code = proc.stdout.strip().partition(" ")
    return running == "true", int(code or 0)


def _settle(container: Container, timeout: float) -> Container:
    """Wait until the container is ready (its ports answer) or has exited."""
    spec = container.spec
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        running, code = _state(spec.name)
        if spec.exits and not running:
            container.exit_code = code
            container.output = container.logs()
            return container
        if spec.ready_log is not None:
            if running and spec.ready_log in container.logs():
                return container
        else:
            ports = [p for p in (spec.grpc_port, spec.rest_port) if p is not None]
            if not spec.exits and ports and all(port_open(p) for p in ports):
                return container
        if not spec.exits and not running:
            raise AssertionError(f"{spec.name} exited {code}:\n{container.logs()[-4000:]}")
        time.sleep(0.5)
    raise AssertionError(f"{spec.name} did not settle in {timeout:.0f}s:\n"
                         f"{container.logs()[-4000:]}")


def start_all(specs: Sequence[Spec], timeout: float = 240) -> dict[str, Container]:
    """Start every container at once, then wait for each to be ready or to exit."""
    names = " ".join(s.name for s in specs)
    ssh(f"docker rm -f {names} >/dev/null 2>&1; true")
    containers = {}
    for spec in specs:
        ssh(spec.run_command())
        containers[spec.key] = Container(spec)
    with concurrent.futures.ThreadPoolExecutor(len(specs)) as pool:
        list(pool.map(lambda c: _settle(c, timeout), containers.values()))
    return containers


def remove_all(containers: dict[str, Container]) -> None:
    """Remove every container (whatever its state)."""
    names = " ".join(c.spec.name for c in containers.values())
    ssh(f"docker rm -f {names} >/dev/null 2>&1; true", check=False)


@pytest.fixture(scope="session")
def scratch() -> Iterator[pathlib.Path]:
    """A directory the host's Docker engine can mount (not /tmp: private to each host)."""
    path = CACHE / "conformance" / uuid.uuid4().hex[:12]
    path.mkdir(parents=True)
    path.chmod(0o777)
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def stage_testdata(root: pathlib.Path) -> pathlib.Path:
    """Copy TFServing's testdata/ (about 440 KB) to ``root/testdata``, where the host's Docker
    engine can mount it whatever the checkout's location; return the copy."""
    target = root / "testdata"
    shutil.copytree(TESTDATA, target)
    return target


def http(method: str, url: str, body: bytes | None = None,
         headers: dict[str, str] | None = None) -> tuple[int, str, dict[str, str]]:
    """Plain HTTP: (status, body, headers), HTTP errors included."""
    request = urllib.request.Request(url, data=body, method=method, headers=headers or {})
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status, response.read().decode(), dict(response.headers)
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode(), dict(exc.headers)


def post_json(url: str, document: Any) -> tuple[int, Any]:
    """POST a JSON document; (status, parsed JSON answer)."""
    body = document if isinstance(document, bytes) else json.dumps(document).encode()
    status, text, _headers = http("POST", url, body)
    return status, json.loads(text) if text else None


def sorted_object(value: Any) -> Any:
    """A JSON value with every list and object sorted, to compare documents whose arrays
    carry no order (as tensorflow_model_server_test_base.py's SortedObject does)."""
    if isinstance(value, dict):
        return sorted((k, sorted_object(v)) for k, v in value.items())
    if isinstance(value, list):
        return sorted((sorted_object(v) for v in value), key=repr)
    return value


TWO_VERSIONS = "saved_model_half_plus_two_2_versions"
LABEL = "Version_Label"


def main_config(label: bool) -> str:
    """testdata/good_model_config.txt with its placeholders filled in, plus the other shared
    models and the two TF2 exports made by the tests."""
    template = (TESTDATA / "good_model_config.txt").read_text()
    text = template.replace("${TEST_HALF_PLUS_TWO_DIR}", "/testdata/saved_model_half_plus_two_cpu")
    text = text.replace("${TEST_HALF_PLUS_THREE_DIR}", "/testdata/saved_model_half_plus_three")
    config = text_format.Parse(text, model_server_config_pb2.ModelServerConfig())
    entries = config.model_config_list.config
    for name, path in (("default", "/testdata/saved_model_half_plus_two_cpu"),
                       ("tf2", "/testdata/saved_model_half_plus_two_tf2_cpu"),
                       ("mkl", "/testdata/saved_model_half_plus_two_mkl"),
                       ("counter", "/testdata/saved_model_counter"),
                       ("with_saved_model_config",
                        "/testdata/saved_model_half_plus_two_cpu_with_saved_model_config"),
                       ("tf2_save", "/conf/tf2_save"), ("tf2_multi", "/conf/tf2_multi")):
        entries.add(name=name, base_path=path, model_platform="tensorflow")
    # http_rest_api_handler_test.cc: version 123 only, labelled once the core exists
    two = entries.add(name=TWO_VERSIONS, base_path=f"/testdata/{TWO_VERSIONS}",
                      model_platform="tensorflow")
    two.model_version_policy.specific.versions.append(123)
    if label:
        two.version_labels[LABEL] = 123
    # get_model_status_impl_test.cc: both versions
    both = entries.add(name="two_versions_both", base_path=f"/testdata/{TWO_VERSIONS}",
                       model_platform="tensorflow")
    both.model_version_policy.specific.versions.extend([123, 124])
    return str(text_format.MessageToString(config))


def single_config(name: str, path: str) -> str:
    """A model config with one TensorFlow model."""
    return (f'model_config_list {{ config {{ name: "{name}" base_path: "{path}" '
            'model_platform: "tensorflow" } }\n')


def wait_until(predicate: Any, timeout: float = 60, what: str = "condition") -> Any:
    """Poll ``predicate`` until it returns something truthy (gRPC errors count as no)."""
    deadline = time.monotonic() + timeout
    last: Any = None
    while time.monotonic() < deadline:
        try:
            last = predicate()
            if last:
                return last
        except grpc.RpcError as exc:
            last = exc
        time.sleep(0.5)
    raise AssertionError(f"timed out waiting for {what}; last {last!r}")
