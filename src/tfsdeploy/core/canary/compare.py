"""Prediction comparison: the new slot's answers against the old slot's on the same requests,
beyond the old slot's own noise (pure, except ``load_corpus``, which reads the corpus file).

The caller sends every request of the corpus to the old slot twice and to the new slot once.
The old slot's two answers to the same request measure its noise (a server that batches
requests differently, or a GPU's non-deterministic reductions, answers the same request with
slightly different values): only what the new slot changes beyond that counts.

Each output is judged by its kind:

* regressor: an element differs when ``|new - old| > atol + rtol * |old| + noise``, the noise
  being the largest ``|old - old'|`` of that output; at most ``max_mismatch_fraction`` of the
  elements may differ.
* classifier: the top-1 class (argmax of the last axis) of each row; the new slot's agreement
  with the old one must be at least the old slot's agreement with itself minus
  ``max_agreement_drop``.
* exact: elements compared for equality; the new slot's share of unequal elements may exceed
  the old slot's own by at most ``max_mismatch_fraction``.

Kinds are named per output in the policy, or inferred from the old slot's answers: integer,
boolean and string outputs (class ids, counts, labels) are exact; float outputs whose last
axis has at least 2 entries and whose every row is a probability distribution (values in
[0, 1] summing to 1 within 1e-3: a softmax) are classifiers; every other float output
(scores, logits, regressions) is a regressor. Logits to be judged by their top-1 class must be
named ``classifier`` in the policy.

Request corpus: the golden requests, plus the file the policy names: a TFRecord of
``PredictionLog`` (a SavedModel's ``assets.extra/tf_serving_warmup_requests``, or the
SavedModel directory itself) or JSON lines (``.jsonl``, ``.ndjson``, ``.json``), one request a
line in the golden file's input format::

    {"signature": "serving_default",
     "inputs": {"x": {"dtype": "DT_FLOAT", "shape": [2, 1], "values": [[1.0], [2.0]]}}}
"""

from __future__ import annotations

import json
import math
import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeAlias

from tfsdeploy.core.errors import ConfigError, Problem
from tfsdeploy.core.inventory.canary_policy import (
    ComparisonPolicy,
    Kind,
    OutputRule,
    Verdict,
)
from tfsdeploy.core.tfserving import api as tfsapi
from tfsdeploy.core.tfserving.golden import GoldenExample, tensor_from_spec
from tfsdeploy.core.tfserving.tensors import STRING, Tensor
from tfsdeploy.core.tfserving.warmup_records import WarmupError, requests_from_warmup, warmup_file

JSON_LINES_SUFFIXES = frozenset({".jsonl", ".ndjson", ".json"})
Outputs: TypeAlias = Mapping[str, Tensor]


# -- the request corpus -----------------------------------------------------------------------


@dataclass(frozen=True)
class CorpusRequest:
    """One request to send to both slots, and where it comes from (for the report)."""

    signature: str
    inputs: Mapping[str, Tensor]
    source: str


def golden_corpus(examples: Sequence[GoldenExample]) -> list[CorpusRequest]:
    """The golden requests as corpus requests."""
    return [CorpusRequest(e.signature, e.inputs, f"golden #{i}") for i, e in enumerate(examples)]


def load_corpus(path: str | Path) -> list[CorpusRequest]:
    """The requests of a corpus file (JSON lines by suffix, else TFRecord of PredictionLog);
    a ConfigError naming the file, the line or record, and the fix when it cannot be read."""
    path = Path(path)
    if path.suffix.lower() in JSON_LINES_SUFFIXES:
        return _json_lines(path)
    try:
        requests: list[Any] = requests_from_warmup(path)
    except WarmupError as err:
        raise ConfigError(Problem(
            f"request corpus unreadable: {err}",
            "name a TFRecord of PredictionLog (as a SavedModel's warmup file) or a JSON-lines "
            "file ending in .jsonl", file=str(path))) from None
    name = warmup_file(path).name
    return [_from_predict_request(request, f"{name}#{index}", path)
            for index, request in enumerate(requests)]


