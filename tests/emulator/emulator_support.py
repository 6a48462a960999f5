"""Fixtures for the emulator tests: test SavedModels, free ports, server processes.

Servers run as subprocesses on 127.0.0.1 and are only talked to through public APIs:
tensorflow_serving.apis gRPC stubs and plain HTTP.
"""

from __future__ import annotations

import contextlib
import os
import pathlib
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from typing import Any

import grpc
import pytest

sys.path.insert(0, str(pathlib.Path(__file__).parent))

import modelgen

from tests.ports import free_port as free_port  # the emulator tests' servers' ports

REPO = pathlib.Path(__file__).resolve().parents[2]
EMULATOR_DIR = REPO / "testbed" / "emulator"
LAUNCHER = EMULATOR_DIR / "tensorflow_model_server"


def port_open(port: int) -> bool:
    """True when something accepts TCP connections on 127.0.0.1:port."""
    with socket.socket() as sock:
        sock.settimeout(0.2)
        return sock.connect_ex(("127.0.0.1", port)) == 0


class Emulator:
    """One server process; output goes to a log file that tests can read."""

    def __init__(self, args: list[str], log_path: pathlib.Path, *,
                 env: dict[str, str] | None = None, argv0: list[str] | None = None) -> None:
        self.args = args
        self.log_path = log_path
        full_env = dict(os.environ)
        full_env["PYTHONPATH"] = str(EMULATOR_DIR)
        full_env["TFS_EMULATOR_PYTHON"] = sys.executable
        full_env.setdefault("SIMGPU_DIR", str(log_path.parent / "no-simgpu"))
        full_env.update(env or {})
        self._log = open(log_path, "wb")  # noqa: SIM115 - closed in stop()
        command = (argv0 or [str(LAUNCHER)]) + args
        # its own process group: a server started through the entrypoint script is bash's
        # child (no exec, as in the real image), and must die with it
        self.proc = subprocess.Popen(command, stdout=self._log, stderr=subprocess.STDOUT,
                                     env=full_env, start_new_session=True)

    def output(self) -> str:
        """Everything the server printed so far (stdout and stderr)."""
        return self.log_path.read_text(errors="replace")

    def wait_output(self, text: str, timeout: float = 60.0) -> str:
        """Everything printed once ``text`` is among it: a line printed after the event a test
        waited for (a port that opened, a file the server polls) may still be on its way."""
        deadline = time.monotonic() + timeout
        while True:
            exited = self.proc.poll() is not None  # before the read: its last lines are in
            out = self.output()
            if text in out:
                return out
            assert not exited, f"server exited {self.proc.returncode} without {text!r}:\n{out}"
            assert time.monotonic() < deadline, f"{text!r} not printed in {timeout} s:\n{out}"
            time.sleep(0.1)

    def wait_port(self, port: int, timeout: float = 90.0) -> None:
        """Wait until ``port`` accepts connections; fail with the log if the server died."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if port_open(port):
                return
            if self.proc.poll() is not None:
                raise AssertionError(f"server exited {self.proc.returncode}:\n{self.output()}")
            time.sleep(0.1)
        raise AssertionError(f"port {port} not open after {timeout}s:\n{self.output()}")

    def wait_exit(self, timeout: float = 90.0) -> int:
        """Wait for the process to exit and return its exit code."""
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired as exc:
            raise AssertionError(f"server still running:\n{self.output()}") from exc

    def stop(self) -> None:
        """Kill the process and its children (they may ignore SIGTERM, as bash as PID 1 does)."""
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait(10)
        self._log.close()


@pytest.fixture
def emulator(tmp_path: pathlib.Path) -> Iterator[Any]:
    """Factory: start servers that are killed at the end of the test."""
    started: list[Emulator] = []

    def start(args: list[str], **kwargs: Any) -> Emulator:
        server = Emulator(args, tmp_path / f"server{len(started)}.log", **kwargs)
        started.append(server)
        return server

    yield start
    for server in started:
        server.stop()


@pytest.fixture(scope="session")
def sources(tmp_path_factory: pytest.TempPathFactory) -> dict[str, pathlib.Path]:
    """Source SavedModels (not yet published under any base path)."""
    root = tmp_path_factory.mktemp("sources")
    out = {
        "hpt1": modelgen.half_plus_two(root / "hpt1", 1),
        "hpt2": modelgen.half_plus_two(root / "hpt2", 2),
        "hpt3": modelgen.half_plus_two(root / "hpt3", 3),
        "tf1": modelgen.tf1_builder(root / "tf1"),
        "corrupt": modelgen.corrupt(root / "corrupt"),
    }
    out["warm"] = modelgen.half_plus_two(root / "warm", 6)
    modelgen.warmup_records(out["warm"], 3)
    out["badwarm"] = modelgen.half_plus_two(root / "badwarm", 7)
    modelgen.bad_warmup(out["badwarm"])
    out["toomanywarm"] = modelgen.half_plus_two(root / "toomanywarm", 8)
    modelgen.warmup_records(out["toomanywarm"], 1001)
    out["huge"] = modelgen.half_plus_two(root / "huge", 1)
    modelgen.simgpu_footprint(out["huge"], 100_000)
    out["large"] = modelgen.half_plus_two(root / "large", 2)
    modelgen.simgpu_footprint(out["large"], 8500)
    out["examples"] = modelgen.tf1_examples(root / "examples")
    modelgen.example_warmup(out["examples"], "ex")
    out["block"] = modelgen.blocking(root / "block")
    return out


def write(path: pathlib.Path, text: str) -> pathlib.Path:
    """Write a config file and return its path."""
    path.write_text(text)
    return path


def stubs(port: int) -> tuple[Any, Any, grpc.Channel]:
    """(PredictionService stub, ModelService stub, channel) for 127.0.0.1:port."""
    from tensorflow_serving.apis import model_service_pb2_grpc, prediction_service_pb2_grpc

    channel = grpc.insecure_channel(f"127.0.0.1:{port}")
    return (prediction_service_pb2_grpc.PredictionServiceStub(channel),
            model_service_pb2_grpc.ModelServiceStub(channel), channel)


def http(method: str, url: str, body: bytes | None = None) -> tuple[int, str]:
    """Plain HTTP request: (status, body text), HTTP errors included."""
    request = urllib.request.Request(url, data=body, method=method)
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def status_of(model_stub: Any, name: str, version: int | None = None) -> dict[int, tuple[int, int]]:
    """GetModelStatus as {version: (state, error_code)}."""
    from tensorflow_serving.apis import get_model_status_pb2

    request = get_model_status_pb2.GetModelStatusRequest()
    request.model_spec.name = name
    if version is not None:
        request.model_spec.version.value = version
    response = model_stub.GetModelStatus(request, timeout=10)
    return {s.version: (s.state, s.status.error_code) for s in response.model_version_status}


def wait_for(predicate: Any, timeout: float = 60.0, what: str = "condition") -> Any:
    """Poll ``predicate`` until it returns something truthy."""
    deadline = time.monotonic() + timeout
    last: Any = None
    while time.monotonic() < deadline:
        with contextlib.suppress(grpc.RpcError):
            last = predicate()
            if last:
                return last
        time.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what}; last value {last!r}")


def predict_request(name: str, values: list[list[float]], *, signature: str = "",
                    version: int | None = None, label: str | None = None,
                    input_name: str = "x") -> Any:
    """A PredictRequest with one float input."""
    import numpy as np
    from tensorflow.core.framework import tensor_pb2, tensor_shape_pb2, types_pb2
    from tensorflow_serving.apis import predict_pb2

    array = np.asarray(values, dtype=np.float32)
    request = predict_pb2.PredictRequest()
    request.model_spec.name = name
    request.model_spec.signature_name = signature
    if version is not None:
        request.model_spec.version.value = version
    if label is not None:
        request.model_spec.version_label = label
    proto = tensor_pb2.TensorProto(dtype=types_pb2.DT_FLOAT, tensor_shape=tensor_shape_pb2.
                                   TensorShapeProto(dim=[tensor_shape_pb2.TensorShapeProto.Dim(
                                       size=d) for d in array.shape]))
    proto.float_val.extend(array.ravel().tolist())
    request.inputs[input_name].CopyFrom(proto)
    return request
