"""The failure classifier (tfsdeploy.core.rollout.gate_diagnosis) fed with the messages real
TFServing servers wrote: as TensorFlow's and TFServing's sources build them (file named in each
case) and as published reports of real servers quote them; and the same failures as the
testbed's server words them. Pure: no host, no fleet."""

from __future__ import annotations

from typing import Any

import pytest

from tfsdeploy.core.rollout.gate_diagnosis import (
    PATTERNS,
    Diagnosis,
    Kind,
    ServerFacts,
    diagnose,
    diagnose_signature,
    evidence_at,
)

RETRIER = "E external/tf_serving/tensorflow_serving/util/retrier.cc:40] "

# (kind, the real message, a word the fix must say) -- each message as the server logs it
REAL_MESSAGES: list[tuple[Kind, str, str]] = [
    # resource_variable_ops.cc ReadVariableOp::Compute + resource_mgr.cc: a Keras 3 model in a
    # tf.Module exported with tf.saved_model.save, read by TFServing 2.x during a request
    (Kind.VARIABLES_NOT_RESTORED,
     "W external/org_tensorflow/tensorflow/core/framework/local_rendezvous.cc:404] Local "
     "rendezvous is aborting with status: FAILED_PRECONDITION: Could not find variable "
     "sequential/dense_2/kernel. This could mean that the variable has been deleted. In TF1, "
     "it can also mean the variable is uninitialized. Debug info: container=localhost, status "
     "error message=Resource localhost/sequential/dense_2/kernel/N10tensorflow3VarE does not "
     "exist.\n\t [[{{function_node __inference_serving_default_46412}}{{node "
     "sequential_1/dense_2_1/Cast/ReadVariableOp}}]]", "model.export"),
    # the same kernel before TF 2.7 ("status=" and the container lookup's message)
    (Kind.VARIABLES_NOT_RESTORED,
     "Could not find variable batch_normalization/moving_mean. This could mean that the "
     "variable has been deleted. In TF1, it can also mean the variable is uninitialized. "
     "Debug info: container=localhost, status=Not found: Container localhost does not exist. "
     "(Could not find resource: localhost/batch_normalization/moving_mean)", "model.export"),
    # the warmup of the testbed's half_plus_two_bad/18 (TensorFlow 2.21's words)
    (Kind.VARIABLES_NOT_RESTORED,
     RETRIER + "Loading servable: {name: m version: 18} failed: FAILED_PRECONDITION: Could not "
     "find variable dense/kernel. This could mean that the variable has been deleted. In TF1, "
     "it can also mean the variable is uninitialized. Debug info: container=localhost, status "
     "error message=Resource localhost/dense/kernel/N10tensorflow3VarE does not exist.",
     "ExportArchive"),
    # op.cc OpNotFound: a TFServing 1.x without script ops (tensorflow/serving#992)
    (Kind.OP_NOT_IN_SERVER,
     "E tensorflow_serving/util/retrier.cc:37] Loading servable: {name: deeplab version: 1} "
     "failed: Not found: Op type not registered 'PyFunc' in binary running on iva. Make sure "
     "the Op and Kernel are registered in the binary running in this process. Note that if "
     "you are loading a saved graph which used ops from tf.contrib, accessing (e.g.) "
     "`tf.contrib.resampler` should be done before importing the graph, as contrib ops are "
     "lazily registered when the module is first accessed.", "tf.numpy_function"),
    # op.cc OpNotFound today: a custom op the image was not built with
    (Kind.OP_NOT_IN_SERVER,
     "NOT_FOUND: Op type not registered 'ZeroOut' in binary running on 5f0c2a7d9e1b. Make "
     "sure the Op and Kernel are registered in the binary running in this process. Note that "
     "if you are loading a saved graph which used ops from tf.contrib (e.g. "
     "`tf.contrib.resampler`), accessing should be done before importing the graph, as "
     "contrib ops are lazily registered when the module is first accessed.", "custom_op"),
    # colocation_graph.cc: the op is registered, no kernel (TF1 graph; Tacotron-2#394)
    (Kind.OP_NOT_IN_SERVER,
     "E tensorflow_serving/util/retrier.cc:37] Loading servable: {name: tts version: 1} "
     "failed: Invalid argument: No OpKernel was registered to support Op 'PyFunc' used by "
     "{{node Tacotron_model/PyFunc}}with these attrs: [token=\"pyfunc_0\", "
     "_output_shapes=[<unknown>], Tin=[DT_INT32, DT_INT32], Tout=[DT_INT32]]",
     "tf.numpy_function"),
    # colocation_graph.cc for tf.py_function in a TF2 function body (warmup of bad/19)
    (Kind.OP_NOT_IN_SERVER,
     "INVALID_ARGUMENT: No OpKernel was registered to support Op 'EagerPyFunc' used by "
     "{{node StatefulPartitionedCall/StatefulPartitionedCall/EagerPyFunc}} with these attrs: "
     "[Tin=[DT_FLOAT], Tout=[DT_FLOAT], is_async=false, token=\"pyfunc_0\"]\n"
     "Registered devices: [CPU]\nRegistered kernels:\n  <no registered kernels>\n\n"
     "\t [[StatefulPartitionedCall/StatefulPartitionedCall/EagerPyFunc]]", "tf.py_function"),
    # op_kernel.cc FindKernelRegistration (tensorflow#24099)
    (Kind.OP_NOT_IN_SERVER,
     "No registered 'PyFunc' OpKernel for CPU devices compatible with node {{node PyFunc}} = "
     "PyFunc[Tin=[], Tout=[DT_INT64], token=\"pyfunc_3\"]()\n\t.  Registered:  <no registered "
     "kernels>", "tf.numpy_function"),
    # versions.cc CheckVersions for the GraphDef (graph_constructor.cc), bad/20 on 2.21.0
    (Kind.MODEL_NEWER_THAN_SERVER,
     RETRIER + "Loading servable: {name: m version: 20} failed: INVALID_ARGUMENT: GraphDef min "
     "consumer version 3474 above current version 2474 for TensorFlow 2.21.0.  Please upgrade "
     "TensorFlow.", "tfserving_version"),
    # the same check of the variables' checkpoint (tensor_bundle.cc)
    (Kind.MODEL_NEWER_THAN_SERVER,
     "Checkpoint min consumer version 3 above current version 2 for TensorFlow 2.21.0.  Please "
     "upgrade TensorFlow.", "image"),
    (Kind.MODEL_NEWER_THAN_SERVER,
     "GraphDef disallows consumer version 2474.  Please upgrade TensorFlow: this version is "
     "likely buggy.", "tfserving_version"),
    # op_kernel.cc allocate_tensor on a GPU
    (Kind.GPU_MEMORY_EXHAUSTED,
     "RESOURCE_EXHAUSTED: OOM when allocating tensor with shape[25088,4096] and type float on "
     "/job:localhost/replica:0/task:0/device:GPU:0 by allocator GPU_0_bfc", "memory_mib"),
    # bfc_allocator.cc
    (Kind.GPU_MEMORY_EXHAUSTED,
     "W external/org_tensorflow/tensorflow/core/common_runtime/bfc_allocator.cc:479] Allocator "
     "(GPU_0_bfc) ran out of memory trying to allocate 392.00MiB (rounded to 411041792)"
     "requested by op save/RestoreV2", "per_process_gpu_memory_fraction"),
    # the CUDA driver's allocation
    (Kind.GPU_MEMORY_EXHAUSTED,
     "E external/org_tensorflow/tensorflow/stream_executor/cuda/cuda_driver.cc:806] failed to "
     "allocate 20.00G (21474836480 bytes) from device: CUDA_ERROR_OUT_OF_MEMORY: out of memory",
     "larger GPU"),
    # the testbed's simulated GPU (half_plus_two_bad/15)
    (Kind.GPU_MEMORY_EXHAUSTED,
     RETRIER + "Loading servable: {name: m version: 15} failed: RESOURCE_EXHAUSTED: OOM when "
     "allocating tensor of 20000 MiB on /physical_device:GPU:0 by allocator GPU_0_bfc: 0 MiB "
     "could be added to its 614 MiB (limit 614 MiB)", "gpu_safety_margin"),
    # saved_model_warmup_util.cc on a DATA_LOSS of the record reader (tensorflow/serving#1562)
    (Kind.WARMUP_FILE_UNREADABLE,
     RETRIER + "Loading servable: {name: m version: 14} failed: DATA_LOSS: corrupted record at "
     "0. Please verify your warmup data is in TFRecord format.", "TFRecordWriter"),
    # saved_model_warmup_util.cc: a record that is no PredictionLog
    (Kind.WARMUP_FILE_UNREADABLE,
     "INVALID_ARGUMENT: Failed to parse warmup record: \x08\x01 from "
     "/models/m/3/assets.extra/tf_serving_warmup_requests", "PredictionLog"),
]

