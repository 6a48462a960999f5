"""Fixtures of the acceptance-run tests: the fake PredictionService (test equipment), which
reports how many requests it received when it stops."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


@dataclass
class FakeServer:
    """A running fake server and, once stopped, the number of requests it received."""

    port: int
    process: subprocess.Popen[str]
    output: list[str] = field(default_factory=list)

    def stop(self) -> int:
        """SIGTERM, then the ``served=`` count it printed."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
        out, _ = self.process.communicate(timeout=15)
        found = re.search(r"stopped served=(\d+)", out)
        assert found, f"the fake server printed no count: {out!r}"
        return int(found.group(1))


@pytest.fixture
def fake_server() -> Iterator[FakeServer]:
    """A fake server on 127.0.0.1 answering after 2 ms."""
    proc = subprocess.Popen([sys.executable, "-m", "tfsdeploy.loadtest.fakeserver", "--port",
                             "0", "--latency-ms", "2"], stdout=subprocess.PIPE, text=True,
                            cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO / "src")})
    assert proc.stdout is not None
    line = proc.stdout.readline()
    found = re.search(r"grpc=(\d+)", line)
    assert found, line
    server = FakeServer(int(found.group(1)), proc)
    yield server
    if proc.poll() is None:
        proc.kill()
        proc.wait(timeout=10)
