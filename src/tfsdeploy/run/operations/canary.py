"""Canary steps on live traffic: on the first batch's hosts, after the gates, the proxy sends
``w`` % of the stable ports' requests to the new slots, step by step. A weight is the share of
the HOST's requests: on a host with several instances the engine brings every instance's new
slot up and through its gates first, then runs these steps once for the host, every instance
at the same weight (``engine.instance_passes``). At the first weight the predictions of both
sides are compared on a sample of requests (``compare``: a release answering wrongly stops
there); then each step is judged new slots against old slots on the same host over the same
interval (``canary.step_analysis``): their TFServing metrics, and the judge's own requests
sent to each old and each new slot in turn while the step holds (``Prober``). A failed step
stops the roll (the rescue list restores every instance). With ``pause`` the run ends after
the last step, holding the canary at that weight, its state recorded on the hosts; ``fab
promote`` or ``fab abort`` finish it."""

from __future__ import annotations

import time
from typing import Any

from tfsdeploy.core.canary.compare import compare, golden_corpus, load_corpus, sample_corpus
from tfsdeploy.core.canary.steps import (
    Action,
    CanaryRecord,
    CanaryState,
    Probes,
    StepResult,
    decide,
    step_analysis,
)
from tfsdeploy.core.inventory.canary_policy import CanaryPolicy, Verdict, weights_for
from tfsdeploy.core.observe.guard import Scrape, parse_metrics
from tfsdeploy.core.render.host_proxy import set_state, weight_commands
from tfsdeploy.core.rollout.gates import GateFailed
from tfsdeploy.core.rollout.records import ReleaseStatus, now_iso
from tfsdeploy.hosts import probes
from tfsdeploy.run.changes import Check, ProxyCommands, WriteFile
from tfsdeploy.run.jobs import HostJob, InstanceJob
from tfsdeploy.run.operations.gates import grpc_client
from tfsdeploy.run.operations.step import Ops, operation

PROBE_PAUSE_S = 0.1  # between two rounds of the judge's requests (a round: every slot once)
MAX_PROBES = 600  # per side, the most recent kept (the judge compares every pair of them)


class CanaryPaused(Exception):
    """The canary reached its last step and holds there (``pause``): not a failure."""

    benign = True  # the audit log records no failure for it


def canary_instances(job: HostJob) -> list[InstanceJob]:
    """The host's instances that take part: those with an old release to compare against (an
    instance added since, with nothing to compare, waits out of rotation until the switch)."""
    return [i for i in job.instances if i.old is not None]


def side_slot(instance: InstanceJob, side: str) -> str:
    """The instance's old or new slot."""
    assert instance.old is not None
    return instance.old.slot if side == "old" else instance.new_slot


def scrape_side(job: HostJob, side: str) -> list[Scrape]:
    """One read of the TFServing metrics of every taking-part instance's old (or new) slot,
    in the instances' order."""
    return [parse_metrics(probes.metrics(
        job.host.address, job.ports.slot_rest(side_slot(i, side), i.index),
        job.host.vars.monitoring_path), job.model.name) for i in canary_instances(job)]


class Prober:
    """The judge's own requests: each round sends the model's first golden request to every
    old and every new slot of the host, in turn, and keeps each successful answer's latency
    (the same request, as many on each side, at the same moments under the same live load)."""

    def __init__(self, job: HostJob) -> None:
        self.request = job.run.golden[0] if job.run.golden else None
        self.clients: list[tuple[str, Any]] = []
        if self.request is not None:
            for instance in canary_instances(job):
                for side in ("old", "new"):
                    port = job.ports.slot_grpc(side_slot(instance, side), instance.index)
                    self.clients.append((side, grpc_client(job, port)))
        self.samples: dict[str, list[float]] = {"old": [], "new": []}
        self.failed = {"old": 0, "new": 0}

    def round(self) -> None:
        """One request to every slot."""
        request = self.request
        if request is None:
            return
        for side, client in self.clients:
            started = time.perf_counter()
            try:
                client.predict(request.inputs, signature=request.signature)
            except Exception:  # an error is the metrics' to count: here it is no latency
                self.failed[side] += 1
                continue
            self.samples[side].append((time.perf_counter() - started) * 1000.0)

    def probes(self) -> Probes | None:
        """What was measured so far (None: nothing to send, the latency is not judged)."""
        if not self.clients:
            return None
        return Probes(tuple(self.samples["old"][-MAX_PROBES:]),
                      tuple(self.samples["new"][-MAX_PROBES:]),
                      self.failed["old"], self.failed["new"])

    def close(self) -> None:
        """Close every client."""
        for _, client in self.clients:
            client.close()


def hold(job: HostJob, seconds: float, prober: Prober) -> None:
    """Hold the step ``seconds``, the prober sending a round every ``PROBE_PAUSE_S``."""
    clock = job.run.clock
    deadline = clock.now() + seconds
    while (left := deadline - clock.now()) > 0:
        prober.round()
        clock.sleep(min(PROBE_PAUSE_S, max(0.0, deadline - clock.now()), left))


