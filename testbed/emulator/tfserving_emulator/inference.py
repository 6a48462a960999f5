"""Predict, Classify, Regress and MultiInference as Session::Run calls over SignatureDefs.

Each API is split in a pure "prepare" step (request + SignatureDef -> the tensor names to feed
and fetch) and a pure "result" step (fetched numpy arrays -> response proto); the servable runs
the Session call in between. Texts and checks follow:
- servables/tensorflow/predict_util.cc (signature lookup, VerifyRequestInputsSize, output
  filter) and tensorflow/cc/saved_model/util.cc GetInputValues (aliases, defaults, parsing);
- servables/tensorflow/classifier.cc, regressor.cc (signature checks, result shapes);
- servables/tensorflow/multi_inference.cc (one model, distinct signatures, one Session run);
- servables/tensorflow/util.cc InputToSerializedExampleTensor (Examples as a DT_STRING vector,
  context bytes prepended to each example) and MakeModelSpec.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence

import numpy as np
from google.protobuf import text_format
from tensorflow.core.framework import types_pb2
from tensorflow.core.protobuf import meta_graph_pb2
from tensorflow_serving.apis import (
    classification_pb2,
    inference_pb2,
    input_pb2,
    model_pb2,
    predict_pb2,
    regression_pb2,
)

from .status import Code, ServingError, failed_precondition, invalid_argument
from .tensors import ProtoError, fill_proto, tf_dtype, to_numpy

DEFAULT_SIGNATURE = "serving_default"
PREDICT_METHOD = "tensorflow/serving/predict"
CLASSIFY_METHOD = "tensorflow/serving/classify"
REGRESS_METHOD = "tensorflow/serving/regress"
CLASSIFY_INPUTS = "inputs"
CLASSIFY_CLASSES = "classes"
CLASSIFY_SCORES = "scores"
REGRESS_INPUTS = "inputs"
REGRESS_OUTPUTS = "outputs"

Signatures = Mapping[str, meta_graph_pb2.SignatureDef]


@dataclasses.dataclass(frozen=True)
class SessionCall:
    """One Session::Run: graph tensor names fed and fetched."""

    feeds: tuple[tuple[str, np.ndarray], ...]
    fetches: tuple[str, ...]


@dataclasses.dataclass(frozen=True)
class PredictPlan:
    """What a PredictRequest runs, and which alias each fetched tensor answers."""

    signature_name: str
    call: SessionCall
    aliases: tuple[str, ...]


def _keys(mapping: Mapping[str, object] | Sequence[str]) -> str:
    return ",".join(sorted(mapping))


def _signature_name(spec: model_pb2.ModelSpec) -> str:
    return spec.signature_name or DEFAULT_SIGNATURE


def make_model_spec(name: str, signature_name: str | None, version: int | None
                    ) -> model_pb2.ModelSpec:
    """util.cc MakeModelSpec: an empty signature name becomes serving_default."""
    spec = model_pb2.ModelSpec(name=name)
    if signature_name is not None:
        spec.signature_name = signature_name or DEFAULT_SIGNATURE
    if version is not None:
        spec.version.value = version
    return spec


# ------------------------------------------------------------------ Predict


def _verify_inputs_size(signature: meta_graph_pb2.SignatureDef, inputs: Mapping[str, object]
                        ) -> None:
    sent, wanted = len(inputs), len(signature.inputs)
    if sent > wanted or (sent < wanted and not signature.defaults):
        extra = sorted(set(inputs) - set(signature.inputs))
        missing = sorted(set(signature.inputs) - set(inputs))
        raise invalid_argument(
            f"input size does not match signature: {sent}!={wanted} len({{{_keys(inputs)}}}) "
            f"!= len({{{_keys(signature.inputs)}}}). Sent extra: {{{','.join(extra)}}}. "
            f"Missing but required: {{{','.join(missing)}}}.")


@dataclasses.dataclass(frozen=True)
class SignatureIndex:
    """A SignatureDef's aliases and tensor names, sorted once (proto maps are slow to walk)."""

    inputs: tuple[tuple[str, str], ...]
    outputs: dict[str, str]
    sorted_outputs: tuple[str, ...]
    has_defaults: bool

    @classmethod
    def of(cls, signature: meta_graph_pb2.SignatureDef) -> SignatureIndex:
        """Index one SignatureDef."""
        outputs = {alias: info.name for alias, info in signature.outputs.items()}
        return cls(inputs=tuple((a, signature.inputs[a].name) for a in sorted(signature.inputs)),
                   outputs=outputs, sorted_outputs=tuple(sorted(outputs)),
                   has_defaults=bool(signature.defaults))


