"""Prediction comparison of the new slot against the old one, and the request corpus."""

from __future__ import annotations

import json
import math
import random
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tfsdeploy.core.canary.compare import (
    CorpusRequest,
    compare,
    golden_corpus,
    infer_kind,
    load_corpus,
    sample_corpus,
)
from tfsdeploy.core.errors import ConfigError
from tfsdeploy.core.inventory.canary_policy import (
    ComparisonPolicy,
    OutputRule,
    Verdict,
    validate_comparison,
)
from tfsdeploy.core.tfserving import api as tfsapi
from tfsdeploy.core.tfserving.golden import GoldenExample
from tfsdeploy.core.tfserving.tensors import Tensor, tensor
from tfsdeploy.core.tfserving.tfrecord import frame_record
from tfsdeploy.core.tfserving.warmup_records import WARMUP_RELATIVE
from tfsdeploy.loadtest.payloads import tensor_from_json

DEFAULT = ComparisonPolicy()
# ten requests of a 4x2 input: 0..7 row-major, plus the request's index
X = [[[2 * r + c + i for c in range(2)] for r in range(4)] for i in range(10)]


def half_plus_two(shift: float = 0.0) -> list[dict[str, Tensor]]:
    return [{"y": tensor([[v / 2 + 2 + shift for v in row] for row in x], "DT_FLOAT")}
            for x in X]


def changed(answer: Tensor, *, at: int | None = None, by: float) -> Tensor:
    """``answer`` with ``by`` added to its ``at``-th value (every value when None)."""
    return Tensor(answer.dtype, answer.shape, tuple(
        v + by if at is None or i == at else v for i, v in enumerate(answer.values)))


def softmax(row: list[float]) -> list[float]:
    top = max(row)
    exp = [math.exp(v - top) for v in row]
    return [e / sum(exp) for e in exp]


def classes(flip_rows: int = 0, seed: int = 0) -> list[dict[str, Tensor]]:
    """10 requests of 10 rows of 3 class probabilities; the first ``flip_rows`` rows of every
    request answer another class."""
    rng = random.Random(seed)
    answers = []
    for _ in range(10):
        rows = []
        for r in range(10):
            top = (r % 3 + 1) % 3 if r < flip_rows else r % 3
            rows.append(softmax([(3.0 if c == top else 0.0) + rng.gauss(0, 0.05)
                                 for c in range(3)]))
        answers.append({"probabilities": tensor(rows, "DT_FLOAT")})
    return answers


# -- regressors ------------------------------------------------------------------------------


def test_the_same_answers_pass() -> None:
    result = compare(half_plus_two(), half_plus_two(), half_plus_two(), DEFAULT)
    assert result.verdict is Verdict.PASS and result.reasons == ()
    (figure,) = result.outputs
    assert (figure.name, figure.kind, figure.compared, figure.differing) == \
        ("y", "regressor", 80, 0)


def test_regressor_drift_is_caught_with_the_worst_example() -> None:
    new = half_plus_two()
    new[3]["y"] = changed(new[3]["y"], at=2 * 2 + 1, by=0.5)  # y[2, 1]
    result = compare(half_plus_two(), new, half_plus_two(), DEFAULT,
                     sources=[f"golden #{i}" for i in range(10)])
    assert result.verdict is Verdict.FAIL
    (figure,) = result.outputs
    assert figure.differing == 1
    (worst,) = figure.worst
    assert (worst.request, worst.source, worst.position) == (3, "golden #3", (2, 1))
    assert (worst.old, worst.new, worst.difference) == (6.0, 6.5, 0.5)
    assert result.reasons == (
        "output 'y': 1 of 80 values differ beyond atol 1e-06 + rtol 1e-06 x |old| + noise 0; "
        "worst: request 3 (golden #3) y[2, 1]: old 6.0, new 6.5 (difference 0.5)",)


def test_noise_measured_old_vs_old_is_allowed_and_no_more() -> None:
    old, noise = half_plus_two(), half_plus_two(0.001)  # the old slot itself wanders 1e-3
    assert compare(old, half_plus_two(0.0005), noise, DEFAULT).verdict is Verdict.PASS
    drifted = compare(old, half_plus_two(0.003), noise, DEFAULT)
    assert drifted.verdict is Verdict.FAIL
    assert drifted.outputs[0].noise == pytest.approx(0.001, rel=1e-3)
    assert "80 of 80 values differ" in drifted.reasons[0]


