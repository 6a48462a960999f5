"""Fixtures: the latency-injecting fake PredictionService and the TFServing emulator.

Both run as subprocesses on 127.0.0.1 with free ports, and are killed at teardown.
"""

from __future__ import annotations

import os
import queue
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.ports import free_port

REPO = Path(__file__).resolve().parents[2]
MODELS = Path(os.environ.get("TFSDEPLOY_CACHE", "/var/cache/tfsdeploy")) / "models"
HALF_PLUS_TWO = MODELS / "half_plus_two"


@dataclass(frozen=True)
class Server:
    """A running test server."""

    grpc: str
    rest: str
    process: subprocess.Popen[str]


def _read_line_until(proc: subprocess.Popen[str], marker: str, timeout_s: float) -> str:
    """Read the process's stdout until a line contains ``marker``.

    The lines are read by a thread, one ``readline`` after another: a ``select`` on the pipe
    would miss a line that an earlier read already took into the file object's buffer (two
    lines written together, as on a busy machine, left the second unseen until the deadline).
    """
    assert proc.stdout is not None
    stream = proc.stdout
    lines: queue.Queue[str] = queue.Queue()

    def read() -> None:
        for line in iter(stream.readline, ""):
            lines.put(line)
            if marker in line:
                return
        lines.put("")  # end of output

    threading.Thread(target=read, daemon=True).start()
    deadline = time.monotonic() + timeout_s
    seen = []
    while (left := deadline - time.monotonic()) > 0:
        try:
            line = lines.get(timeout=left)
        except queue.Empty:
            break
        if not line:
            break
        seen.append(line)
        if marker in line:
            return line
    proc.kill()
    raise RuntimeError(f"server did not print {marker!r} in {timeout_s:g} s "
                       f"(exit {proc.poll()}): {''.join(seen)[-2000:]}")


def _drain(proc: subprocess.Popen[str]) -> None:
    """Keep reading the output so a chatty server never blocks on a full pipe."""
    assert proc.stdout is not None
    threading.Thread(target=proc.stdout.read, daemon=True).start()


def _stop(proc: subprocess.Popen[str]) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=3)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=5)


TEST_TIME_LIMIT_S = 180


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Every load-test test is bounded: pytest-timeout fails it after TEST_TIME_LIMIT_S, its
    fixtures' set-up included (the emulator's module fixture waits up to 90 s for its server;
    the runs themselves take seconds; the suite's default is 600 s)."""
    here = Path(__file__).parent
    for item in items:
        if here in Path(str(item.fspath)).parents:
            item.add_marker(pytest.mark.timeout(TEST_TIME_LIMIT_S))


@pytest.fixture
def fake_server() -> Iterator[Callable[..., Server]]:
    """Factory: ``fake_server(latency_ms=20, stall_after_s=1, stall_for_s=1, error_every=0)``."""
    started: list[subprocess.Popen[str]] = []

    def start(*, latency_ms: float = 0.0, stall_after_s: float = -1.0,
              stall_for_s: float = 0.0, error_every: int = 0) -> Server:
        proc = subprocess.Popen(
            [sys.executable, "-m", "tfsdeploy.loadtest.fakeserver", "--port", "0",
             "--rest-port", "0", "--latency-ms", str(latency_ms),
             "--stall-after-s", str(stall_after_s), "--stall-for-s", str(stall_for_s),
             "--error-every", str(error_every)],
            stdout=subprocess.PIPE, text=True, cwd=REPO)
        started.append(proc)
        line = _read_line_until(proc, "listening", 15)
        _drain(proc)
        parts = dict(item.split("=") for item in line.split()[1:])
        return Server(f"127.0.0.1:{parts['grpc']}", f"127.0.0.1:{parts['rest']}", proc)

    yield start
    for proc in started:
        _stop(proc)


@pytest.fixture(scope="module")
def emulator() -> Iterator[Server]:
    """The TFServing-compatible server with half_plus_two; a checkout without them is a
    failure (a missing prerequisite, never a skip)."""
    package = REPO / "testbed" / "emulator" / "tfserving_emulator"
    if not package.is_dir() or not (HALF_PLUS_TWO / "1").is_dir():
        pytest.fail(f"the emulator ({package}) or half_plus_two ({HALF_PLUS_TWO}/1) is "
                    "missing: run scripts/make-models in a complete checkout")
    grpc_port, rest_port = free_port(), free_port()
    env = dict(os.environ, PYTHONPATH=str(REPO / "testbed" / "emulator"))
    proc = subprocess.Popen(
        [sys.executable, "-m", "tfserving_emulator", f"--port={grpc_port}",
         f"--rest_api_port={rest_port}", "--model_name=half_plus_two",
         f"--model_base_path={HALF_PLUS_TWO}", "--file_system_poll_wait_seconds=0"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env, cwd=REPO)
    try:
        _read_line_until(proc, "Exporting HTTP/REST API", 90)
        _drain(proc)
        yield Server(f"127.0.0.1:{grpc_port}", f"127.0.0.1:{rest_port}", proc)
    finally:
        proc.kill()  # the emulator ignores SIGTERM, like TFServing under docker stop
        proc.wait(timeout=10)