def input_values(signature: meta_graph_pb2.SignatureDef, inputs: Mapping[str, object],
                 index: SignatureIndex | None = None) -> list[tuple[str, np.ndarray]]:
    """cc/saved_model/util.cc GetInputValues: feeds by tensor name, defaults filled in."""
    index = index or SignatureIndex.of(signature)
    feeds: list[tuple[str, np.ndarray]] = []
    seen = 0
    for alias, name in index.inputs:
        if alias in inputs:
            proto = inputs[alias]
            seen += 1
        elif index.has_defaults and alias in signature.defaults:
            proto = signature.defaults[alias]
        else:
            raise invalid_argument(
                f"Signature input alias: {alias}(feed name: {name}) not found in request "
                f"and no default value provided. Inputs expected to be in the request "
                f"{{{_keys(inputs)}}}, or default input alias set: "
                f"{_keys(signature.defaults)}")
        try:
            feeds.append((name, to_numpy(proto)))
        except ProtoError as exc:
            raise invalid_argument(f"tensor parsing error: {alias}") from exc
    if inputs and seen != len(inputs):
        used = sorted(a for a, _ in index.inputs if a in inputs)
        raise invalid_argument(
            f"Inputs contains invalid name. Used request inputs: {','.join(used)}, "
            f"request input: {_keys(inputs)}")
    return feeds


def prepare_predict(signatures: Signatures, request: predict_pb2.PredictRequest, *,
                    method_check: bool,
                    indexes: Mapping[str, SignatureIndex] | None = None) -> PredictPlan:
    """predict_util.cc RunPredict up to Session::Run."""
    name = request.model_spec.signature_name or DEFAULT_SIGNATURE
    signature = signatures.get(name)
    if signature is None:
        raise failed_precondition(f'Serving signature key "{name}" not found.')
    index = indexes[name] if indexes is not None else SignatureIndex.of(signature)
    if method_check and signature.method_name not in (PREDICT_METHOD, CLASSIFY_METHOD,
                                                       REGRESS_METHOD):
        raise ServingError(Code.INTERNAL, "Expected prediction signature method_name to be one "
                           f"of {{{PREDICT_METHOD}, {CLASSIFY_METHOD}, {REGRESS_METHOD}}}. "
                           f"Was: {signature.method_name}")
    inputs = request.inputs
    if len(inputs) != len(index.inputs):
        _verify_inputs_size(signature, inputs)
    feeds = input_values(signature, inputs, index)
    aliases: list[str] = []
    for alias in request.output_filter:
        if alias not in index.outputs:
            raise invalid_argument(
                f"output tensor alias not found in signature: {alias} Outputs expected to be "
                f"in the set {{{','.join(index.sorted_outputs)}}}.")
        if alias in aliases:
            raise invalid_argument(f"duplicate output tensor alias: {alias}")
        aliases.append(alias)
    chosen = tuple(aliases) if aliases else index.sorted_outputs
    fetches = tuple(index.outputs[a] for a in chosen)
    return PredictPlan(name, SessionCall(tuple(feeds), fetches), chosen)


def predict_response(plan: PredictPlan, outputs: Sequence[np.ndarray], model: str,
                     version: int | None, *, tensor_content: bool
                     ) -> predict_pb2.PredictResponse:
    """PostProcessPredictionResult plus the response model_spec."""
    response = predict_pb2.PredictResponse()
    spec = response.model_spec
    spec.name = model
    spec.signature_name = plan.signature_name
    if version is not None:
        spec.version.value = version
    for alias, value in zip(plan.aliases, outputs, strict=True):
        fill_proto(response.outputs[alias], value, as_content=tensor_content)
    return response


# ------------------------------------------------------------------ Examples


def serialized_examples(request_input: input_pb2.Input) -> np.ndarray:
    """InputToSerializedExampleTensor: a [N] DT_STRING tensor of serialized Examples."""
    kind = request_input.WhichOneof("kind")
    if kind == "example_list":
        values = [e.SerializeToString() for e in request_input.example_list.examples]
    elif kind == "example_list_with_context":
        listed = request_input.example_list_with_context
        context = listed.context.SerializeToString()
        values = [context + e.SerializeToString() for e in listed.examples]
    else:
        values = []
    if not values:
        raise invalid_argument("Input is empty.")
    array = np.empty(len(values), dtype=object)
    array[:] = values
    return array


def _debug(signature: meta_graph_pb2.SignatureDef) -> str:
    return str(text_format.MessageToString(signature))


# ------------------------------------------------------------------ Classify


