"""`fab tune`'s search over batching and thread pools, and its rate ramp (pure).

A configuration is the catalog's ``Batching`` and ``Threads``. The search starts from the
catalog's configuration (always the first trial, measured in the same run as the others) and
walks one dimension at a time (coordinate descent): from the best configuration so far, it
steps a dimension up through its values while each step beats the one before by more than
``min_gain``, and stops that direction at the first step that does not (the direction only
gets worse from there on a unimodal curve); it tries down only when up brought nothing. A
candidate the toolkit's own rules refuse (``config_problems``: the catalog rules and the
rendered files' checks, batch_timeout_micros <= SLO/3 among them) ends its direction too:
further steps the same way break the same rule. No trial starts once the budget cannot hold it
or ``max_trials`` have run, and a trial's ramp takes no step that would end beyond the budget
(``step_fits``).

A trial's figure is its QPS *at the SLO*: the open-loop rate ramp (``next_rate``) raises the
offered rate until P99 exceeds the SLO or errors appear, and the trial keeps the highest
achieved rate that met both. The recommendation is the best trial, but the catalog's
configuration stays recommended unless another beats it by more than ``min_gain``: measured
QPS is noisy, and a configuration change must earn its place.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from tfsdeploy.core.errors import Problem
from tfsdeploy.core.inventory.catalog import Batching, Model, Threads
from tfsdeploy.core.inventory.fleet import ResolvedHost
from tfsdeploy.core.inventory.gpu import GpuPlan
from tfsdeploy.core.render.files import render_host
from tfsdeploy.core.render.validate import timeout_budget_us, validate_model, validate_render
from tfsdeploy.core.tuning.options import DEFAULT_MIN_GAIN

MAX_BATCH_SIZES = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512)
TIMEOUT_STEPS = 5  # the SLO/3 budget halved 0..4 times, and 0


@dataclass(frozen=True)
class Config:
    """One configuration of the batch scheduler and the thread pools."""

    batching: Batching
    threads: Threads

    @classmethod
    def of(cls, model: Model) -> Config:
        """The catalog's configuration of ``model``."""
        return cls(model.batching, model.threads)

    def applied(self, model: Model) -> Model:
        """``model`` with this configuration."""
        return replace(model, batching=self.batching, threads=self.threads)

    def label(self) -> str:
        """A short line naming the searched values."""
        b, t = self.batching, self.threads
        batching = (f"batch {b.max_batch_size} timeout {b.batch_timeout_micros}us "
                    f"threads {b.num_batch_threads}" if b.enabled else "no batching")
        return f"{batching} intra {t.intra_op or 'default'} inter {t.inter_op or 'default'}"

    def as_json(self) -> dict[str, Any]:
        """``{"batching": {...}, "threads": {...}}``."""
        batching = asdict(self.batching)
        batching["allowed_batch_sizes"] = list(self.batching.allowed_batch_sizes)
        return {"batching": batching, "threads": asdict(self.threads)}

    def python(self) -> str:
        """The catalog entry's ``batching=...`` and ``threads=...`` as Python to paste."""
        return (f"batching={_call('Batching', asdict(self.batching), asdict(Batching()))},\n"
                f"threads={_call('Threads', asdict(self.threads), asdict(Threads()))},\n")


SEARCHED = frozenset({"max_batch_size", "batch_timeout_micros", "num_batch_threads",
                      "intra_op", "inter_op"})


def _call(name: str, values: dict[str, Any], defaults: dict[str, Any]) -> str:
    """``Name(key=value, ...)`` with the searched keys and those that differ from the
    defaults."""
    args = [f"{k}={tuple(v) if isinstance(v, list) else v!r}" for k, v in values.items()
            if k in SEARCHED or v != defaults[k]]
    return f"{name}({', '.join(args)})"


# -- the rate ramp of one trial -----------------------------------------------------------------

@dataclass(frozen=True)
class RatePoint:
    """One open-loop step: the offered rate and what came back."""

    rate: float
    qps: float  # achieved (answered per second)
    p50_ms: float
    p95_ms: float
    p99_ms: float
    error_pct: float

    def meets(self, slo_ms: float) -> bool:
        """P99 within the SLO and no error."""
        return self.p99_ms <= slo_ms and self.error_pct == 0


