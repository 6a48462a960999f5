"""The gates a new release passes before and after it takes traffic. Each yields one
``Check``: a poller with a deadline on the run's cancellable clock, that records its verdict in
the release record and fails with what was expected, what was seen and the server's log tail.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

from tfsdeploy.core.errors import HostUnreachable
from tfsdeploy.core.rollout.gate_diagnosis import (
    Diagnosis,
    ServerFacts,
    SignatureView,
    diagnose,
    diagnose_signature,
)
from tfsdeploy.core.rollout.gates import GateFailed, Verdict, percentile, poll
from tfsdeploy.core.rollout.records import GateRecord
from tfsdeploy.core.tfserving.golden import GoldenExample, mismatch
from tfsdeploy.hosts import probes
from tfsdeploy.hosts.dockerapi import DockerFailed
from tfsdeploy.run.changes import Check
from tfsdeploy.run.jobs import HostJob
from tfsdeploy.run.operations.step import Ops, operation


def grpc_client(job: HostJob, port: int) -> Any:
    """A gRPC client of the model on one of the host's ports (``probes.SlotClient`` unless a
    test injects a factory)."""
    factory = job.run.client_factory
    if factory is None:
        factory = probes.SlotClient
    return factory(job.host.address, port, job.model.name)


def container_problem(job: HostJob) -> str | None:
    """Why the new container is not serving steadily (None when it is)."""
    state = job.conn.docker.state(job.container)
    if state is None:
        return "container is gone"
    job.instance.pid = state.pid  # what GPU gates map nvidia-smi's processes to
    if state.status != "running":
        return f"container {state.status} (exit code {state.exit_code})"
    if state.restarts > 0:
        return f"container restarted {state.restarts} time(s)"
    return None


SHOWN_LOG_LINES = 20  # the tail a failed gate shows
DIAGNOSED_LOG_LINES = 200  # what is searched for a known failure: retries and shutdown follow it


def log_tail(job: HostJob, lines: int = SHOWN_LOG_LINES) -> str:
    """The new container's log tail (TFServing prints load errors there)."""
    try:
        return job.conn.docker.logs(job.container, lines).strip()
    except Exception as error:  # the tail is a courtesy: never hide the gate's own failure
        return f"(log unavailable: {type(error).__name__})"


def last_lines(text: str, count: int) -> str:
    """The last ``count`` lines of ``text``."""
    return "\n".join(text.splitlines()[-count:])


def server_facts(job: HostJob) -> ServerFacts:
    """What a diagnosis may name of the release's server: image, release, GPU share."""
    gpus = {gpu.index: gpu.memory_mib for gpu in job.host.gpus}
    first = job.instance.gpus[0] if job.instance.gpus else None
    return ServerFacts(image=job.image, tfserving_version=job.host.vars.tfserving_version,
                       gpu_fraction=job.instance.fraction, gpu_mib=gpus.get(first or 0),
                       memory_mib=job.model.memory_mib)


def diagnosed(job: HostJob, seen: str, log: str = "") -> Diagnosis | None:
    """The known failure what the gate saw and the server's log show (kept for the host's
    outcome and release record), or None."""
    found = diagnose(f"{seen}\n{log}", server_facts(job))
    if found is not None:
        job.diagnosis = found
    return found


def failure(job: HostJob, step: str, expected: str, seen: str, *, logs: bool,
            diagnosis: Diagnosis | None = None, tail: str = "") -> GateFailed:
    """A gate's failure with the server's log tail (when ``logs``) and what it means: the
    gate's own diagnosis, else the one its observation and the log show."""
    log = log_tail(job, DIAGNOSED_LOG_LINES) if logs else ""
    if diagnosis is not None:
        job.diagnosis = diagnosis
    else:
        diagnosis = diagnosed(job, seen, log)
    return GateFailed(step, expected, seen, last_lines(log, SHOWN_LOG_LINES) if logs else tail,
                      diagnosis=diagnosis)


def record_gate(job: HostJob, name: str, started: float, ok: bool, detail: str) -> None:
    """Add a gate's verdict to the release record."""
    job.gates.append(GateRecord(gate=name, ok=ok, seconds=round(time.monotonic() - started, 3),
                                detail=detail))