def _json_lines(path: Path) -> list[CorpusRequest]:
    fix = ('write one request per line: {"signature": "serving_default", "inputs": {"x": '
           '{"dtype": "DT_FLOAT", "shape": [1, 1], "values": [[1.0]]}}}')
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as err:
        raise ConfigError(Problem(f"request corpus unreadable: {err}", fix,
                                  file=str(path))) from None
    requests = []
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            entry = json.loads(line)
            if not isinstance(entry, dict) or not isinstance(entry.get("inputs"), dict):
                raise ValueError('expected an object with "inputs": {name: tensor}')
            inputs = {str(k): tensor_from_spec(v) for k, v in entry["inputs"].items()}
        except (ValueError, KeyError, TypeError) as err:
            raise ConfigError(Problem(f"not a request: {_text(err)}", fix,
                                      file=f"{path}:{number}")) from None
        requests.append(CorpusRequest(str(entry.get("signature") or "serving_default"),
                                      inputs, f"{path.name}:{number}"))
    if not requests:
        raise ConfigError(Problem("the request corpus holds no request", fix, file=str(path)))
    return requests


def _text(err: BaseException) -> str:
    return f"missing key {err}" if isinstance(err, KeyError) else str(err)


def _from_predict_request(request: Any, source: str, path: Path) -> CorpusRequest:
    inputs = {}
    for name, tensor in request.inputs.items():
        try:
            inputs[str(name)] = tfsapi.tensor_from_proto(tensor)
            if inputs[str(name)].dtype == STRING:
                raise KeyError(STRING)
        except KeyError:
            dtype = tfsapi.dtype_name(int(tensor.dtype))
            raise ConfigError(Problem(
                f"{source}: input {name!r} is {dtype}; the comparison sends numeric inputs only",
                "use a corpus of numeric requests, or compare with the golden requests alone "
                "(corpus=None)", file=str(path))) from None
    signature = str(request.model_spec.signature_name or "serving_default")
    return CorpusRequest(signature, inputs, source)


def sample_corpus(golden: Sequence[CorpusRequest], corpus: Sequence[CorpusRequest], *,
                  limit: int, seed: int = 0) -> list[CorpusRequest]:
    """At most ``limit`` requests: the golden ones first, then a seeded sample of the corpus
    (in the corpus's order), the same on every host and every run."""
    chosen = list(golden[:limit])
    room = limit - len(chosen)
    if room <= 0 or not corpus:
        return chosen
    picked = sorted(random.Random(seed).sample(range(len(corpus)), min(room, len(corpus))))
    return chosen + [corpus[i] for i in picked]