def judge_step(job: HostJob, policy: CanaryPolicy, weight: int) -> str:
    """Hold the step ``step_s`` (extended while too little traffic came or the score is
    marginal, as the policy says) and judge it, with the comparison's outputs when one was
    made; raise GateFailed naming each failing metric with its effect, interval and
    p-value."""
    outputs = (job.canary_comparison or {}).get("outputs") or ()
    old_before, new_before = scrape_side(job, "old"), scrape_side(job, "new")
    prober = Prober(job)
    extensions = 0
    try:
        while True:
            hold(job, policy.step_s, prober)
            result = step_analysis(old_before, scrape_side(job, "old"), new_before,
                                   scrape_side(job, "new"), policy, weight=weight,
                                   probes=prober.probes(), outputs=outputs)
            decision = decide(result, policy, extensions=extensions)
            if decision.action is Action.EXTEND:
                extensions += 1
                continue
            job.canary_steps.append(result.as_dict())
            if decision.action is Action.STOP:
                raise GateFailed("canary_steps",
                                 f"the new slots as good as the old at {weight}%",
                                 failure_detail(decision.reason, result))
            return result.describe()
    finally:
        prober.close()


def failure_detail(reason: str, result: StepResult) -> str:
    """Why the step stopped, then both sides' figures and every metric's line."""
    lines = result.describe().split("\n")
    figures = lines[0].partition("; old ")[2]
    return "\n".join([f"{reason}; old {figures}" if figures else reason, *lines[1:]])


def compare_predictions(job: HostJob, policy: CanaryPolicy) -> str:
    """Send the sample of requests to both sides (and to the old side twice, for the noise
    floor), request k to the host's taking-part instance k mod n, and compare the answers;
    raise GateFailed with the worst examples."""
    rules = policy.comparison
    corpus = load_corpus(rules.corpus) if rules.corpus else []
    requests = sample_corpus(golden_corpus(job.run.golden), corpus, limit=rules.samples,
                             seed=rules.seed)
    instances = canary_instances(job)
    answers: dict[str, list[Any]] = {"old": [], "new": [], "noise": []}
    clients: dict[tuple[int, str], Any] = {}
    try:
        for number, request in enumerate(requests):
            instance = instances[number % len(instances)]
            for name, side in (("old", "old"), ("new", "new"), ("noise", "old")):
                key = (instance.index, side)
                if key not in clients:
                    clients[key] = grpc_client(job, job.ports.slot_grpc(
                        side_slot(instance, side), instance.index))
                answers[name].append(clients[key].predict(request.inputs,
                                                          signature=request.signature)[0])
    finally:
        for client in clients.values():
            client.close()
    result = compare(answers["old"], answers["new"], answers["noise"], rules,
                     sources=[r.source for r in requests])
    job.canary_comparison = result.as_dict()
    if result.verdict is Verdict.FAIL:
        raise GateFailed("canary_steps", "the new slots' predictions as the old slots'",
                         result.describe())
    return result.describe()


def canary_record(job: HostJob, state: CanaryState, weight: int) -> CanaryRecord:
    """The canary's state as the host records it."""
    policy = job.run.canary
    assert policy is not None
    return CanaryRecord(state=state, weights=policy.weights, weight=weight,
                        steps=tuple(job.canary_steps), comparison=job.canary_comparison,
                        updated_at=now_iso())


def weight_change(job: HostJob, weight: int) -> ProxyCommands:
    """Every taking-part instance's new slot at ``weight`` % and its old slot at the rest:
    the host's share, whatever its instances."""
    old_weight, new_weight = weights_for(weight)
    commands: list[str] = []
    for i in canary_instances(job):
        commands += (weight_commands(i.index, i.new_slot, new_weight)
                     + weight_commands(i.index, side_slot(i, "old"), old_weight)
                     + set_state(i.index, i.new_slot, "ready"))
    where = ", ".join(f"i{i.index} {i.new_slot}" for i in canary_instances(job))
    several = len(canary_instances(job)) > 1
    return ProxyCommands(tuple(commands), f"proxy: {weight}% of the host's requests to the new "
                         f"slot{'s' if several else ''} ({where}), {100 - weight}% to the old")


@operation("canary_steps", gate=True)
def canary_steps(job: HostJob) -> Ops:
    """The weighted steps of the first batch's hosts, once per host (nothing elsewhere, nor
    without a canary policy, nor where nothing served before)."""
    policy = job.run.canary
    if policy is None or not job.canary_host:
        return "no canary steps here"
    if not canary_instances(job):
        return "nothing served here before: no canary to compare against"
    if not job.last_instance:
        return "the host's instances step together once its last instance is up"
    for number, weight in enumerate(policy.weights):
        yield weight_change(job, weight)
        for instance in canary_instances(job):
            instance.switched = instance.took_traffic = instance.weighted = True
        if number == 0 and policy.comparison.enabled:
            yield Check(f"compare both sides' predictions on {policy.comparison.samples} "
                        "requests", lambda: compare_predictions(job, policy))
        yield Check(f"hold {policy.step_s:g} s at {weight}% and judge the new slots against "
                    "the old", lambda w=weight: judge_step(job, policy, w))  # type: ignore[misc]
    if policy.pause:
        record = job.release_record(ReleaseStatus.PAUSED)
        paused = canary_record(job, CanaryState.PAUSED, policy.weights[-1])
        yield WriteFile(f"{job.paths.release_dir(job.run.release_id)}/manifest.json",
                        record.model_copy(update={"canary": paused.as_dict()}).to_json())
        raise CanaryPaused(f"holding {policy.weights[-1]}% on {job.name}")
    return f"canary steps {', '.join(f'{w}%' for w in policy.weights)} passed"