NOT_RECOGNISED = [
    "",
    "version 3 AVAILABLE after 120 s (deadline)",
    RETRIER + "Loading servable: {name: m version: 11} failed: DATA_LOSS: Can't parse "
    "/models/m/11/saved_model.pb as binary proto",
    "NOT_FOUND: Could not find meta graph def matching supplied tags: { serve }.",
    "RESOURCE_EXHAUSTED: Server Threadpool Exhausted",  # gRPC's thread quota, not the GPU
    "RESOURCE_EXHAUSTED: OOM when allocating tensor with shape[1000000000] and type float on "
    "/job:localhost/replica:0/task:0/device:CPU:0 by allocator cpu",
    "I tensorflow_serving/servables/tensorflow/saved_model_warmup_util.cc:97] Starting to read "
    "warmup data for model at /models/m/1/assets.extra/tf_serving_warmup_requests",
]


@pytest.mark.parametrize(("kind", "message", "word"), REAL_MESSAGES,
                         ids=[f"{k.value}-{i}" for i, (k, _, _) in enumerate(REAL_MESSAGES)])
def test_real_server_messages_are_recognised_with_cause_fix_and_evidence(
        kind: Kind, message: str, word: str) -> None:
    found = diagnose(message)
    assert found is not None and found.kind == kind
    assert found.cause and word in found.fix
    assert found.evidence and found.evidence.strip("…") in message
    assert "\n" not in found.evidence