@contextlib.contextmanager
def gate_errors(job: HostJob, gate: str, started: float, *, step: str, expected: str,
                logs: bool = True) -> Iterator[None]:
    """Record a gate that failed and raise it as GateFailed: a GateFailed as it is, any other
    error (a refused or timed-out request) as ``expected`` not met; with the container's log
    tail when ``logs``, and the diagnosis of a known failure. A host that stopped answering
    SSH stays HostUnreachable."""
    try:
        yield
    except HostUnreachable:
        raise  # not the release's fault: the host is reported unreachable
    except GateFailed as error:
        record_gate(job, gate, started, False, error.seen)
        raise failure(job, error.step, error.expected, error.seen, logs=logs,
                      diagnosis=error.diagnosis, tail=error.log_tail) from None
    except Exception as exc:
        reachable(job)
        record_gate(job, gate, started, False, str(exc))
        raise failure(job, step, expected, f"{type(exc).__name__}: {exc}", logs=logs) from None


def reachable(job: HostJob) -> None:
    """Raise HostUnreachable when the host's SSH connection no longer answers: a probe that
    timed out or was refused on such a host (its network cut, the host gone) says nothing of
    the release, and the run must report the host unreachable, not a failed gate. A probe
    that failed on a host that still answers is the gate's failure, as before."""
    with contextlib.suppress(DockerFailed):
        container_problem(job)


T = TypeVar("T")


def _with_client(job: HostJob, port: int, body: Callable[[Any], T]) -> T:
    client = grpc_client(job, port)
    try:
        return body(client)
    finally:
        client.close()


@operation("gate_available", gate=True)
def gate_available(job: HostJob, timeout_s: float | None = None) -> Ops:
    """The exact new version is AVAILABLE (GetModelStatus), the container running throughout."""
    deadline = timeout_s or job.model.rollout.load_timeout_s
    version = job.run.version
    expected = f"version {version} AVAILABLE"

    def check(client: Any) -> Verdict:
        problem = container_problem(job)
        if problem:
            return Verdict.fail(problem)
        try:
            statuses = client.status(timeout=3)
        except Exception as exc:  # ports open only after the initial load
            return Verdict.wait(f"not answering yet ({type(exc).__name__})")
        mine = [s for s in statuses if s.version == version]
        if not mine:
            return Verdict.wait(f"version {version} unknown yet")
        if mine[0].state == "AVAILABLE":
            return Verdict.ok("AVAILABLE")
        if mine[0].state == "END":
            return Verdict.fail(f"END: {mine[0].error_message or 'unloaded'}")
        return Verdict.wait(mine[0].state)

    def run() -> str:
        started = time.monotonic()
        port = job.ports.slot_grpc(job.new_slot, job.instance.index)
        with gate_errors(job, "available", started, step="gate_available", expected=expected):
            verdict = _with_client(job, port, lambda c: poll(
                lambda: check(c), step="gate_available", expected=expected,
                deadline_s=deadline, clock=job.run.clock).seen)
        record_gate(job, "available", started, True, verdict)
        return expected

    yield Check(f"wait until version {version} is AVAILABLE on "
                f":{job.ports.slot_grpc(job.new_slot, job.instance.index)} ({deadline:g} s)", run,
                process_ready=True)
    return ""  # the check says what it saw


def contract_view(contract: Any) -> SignatureView:
    """The catalog's signature as the served ones are given: side -> name -> (dtype, shape)."""
    return {side: {name: (spec.dtype, tuple(spec.shape))
                   for name, spec in getattr(contract, side).items()}
            for side in ("inputs", "outputs")}


def signature_differences(contract: Any, served: dict[str, Any]) -> list[str]:
    """How the served signature differs from the contract (empty when it matches)."""
    if not served:
        return [f"no signature {contract.name!r} served"]
    found = []
    for kind in ("inputs", "outputs"):
        want: dict[str, Any] = dict(getattr(contract, kind))
        have: dict[str, Any] = served.get(kind, {})
        if set(want) != set(have):
            found.append(f"{kind} {sorted(have)} != contract {sorted(want)}")
            continue
        for name, spec in want.items():
            dtype, shape = have[name]
            if dtype != spec.dtype:
                found.append(f"{kind} {name!r} dtype {dtype} != {spec.dtype}")
            if len(shape) != len(spec.shape) or any(
                    a != b and -1 not in (a, b) for a, b in zip(shape, spec.shape, strict=False)):
                found.append(f"{kind} {name!r} shape {list(shape)} != {list(spec.shape)}")
    return found


