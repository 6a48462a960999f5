"""The small models: ``half_plus_two`` (good), ``half_plus_two_bad`` and ``half_plus_two_tf1``.

Every version computes ``y = 0.5 * x + b`` with ``b = version + 1`` (so version 1 gives
``0.5x + 2``, version 2 ``0.5x + 3``, ...), which lets a test tell versions apart by output.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import numpy as np

from testbed.models import savedmodel
from testbed.models.spec import VersionSpec

GOOD = "half_plus_two"
BAD = "half_plus_two_bad"
TF1 = "half_plus_two_tf1"

WARMUP_RECORDS = 10
SLOW_WARMUP_RECORDS = 1000  # TFServing's limit: one more and the version fails to load
SLOW_MATRIX = 512  # heavy signature: HEAVY_STEPS chained [512,512] matmuls per request
SLOW_STEPS = 30  # tuned for ~20-40 s of warmup on a 2-core machine (see docs/models.md)
TOO_LARGE_MIB = 20000  # declared simulated-GPU footprint of version 15 (a T4 has 16384)
CANARY_B = 3.0  # versions 16, 17 and 21 answer as good version 2 does (where they are right)
SLOWER_MS = 40  # version 16: this much slower per request than version 2, same answers
# version 21: slower by far more than a busy machine's latency noise (a test judging latency
# beside other tests: a good release's P99 stays well under it, the slow one's never does)
MUCH_SLOWER_MS = 300
DIFFERENT_ABOVE = 100.0  # version 17: wrong (by +1) for inputs above this, right below
# versions 22, 23, 24: a baseline slow enough that a relative change is a few ms, and its
# releases 25 % and 5 % slower per request (benchmarks/bench_canary.py: the canary judge's
# rates on a busy machine); the sleep is in the graph, so the 25 % is the server's own time
BASELINE_MS, SLOWER_25_MS, SLOWER_5_MS = 40, 50, 42

_SOURCES = (Path(__file__), Path(savedmodel.__file__), Path(__file__).with_name("spec.py"))
_GOLDEN_X = [[1.0], [2.0], [5.0]]


def intercept(version: int) -> float:
    """Return ``b`` in ``y = 0.5 * x + b`` for a version: ``version + 1``."""
    return float(version + 1)


def _x_tensor(values: list[list[float]], name: str = "x") -> dict[str, Any]:
    """Return a catalog input mapping for a float32 [-1, 1] input."""
    return {name: savedmodel.encode_array(np.asarray(values, dtype=np.float32))}


def _examples(in_name: str = "x", times_two: bool = True) -> tuple[dict[str, Any], ...]:
    """Golden request templates for the half_plus_two contract (outputs computed later)."""
    tol = {"rtol": 1e-6, "atol": 1e-6}
    examples = [{"signature": "serving_default", "inputs": _x_tensor(_GOLDEN_X, in_name), **tol}]
    if times_two:
        examples.append({"signature": "times_two", "inputs": _x_tensor(_GOLDEN_X), **tol})
    return tuple(examples)


def _warmup_records(model: str, signature: str, count: int, in_name: str = "x") -> list[bytes]:
    """Predict requests for warmup: record i sends ``x = [[i]]`` to ``signature``."""
    return [
        savedmodel.predict_log(model, signature, {in_name: np.array([[float(i)]], np.float32)})
        for i in range(count)
    ]


def save_tf2(
    path: Path, b: float, in_name: str = "x", out_name: str = "y", heavy_steps: int = 0
) -> None:
    """Save a TF2 ``tf.Module`` with ``serving_default`` (in_name -> 0.5*in + b), ``times_two``
    (x -> 2x) and, when ``heavy_steps`` > 0, ``heavy`` (x -> y plus a matmul-chain checksum)."""
    import tensorflow as tf

    module = tf.Module()
    module.a = tf.Variable(0.5, name="a")
    module.b = tf.Variable(b, name="b")
    spec_in = tf.TensorSpec([None, 1], tf.float32, name=in_name)
    spec_x = tf.TensorSpec([None, 1], tf.float32, name="x")

    def serve(t: tf.Tensor) -> dict[str, tf.Tensor]:
        return {out_name: module.a * t + module.b}

    def times_two(x: tf.Tensor) -> dict[str, tf.Tensor]:
        return {"y": 2.0 * x}

    signatures = {
        "serving_default": tf.function(serve, input_signature=[spec_in]),
        "times_two": tf.function(times_two, input_signature=[spec_x]),
    }
    if heavy_steps:
        module.w = tf.Variable(
            tf.random.stateless_normal([SLOW_MATRIX, SLOW_MATRIX], seed=[13, 13])
            / SLOW_MATRIX**0.5,
            name="w",
        )
        module.steps = tf.Variable(heavy_steps, name="steps")

        def heavy(x: tf.Tensor) -> dict[str, tf.Tensor]:
            h = tf.ones([SLOW_MATRIX, SLOW_MATRIX]) * tf.reduce_mean(x)
            for _ in tf.range(module.steps):
                h = tf.tanh(tf.matmul(h, module.w))
            return {"y": module.a * x + module.b, "checksum": tf.zeros_like(x) + tf.reduce_sum(h)}

        signatures["heavy"] = tf.function(heavy, input_signature=[spec_x])
    tf.saved_model.save(module, str(path), signatures=signatures)


def save_tf1(path: Path, b: float) -> None:
    """Save a legacy TF1 ``SavedModelBuilder`` model (graph mode) with the same two signatures."""
    import tensorflow as tf

    v1 = tf.compat.v1
    with tf.Graph().as_default(), v1.Session() as sess:
        x = v1.placeholder(tf.float32, [None, 1], name="x")
        a = v1.Variable(0.5, name="a")
        bias = v1.Variable(b, name="b")
        y = tf.add(a * x, bias, name="y")
        doubled = tf.multiply(x, 2.0, name="times_two")
        sess.run(v1.global_variables_initializer())
        builder = v1.saved_model.Builder(str(path))
        builder.add_meta_graph_and_variables(
            sess,
            [v1.saved_model.tag_constants.SERVING],
            signature_def_map={
                "serving_default": v1.saved_model.predict_signature_def({"x": x}, {"y": y}),
                "times_two": v1.saved_model.predict_signature_def({"x": x}, {"y": doubled}),
            },
        )
        builder.save()


def _build_good(model: str, version: int) -> VersionSpec:
    """A good TF2 version: serving_default + times_two, 10 warmup records."""

    def build(path: Path) -> dict[str, Any]:
        save_tf2(path, intercept(version))
        savedmodel.write_warmup(path, _warmup_records(model, "serving_default", WARMUP_RECORDS))
        return {"warmup_records": WARMUP_RECORDS}

    return VersionSpec(
        model=model,
        version=version,
        summary=f"good: y = 0.5*x + {intercept(version):g}",
        recipe={"kind": "tf2", "b": intercept(version), "warmup": WARMUP_RECORDS},
        build=build,
        source_files=_SOURCES,
        examples=_examples(),
    )


def _build_corrupt(version: int) -> VersionSpec:
    """Version 11: a complete TF2 model whose saved_model.pb is truncated and padded with junk."""

    def build(path: Path) -> dict[str, Any]:
        save_tf2(path, intercept(version))
        savedmodel.write_warmup(path, _warmup_records(BAD, "serving_default", WARMUP_RECORDS))
        pb = path / "saved_model.pb"
        data = pb.read_bytes()
        pb.write_bytes(data[: len(data) // 3] + b"\xff" * 64 + b"not a SavedModel\n")
        _assert_unparsable(pb)
        return {"warmup_records": WARMUP_RECORDS}

    return VersionSpec(
        model=BAD,
        version=version,
        summary="corrupt SavedModel: saved_model.pb truncated to a third plus garbage",
        recipe={"kind": "corrupt", "b": intercept(version)},
        build=build,
        source_files=_SOURCES,
        expect={"state": "END", "error_code": "DATA_LOSS", "why": "saved_model.pb does not parse"},
        honours_contract=False,
    )


def _assert_unparsable(pb: Path) -> None:
    """Raise if ``pb`` still parses as a SavedModel proto (the corruption must be real)."""
    from google.protobuf.message import DecodeError
    from tensorflow.core.protobuf import saved_model_pb2

    try:
        saved_model_pb2.SavedModel().ParseFromString(pb.read_bytes())
    except DecodeError:
        return
    raise RuntimeError(f"{pb} still parses after corruption")


def _build_wrong_signature(version: int) -> VersionSpec:
    """Version 12: loads and serves, but serving_default takes ``z`` and returns ``w``."""

    def build(path: Path) -> dict[str, Any]:
        save_tf2(path, intercept(version), in_name="z", out_name="w")
        records = _warmup_records(BAD, "serving_default", WARMUP_RECORDS, in_name="z")
        savedmodel.write_warmup(path, records)
        return {"warmup_records": WARMUP_RECORDS}

    return VersionSpec(
        model=BAD,
        version=version,
        summary="wrong signature: serving_default input z, output w (0.5*z + 13)",
        recipe={"kind": "wrong_signature", "b": intercept(version), "warmup": WARMUP_RECORDS},
        build=build,
        source_files=_SOURCES,
        examples=_examples(in_name="z"),
        expect={"state": "AVAILABLE", "why": "loads fine; a signature gate must reject it"},
        honours_contract=False,
    )


def _build_slow(version: int) -> VersionSpec:
    """Version 13: 1000 warmup records on the ``heavy`` signature (a matmul chain each)."""

    def build(path: Path) -> dict[str, Any]:
        save_tf2(path, intercept(version), heavy_steps=SLOW_STEPS)
        records = _warmup_records(BAD, "heavy", SLOW_WARMUP_RECORDS)
        savedmodel.write_warmup(path, records)
        return {
            "warmup_records": SLOW_WARMUP_RECORDS,
            "warmup_seconds_estimate": round(estimate_warmup_seconds(path), 1),
        }

    return VersionSpec(
        model=BAD,
        version=version,
        summary=(
            f"slow load: {SLOW_WARMUP_RECORDS} warmup records on signature heavy, "
            f"{SLOW_STEPS} chained {SLOW_MATRIX}x{SLOW_MATRIX} matmuls each"
        ),
        recipe={
            "kind": "slow",
            "b": intercept(version),
            "steps": SLOW_STEPS,
            "matrix": SLOW_MATRIX,
            "warmup": SLOW_WARMUP_RECORDS,
        },
        build=build,
        source_files=_SOURCES,
        examples=_examples(),
        expect={"state": "AVAILABLE", "why": "AVAILABLE only after a long warmup"},
        check_records=20,  # every record runs the same heavy graph: 20 prove it runs
    )


def estimate_warmup_seconds(path: Path, sample: int = 30) -> float:
    """Time ``sample`` warmup requests through TensorFlow and scale to the whole file."""
    import tensorflow as tf

    logs = savedmodel.read_warmup(path)
    fn = tf.saved_model.load(str(path)).signatures["heavy"]
    x = tf.make_ndarray(logs[1].predict_log.request.inputs["x"])
    fn(x=tf.constant(x))  # trace/initialise outside the timing
    start = time.perf_counter()
    for _ in range(sample):
        fn(x=tf.constant(x))
    return (time.perf_counter() - start) / sample * len(logs)


def _build_failing_warmup(version: int) -> VersionSpec:
    """Version 14: a good model whose warmup file is plain text, not a TFRecord."""

    def build(path: Path) -> dict[str, Any]:
        save_tf2(path, intercept(version))
        warmup = path / savedmodel.WARMUP_RELPATH
        warmup.parent.mkdir(parents=True, exist_ok=True)
        warmup.write_bytes(b"this warmup file is plain text, not a TFRecord of PredictionLog\n")
        return {"warmup_records": None}

    return VersionSpec(
        model=BAD,
        version=version,
        summary="failing warmup: tf_serving_warmup_requests is not a TFRecord file",
        recipe={"kind": "failing_warmup", "b": intercept(version)},
        build=build,
        source_files=_SOURCES,
        examples=_examples(),
        expect={
            "state": "END",
            "error_code": "DATA_LOSS",
            "why": "warmup file: corrupted record at 0 (not TFRecord format)",
        },
    )


def _build_too_large(version: int) -> VersionSpec:
    """Version 15: a good model declaring a 20000 MiB footprint on the simulated GPU."""

    def build(path: Path) -> dict[str, Any]:
        save_tf2(path, intercept(version))
        savedmodel.write_warmup(path, _warmup_records(BAD, "serving_default", WARMUP_RECORDS))
        simgpu = path / savedmodel.SIMGPU_RELPATH
        simgpu.write_text(json.dumps({"memory_mib": TOO_LARGE_MIB}) + "\n")
        return {"warmup_records": WARMUP_RECORDS, "simgpu_memory_mib": TOO_LARGE_MIB}

    return VersionSpec(
        model=BAD,
        version=version,
        summary=f"too large for the GPU: assets.extra/simgpu.json memory_mib {TOO_LARGE_MIB}",
        recipe={"kind": "too_large", "b": intercept(version), "mib": TOO_LARGE_MIB},
        build=build,
        source_files=_SOURCES,
        examples=_examples(),
        expect={
            "state": "END",
            "error_code": "RESOURCE_EXHAUSTED",
            "why": "does not fit the server's simulated-GPU reservation (GPU hosts only)",
        },
    )


def save_canary_variant(path: Path, *, sleep_ms: int = 0, wrong_above: float | None = None
                        ) -> None:
    """A version answering as good version 2 does (y = 0.5*x + 3) but slower by ``sleep_ms``
    per request (an in-graph tf.data sleep: no CPU cost), or off by one for inputs above
    ``wrong_above``: each is right on the golden requests (small inputs)."""
    import tensorflow as tf
    from tensorflow.python.data.experimental.ops import testing

    module = tf.Module()
    module.a = tf.Variable(0.5, name="a")
    module.b = tf.Variable(CANARY_B, name="b")
    spec = [tf.TensorSpec([None, 1], tf.float32, name="x")]

    def serve(x: tf.Tensor) -> dict[str, tf.Tensor]:
        y = module.a * x + module.b
        if wrong_above is not None:
            y = y + tf.cast(x > wrong_above, tf.float32)
        if sleep_ms:
            y = tf.data.Dataset.from_tensors(y).apply(
                testing.sleep(sleep_ms * 1000)).get_single_element()
        return {"y": y}

    def times_two(x: tf.Tensor) -> dict[str, tf.Tensor]:
        return {"y": 2.0 * x}

    tf.saved_model.save(module, str(path), signatures={
        "serving_default": tf.function(serve, input_signature=spec),
        "times_two": tf.function(times_two, input_signature=spec)})


def _build_canary_variant(version: int, *, sleep_ms: int = 0,
                          wrong_above: float | None = None) -> VersionSpec:
    """Versions 16 (slower), 21 (much slower) and 17 (different on large inputs): for the
    canary's analysis, latency alerts and the prediction comparison against good version 2;
    22, 23 and 24 (40, 50 and 42 ms per request): the canary judge's benchmark."""

    def build(path: Path) -> dict[str, Any]:
        save_canary_variant(path, sleep_ms=sleep_ms, wrong_above=wrong_above)
        savedmodel.write_warmup(path, _warmup_records(BAD, "serving_default", WARMUP_RECORDS))
        return {"warmup_records": WARMUP_RECORDS}

    what = (f"slower by {sleep_ms} ms per request" if sleep_ms else
            f"off by +1 for x > {wrong_above:g}")
    return VersionSpec(
        model=BAD,
        version=version,
        summary=f"canary test: answers as version 2 (y = 0.5*x + 3), {what}",
        recipe={"kind": "canary", "b": CANARY_B, "sleep_ms": sleep_ms,
                "wrong_above": wrong_above, "warmup": WARMUP_RECORDS},
        build=build,
        source_files=_SOURCES,
        examples=_examples(),
    )


