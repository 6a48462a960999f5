"""Batching parameters really shape batches: timeout, max batch size and threads."""

from __future__ import annotations

import concurrent.futures
import re
import time
from typing import Any

import grpc
import modelgen
import pytest
from emulator_support import Emulator, free_port, http, predict_request, stubs, write

from tests.bounds import within

BATCHING = """max_batch_size { value: 16 }
enable_large_batch_splitting { value: true }
max_execution_batch_size { value: 8 }
batch_timeout_micros { value: 2000000 }
max_enqueued_batches { value: 4 }
num_batch_threads { value: 1 }
thread_pool_name { value: "bench_pool" }
"""


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory, sources: dict[str, Any]) -> Any:
    root = tmp_path_factory.mktemp("batching")
    modelgen.copy_version(sources["hpt1"], root / "hpt", 1)
    batching = write(root / "batching.config", BATCHING)
    monitoring = write(root / "monitoring.config",
                       'prometheus_config { enable: true path: "/custom/metrics" }\n')
    grpc_port, rest_port = free_port(), free_port()
    emulator = Emulator([f"--port={grpc_port}", f"--rest_api_port={rest_port}",
                         f"--model_base_path={root / 'hpt'}", "--model_name=hpt",
                         "--enable_batching", f"--batching_parameters_file={batching}",
                         f"--monitoring_config_file={monitoring}"], root / "server.log")
    try:
        emulator.wait_port(rest_port)
        predict, _models, _channel = stubs(grpc_port)
        yield predict, f"http://127.0.0.1:{rest_port}"
    finally:
        emulator.stop()


def batches(rest: str) -> tuple[int, int]:
    """(batches run, request rows seen): processed_batch_size counts batches, input_batch_size
    counts every request's input tensor (BatchingSession::ComputeInputSize)."""
    status, page = http("GET", rest + "/custom/metrics")
    assert status == 200
    count = re.search(
        r"^:tensorflow:serving:batching_session:processed_batch_size_count\{\} (\d+)$", page,
        re.M)
    total = re.search(r"^:tensorflow:serving:batching_session:input_batch_size_sum\{\} (\S+)$",
                      page, re.M)
    assert 'queuing_latency_count{thread_pool_name=""}' in page or not count
    return (int(count.group(1)) if count else 0, int(float(total.group(1))) if total else 0)


def concurrent_latencies(predict: Any, n: int) -> list[float]:
    """Seconds from before the first call is sent to each call's answer (a thread that
    starts late can only make its figure larger)."""
    started = time.monotonic()

    def call(_: int) -> float:
        predict.Predict(predict_request("hpt", [[1.0]]), timeout=30)
        return time.monotonic() - started

    with concurrent.futures.ThreadPoolExecutor(max_workers=n) as pool:
        return list(pool.map(call, range(n)))


def test_partial_batch_waits_for_the_timeout(server: Any) -> None:
    predict, rest = server
    before = batches(rest)
    latencies = concurrent_latencies(predict, 3)
    after = batches(rest)
    assert after[1] - before[1] == 3
    assert after[0] - before[0] <= 2  # merged into one batch (rarely two)
    # nobody filled the batch: it ran at the 2 s timeout, a lower limit no machine shortens
    # measured in a full run (2 cores, 4 workers beside it): 2.05 s, margin 1.08x;
    # scripts/test prints it every run
    within("fastest of a partial batch's requests, s", min(latencies), at_least=1.9)


def test_full_batch_runs_without_waiting(server: Any) -> None:
    predict, rest = server
    before = batches(rest)
    request = predict_request("hpt", [[1.0]] * 8)
    started = time.monotonic()
    predict.Predict(request, timeout=30)
    # a full batch (8 = execution limit) goes at once; waiting for the timeout would take
    # 2 s, and a stall of the fleet-free tiers at nice 19 has been seen to add 0.25 s
    # measured in a full run (2 cores, 4 workers beside it): 0.00240 s, margin 417x;
    # scripts/test prints it every run
    within("full batch answered, s", time.monotonic() - started, below=1.0)
    after = batches(rest)
    assert after == (before[0] + 1, before[1] + 8)


def test_large_requests_are_split_across_batches(server: Any) -> None:
    import tensorflow as tf

    predict, rest = server
    before = batches(rest)
    values = [[float(i)] for i in range(12)]
    response = predict.Predict(predict_request("hpt", values), timeout=30)
    assert tf.make_ndarray(response.outputs["y"]).ravel().tolist() == \
        [0.5 * i + 2 for i in range(12)]
    after = batches(rest)
    assert after == (before[0] + 2, before[1] + 12)  # 8 + 4
    with pytest.raises(grpc.RpcError) as info:
        predict.Predict(predict_request("hpt", [[1.0]] * 17), timeout=30)
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert info.value.details() == "Task size 17 is larger than maximum input batch size 16"
