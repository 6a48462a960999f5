"""Canary steps on live traffic: on the first batch's hosts, after the gates, the proxy sends
``w`` % of the stable ports' requests to the new slot, step by step; each step is judged new
slot against old slot on the same host over the same interval (``canary.step_analysis``), and
the predictions of both slots are compared on a sample of requests (``compare``). A failed
step or comparison stops the roll (the host is restored by the rescue list). With ``pause``
the run ends after the last step, holding the canary at that weight, its state recorded on the
hosts; ``fab promote`` or ``fab abort`` finish it."""

from __future__ import annotations

from typing import Any

from tfsdeploy.core.canary.compare import compare, golden_corpus, load_corpus, sample_corpus
from tfsdeploy.core.canary.steps import Action, CanaryRecord, CanaryState, decide, step_analysis
from tfsdeploy.core.inventory.canary_policy import CanaryPolicy, Verdict, weights_for
from tfsdeploy.core.observe.guard import Scrape, parse_metrics
from tfsdeploy.core.render.host_proxy import set_state, weight_commands
from tfsdeploy.core.rollout.gates import GateFailed
from tfsdeploy.core.rollout.records import ReleaseStatus, now_iso
from tfsdeploy.hosts import probes
from tfsdeploy.run.changes import Check, ProxyCommands, WriteFile
from tfsdeploy.run.jobs import HostJob
from tfsdeploy.run.operations.gates import grpc_client
from tfsdeploy.run.operations.step import Ops, operation


class CanaryPaused(Exception):
    """The canary reached its last step and holds there (``pause``): not a failure."""

    benign = True  # the audit log records no failure for it


def scrape_slot(job: HostJob, slot: str) -> Scrape:
    """One read of the TFServing metrics of the current instance's ``slot``."""
    port = job.ports.slot_rest(slot, job.instance.index)
    return parse_metrics(probes.metrics(job.host.address, port, job.host.vars.monitoring_path),
                         job.model.name)


def judge_step(job: HostJob, policy: CanaryPolicy, weight: int) -> str:
    """Hold the step ``step_s`` (extended while too little traffic came, as the policy says)
    and judge it; raise GateFailed naming the failing figure with both values."""
    assert job.old is not None
    old_slot, new_slot = job.old.slot, job.new_slot
    old_before, new_before = scrape_slot(job, old_slot), scrape_slot(job, new_slot)
    extensions = 0
    while True:
        job.run.clock.sleep(policy.step_s)
        result = step_analysis(old_before, scrape_slot(job, old_slot), new_before,
                               scrape_slot(job, new_slot), policy, weight=weight)
        decision = decide(result, policy, extensions=extensions)
        if decision.action is Action.EXTEND:
            extensions += 1
            continue
        job.canary_steps.append(result.as_dict())
        if decision.action is Action.STOP:
            raise GateFailed("canary_steps", f"the new slot as good as the old at {weight}%",
                             f"{decision.reason}; {result.describe()}")
        return result.describe()


def compare_predictions(job: HostJob, policy: CanaryPolicy) -> str:
    """Send the sample of requests to both slots (and to the old one twice, for the noise
    floor) and compare the answers; raise GateFailed with the worst examples."""
    rules = policy.comparison
    corpus = load_corpus(rules.corpus) if rules.corpus else []
    requests = sample_corpus(golden_corpus(job.run.golden), corpus, limit=rules.samples,
                             seed=rules.seed)
    assert job.old is not None
    answers: dict[str, list[Any]] = {}
    for name, slot in (("old", job.old.slot), ("new", job.new_slot), ("noise", job.old.slot)):
        client = grpc_client(job, job.ports.slot_grpc(slot, job.instance.index))
        try:
            answers[name] = [client.predict(r.inputs, signature=r.signature)[0]
                             for r in requests]
        finally:
            client.close()
    result = compare(answers["old"], answers["new"], answers["noise"], rules,
                     sources=[r.source for r in requests])
    job.canary_comparison = result.as_dict()
    if result.verdict is Verdict.FAIL:
        raise GateFailed("canary_steps", "the new slot's predictions as the old slot's",
                         result.describe())
    return result.describe()


def canary_record(job: HostJob, state: CanaryState, weight: int) -> CanaryRecord:
    """The canary's state as the host records it."""
    policy = job.run.canary
    assert policy is not None
    return CanaryRecord(state=state, weights=policy.weights, weight=weight,
                        steps=tuple(job.canary_steps), comparison=job.canary_comparison,
                        updated_at=now_iso())


@operation("canary_steps", gate=True)
def canary_steps(job: HostJob) -> Ops:
    """The weighted steps of the first batch's hosts (nothing elsewhere, nor without a canary
    policy, nor where nothing served before)."""
    policy = job.run.canary
    if policy is None or job.name not in job.run.canary_hosts:
        return "no canary steps here"
    if job.old is None:
        return "nothing served here before: no canary to compare against"
    index, old, new = job.instance.index, job.old.slot, job.new_slot
    for weight in policy.weights:
        old_weight, new_weight = weights_for(weight)
        yield ProxyCommands(tuple(weight_commands(index, new, new_weight)
                                  + weight_commands(index, old, old_weight)
                                  + set_state(index, new, "ready")),
                            f"proxy: {weight}% of requests to {new}, {100 - weight}% to {old}")
        job.switched = job.took_traffic = job.weighted = True
        yield Check(f"hold {policy.step_s:g} s at {weight}% and judge the new slot against "
                    "the old", lambda w=weight: judge_step(job, policy, w))  # type: ignore[misc]
    if policy.comparison.enabled:
        yield Check(f"compare both slots' predictions on {policy.comparison.samples} "
                    "requests", lambda: compare_predictions(job, policy))
    if policy.pause and job.last_instance:
        record = job.release_record(ReleaseStatus.PAUSED)
        paused = canary_record(job, CanaryState.PAUSED, policy.weights[-1])
        yield WriteFile(f"{job.paths.release_dir(job.run.release_id)}/manifest.json",
                        record.model_copy(update={"canary": paused.as_dict()}).to_json())
        raise CanaryPaused(f"holding {policy.weights[-1]}% on {job.name}")
    return f"canary steps {', '.join(f'{w}%' for w in policy.weights)} passed"