@dataclass(frozen=True)
class Ramp:
    """How the offered rate moves: doubled while each step meets the SLO, halved while none
    has yet, then bisected between the highest rate that met it and the lowest that did not
    until they are within ``precision`` of each other; at most ``max_steps``. A step that met
    the SLO but answered less than ``saturated`` of the offered rate counts as not meeting it:
    in an open loop the backlog of a full server only grows."""

    slo_ms: float
    growth: float = 2.0
    precision: float = 1.15
    max_steps: int = 8
    saturated: float = 0.9

    def held(self, point: RatePoint) -> bool:
        """Whether the server held the offered rate within the SLO."""
        return point.meets(self.slo_ms) and point.qps >= self.saturated * point.rate

    def next_rate(self, points: Sequence[RatePoint]) -> float | None:
        """The next rate to offer, or None when the trial's figure is known."""
        if not points or len(points) >= self.max_steps:
            return None
        held = [p.rate for p in points if self.held(p)]
        above = [p.rate for p in points if not self.held(p) and p.rate > max(held, default=0)]
        if not held:
            low = min(p.rate for p in points)
            return low / 2 if low >= 2 else None
        if not above:
            return max(held) * self.growth
        low, high = max(held), min(above)
        return (low + high) / 2 if high > low * self.precision else None

    def at_slo(self, points: Sequence[RatePoint]) -> RatePoint | None:
        """The step that met the SLO with the highest achieved QPS (None: none did)."""
        met = [p for p in points if p.meets(self.slo_ms)]
        return max(met, key=lambda p: p.qps) if met else None


def step_fits(steps_made: int, now: float, deadline: float, step_s: float) -> bool:
    """Whether a trial's next rate step may start: its first always (a trial without a step
    has no figure), a later one only when it ends before the search's deadline (the end of
    ``--budget``), so that a trial that started within the budget ends there too."""
    return steps_made == 0 or now + step_s <= deadline


def first_rate(probe_qps: float, *, share: float = 0.5, floor: float = 5.0) -> float:
    """The first offered rate: ``share`` of what a short closed-loop probe reached."""
    return max(floor, probe_qps * share) if math.isfinite(probe_qps) else floor


# -- trials and the search -----------------------------------------------------------------------

@dataclass(frozen=True)
class Trial:
    """One configuration measured: its figures at the SLO (``qps`` 0 when no rate met it)."""

    config: Config
    qps: float
    p50_ms: float | None
    p95_ms: float | None
    p99_ms: float | None
    meets_slo: bool
    seconds: float  # what the trial cost: start, probe and ramp
    mean_batch: float | None = None  # processed batch size (TFServing's histogram)
    queue_share: float | None = None  # batch queueing / request latency
    cpu_cores: float | None = None  # the instance's CPU use, in cores
    error: str | None = None  # the instance did not start or answer
    stop: str = ""  # why the ramp stopped

    @property
    def score(self) -> float:
        """What the search compares: QPS at the SLO, 0 when it never met it."""
        return self.qps if self.meets_slo else 0.0

    def as_json(self) -> dict[str, Any]:
        """The trial in tune.json."""
        return {**self.config.as_json(), "qps": round(self.qps, 2),
                "p50_ms": _round(self.p50_ms), "p95_ms": _round(self.p95_ms),
                "p99_ms": _round(self.p99_ms), "meets_slo": self.meets_slo,
                "mean_batch_size": _round(self.mean_batch),
                "queue_share": _round(self.queue_share, 4), "cpu_cores": _round(self.cpu_cores),
                "seconds": round(self.seconds, 1), "error": self.error, "stop": self.stop,
                "label": self.config.label()}


def _round(value: float | None, places: int = 2) -> float | None:
    return None if value is None else round(value, places)