def test_tolerances_and_allowed_share_come_from_the_policy() -> None:
    loose = ComparisonPolicy(outputs={"y": OutputRule(kind="regressor", atol=0.01)})
    assert compare(half_plus_two(), half_plus_two(0.005), half_plus_two(), loose).verdict \
        is Verdict.PASS
    new = half_plus_two()
    new[0]["y"] = changed(new[0]["y"], by=1)  # 8 of 80 values
    some = ComparisonPolicy(outputs={"y": OutputRule(kind="regressor",
                                                     max_mismatch_fraction=0.1)})
    assert compare(half_plus_two(), new, half_plus_two(), some).verdict is Verdict.PASS
    fewer = ComparisonPolicy(outputs={"y": OutputRule(kind="regressor",
                                                      max_mismatch_fraction=0.05)})
    failed = compare(half_plus_two(), new, half_plus_two(), fewer)
    assert "(more than the 5.00% allowed)" in failed.reasons[0]


def test_nan_against_a_number_differs_and_nan_against_nan_does_not() -> None:
    old = [{"y": tensor([1.0, math.nan], "DT_DOUBLE")}]
    assert compare(old, [{"y": tensor([1.0, math.nan], "DT_DOUBLE")}], old, DEFAULT).verdict \
        is Verdict.PASS
    result = compare(old, [{"y": tensor([math.nan, math.nan], "DT_DOUBLE")}], old, DEFAULT)
    assert result.outputs[0].differing == 1
    assert json.dumps(result.as_dict(), allow_nan=False)  # NaN is written as text


@settings(max_examples=50, deadline=None)
@given(st.floats(min_value=-1e6, max_value=1e6), st.floats(min_value=0, max_value=10),
       st.floats(min_value=0, max_value=1))
def test_a_value_differs_exactly_when_beyond_its_tolerance(old: float, diff: float,
                                                          noise: float) -> None:
    rule = ComparisonPolicy(outputs={"y": OutputRule(kind="regressor", atol=0.5, rtol=0.01)})
    def answer(value: float) -> list[dict[str, Tensor]]:
        return [{"y": tensor([value], "DT_DOUBLE")}]

    result = compare(answer(old), answer(old + diff), answer(old + noise), rule)
    measured_noise = abs((old + noise) - old)
    beyond = abs((old + diff) - old) > 0.5 + 0.01 * abs(old) + measured_noise
    assert (result.verdict is Verdict.FAIL) == beyond


# -- classifiers -----------------------------------------------------------------------------


def test_probabilities_that_keep_their_top_class_pass() -> None:
    result = compare(classes(seed=0), classes(seed=1), classes(seed=2), DEFAULT)
    assert result.outputs[0].kind == "classifier"
    assert result.verdict is Verdict.PASS


def test_a_classifier_whose_top_1_flips_on_part_of_the_inputs_is_caught() -> None:
    result = compare(classes(), classes(flip_rows=3, seed=1), classes(seed=2), DEFAULT)
    assert result.verdict is Verdict.FAIL
    figure = result.outputs[0]
    assert (figure.compared, figure.differing, figure.noise) == (100, 30, 1.0)
    assert figure.as_dict()["agreement"] == pytest.approx(0.7)
    assert result.reasons[0].startswith(
        "output 'probabilities': top-1 agreement new vs old 70.00% (30 of 100 rows changed "
        "class) < old vs old 100.00%; worst: request ")
    assert all(e.old != e.new and len(e.position) == 1 and e.position[0] < 3
               for e in figure.worst)


def test_agreement_is_judged_against_the_old_slot_s_own_agreement() -> None:
    # the old slot itself flips 2 rows in 10 (near ties): a new slot doing as much passes
    noisy = classes(flip_rows=2, seed=3)
    assert compare(classes(), classes(flip_rows=2, seed=4), noisy, DEFAULT).verdict \
        is Verdict.PASS
    worse = compare(classes(), classes(flip_rows=4, seed=4), noisy, DEFAULT)
    assert worse.verdict is Verdict.FAIL and "< old vs old 80.00%" in worse.reasons[0]
    drop = ComparisonPolicy(outputs={"probabilities": OutputRule(kind="classifier",
                                                                 max_agreement_drop=0.2)})
    assert compare(classes(), classes(flip_rows=4, seed=4), noisy, drop).verdict \
        is Verdict.PASS


def test_logits_named_classifier_are_judged_by_their_top_1() -> None:
    old = [{"logits": tensor([[3.0, 1.0], [0.0, 2.0]], "DT_DOUBLE")}]
    new = [{"logits": tensor([[5.0, 1.0], [0.0, 9.0]], "DT_DOUBLE")}]
    assert compare(old, new, old, DEFAULT).verdict is Verdict.FAIL  # inferred: regressor
    named = ComparisonPolicy(outputs={"logits": OutputRule(kind="classifier")})
    assert compare(old, new, old, named).verdict is Verdict.PASS
    scalar = [{"logits": tensor([[1.0], [2.0]], "DT_DOUBLE")}]
    refused = compare(scalar, scalar, scalar, named)
    assert "cannot be compared as a classifier" in refused.reasons[0]