@operation("gate_signature", gate=True)
def gate_signature(job: HostJob) -> Ops:
    """The served signature matches the catalog contract (names, dtypes, shapes)."""
    contract = job.model.signature

    def run() -> str:
        started = time.monotonic()
        with gate_errors(job, "signature", started, step="gate_signature",
                         expected=f"signature {contract.name!r} served"):
            every = _with_client(job, job.ports.slot_grpc(job.new_slot, job.instance.index),
                                 lambda c: c.signatures(job.run.version))
        differences = signature_differences(contract, every.get(contract.name, {}))
        record_gate(job, "signature", started, not differences,
                    "; ".join(differences) or "matches")
        if differences:
            diagnosis = diagnose_signature(contract.name, contract_view(contract), every,
                                           differences)
            job.diagnosis = diagnosis
            raise GateFailed("gate_signature", f"signature {contract.name!r} as in the catalog",
                             "; ".join(differences), diagnosis=diagnosis)
        return (f"{contract.name}: {len(contract.inputs)} input(s), "
                f"{len(contract.outputs)} output(s)")

    yield Check(f"compare signature {contract.name!r} with the catalog", run)
    return ""  # the check says what it saw


def golden_requests(job: HostJob, step: str) -> list[GoldenExample]:
    """The version's golden requests, or a failed step naming the fix."""
    if not job.run.golden:
        raise GateFailed(step, "golden requests for this version (Model.golden)",
                         "none: add golden examples for the version to the model's golden file")
    return job.run.golden


@operation("gate_warmup", gate=True)
def gate_warmup(job: HostJob, rounds: int = 20, skip_if_warm: bool = False) -> Ops:
    """Representative requests straight to the new slot until P99 is under the threshold."""
    if skip_if_warm and job.warm:
        return "skipped: the container was already running and warm"
    model = job.model
    threshold = (model.warmup.p99_ms or model.latency_slo_ms) / 1000

    def body(client: Any) -> tuple[float, int]:
        examples = golden_requests(job, "gate_warmup")
        end = job.run.clock.now() + model.warmup.timeout_s
        p99, done = float("inf"), 0
        while done < rounds:
            latencies = [client.predict(ex.inputs, version=job.run.version,
                                        signature=ex.signature)[1]
                         for ex in _cycle(examples, model.warmup.samples)]
            p99, done = percentile(latencies, 99), done + 1
            if p99 <= threshold or job.run.clock.now() >= end:
                break
        return p99, done

    def run() -> str:
        started = time.monotonic()
        with gate_errors(job, "warmup", started, step="gate_warmup",
                         expected="warmup requests to succeed"):
            p99, done = _with_client(job, job.ports.slot_grpc(job.new_slot, job.instance.index),
                                     body)
        detail = (f"P99 {p99 * 1000:.1f} ms over {model.warmup.samples} requests "
                  f"(<= {threshold * 1000:.0f} ms)")
        ok = p99 <= threshold
        record_gate(job, "warmup", started, ok, detail)
        if not ok:  # what ended it: the rounds or the time (a failure once said "after
            # 120 s" of a gate that had run its 20 rounds in 20 s)
            raise GateFailed("gate_warmup", f"P99 <= {threshold * 1000:.0f} ms",
                             f"P99 {p99 * 1000:.1f} ms in the last of {done} round(s) of "
                             f"{model.warmup.samples} requests, "
                             f"{time.monotonic() - started:.0f} s "
                             f"(at most {rounds} rounds, {model.warmup.timeout_s:g} s)")
        return detail

    yield Check(f"send {model.warmup.samples} golden requests per round until P99 <= "
                f"{threshold * 1000:.0f} ms ({model.warmup.timeout_s:g} s)", run)
    return ""  # the check says what it saw


