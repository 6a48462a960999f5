"""The containers of the conformance tier, started once for the whole session, all at once.

- main: a model config built from testdata/good_model_config.txt plus every other shared model
  and two TF2 exports made here; REST, testdata/monitoring_config.txt, a gRPC socket.
- tutorial: as g3doc/docker.md starts it (``-v .../saved_model_half_plus_two_cpu:
  /models/half_plus_two -e MODEL_NAME=half_plus_two``).
- poll: its config re-read every second, batching with testdata/batching_config.txt.
- core: a bad monitoring config (read after gRPC started: gRPC only), labels for unavailable
  versions allowed; for the ServerCore reload sequences.
- badconfig, badmodel, version: testdata/bad_model_config.txt, testdata/bad_half_plus_two,
  ``--version``; they exit.
- stopper, stopper_pid1: a base path without versions (they wait forever), with the standard
  entrypoint and with ``--entrypoint tensorflow_model_server``: for docker stop.
- exports: the SavedModels of export_styles.py (every way TF 2.21 users export one), load
  retries off; for test_export_styles.py.

Containers mount TFServing's test data from the run's scratch directory (a copy made by
``stage_testdata``), never from beside the checkout, which may be under a directory private
to each host (/tmp, /root).
"""

from __future__ import annotations

import pathlib
from collections.abc import Iterator

import export_styles
import pytest
from conformance_support import (
    RPC_TIMEOUT,
    Container,
    Spec,
    fleet_problem,
    main_config,
    remove_all,
    scratch,
    single_config,
    stage_testdata,
    start_all,
)

__all__ = ["scratch"]

PORTS = {"main": (9740, 9741), "tutorial": (9742, 9743), "core": (9744, 9745),
         "poll": (9746, 9747), "exports": (9754, 9755)}


def export_tf2_models(root: pathlib.Path) -> None:
    """tensorflow_model_server_test.py's test_tf_saved_model_save and
    test_tf_saved_model_save_multiple_signatures exports (version 00000123)."""
    import tensorflow as tf

    checkpoint = tf.train.Checkpoint()
    checkpoint.v1 = tf.Variable(3.0)
    checkpoint.v2 = tf.Variable(2.0)
    checkpoint.f = tf.function(lambda x: {"y": checkpoint.v1 * checkpoint.v2 * x})
    function = checkpoint.f.get_concrete_function(tf.TensorSpec(None, tf.float32))
    tf.saved_model.save(checkpoint, str(root / "tf2_save" / "00000123"), function)
    multi = tf.train.Checkpoint()
    multi.f = tf.function(lambda x: {"y": 1.0}, input_signature=[tf.TensorSpec(None, tf.float32)])
    multi.g = tf.function(lambda x: {"y": 2.0}, input_signature=[tf.TensorSpec(None, tf.float32)])
    tf.saved_model.save(multi, str(root / "tf2_multi" / "00000123"),
                        signatures={"serving_default": multi.f, "custom_signature_key": multi.g})


