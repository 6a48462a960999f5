"""Where the C++ server refuses what Python TensorFlow runs (tfserving_emulator/cpp_runtime.py):
tf.py_function and tf.numpy_function graphs (no kernel), GraphDefs from a newer TensorFlow; and
the Keras 3 model in a tf.Module, which the Session-style load refuses by itself. Each is
half_plus_two_bad's version as scripts/make-models writes it (18, 19, 20)."""

from __future__ import annotations

import pathlib
from typing import Any

import grpc
import pytest
import tensorflow as tf
from emulator_support import free_port, predict_request, status_of, stubs, write

from testbed.models import savedmodel, serving_failures
from testbed.models.half_plus_two import save_tf2

AVAILABLE = 30
PYTHON_ATTRS = 'Tin=[DT_FLOAT], Tout=[DT_FLOAT], token="pyfunc_'  # then the token's number


def no_kernel(op: str, node: str) -> tuple[str, str]:
    """The placer's refusal (colocation_graph.cc), before and after the node's token."""
    return (f"No OpKernel was registered to support Op '{op}' used by {{{{node {node}}}}} with "
            f"these attrs: [{PYTHON_ATTRS}",
            f"]\nRegistered devices: [CPU]\nRegistered kernels:\n  <no registered kernels>\n\n"
            f"\t [[{node}]]")


def _warmup(path: pathlib.Path) -> None:
    import numpy as np

    savedmodel.write_warmup(path, [savedmodel.predict_log(
        "m", "serving_default", {"x": np.array([[1.0]], np.float32)})])


def _tf1_numpy_function(path: pathlib.Path) -> None:
    """A TF1 graph whose serving_default output is a top-level PyFunc node."""
    v1 = tf.compat.v1
    with tf.Graph().as_default(), v1.Session() as sess:
        x = v1.placeholder(tf.float32, [None, 1], name="x")
        y = tf.numpy_function(lambda t: t * 2, [x], tf.float32, name="double")
        builder = v1.saved_model.Builder(str(path))
        builder.add_meta_graph_and_variables(sess, ["serve"], signature_def_map={
            "serving_default": v1.saved_model.predict_signature_def({"x": x}, {"y": y})})
        builder.save()


@pytest.fixture(scope="module")
def refused(tmp_path_factory: pytest.TempPathFactory) -> dict[str, pathlib.Path]:
    root = tmp_path_factory.mktemp("refused")
    made = {name: root / name / "1" for name in ("keras", "pyfunc", "newer", "tf1py", "bare")}
    serving_failures.save_keras_in_module(made["keras"], 19.0)
    serving_failures.save_py_function(made["pyfunc"], 20.0)
    save_tf2(made["newer"], 21.0)
    serving_failures.require_newer_tensorflow(made["newer"])
    _tf1_numpy_function(made["tf1py"])
    serving_failures.save_py_function(made["bare"], 20.0)  # no warmup: loads, runs fail
    for name in ("keras", "pyfunc", "newer"):
        _warmup(made[name])
    return {name: path.parent for name, path in made.items()}


def _config(models: dict[str, pathlib.Path], names: tuple[str, ...]) -> str:
    return "model_config_list {\n" + "".join(
        f'  config {{ name: "{n}" base_path: "{models[n]}" model_platform: "tensorflow" }}\n'
        for n in names) + "}\n"


def test_each_refusal_fails_start_up_with_the_real_servers_status(
        emulator: Any, tmp_path: pathlib.Path, refused: dict[str, pathlib.Path]) -> None:
    config = write(tmp_path / "models.config",
                   _config(refused, ("keras", "pyfunc", "newer", "tf1py")))
    server = emulator([f"--port={free_port()}", f"--model_config_file={config}",
                       "--max_num_load_retries=0"])
    assert server.wait_exit(120) == 255
    out = server.output()
    graph = tf.version.GRAPH_DEF_VERSION
    assert ("{name: keras version: 1} due to error: FAILED_PRECONDITION: Could not find "
            "variable dense/") in out
    assert "/N10tensorflow3VarE does not exist." in out
    head, tail = no_kernel("EagerPyFunc",
                           "StatefulPartitionedCall/StatefulPartitionedCall/EagerPyFunc")
    assert "{name: pyfunc version: 1} due to error: INVALID_ARGUMENT: " + head in out
    assert tail + "\n\t [[StatefulPartitionedCall/StatefulPartitionedCall]]" in out
    assert (f"{{name: newer version: 1}} due to error: INVALID_ARGUMENT: GraphDef min consumer "
            f"version {graph + serving_failures.NEWER_BY} above current version {graph} for "
            f"TensorFlow {tf.version.VERSION}.  Please upgrade TensorFlow.") in out
    head, tail = no_kernel("PyFunc", "double")
    assert "{name: tf1py version: 1} due to error: INVALID_ARGUMENT: " + head in out
    assert tail + "}" in out


def test_without_warmup_a_py_function_loads_and_every_run_of_it_fails(
        emulator: Any, tmp_path: pathlib.Path, refused: dict[str, pathlib.Path]) -> None:
    port = free_port()
    config = write(tmp_path / "models.config", _config(refused, ("bare",)))
    server = emulator([f"--port={port}", f"--model_config_file={config}"])
    server.wait_port(port, timeout=120)
    predict, models, channel = stubs(port)
    assert status_of(models, "bare") == {1: (AVAILABLE, 0)}
    for _ in range(2):
        with pytest.raises(grpc.RpcError) as error:
            predict.Predict(predict_request("bare", [[1.0]]), timeout=10)
        assert error.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "No OpKernel was registered to support Op 'EagerPyFunc'" in error.value.details()
    doubled = predict.Predict(predict_request("bare", [[1.5]], signature="times_two"),
                              timeout=10)
    assert list(doubled.outputs["y"].float_val) == [3.0]
    channel.close()


def test_a_graph_that_names_a_missing_input_fails_its_load_invalid_argument(
        emulator: Any, tmp_path: pathlib.Path) -> None:
    """The graph is built as the C++ server's Session::Create builds it (GraphConstructor):
    an input no node provides is INVALID_ARGUMENT. Python's importer would have turned that
    status into a ValueError (importer.py), an UNKNOWN error."""
    from tensorflow.core.protobuf import saved_model_pb2

    version = tmp_path / "broken" / "1"
    save_tf2(version, 2.0)
    saved = saved_model_pb2.SavedModel()
    saved.ParseFromString((version / "saved_model.pb").read_bytes())
    node = saved.meta_graphs[0].graph_def.node.add()
    node.name, node.op = "broken", "Identity"
    node.input.append("does_not_exist:0")
    (version / "saved_model.pb").write_bytes(saved.SerializeToString())
    config = write(tmp_path / "models.config", _config({"broken": version.parent}, ("broken",)))
    server = emulator([f"--port={free_port()}", f"--model_config_file={config}",
                       "--max_num_load_retries=0"])
    assert server.wait_exit(120) == 255
    assert ("{name: broken version: 1} due to error: INVALID_ARGUMENT: Node 'broken': Unknown "
            "input node 'does_not_exist:0'") in server.output()