# -- exact outputs, kinds, missing answers ---------------------------------------------------


def test_kinds_are_inferred_from_the_old_answers() -> None:
    assert infer_kind([tensor([1, 2], "DT_INT64")]) == "exact"
    assert infer_kind([tensor([True, False], "DT_BOOL")]) == "exact"
    assert infer_kind([tensor([b"cat"], "DT_STRING")]) == "exact"
    assert infer_kind([tensor([[0.2, 0.8], [0.5, 0.5]], "DT_FLOAT")]) == "classifier"
    assert infer_kind([tensor([[2.0, -1.0]], "DT_DOUBLE")]) == "regressor"  # logits
    assert infer_kind([tensor([[0.7], [0.1]], "DT_DOUBLE")]) == "regressor"  # one sigmoid score
    assert infer_kind([tensor([[0.2, 0.8]], "DT_DOUBLE"),
                       tensor([[0.2, 0.7]], "DT_DOUBLE")]) == "regressor"


def test_exact_outputs_must_be_equal_beyond_the_old_slot_s_own_changes() -> None:
    old = [{"classes": tensor([1, 2, 3, 4], "DT_INT64")},
           {"label": tensor([b"cat"], "DT_STRING")}]
    same = compare(old, old, old, DEFAULT)
    assert same.verdict is Verdict.PASS
    assert [f.kind for f in same.outputs] == ["exact", "exact"]
    new = [{"classes": tensor([1, 2, 0, 4], "DT_INT64")},
           {"label": tensor([b"dog"], "DT_STRING")}]
    result = compare(old, new, old, DEFAULT)
    assert result.verdict is Verdict.FAIL and len(result.reasons) == 2
    assert "request 1 (#1) label[0]: old cat, new dog" in result.reasons[1]
    assert json.dumps(result.as_dict(), allow_nan=False)


def test_text_outputs_cannot_be_regressors() -> None:
    old = [{"label": tensor([b"cat"], "DT_STRING")}]
    named = ComparisonPolicy(outputs={"label": OutputRule(kind="regressor")})
    assert "name it 'exact'" in compare(old, old, old, named).reasons[0]


def test_missing_or_reshaped_answers_fail() -> None:
    new = half_plus_two()
    del new[2]["y"]
    new[5]["y"] = Tensor("DT_FLOAT", (2, 4), new[5]["y"].values)
    result = compare(half_plus_two(), new, half_plus_two(), DEFAULT)
    assert result.verdict is Verdict.FAIL
    assert result.outputs[0].differing == 16
    assert "2 request(s) is missing or shaped differently (request 2 (#2): missing" \
        in result.reasons[0]


def test_an_output_the_policy_names_must_exist() -> None:
    named = ComparisonPolicy(outputs={"scores": OutputRule(kind="regressor")})
    result = compare(half_plus_two(), half_plus_two(), half_plus_two(), named)
    assert result.reasons == ("output 'scores' named in the comparison policy is in no answer "
                              "of the old slot (its outputs: y)",)


def test_nothing_compared_is_inconclusive_and_lengths_must_match() -> None:
    assert compare([], [], [], DEFAULT).verdict is Verdict.INCONCLUSIVE
    with pytest.raises(ValueError, match="pass one per request"):
        compare(half_plus_two(), half_plus_two()[:3], half_plus_two(), DEFAULT)


def test_policy_validation() -> None:
    assert validate_comparison(DEFAULT) == []
    bad = ComparisonPolicy(samples=0, corpus=" ", worst=-1, outputs={
        "y": OutputRule(kind="ranking", rtol=math.inf,  # type: ignore[arg-type]
                        max_agreement_drop=2.0)})
    fields = [p.field for p in validate_comparison(bad, field="models.m.rollout.canary."
                                                              "comparison")]
    prefix = "models.m.rollout.canary.comparison."
    assert fields == [prefix + name for name in (
        "samples", "corpus", "worst", "outputs.y.kind", "outputs.y.rtol",
        "outputs.y.max_agreement_drop")]


# -- the request corpus ----------------------------------------------------------------------