@pytest.mark.parametrize("message", NOT_RECOGNISED)
def test_other_failures_are_not_diagnosed(message: str) -> None:
    assert diagnose(message) is None


def test_every_pattern_names_its_source_file() -> None:
    for pattern in PATTERNS:
        assert pattern.source.split()[0].endswith(".cc"), pattern


def test_the_op_is_named_and_python_ops_get_their_own_fix() -> None:
    python = diagnose(REAL_MESSAGES[6][1])
    custom = diagnose(REAL_MESSAGES[4][1], ServerFacts(image="registry:5000/tfs:2.21.0"))
    assert python is not None and custom is not None
    assert "'EagerPyFunc'" in python.cause and "tf.py_function" in python.cause
    assert "without tf.py_function" in python.fix
    assert "'ZeroOut'" in custom.cause and "registry:5000/tfs:2.21.0" in custom.cause
    assert "without 'ZeroOut'" in custom.fix and "custom_op.md" in custom.fix


def test_a_newer_model_names_both_versions_and_the_hosts_vars() -> None:
    found = diagnose(REAL_MESSAGES[8][1], ServerFacts(
        image="tensorflow/serving:2.21.0-gpu", tfserving_version="2.21.0"))
    assert found is not None
    assert "consumer version 3474" in found.cause and "TensorFlow 2.21.0" in found.cause
    assert "reads up to 2474" in found.cause
    assert "(now tensorflow/serving:2.21.0-gpu / 2.21.0)" in found.fix
    assert "TensorFlow 2.21.0 or older" in found.fix