def _build_tf1(version: int) -> VersionSpec:
    """``half_plus_two_tf1`` version 1: a legacy TF1-builder model, y = 0.5*x + 2."""

    def build(path: Path) -> dict[str, Any]:
        save_tf1(path, 2.0)
        savedmodel.write_warmup(path, _warmup_records(TF1, "serving_default", WARMUP_RECORDS))
        return {"warmup_records": WARMUP_RECORDS}

    return VersionSpec(
        model=TF1,
        version=version,
        summary="good, legacy format: TF1 SavedModelBuilder (graph mode), y = 0.5*x + 2",
        recipe={"kind": "tf1", "b": 2.0, "warmup": WARMUP_RECORDS},
        build=build,
        source_files=_SOURCES,
        examples=_examples(),
    )


def specs() -> list[VersionSpec]:
    """Every small-model version the generator makes."""
    return [
        *(_build_good(GOOD, v) for v in (1, 2, 3)),
        _build_corrupt(11),
        _build_wrong_signature(12),
        _build_slow(13),
        _build_failing_warmup(14),
        _build_too_large(15),
        _build_canary_variant(16, sleep_ms=SLOWER_MS),
        _build_canary_variant(17, wrong_above=DIFFERENT_ABOVE),
        _build_canary_variant(21, sleep_ms=MUCH_SLOWER_MS),
        _build_canary_variant(22, sleep_ms=BASELINE_MS),
        _build_canary_variant(23, sleep_ms=SLOWER_25_MS),
        _build_canary_variant(24, sleep_ms=SLOWER_5_MS),
        _build_tf1(1),
    ]