def test_json_lines_corpus(tmp_path: Path) -> None:
    path = tmp_path / "corpus.jsonl"
    path.write_text(
        '{"inputs": {"x": {"dtype": "DT_FLOAT", "shape": [2, 1], "values": [[1], [2]]}}}\n'
        "\n"
        '{"signature": "other", "inputs": {"x": {"dtype": "DT_INT64", "shape": [3], '
        '"fill": {"kind": "ramp", "modulus": 2, "scale": 1}}}}\n')
    first, second = load_corpus(path)
    assert (first.signature, first.source) == ("serving_default", "corpus.jsonl:1")
    assert first.inputs["x"] == tensor([[1.0], [2.0]], "DT_FLOAT")
    assert (second.signature, second.source) == ("other", "corpus.jsonl:3")
    assert second.inputs["x"] == tensor([0, 1, 0], "DT_INT64")


@pytest.mark.parametrize("line, words", [
    ("not json", "not a request: Expecting value"),
    ('{"x": 1}', 'expected an object with "inputs"'),
    ('{"inputs": {"x": {"shape": [1], "values": [1]}}}', "missing key 'dtype'"),
    ('{"inputs": {"x": {"dtype": "DT_FLOAT", "shape": [3], "values": [1]}}}',
     "do not fill shape [3]"),
])
def test_a_bad_json_line_is_located(tmp_path: Path, line: str, words: str) -> None:
    path = tmp_path / "c.jsonl"
    path.write_text('{"inputs": {"x": {"dtype": "DT_FLOAT", "shape": [1], "values": [1]}}}\n'
                    + line + "\n")
    with pytest.raises(ConfigError) as err:
        load_corpus(path)
    (problem,) = err.value.problems
    assert problem.file == f"{path}:2" and words in problem.message and problem.fix


def _warmup(path: Path, requests: list[Any]) -> None:
    log_class = tfsapi.message_class(tfsapi.PREDICTION_LOG)
    blob = b""
    for request in requests:
        log: Any = log_class()
        log.predict_log.request.CopyFrom(request)
        blob += frame_record(log.SerializeToString())
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(blob)


def _request(inputs: dict[str, Any], signature: str = "") -> Any:
    request: Any = tfsapi.new_message(tfsapi.PREDICT_REQUEST)
    request.model_spec.name = "m"
    request.model_spec.signature_name = signature
    for name, values in inputs.items():
        request.inputs[name].CopyFrom(tensor_from_json(name, values, {}))
    return request


def test_prediction_log_corpus(tmp_path: Path) -> None:
    _warmup(tmp_path / "1" / WARMUP_RELATIVE,
            [_request({"x": [[1.0], [2.0]]}), _request({"x": [[5.0]]}, "sig")])
    first, second = load_corpus(tmp_path / "1")  # a SavedModel directory: its warmup file
    assert (first.signature, first.source) == ("serving_default",
                                               "tf_serving_warmup_requests#0")
    assert first.inputs["x"] == tensor([[1.0], [2.0]], "DT_FLOAT")
    assert second.signature == "sig"
    assert len(load_corpus(tmp_path / "1" / WARMUP_RELATIVE)) == 2


def test_unreadable_prediction_logs_are_refused(tmp_path: Path) -> None:
    broken = tmp_path / "requests.tfrecord"
    broken.write_bytes(b"\x05" * 20)
    with pytest.raises(ConfigError, match="request corpus unreadable") as err:
        load_corpus(broken)
    assert err.value.problems[0].file == str(broken)
    text = tmp_path / "text.tfrecord"
    _warmup(text, [_request({"words": ["a", "b"]})])
    with pytest.raises(ConfigError, match="input 'words' is DT_STRING"):
        load_corpus(text)


def _corpus(count: int, prefix: str) -> list[CorpusRequest]:
    return [CorpusRequest("serving_default", {"x": tensor([float(i)], "DT_DOUBLE")}, f"{prefix}{i}")
            for i in range(count)]


def test_the_sample_is_bounded_golden_first_and_the_same_every_time() -> None:
    golden = golden_corpus([GoldenExample("serving_default", {"x": tensor([1.0], "DT_DOUBLE")},
                                          {}, 0, 0)])
    assert golden[0].source == "golden #0"
    corpus = _corpus(1000, "c")
    picked = sample_corpus(golden, corpus, limit=50, seed=7)
    assert len(picked) == 50 and picked[0] is golden[0]
    assert picked == sample_corpus(golden, corpus, limit=50, seed=7)
    assert picked != sample_corpus(golden, corpus, limit=50, seed=8)
    sources = [int(r.source[1:]) for r in picked[1:]]
    assert sources == sorted(sources) and len(set(sources)) == 49  # corpus order, no repeats
    assert sample_corpus(golden, corpus[:3], limit=50) == golden + corpus[:3]
    assert sample_corpus(_corpus(5, "g"), corpus, limit=2) == _corpus(2, "g")
