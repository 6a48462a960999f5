"""Against the TFServing-compatible server (testbed emulator) with half_plus_two.

The emulator cannot inject latency, so accuracy checks live in test_load_fake.py; here the
point is protocol compatibility: the real Predict API over gRPC and REST, warmup records as
request data, and real error statuses counted and gated.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from tfsdeploy.loadtest import cli

from .conftest import HALF_PLUS_TWO, Server


def _run(tmp_path: Path, *args: str) -> tuple[int, dict[str, Any]]:
    report = tmp_path / "report.json"
    code = cli.main(["--procs", "1", "--report", str(report), "-o", str(tmp_path / "out"),
                     *args])
    return code, json.loads(report.read_text()) if report.exists() else {}


def test_grpc_load_from_warmup_records(tmp_path: Path, emulator: Server) -> None:
    code, data = _run(tmp_path, "--data-from-warmup", str(HALF_PLUS_TWO / "1"), "-c", "4",
                      "-n", "300", emulator.grpc)
    assert code == 0
    assert data["statusCodeDistribution"] == {"OK": 300}
    assert data["tfsdeploy"]["clientCpu"]["requestsPerCoreSecond"] > 0


def test_rest_load_with_json_data(tmp_path: Path, emulator: Server) -> None:
    code, data = _run(tmp_path, "--rest", "--model", "half_plus_two", "-d",
                      '{"instances": [1.0, 2.0, 5.0]}', "--input-dtype", "inputs=DT_FLOAT",
                      "-c", "2", "-n", "60", "--max-error-rate", "100", emulator.rest)
    # half_plus_two's input is "x": unnamed rows are sent as input "inputs", which the server
    # rejects (HTTP 400); every answer must be counted under its status
    assert code == 0 and data["count"] == 60
    assert data["statusCodeDistribution"] == {"HTTP 400": 60}, data["errorDistribution"]
    code, data = _run(tmp_path, "--rest", "--model", "half_plus_two", "-d",
                      '{"inputs": {"x": [[1.0], [2.0]]}}', "-c", "2", "-n", "60", emulator.rest)
    assert code == 0 and data["statusCodeDistribution"] == {"OK": 60}


def test_unknown_model_fails_the_error_gate(tmp_path: Path, emulator: Server) -> None:
    code, data = _run(tmp_path, "--model", "no_such_model", "-d", '{"inputs": {"x": [[1.0]]}}',
                      "-c", "2", "-n", "20", emulator.grpc)
    assert code == 2
    assert data["statusCodeDistribution"] == {"NotFound": 20}
    (message,) = data["errorDistribution"]
    assert message.startswith("rpc error: code = NotFound desc = ")