def classification_tensors(signature: meta_graph_pb2.SignatureDef, *, method_check: bool
                           ) -> tuple[str, tuple[str, ...]]:
    """classifier.cc PreProcessClassification: (input tensor name, output tensor names)."""
    if method_check and signature.method_name != CLASSIFY_METHOD:
        raise invalid_argument(f"Expected classification signature method_name to be "
                               f"{CLASSIFY_METHOD}. Was: {signature.method_name}")
    if len(signature.inputs) != 1:
        raise invalid_argument("Expected one input Tensor.")
    if len(signature.outputs) not in (1, 2):
        raise invalid_argument(
            f"Expected one or two output Tensors, found {len(signature.outputs)}")
    if CLASSIFY_INPUTS not in signature.inputs:
        raise invalid_argument(
            f"No classification inputs found in SignatureDef: {_debug(signature)}")
    outputs = tuple(signature.outputs[k].name for k in (CLASSIFY_CLASSES, CLASSIFY_SCORES)
                    if k in signature.outputs)
    if not outputs:
        raise invalid_argument(
            'Expected classification signature outputs to contain at least one of "classes" '
            f'or "scores". Signature was: {_debug(signature)}')
    return signature.inputs[CLASSIFY_INPUTS].name, outputs


def classify_signature(signatures: Signatures, spec: model_pb2.ModelSpec, *,
                       method_check: bool) -> meta_graph_pb2.SignatureDef:
    """GetClassificationSignatureDef."""
    name = _signature_name(spec)
    signature = signatures.get(name)
    if signature is None:
        raise invalid_argument(f"No signature was found with the name: {name}")
    classification_tensors(signature, method_check=method_check)
    return signature


def _shape_text(array: np.ndarray) -> str:
    return "[" + ",".join(str(d) for d in array.shape) + "]"


def _check_matrix(array: np.ndarray, what: str, dtype: str, examples: int) -> None:
    if array.ndim != 2:
        raise invalid_argument(f"Expected Tensor shape: [batch_size num_classes] but got "
                               f"{_shape_text(array)}")
    is_string = array.dtype == object or array.dtype.kind in ("S", "U")
    if (dtype == "DT_STRING") != is_string or (dtype == "DT_FLOAT"
                                               and array.dtype != np.float32):
        raise invalid_argument(f"Expected {what} Tensor of {dtype}. Got: "
                               f"{types_pb2.DataType.Name(tf_dtype(array))}")
    if array.shape[0] != examples:
        raise invalid_argument(f"Expected {what} output batch size of {examples}. Got: "
                               f"{array.shape[0]}")


def classification_result(signature: meta_graph_pb2.SignatureDef, examples: int,
                          fetches: Sequence[str], outputs: Sequence[np.ndarray]
                          ) -> classification_pb2.ClassificationResult:
    """classifier.cc PostProcessClassificationResult."""
    by_name = dict(zip(fetches, outputs, strict=True))
    classes = by_name.get(signature.outputs[CLASSIFY_CLASSES].name) \
        if CLASSIFY_CLASSES in signature.outputs else None
    scores = by_name.get(signature.outputs[CLASSIFY_SCORES].name) \
        if CLASSIFY_SCORES in signature.outputs else None
    if classes is not None:
        _check_matrix(classes, "classes", "DT_STRING", examples)
    if scores is not None:
        _check_matrix(scores, "scores", "DT_FLOAT", examples)
    if classes is not None and scores is not None and classes.shape[1] != scores.shape[1]:
        raise invalid_argument("Tensors class and score should match in dim_size(1). Got "
                               f"{classes.shape[1]} vs. {scores.shape[1]}")
    width = (classes if classes is not None else scores).shape[1]  # type: ignore[union-attr]
    result = classification_pb2.ClassificationResult()
    for row in range(examples):
        entry = result.classifications.add()
        for column in range(width):
            item = entry.classes.add()
            if classes is not None:
                label = classes[row, column]
                item.label = label.decode("utf-8", errors="replace") \
                    if isinstance(label, bytes) else str(label)
            if scores is not None:
                item.score = float(scores[row, column])
    return result


# ------------------------------------------------------------------ Regress


def regression_tensors(signature: meta_graph_pb2.SignatureDef, *, method_check: bool
                       ) -> tuple[str, tuple[str, ...]]:
    """regressor.cc PreProcessRegression: (input tensor name, output tensor names)."""
    if method_check and signature.method_name != REGRESS_METHOD:
        raise invalid_argument(f"Expected regression signature method_name to be "
                               f"{REGRESS_METHOD}. Was: {signature.method_name}")
    if len(signature.inputs) != 1:
        raise invalid_argument("Expected one input Tensor.")
    if len(signature.outputs) != 1:
        raise invalid_argument("Expected one output Tensor.")
    if REGRESS_INPUTS not in signature.inputs:
        raise invalid_argument(f"No regression inputs found in SignatureDef: {_debug(signature)}")
    if REGRESS_OUTPUTS not in signature.outputs:
        raise invalid_argument(
            f"No regression outputs found in SignatureDef: {_debug(signature)}")
    return signature.inputs[REGRESS_INPUTS].name, (signature.outputs[REGRESS_OUTPUTS].name,)