@dataclass(frozen=True)
class Dimension:
    """One searched setting: its name and the values it may take, increasing. A thread pool's
    0 ("TFServing's default") is walked as ``zero_as`` (the default's size)."""

    name: str
    values: tuple[int, ...]
    zero_as: int | None = None

    def get(self, config: Config) -> int:
        """The dimension's value in ``config``."""
        if self.name in ("intra_op", "inter_op"):
            return int(getattr(config.threads, self.name))
        return int(getattr(config.batching, self.name))

    def set(self, config: Config, value: int) -> Config:
        """``config`` with the dimension at ``value`` (allowed_batch_sizes kept ending at
        max_batch_size: the smaller entries stay, the new size closes the list)."""
        changes: dict[str, Any] = {self.name: value}
        if self.name in ("intra_op", "inter_op"):
            return replace(config, threads=replace(config.threads, **changes))
        batching = replace(config.batching, **changes)
        if self.name == "max_batch_size" and batching.allowed_batch_sizes:
            kept = tuple(s for s in batching.allowed_batch_sizes if s < value)
            batching = replace(batching, allowed_batch_sizes=(*kept, value))
        return replace(config, batching=batching)

    def neighbour(self, config: Config, direction: int) -> int | None:
        """The next value up (``direction`` 1) or down (-1) from ``config``'s, or None."""
        value = self.get(config)
        if value == 0 and self.zero_as is not None:
            value = self.zero_as
        ahead = [v for v in self.values if (v > value if direction > 0 else v < value)]
        if not ahead:
            return None
        return min(ahead) if direction > 0 else max(ahead)


def dimensions(model: Model, *, host_cpus: int) -> tuple[Dimension, ...]:
    """What the search walks for ``model`` on a host of ``host_cpus`` CPUs: the batch size,
    the batch timeout up to a third of the SLO, the batch threads and the intra/inter-op
    pools up to the host's CPUs (TensorFlow sizes a default pool to the CPUs it sees)."""
    cpus = max(1, host_cpus)
    threads = tuple(sorted({c for c in (1, 2, 4, 8, 16, 32, 64) if c < cpus} | {cpus}))
    found = []
    if model.batching.enabled:
        b = model.batching
        budget = timeout_budget_us(model.latency_slo_ms)
        timeouts = {0} | {budget >> k for k in range(TIMEOUT_STEPS)}
        found += [
            Dimension("max_batch_size", tuple(sorted({*MAX_BATCH_SIZES, b.max_batch_size}))),
            Dimension("batch_timeout_micros",
                      tuple(sorted(t for t in {*timeouts, b.batch_timeout_micros}
                                   if t <= budget))),
            Dimension("num_batch_threads", tuple(sorted({*threads, b.num_batch_threads}
                                                        - {0}))),
        ]
    for name in ("intra_op", "inter_op"):
        current = getattr(model.threads, name)
        found.append(Dimension(name, tuple(sorted({*threads, current} - {0})), zero_as=cpus))
    return tuple(found)


def config_problems(model: Model, host: ResolvedHost, version: int, config: Config, *,
                    inventory_file: str, co_located: Sequence[Model] = ()) -> list[Problem]:
    """What the toolkit refuses in ``config`` for ``model`` on ``host``: the catalog's rules
    and every check of the rendered files (the same as a deploy of it would meet)."""
    changed = config.applied(model)
    problems = validate_model(changed, inventory_file)
    if problems:
        return problems
    render = render_host(host, changed, version, co_located=co_located)
    return validate_render(render, inventory_file)


@dataclass(frozen=True)
class Skipped:
    """A candidate the search did not measure, and why."""

    config: Config
    reason: str


@dataclass
class Search:
    """A search's course: the trials in the order made, the candidates refused, and why it
    ended."""

    trials: list[Trial] = field(default_factory=list)
    skipped: list[Skipped] = field(default_factory=list)
    ended: str = "every direction explored"

    @property
    def spent_s(self) -> float:
        """Seconds the trials took."""
        return sum(t.seconds for t in self.trials)


class BudgetSpent(Exception):
    """The budget cannot hold another trial."""


def better(candidate: Trial, incumbent: Trial, min_gain: float) -> bool:
    """Whether ``candidate`` beats ``incumbent`` by more than ``min_gain`` (QPS at the SLO)."""
    if incumbent.score <= 0:
        return candidate.score > 0
    return candidate.score > incumbent.score * (1 + min_gain)