def specs(root: pathlib.Path) -> list[Spec]:
    """Every container of the tier."""
    testdata = root / "testdata"  # stage_testdata's copy, visible to the host
    data = (testdata, "/testdata:ro")
    conf = (root, "/conf")

    def ports(key: str, rest: bool = True) -> dict[str, int | None]:
        grpc_port, rest_port = PORTS[key]
        return {"grpc_port": grpc_port, "rest_port": rest_port if rest else None}

    waiting = "No versions of servable empty found under base path"
    return [
        Spec("main", volumes=(data, conf), **ports("main"), flags=(
            "--port=9740", "--rest_api_port=9741", "--model_config_file=/conf/main.config",
            "--monitoring_config_file=/testdata/monitoring_config.txt",
            "--grpc_socket_path=/conf/tf-serving.sock", "--rest_api_timeout_in_ms=5000",
            "--grpc_channel_arguments=grpc.max_connection_age_ms=2000,"
            "grpc.lb_policy_name=grpclb")),
        Spec("tutorial", **ports("tutorial"),
             volumes=((testdata / "saved_model_half_plus_two_cpu", "/models/half_plus_two"),),
             env=(("MODEL_NAME", "half_plus_two"),),
             flags=("--port=9742", "--rest_api_port=9743")),
        Spec("poll", volumes=(data, conf), **ports("poll"), flags=(
            "--port=9746", "--rest_api_port=9747", "--model_config_file=/conf/poll.config",
            "--model_config_file_poll_wait_seconds=1", "--enable_batching",
            "--batching_parameters_file=/testdata/batching_config.txt")),
        Spec("core", volumes=(data, conf), **ports("core", rest=False), flags=(
            "--port=9744", "--rest_api_port=9745", "--model_config_file=/conf/core.config",
            "--monitoring_config_file=/conf/bad_monitoring.config",
            "--allow_version_labels_for_unavailable_models")),
        Spec("badconfig", volumes=(data,), exits=True, flags=(
            "--port=9748", "--model_config_file=/testdata/bad_model_config.txt")),
        Spec("badmodel", exits=True,
             volumes=((testdata / "bad_half_plus_two", "/models/bad_half_plus_two"),),
             env=(("MODEL_NAME", "bad_half_plus_two"),),
             flags=("--port=9749", "--rest_api_port=9753", "--max_num_load_retries=0")),
        Spec("version", exits=True, flags=("--version",)),
        Spec("stopper", volumes=((root / "empty", "/models/empty"),),
             env=(("MODEL_NAME", "empty"),), ready_log=waiting,
             flags=("--port=9750", "--rest_api_port=9751")),
        Spec("stopper_pid1", volumes=((root / "empty", "/models/empty"),),
             entrypoint="tensorflow_model_server", ready_log=waiting,
             flags=("--port=9752", "--model_name=empty", "--model_base_path=/models/empty")),
        Spec("exports", volumes=(conf,), **ports("exports"), flags=(
            "--port=9754", "--rest_api_port=9755", "--model_config_file=/conf/exports.config",
            "--max_num_load_retries=0")),
    ]


def label_version(container: Container) -> None:
    """http_rest_api_handler_test.cc: create the core, then ReloadConfig with the label."""
    from google.protobuf import text_format
    from tensorflow_serving.apis import model_management_pb2
    from tensorflow_serving.config import model_server_config_pb2

    config = text_format.Parse(main_config(label=True),
                               model_server_config_pb2.ModelServerConfig())
    _predict, models = container.stubs()
    response = models.HandleReloadConfigRequest(
        model_management_pb2.ReloadConfigRequest(config=config), timeout=RPC_TIMEOUT * 3)
    assert response.status.error_code == 0, response


@pytest.fixture(scope="session")
def servers(scratch: pathlib.Path) -> Iterator[dict[str, Container]]:
    """All containers, ready or exited."""
    problem = fleet_problem()
    if problem:
        pytest.fail(f"the conformance tier cannot run: {problem}", pytrace=False)
    stage_testdata(scratch)
    export_tf2_models(scratch)
    export_styles.export_all(scratch / "exports")
    (scratch / "exports.config").write_text(export_styles.config_text(export_styles.SERVED))
    (scratch / "empty").mkdir()
    (scratch / "main.config").write_text(main_config(label=False))
    (scratch / "poll.config").write_text(
        single_config("half_plus_two", "/testdata/saved_model_half_plus_two_cpu"))
    (scratch / "core.config").write_text(
        single_config("half_plus_two", "/testdata/saved_model_half_plus_two_cpu"))
    (scratch / "bad_monitoring.config").write_text("prometheus_config { enable: true colour: 1 }")
    containers = start_all(specs(scratch))
    try:
        label_version(containers["main"])
        yield containers
    finally:
        remove_all(containers)