def regress_signature(signatures: Signatures, spec: model_pb2.ModelSpec, *,
                      method_check: bool) -> meta_graph_pb2.SignatureDef:
    """GetRegressionSignatureDef."""
    name = _signature_name(spec)
    signature = signatures.get(name)
    if signature is None:
        raise invalid_argument(f"No signature was found with the name: {name}")
    regression_tensors(signature, method_check=method_check)
    return signature


def regression_result(signature: meta_graph_pb2.SignatureDef, examples: int,
                      fetches: Sequence[str], outputs: Sequence[np.ndarray]
                      ) -> regression_pb2.RegressionResult:
    """regressor.cc PostProcessRegressionResult."""
    name = signature.outputs[REGRESS_OUTPUTS].name
    value = dict(zip(fetches, outputs, strict=True)).get(name)
    if value is None:
        raise invalid_argument(f"Could not find output tensor '{name}'")
    if not (value.ndim == 1 or (value.ndim == 2 and value.shape[1] == 1)):
        raise invalid_argument("Expected output Tensor shape to be either [batch_size] or "
                               f"[batch_size, 1] but got {_shape_text(value)}")
    if value.shape[0] != examples:
        raise invalid_argument("Input batch size did not match output batch size: "
                               f"{examples} vs. {value.shape[0]}")
    if value.dtype != np.float32:
        raise invalid_argument("Expected output Tensor of DT_FLOAT.  Got: "
                               f"{types_pb2.DataType.Name(tf_dtype(value))}")
    result = regression_pb2.RegressionResult()
    for item in value.ravel()[:examples]:
        result.regressions.add(value=float(item))
    return result


# ------------------------------------------------------------------ MultiInference


@dataclasses.dataclass(frozen=True)
class MultiPlan:
    """One Session run for every task, and how to read each task's result."""

    model: str
    call: SessionCall
    tasks: tuple[tuple[inference_pb2.InferenceTask, meta_graph_pb2.SignatureDef], ...]


def prepare_multi(signatures: Signatures, request: inference_pb2.MultiInferenceRequest, *,
                  method_check: bool) -> MultiPlan:
    """multi_inference.cc Infer up to the Session run."""
    model = ""
    seen: set[str] = set()
    inputs: set[str] = set()
    outputs: set[str] = set()
    tasks = []
    for task in request.tasks:
        if not task.model_spec.name:
            raise invalid_argument("Found ModelSpec with an empty model name.")
        if model and model != task.model_spec.name:
            raise invalid_argument("All ModelSpecs in a MultiInferenceRequest must access the "
                                   "same model name.")
        model = task.model_spec.name
        name = _signature_name(task.model_spec)
        if name in seen:
            raise invalid_argument(f"Duplicate evaluation of signature: {name}")
        seen.add(name)
        signature = signatures.get(name)
        if signature is None:
            raise invalid_argument(f"Requested signature not found in model graph: {name}")
        if task.method_name == CLASSIFY_METHOD:
            feed, fetches = classification_tensors(signature, method_check=method_check)
        elif task.method_name == REGRESS_METHOD:
            feed, fetches = regression_tensors(signature, method_check=method_check)
        else:
            raise ServingError(Code.UNIMPLEMENTED,
                               f"Unsupported signature method_name: {task.method_name}")
        inputs.add(feed)
        outputs.update(fetches)
        tasks.append((task, signature))
    examples = serialized_examples(request.input)
    call = SessionCall(tuple((name, examples) for name in sorted(inputs)),
                       tuple(sorted(outputs)))
    return MultiPlan(model, call, tuple(tasks))


def multi_response(plan: MultiPlan, examples: int, outputs: Sequence[np.ndarray],
                   version: int | None) -> inference_pb2.MultiInferenceResponse:
    """multi_inference.cc Infer after the Session run."""
    response = inference_pb2.MultiInferenceResponse()
    for task, signature in plan.tasks:
        entry = response.results.add()
        if task.method_name == CLASSIFY_METHOD:
            entry.classification_result.CopyFrom(
                classification_result(signature, examples, plan.call.fetches, outputs))
        else:
            entry.regression_result.CopyFrom(
                regression_result(signature, examples, plan.call.fetches, outputs))
        entry.model_spec.CopyFrom(make_model_spec(task.model_spec.name,
                                                  task.model_spec.signature_name, version))
    return response
