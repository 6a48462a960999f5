"""Version life cycle on one shared server: polling, availability-preserving swaps, failed
versions, numeric directories, warmup, and version policies via reload."""

from __future__ import annotations

import pathlib
import re
import shutil
import threading
from typing import Any

import grpc
import modelgen
import pytest
from emulator_support import (
    Emulator,
    free_port,
    http,
    predict_request,
    status_of,
    stubs,
    wait_for,
    write,
)
from google.protobuf import text_format
from grpc._common import CYGRPC_CONNECTIVITY_STATE_TO_CHANNEL_CONNECTIVITY
from tensorflow_serving.apis import model_management_pb2
from tensorflow_serving.config import model_server_config_pb2

AVAILABLE, END = 30, 50
CONFIG = """model_config_list {{
  config {{ name: "live" base_path: "{root}/live" model_platform: "tensorflow" }}
  config {{ name: "pol" base_path: "{root}/pol" model_platform: "tensorflow"
           model_version_policy {{ {policy} }} }}
}}
"""


class Live:
    """Handles to the shared server."""

    def __init__(self, server: Emulator, grpc_port: int, rest_port: int,
                 root: pathlib.Path, sources: dict[str, pathlib.Path]) -> None:
        self.server = server
        self.rest = f"http://127.0.0.1:{rest_port}"
        self.predict, self.models, self.channel = stubs(grpc_port)
        self.root = root
        self.sources = sources

    def publish(self, source: str, version: int | str) -> None:
        modelgen.copy_version(self.sources[source], self.root / "live", version)

    def served_version(self) -> int:
        request = predict_request("live", [[0.0]], signature="version_of")
        response = self.predict.Predict(request, timeout=10)
        return int(response.outputs["version"].int64_val[0])

    def metric(self, pattern: str) -> float:
        status, page = http("GET", self.rest + "/monitoring/prometheus/metrics")
        assert status == 200
        match = re.search(pattern, page, re.M)
        return float(match.group(1)) if match else 0.0


@pytest.fixture(scope="module")
def live(tmp_path_factory: pytest.TempPathFactory, sources: dict[str, pathlib.Path]) -> Any:
    root = tmp_path_factory.mktemp("live")
    modelgen.copy_version(sources["hpt1"], root / "live", 1)
    for version in (1, 2, 3):
        modelgen.copy_version(sources[f"hpt{version}"], root / "pol", version)
    config = write(root / "models.config", CONFIG.format(
        root=root, policy="specific { versions: 1 versions: 3 }"))
    monitoring = write(root / "monitoring.config", "prometheus_config { enable: true }\n")
    grpc_port, rest_port = free_port(), free_port()
    server = Emulator([
        f"--port={grpc_port}", f"--rest_api_port={rest_port}", f"--model_config_file={config}",
        f"--monitoring_config_file={monitoring}", "--file_system_poll_wait_seconds=1",
        "--max_num_load_retries=1", "--load_retry_interval_micros=100000", "--enable_batching",
        "--num_request_iterations_for_warmup=2",
        "--grpc_channel_arguments=grpc.max_connection_age_ms=2000,grpc.http2.max_pings_without_data=0"],
        root / "server.log")
    try:
        server.wait_port(rest_port)
        yield Live(server, grpc_port, rest_port, root, sources)
    finally:
        server.stop()


def test_initial_version_is_available(live: Live) -> None:
    assert status_of(live.models, "live") == {1: (AVAILABLE, 0)}
    assert live.served_version() == 1


def test_new_version_loads_before_old_unloads(live: Live) -> None:
    errors: list[str] = []
    seen: set[int] = set()
    stop = threading.Event()

    def hammer() -> None:
        while not stop.is_set():
            try:
                seen.add(live.served_version())
            except grpc.RpcError as exc:
                errors.append(f"{exc.code()}: {exc.details()}")

    thread = threading.Thread(target=hammer)
    thread.start()
    try:
        live.publish("hpt2", 2)
        wait_for(lambda: status_of(live.models, "live") == {2: (AVAILABLE, 0), 1: (END, 0)},
                 what="v2 AVAILABLE and v1 END")
    finally:
        stop.set()
        thread.join()
    assert errors == []
    assert seen == {1, 2}
    out = live.server.output()
    assert out.index("Successfully loaded servable version {name: live version: 2}") < \
        out.index("Unloading servable version {name: live version: 1}")


def test_failed_new_version_leaves_old_serving(live: Live) -> None:
    live.publish("corrupt", 3)
    states = wait_for(lambda: (s := status_of(live.models, "live")).get(3, (0,))[0] == END
                      and s, what="v3 END")
    assert states[3][1] != 0
    assert states[2] == (AVAILABLE, 0)
    assert live.served_version() == 2
    assert "Retrying of Loading servable: {name: live version: 3} retry: 1" in \
        live.server.output()


def test_only_numeric_version_directories(live: Live) -> None:
    live.publish("hpt3", "v9")
    live.publish("hpt3", "00000004")
    wait_for(lambda: status_of(live.models, "live").get(4) == (AVAILABLE, 0), what="v4")
    assert 9 not in status_of(live.models, "live")
    assert live.served_version() == 3  # the hpt3 model answers as version 4's contents