def _cycle(examples: list[GoldenExample], count: int) -> list[GoldenExample]:
    return [examples[i % len(examples)] for i in range(max(1, count))]


@operation("gate_health", gate=True)
def gate_health(job: HostJob, min_healthy_s: float | None = None) -> Ops:
    """Golden requests give the expected outputs, with no error, for the minimum time."""
    hold = job.model.rollout.min_healthy_s if min_healthy_s is None else min_healthy_s

    def body(client: Any) -> str:
        examples = golden_requests(job, "gate_health")
        clock = job.run.clock
        end, sent = clock.now() + hold, 0
        while True:
            for example in examples:
                outputs, _ = client.predict(example.inputs, version=job.run.version,
                                            signature=example.signature)
                wrong = mismatch(example, outputs)
                if wrong:
                    raise GateFailed("gate_health", "golden outputs", wrong)
                sent += 1
            problem = container_problem(job)
            if problem:
                raise GateFailed("gate_health", "the container to keep running", problem)
            if clock.now() >= end:
                return f"{sent} golden request(s) correct over {hold:g} s"
            clock.sleep(0.2)

    def run() -> str:
        started = time.monotonic()
        with gate_errors(job, "health", started, step="gate_health",
                         expected="golden requests to succeed"):
            detail = _with_client(job, job.ports.slot_grpc(job.new_slot, job.instance.index), body)
        record_gate(job, "health", started, True, detail)
        return detail

    yield Check(f"golden requests with the expected outputs and no error for {hold:g} s", run)
    return ""  # the check says what it saw


@operation("gate_rest", gate=True)
def gate_rest(job: HostJob, timeout_s: float = 10.0) -> Ops:
    """The new slot's REST port answers the model's status, and its metrics endpoint serves
    TFServing's metric names (when monitoring is on): a server whose REST start failed still
    serves gRPC, and every other gate uses gRPC."""
    port = job.ports.slot_rest(job.new_slot, job.instance.index)
    path = job.host.vars.monitoring_path

    def run() -> str:
        started = time.monotonic()
        with gate_errors(job, "rest", started, step="gate_rest",
                         expected=f"REST status and metrics on :{port}"):
            def check() -> Verdict:
                problems = probes.rest_problems(job.host.address, port, job.model.name,
                                         job.run.version, metrics_path=path, timeout_s=3)
                return Verdict.wait("; ".join(problems)) if problems else Verdict.ok("answers")

            poll(check, step="gate_rest", expected=f"REST status and metrics on :{port}",
                 deadline_s=timeout_s, clock=job.run.clock, interval_s=0.3)
        record_gate(job, "rest", started, True, f"REST :{port} status and {path} answer")
        return f"REST :{port} and {path} answer"

    yield Check(f"GET the model's status and {path} on :{port} ({timeout_s:g} s)", run)
    return ""  # the check says what it saw


@operation("gate_stable", gate=True)
def gate_stable(job: HostJob) -> Ops:
    """A golden request through the host's stable port (the path clients use) is answered by
    the new release; while a host's instances are still rolling (requests go to any of them)
    it must be answered, by the new release or the old."""
    port = job.ports.grpc
    all_new = job.last_instance or all(i.switched for i in job.instances)

    def body(client: Any) -> tuple[str, float]:
        example = golden_requests(job, "gate_stable")[0]
        outputs, latency = client.predict(example.inputs, signature=example.signature,
                                          timeout=30)
        return (mismatch(example, outputs) or "") if all_new else "", latency

    def run() -> str:
        started = time.monotonic()
        with gate_errors(job, "stable", started, step="gate_stable", logs=False,
                         expected=f"an answer on the stable port {port}"):
            wrong, latency = _with_client(job, port, body)
        record_gate(job, "stable", started, not wrong, wrong or "new release answers")
        if wrong:
            raise GateFailed("gate_stable", f"version {job.run.version}'s golden outputs on "
                             f"the stable port {port}", wrong)
        who = f"version {job.run.version}" if all_new else "the host's instances"
        return f":{port} answers with {who} ({latency * 1000:.1f} ms)"

    yield Check(f"a golden request through the stable port :{port} answered by "
                + (f"version {job.run.version}" if all_new else "a serving instance"), run)
    return ""  # the check says what it saw