# -- the comparison ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Example:
    """One differing value: which request and where, both answers and their difference."""

    request: int  # index in the corpus sent
    source: str  # where that request comes from
    output: str
    position: tuple[int, ...]  # element (regressor, exact) or row (classifier) in the output
    old: Any  # a number, a class index (classifier) or a string
    new: Any
    difference: float | None  # |new - old| (classifier: largest over the row); None: exact

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready example."""
        return {"request": self.request, "source": self.source, "output": self.output,
                "position": list(self.position), "old": _json_value(self.old),
                "new": _json_value(self.new), "difference": _json_value(self.difference)}

    def describe(self) -> str:
        """``request 3 (golden #3) y[1, 0]: old 3.5, new 4.5 (difference 1)``."""
        where = f"[{', '.join(map(str, self.position))}]" if self.position else ""
        diff = "" if self.difference is None else f" (difference {self.difference:.6g})"
        return (f"request {self.request} ({self.source}) {self.output}{where}: old "
                f"{_json_value(self.old)}, new {_json_value(self.new)}{diff}")


def _json_value(value: Any) -> Any:
    """Numbers as JSON allows them (NaN and infinities as text), bytes as text."""
    if isinstance(value, bytes):
        return value.decode("utf-8", errors="backslashreplace")
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    return value


@dataclass(frozen=True)
class OutputFigure:
    """One output's comparison: how many values (or rows) differ, against what noise."""

    name: str
    kind: Kind
    compared: int  # values (regressor, exact) or rows (classifier)
    differing: int  # beyond tolerance, top-1 changed, or unequal
    noise: float  # regressor: largest |old - old'|; classifier: old-vs-old top-1 agreement;
    # exact: old-vs-old share of unequal values
    ok: bool
    reason: str = ""
    worst: tuple[Example, ...] = ()

    @property
    def rate(self) -> float:
        """Differing over compared (0 when nothing was compared)."""
        return self.differing / self.compared if self.compared else 0.0

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready figure."""
        data: dict[str, Any] = {
            "name": self.name, "kind": self.kind, "compared": self.compared,
            "differing": self.differing, "rate": self.rate, "noise": _json_value(self.noise),
            "ok": self.ok, "reason": self.reason, "worst": [e.as_dict() for e in self.worst]}
        if self.kind == "classifier":
            data["agreement"] = 1.0 - self.rate
        return data

    def describe(self) -> str:
        """One line for people."""
        unit = "rows" if self.kind == "classifier" else "values"
        what = "changed top-1" if self.kind == "classifier" else "differ"
        return (f"{self.name} ({self.kind}): {self.differing} of {self.compared} {unit} {what}"
                f", noise {self.noise:.6g}" + ("" if self.ok else f": {self.reason}"))


@dataclass(frozen=True)
class Comparison:
    """The verdict over every output, each output's figure, and why it failed."""

    verdict: Verdict
    requests: int
    outputs: tuple[OutputFigure, ...]
    reasons: tuple[str, ...] = ()

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready comparison."""
        return {"verdict": str(self.verdict), "requests": self.requests,
                "reasons": list(self.reasons), "outputs": [o.as_dict() for o in self.outputs]}

    def describe(self) -> str:
        """One line: the verdict and the outputs that failed (or every output's figure)."""
        if self.reasons:
            return f"comparison {self.verdict}: {'; '.join(self.reasons)}"
        figures = "; ".join(o.describe() for o in self.outputs)
        return f"comparison {self.verdict} over {self.requests} requests: {figures}"


def infer_kind(old: Sequence[Tensor]) -> Kind:
    """An output's kind from the old slot's answers (the rule in the module's docstring)."""
    if any(a.kind != "f" for a in old):
        return "exact"
    if old and all(a.ndim >= 1 and a.shape[-1] >= 2 and a.size and _is_distribution(a)
                   for a in old):
        return "classifier"
    return "regressor"


def _is_distribution(answer: Tensor) -> bool:
    return all(all(0 <= v <= 1 for v in row) and abs(math.fsum(row) - 1.0) <= 1e-3
               for row in answer.rows())


@dataclass(frozen=True)
class _Answers:
    """One output's answers to one request: old, new (None: missing), old again."""

    request: int
    old: Tensor
    new: Tensor | None
    noise: Tensor | None


def compare(old_outputs: Sequence[Outputs], new_outputs: Sequence[Outputs],
            noise_outputs: Sequence[Outputs], policy: ComparisonPolicy, *,
            sources: Sequence[str] | None = None) -> Comparison:
    """Judge the new slot's answers against the old slot's.

    The three sequences hold, per request of the corpus and in its order, the outputs of the
    old slot, of the new slot, and of the old slot again (the noise floor). ``sources``
    names each request in the worst examples.
    """
    count = len(old_outputs)
    if len(new_outputs) != count or len(noise_outputs) != count:
        raise ValueError(f"answers to {count} (old), {len(new_outputs)} (new) and "
                         f"{len(noise_outputs)} (old again) requests: pass one per request")
    if count == 0:
        return Comparison(Verdict.INCONCLUSIVE, 0, (), ("no request was compared",))
    labels = list(sources) if sources is not None else [f"#{i}" for i in range(count)]
    names = list(dict.fromkeys(name for outputs in old_outputs for name in outputs))
    figures = []
    for name in names:
        answers = [_Answers(i, old[name], new_outputs[i].get(name), noise_outputs[i].get(name))
                   for i, old in enumerate(old_outputs) if name in old]
        rule = policy.outputs.get(name) or OutputRule(kind=infer_kind([a.old for a in answers]))
        figures.append(_judge_output(name, rule, answers, labels, policy.worst))
    reasons = [f.reason for f in figures if not f.ok]
    reasons += [f"output {name!r} named in the comparison policy is in no answer of the old "
                f"slot (its outputs: {', '.join(names) or 'none'})"
                for name in policy.outputs if name not in names]
    verdict = Verdict.FAIL if reasons else Verdict.PASS
    return Comparison(verdict, count, tuple(figures), tuple(reasons))


def _judge_output(name: str, rule: OutputRule, answers: list[_Answers], labels: list[str],
                  worst: int) -> OutputFigure:
    broken = [a for a in answers if a.new is None or a.new.shape != a.old.shape]
    usable = [a for a in answers if a.new is not None and a.new.shape == a.old.shape]
    text = [a for a in answers if a.old.kind not in "fiub"]
    if text and rule.kind != "exact":
        return OutputFigure(name, rule.kind, 0, 0, 0.0, ok=False, reason=(
            f"output {name!r} holds {text[0].old.dtype} values, not numbers: it cannot be "
            f"compared as a {rule.kind}; name it 'exact' in the policy"))
    if rule.kind == "classifier":
        figure = _classifier(name, rule, usable, labels, worst)
    elif rule.kind == "exact":
        figure = _exact(name, rule, usable, labels, worst)
    else:
        figure = _regressor(name, rule, usable, labels, worst)
    if not broken:
        return figure
    first = broken[0]
    seen = "missing" if first.new is None else f"shaped {first.new.shape}"
    lost = sum(_units(a.old, rule.kind) for a in broken)
    reason = (f"output {name!r}: the new slot's answer to {len(broken)} request(s) is missing "
              f"or shaped differently (request {first.request} ({labels[first.request]}): "
              f"{seen}, old {first.old.shape})")
    return OutputFigure(name, rule.kind, figure.compared + lost, figure.differing + lost,
                        figure.noise, ok=False,
                        reason="; ".join(r for r in (reason, figure.reason) if r),
                        worst=figure.worst)


def _units(answer: Tensor, kind: str) -> int:
    """What one answer counts for: its rows (classifier) or its values."""
    if kind == "classifier" and answer.ndim >= 1 and answer.shape[-1]:
        return answer.size // answer.shape[-1]
    return answer.size


def _regressor(name: str, rule: OutputRule, answers: list[_Answers], labels: list[str],
               worst: int) -> OutputFigure:
    noise = max((_max_abs(a.noise, a.old) for a in answers), default=0.0)
    compared = differing = 0
    candidates: list[tuple[float, Example]] = []
    for a in answers:
        old, new = a.old.as_floats(), _new(a).as_floats()
        compared += len(old)
        beyond: list[tuple[float, int, float]] = []  # (excess, flat index, difference)
        for flat, (was, now) in enumerate(zip(old, new, strict=True)):
            diff = abs(now - was)
            excess = diff - (rule.atol + rule.rtol * abs(was) + noise)
            # NaN where one answer is NaN (or infinite) and the other is not: a difference
            if not _same(was, now) and not excess <= 0:
                beyond.append((math.inf if math.isnan(excess) else excess, flat, diff))
        differing += len(beyond)
        for excess, flat, diff in sorted(beyond, key=lambda b: -b[0])[:worst]:
            candidates.append((excess, Example(
                a.request, labels[a.request], name, a.old.position(flat), old[flat], new[flat],
                diff)))
    examples = _top(candidates, worst)
    ok = differing <= rule.max_mismatch_fraction * compared
    reason = "" if ok else (
        f"output {name!r}: {differing} of {compared} values differ beyond atol {rule.atol:g} + "
        f"rtol {rule.rtol:g} x |old| + noise {noise:.6g}{_allowed(rule.max_mismatch_fraction)}"
        f"{_worst_text(examples)}")
    return OutputFigure(name, "regressor", compared, differing, noise, ok, reason, examples)


def _argmax(row: Sequence[float]) -> int:
    """The first largest entry's index; the first NaN's when the row holds one (NaN counts as
    the largest, as numpy's argmax has it: a row with NaN has changed class unless the other
    answer has its NaN at the same place)."""
    for index, value in enumerate(row):
        if math.isnan(value):
            return index
    return max(range(len(row)), key=lambda i: (row[i], -i))


def _classifier(name: str, rule: OutputRule, answers: list[_Answers], labels: list[str],
                worst: int) -> OutputFigure:
    if any(a.old.ndim == 0 or a.old.shape[-1] < 2 for a in answers):
        return OutputFigure(name, "classifier", 0, 0, 1.0, ok=False, reason=(
            f"output {name!r} cannot be compared as a classifier: its last axis needs one "
            "score per class (at least 2); name it 'regressor' or 'exact' in the policy"))
    rows = changed = noise_rows = noise_agree = 0
    candidates: list[tuple[float, Example]] = []
    for a in answers:
        old_rows = [tuple(float(v) for v in r) for r in a.old.rows()]
        new_rows = [tuple(float(v) for v in r) for r in _new(a).rows()]
        top_old = [_argmax(r) for r in old_rows]
        top_new = [_argmax(r) for r in new_rows]
        rows += len(top_old)
        flipped = [i for i, (was, now) in enumerate(zip(top_old, top_new, strict=True))
                   if was != now]
        changed += len(flipped)
        if a.noise is not None and a.noise.shape == a.old.shape:
            noise_rows += len(top_old)
            noise_agree += sum(_argmax(tuple(float(v) for v in r)) == top_old[i]
                               for i, r in enumerate(a.noise.rows()))
        width = a.old.shape[-1]
        for row in flipped[:worst]:
            position = a.old.position(row * width)[:-1]
            diffs = [abs(n - o) for n, o in zip(new_rows[row], old_rows[row], strict=True)]
            finite = [d for d in diffs if not math.isnan(d)]
            diff = max(finite) if finite else math.nan
            candidates.append((diff, Example(a.request, labels[a.request], name, position,
                                             top_old[row], top_new[row], diff)))
    examples = _top(candidates, worst)
    agreement = 1.0 - changed / rows if rows else 1.0
    noise = noise_agree / noise_rows if noise_rows else 1.0
    ok = agreement >= noise - rule.max_agreement_drop - 1e-12
    drop = f" - {rule.max_agreement_drop:.2%}" if rule.max_agreement_drop else ""
    reason = "" if ok else (
        f"output {name!r}: top-1 agreement new vs old {agreement:.2%} ({changed} of {rows} "
        f"rows changed class) < old vs old {noise:.2%}{drop}{_worst_text(examples)}")
    return OutputFigure(name, "classifier", rows, changed, noise, ok, reason, examples)


def _exact(name: str, rule: OutputRule, answers: list[_Answers], labels: list[str],
           worst: int) -> OutputFigure:
    compared = differing = noise_values = noise_differing = 0
    candidates: list[tuple[float, Example]] = []
    for a in answers:
        new = _new(a)
        unequal = [i for i, (was, now) in enumerate(zip(a.old.values, new.values, strict=True))
                   if not _same(was, now)]
        compared += a.old.size
        differing += len(unequal)
        if a.noise is not None and a.noise.shape == a.old.shape:
            noise_values += a.old.size
            noise_differing += sum(not _same(was, again) for was, again
                                   in zip(a.old.values, a.noise.values, strict=True))
        for flat in unequal[:worst]:
            candidates.append((0.0, Example(a.request, labels[a.request], name,
                                            a.old.position(flat), a.old.values[flat],
                                            new.values[flat], None)))
    examples = _top(candidates, worst)
    rate = differing / compared if compared else 0.0
    noise = noise_differing / noise_values if noise_values else 0.0
    ok = rate <= noise + rule.max_mismatch_fraction + 1e-12
    reason = "" if ok else (
        f"output {name!r}: {differing} of {compared} values differ ({rate:.2%}) > old vs old "
        f"{noise:.2%}{_allowed(rule.max_mismatch_fraction)}{_worst_text(examples)}")
    return OutputFigure(name, "exact", compared, differing, noise, ok, reason, examples)


def _worst_text(examples: tuple[Example, ...]) -> str:
    return f"; worst: {examples[0].describe()}" if examples else ""


def _allowed(fraction: float) -> str:
    return f" (more than the {fraction:.2%} allowed)" if fraction else ""


def _new(answers: _Answers) -> Tensor:
    assert answers.new is not None  # missing answers were set aside by the caller
    return answers.new


def _same(a: Any, b: Any) -> bool:
    """Equal, NaN equal to NaN (the same answer, twice)."""
    return bool(a == b) or (isinstance(a, float) and isinstance(b, float)
                            and math.isnan(a) and math.isnan(b))


def _max_abs(noise: Tensor | None, old: Tensor) -> float:
    """The largest finite |old - old'| of one answer (0 when none can be computed)."""
    if noise is None or noise.shape != old.shape or old.kind not in "fiub":
        return 0.0
    diffs = [abs(float(again) - float(was)) for was, again in zip(old.values, noise.values,
                                                                 strict=True)]
    finite = [d for d in diffs if math.isfinite(d)]
    return max(finite) if finite else 0.0


def _top(candidates: list[tuple[float, Example]], count: int) -> tuple[Example, ...]:
    ranked = sorted(candidates, key=lambda c: (-c[0], c[1].request, c[1].position))
    return tuple(example for _, example in ranked[:count])