def test_warmup_replays_records_inside_load(live: Live) -> None:
    runs = r"^:tensorflow:serving:batching_session:wrapped_run_count\{\} (\S+)$"
    before = live.metric(runs)
    live.publish("warm", 6)
    wait_for(lambda: status_of(live.models, "live").get(6) == (AVAILABLE, 0), what="v6")
    assert live.metric(runs) - before == 6  # 3 records x --num_request_iterations_for_warmup=2
    assert "Number of warmup records read: 3." in live.server.output()
    assert live.metric(r'^:tensorflow:serving:model_warmup_latency_count\{model_path='
                       rf'"{live.root}/live/6",status="OK"\}} (\S+)$') == 1


@pytest.mark.parametrize(("source", "version", "code", "message"), [
    ("badwarm", 7, 15, "Please verify your warmup data is in TFRecord format."),
    ("toomanywarm", 8, 3, "Number of warmup records exceeds the maximum (1000) at "),
])
def test_bad_warmup_fails_the_load(live: Live, source: str, version: int, code: int,
                                   message: str) -> None:
    live.publish(source, version)
    wait_for(lambda: status_of(live.models, "live").get(version, (0,))[0] == END,
             timeout=120, what=f"v{version} END")
    from tensorflow_serving.apis import get_model_status_pb2

    request = get_model_status_pb2.GetModelStatusRequest()
    request.model_spec.name = "live"
    request.model_spec.version.value = version
    status = live.models.GetModelStatus(request, timeout=10).model_version_status[0].status
    assert status.error_code == code
    assert message in status.error_message
    assert live.served_version() == 6


def test_reload_reports_new_models_that_fail(live: Live) -> None:
    modelgen.copy_version(live.sources["corrupt"], live.root / "broken", 1)
    text = CONFIG.format(root=live.root, policy="specific { versions: 1 versions: 3 }")
    text = text.rstrip().rstrip("}") + (f'config {{ name: "broken" base_path: '
                                        f'"{live.root}/broken" model_platform: "tensorflow" }}}}')
    config = text_format.Parse(text, model_server_config_pb2.ModelServerConfig())
    with pytest.raises(grpc.RpcError) as info:
        live.models.HandleReloadConfigRequest(
            model_management_pb2.ReloadConfigRequest(config=config), timeout=60)
    assert info.value.code() == grpc.StatusCode.UNKNOWN
    assert info.value.details().startswith(
        "1 model(s) did not become available: {{{name: broken version: 1} due to error: "
        "DATA_LOSS: ")


def _reload(live: Live, policy: str) -> None:
    text = CONFIG.format(root=live.root, policy=policy)
    config = text_format.Parse(text, model_server_config_pb2.ModelServerConfig())
    response = live.models.HandleReloadConfigRequest(
        model_management_pb2.ReloadConfigRequest(config=config), timeout=60)
    assert response.status.error_code == 0


def test_version_policies(live: Live) -> None:
    assert status_of(live.models, "pol") == {3: (AVAILABLE, 0), 1: (AVAILABLE, 0)}
    _reload(live, "all {}")
    wait_for(lambda: status_of(live.models, "pol") == {3: (AVAILABLE, 0), 2: (AVAILABLE, 0),
                                                       1: (AVAILABLE, 0)}, what="all")
    _reload(live, "latest { num_versions: 2 }")
    wait_for(lambda: status_of(live.models, "pol") == {3: (AVAILABLE, 0), 2: (AVAILABLE, 0),
                                                       1: (END, 0)}, what="latest 2")


def test_deleted_version_directory_is_unloaded(live: Live) -> None:
    shutil.rmtree(live.root / "pol" / "3")
    wait_for(lambda: status_of(live.models, "pol") == {3: (END, 0), 2: (AVAILABLE, 0),
                                                       1: (AVAILABLE, 0)}, what="v3 unloaded")


def test_max_connection_age_closes_idle_connections(live: Live) -> None:
    # --grpc_channel_arguments=grpc.max_connection_age_ms=2000: the server sends GOAWAY, so a
    # client channel drops back from READY to IDLE without any client action. The state is
    # read from the channel itself (without connecting): a subscription's callbacks come from
    # a thread that polls, and on a loaded machine the 2 s of READY passed between two polls
    # (READY never seen in 60 s, a full run's fleet-free tier at nice 19). Without the
    # GOAWAY the channel stays READY and the wait fails.
    _predict, models, channel = stubs(int(live.server.args[0].split("=")[1]))
    status_of(models, "live")  # an answered call: the channel was READY

    def state() -> grpc.ChannelConnectivity:
        code = channel._channel.check_connectivity_state(False)  # type: ignore[attr-defined]
        return CYGRPC_CONNECTIVITY_STATE_TO_CHANNEL_CONNECTIVITY[code]

    wait_for(lambda: state() != grpc.ChannelConnectivity.READY, timeout=15,
             what="connection aged out")
    channel.close()


def test_no_health_service_without_the_flag(live: Live) -> None:
    check = live.channel.unary_unary("/grpc.health.v1.Health/Check",
                                     request_serializer=lambda b: b,
                                     response_deserializer=lambda b: b)
    with pytest.raises(grpc.RpcError) as info:
        check(b"", timeout=10)
    assert info.value.code() == grpc.StatusCode.UNIMPLEMENTED