def test_gpu_memory_fix_shows_the_reservation_when_known() -> None:
    found = diagnose(REAL_MESSAGES[11][1], ServerFacts(gpu_fraction=0.038, gpu_mib=16384,
                                                        memory_mib=512))
    assert found is not None
    assert "fraction 0.038 of 16384 MiB = 623 MiB, sized from memory_mib 512" in found.cause
    assert "fewer instances" in found.fix


def test_the_variable_is_named() -> None:
    found = diagnose(REAL_MESSAGES[0][1])
    assert found is not None and "'sequential/dense_2/kernel'" in found.cause
    assert "tensorflow/tensorflow#72963" in found.cause


def test_what_the_gate_saw_comes_before_the_log_and_the_earliest_pattern_wins() -> None:
    text = ("END: INVALID_ARGUMENT: GraphDef min consumer version 9 above current version 8 for "
            "TensorFlow 2.21.0.  Please upgrade TensorFlow.\n"
            "W bfc_allocator.cc] failed to allocate 1.00G from device: CUDA_ERROR_OUT_OF_MEMORY")
    found = diagnose(text)
    assert found is not None and found.kind == Kind.MODEL_NEWER_THAN_SERVER
    assert found.evidence.startswith("END: INVALID_ARGUMENT: GraphDef")


def test_evidence_is_one_line_around_the_match() -> None:
    text = "first line\n" + "x" * 500 + " Op type not registered 'Foo' in binary running " + \
        "y" * 500 + "\nlast line"
    evidence = evidence_at(text, text.index("Op type"))
    assert evidence.startswith("…") and evidence.endswith("…")
    assert "Op type not registered 'Foo'" in evidence and len(evidence) <= 302
    assert evidence_at("a\n  short line  \nb", 4) == "short line"


def test_a_diagnosis_renders_for_people_and_machines() -> None:
    found = diagnose(REAL_MESSAGES[16][1])
    assert isinstance(found, Diagnosis)
    assert [line.split(":")[0] for line in found.lines()] == ["cause", "fix", "evidence"]
    assert found.as_dict() == {"kind": "warmup_file_unreadable", "cause": found.cause,
                               "fix": found.fix, "evidence": found.evidence}


# -- the signature gate ----------------------------------------------------------------------

def _sig(inputs: dict[str, Any], outputs: dict[str, Any]) -> dict[str, Any]:
    return {"inputs": inputs, "outputs": outputs}


FLOAT = ("DT_FLOAT", (-1, 1))
CONTRACT = _sig({"x": FLOAT}, {"y": FLOAT})
# what GetModelMetadata reports of half_plus_two_bad/12 (and the init op TF2 exports carry)
SERVED = {"serving_default": _sig({"z": FLOAT}, {"w": FLOAT}),
          "times_two": _sig({"x": FLOAT}, {"y": FLOAT}),
          "__saved_model_init_op": _sig({}, {"__saved_model_init_op": ("DT_INVALID", ())})}


def test_wrong_tensor_names_are_diagnosed_naming_the_models_signatures() -> None:
    found = diagnose_signature("serving_default", CONTRACT, SERVED,
                               ["inputs ['z'] != contract ['x']"])
    assert found.kind == Kind.SIGNATURE_MISMATCH
    assert "takes z DT_FLOAT [-1, 1] and returns w DT_FLOAT [-1, 1]" in found.cause
    assert "contract is x DT_FLOAT [-1, 1] -> y DT_FLOAT [-1, 1]" in found.cause
    assert "serving_default (z -> w); times_two (x -> y)" in found.fix
    assert "times_two has the contract's tensor names" in found.fix
    assert "__saved_model_init_op" not in found.fix
    assert found.evidence == "inputs ['z'] != contract ['x']"


def test_a_missing_signature_is_diagnosed_naming_the_ones_there() -> None:
    found = diagnose_signature("predict", CONTRACT, SERVED, ["no signature 'predict' served"])
    assert "no signature 'predict'" in found.cause
    assert found.fix.startswith("the model's signatures are serving_default (z -> w); "
                                "times_two (x -> y): set Signature(name=...)")
    assert "GetModelMetadata lists" in found.evidence