def search(current: Config, dims: Sequence[Dimension], *, measure: Callable[[Config], Trial],
           problems: Callable[[Config], list[Problem]], budget_s: float, estimate_s: float,
           min_gain: float = DEFAULT_MIN_GAIN, max_trials: int | None = None) -> Search:
    """Coordinate search from ``current`` (see the module docstring). ``measure`` runs one
    trial; a trial is expected to cost what the trials so far took on average
    (``estimate_s`` while they took no time). ``max_trials``: no trial beyond that many, the
    first included."""
    course = Search()
    course.trials.append(measure(current))  # always: the figure everything is judged against
    best = course.trials[0]
    seen = {current}

    def trial(config: Config) -> Trial:
        # what the trials took so far (the first always ran), else the caller's estimate
        if max_trials is not None and len(course.trials) >= max_trials:
            raise BudgetSpent(f"trials: {len(course.trials)} of at most {max_trials} run")
        expected = course.spent_s / len(course.trials) or estimate_s
        if course.spent_s + expected > budget_s:
            raise BudgetSpent(f"budget: {course.spent_s:.0f} s of {budget_s:.0f} s spent, a "
                              f"trial takes about {expected:.0f} s")
        made = measure(config)
        course.trials.append(made)
        return made

    try:
        for dim in dims:
            best = _walk(dim, best, trial=trial, problems=problems, seen=seen,
                         skipped=course.skipped, min_gain=min_gain)
    except BudgetSpent as spent:
        course.ended = str(spent)
    return course


def _walk(dim: Dimension, best: Trial, *, trial: Callable[[Config], Trial],
          problems: Callable[[Config], list[Problem]], seen: set[Config],
          skipped: list[Skipped], min_gain: float) -> Trial:
    """One dimension from ``best``: up while it gains, else down while it gains."""
    for direction in (1, -1):
        step = best
        while (value := dim.neighbour(step.config, direction)) is not None:
            config = dim.set(step.config, value)
            if config in seen:
                break
            seen.add(config)
            refused = problems(config)
            if refused:
                skipped.append(Skipped(config, f"{dim.name} {value}: {refused[0].message}"))
                break  # further the same way breaks the same rule
            made = trial(config)
            if not better(made, step, min_gain):
                break  # this direction only gets worse from here
            step = made
        if step is not best:
            return step  # up (or down) gained: the other direction is not tried
    return best


def recommend(trials: Sequence[Trial], min_gain: float = DEFAULT_MIN_GAIN) -> int | None:
    """The index of the trial to recommend: the best QPS at the SLO, the catalog's (trial 0)
    unless another beats it by more than ``min_gain``; None when no trial met the SLO."""
    if not trials:
        return None
    top = max(range(len(trials)), key=lambda i: (trials[i].score, -i))
    if trials[top].score <= 0:
        return None
    return top if better(trials[top], trials[0], min_gain) else 0


# -- where a scratch instance runs --------------------------------------------------------------

SCRATCH_PORT_FLOOR = 14000  # above the default ports (8500..) and most port_offsets; the
# caller counts the ports its inventory gives the host's models as taken (a large offset)


def scratch_ports(listening: frozenset[int], *, floor: int = SCRATCH_PORT_FLOOR,
                  ceiling: int = 65535) -> tuple[int, int] | None:
    """The first (gRPC, REST) pair of adjacent ports from ``floor`` that nothing listens on."""
    for port in range(floor, ceiling):
        if port not in listening and port + 1 not in listening:
            return port, port + 1
    return None


def scratch_gpu_problem(plan: GpuPlan, resident: int) -> str | None:
    """Why ``plan``'s GPU cannot hold one more instance of the model beside the ``resident``
    ones (and the other models'), with the arithmetic; None when it can."""
    more = replace(plan, slots=resident + 1)
    if more.window_total <= more.limit:
        return None
    return (f"{plan.where} of {plan.host} cannot hold a scratch instance of {plan.model} "
            f"beside the {resident} running: {more.arithmetic()}")
