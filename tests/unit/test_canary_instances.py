"""A canary on a host with two GPU instances, on fake hosts: the weight is the host's share,
so both instances step (and pause) at the same weight together and are judged together; a
failed step restores both; abort and promote act on both."""

from __future__ import annotations

from typing import Any

import pytest

from tfsdeploy.core.errors import ExitCode
from tfsdeploy.core.inventory.canary_policy import CanaryPolicy
from tfsdeploy.core.rollout.gates import GateFailed
from tfsdeploy.run.canary import finish_canary
from tfsdeploy.run.deploy import deploy
from tfsdeploy.run.jobs import HostJob, Verb
from tfsdeploy.run.operations import canary as canary_ops

from .fakes import FakeFleet, FakeSlot, FrozenClock
from .runs import Recorder, run_deploy, serving, target

TWO = {"count": 1, "gpus": 2, "on_failure": "stay"}


def _weights(fleet: FakeFleet) -> dict[str, int]:
    """Each gRPC server's weight on h1's proxy (those taking new requests)."""
    proxy = fleet["h1"].proxy
    return {server: proxy.weights[(backend, server)] for backend, server in proxy.servers
            if backend == "grpc" and proxy.servers[(backend, server)] != "MAINT"}


def _canary(world: dict[str, Any], monkeypatch: pytest.MonkeyPatch,
            judged: list[dict[str, Any]] | None = None, *, fail: bool = False,
            pause: bool = True) -> Any:
    """v2 deployed with a canary of 10 then 30 %, its steps judged by a stand-in that notes
    what the proxy and the instances were at (``judged``) and fails when ``fail``."""
    judged = [] if judged is None else judged
    fleet: FakeFleet = world["fleet"]

    def judge(job: HostJob, policy: CanaryPolicy, weight: int) -> str:
        judged.append({"weight": weight, "proxy": _weights(fleet),
                       "instances": [i.index for i in canary_ops.canary_instances(job)],
                       "started": [i.started for i in job.instances]})
        if fail:
            raise GateFailed("canary_steps", "as good", "slower")
        return "as good"

    monkeypatch.setattr(canary_ops, "judge_step", judge)
    monkeypatch.setattr(canary_ops, "compare_predictions", lambda job, policy: "same")
    return deploy(target(world, **TWO), version=2, reporter=Recorder(), connect=fleet.connect,
                  clock=FrozenClock(), client_factory=FakeSlot,
                  canary=CanaryPolicy(weights=(10, 30), step_s=1, pause=pause))


@pytest.fixture
def two(world: dict[str, Any]) -> dict[str, Any]:
    first = run_deploy(world, 1, **TWO)
    assert first.exit_code == ExitCode.OK, first.message
    world["v1"] = first.release_id
    return world


def test_both_instances_step_and_pause_at_each_weight_together(
        two: dict[str, Any], monkeypatch: pytest.MonkeyPatch) -> None:
    judged: list[dict[str, Any]] = []
    paused = _canary(two, monkeypatch, judged)
    assert paused.exit_code == ExitCode.PAUSED, paused.message
    # every step judged once for the host, both instances' new slots up and at the weight
    assert [j["weight"] for j in judged] == [10, 30]
    for step in judged:
        assert step["instances"] == [0, 1] and step["started"] == [True, True]
        new = {s: w for s, w in step["proxy"].items() if w == step["weight"]}
        old = {s: w for s, w in step["proxy"].items() if w == 100 - step["weight"]}
        assert len(new) == len(old) == 2 and {s[:2] for s in new} == {"i0", "i1"}, step
    fleet: FakeFleet = two["fleet"]
    assert sorted(_weights(fleet).values()) == [30, 30, 70, 70]  # paused: 30 % of the host
    assert sorted(serving(fleet["h1"])) == sorted([two["v1"]] * 2 + [paused.release_id] * 2)


def test_abort_returns_both_instances(
        two: dict[str, Any], monkeypatch: pytest.MonkeyPatch) -> None:
    paused = _canary(two, monkeypatch)
    fleet: FakeFleet = two["fleet"]
    aborted = finish_canary(Verb.ABORT, target(two, **TWO), reporter=Recorder(),
                            connect=fleet.connect, clock=FrozenClock(), client_factory=FakeSlot)
    assert aborted.exit_code == ExitCode.OK, aborted.message
    assert serving(fleet["h1"]) == [two["v1"]] * 2
    assert sorted(_weights(fleet).values()) == [100, 100]
    assert paused.release_id not in serving(fleet["h1"])


def test_promote_switches_both_instances(
        two: dict[str, Any], monkeypatch: pytest.MonkeyPatch) -> None:
    paused = _canary(two, monkeypatch)
    fleet: FakeFleet = two["fleet"]
    promoted = finish_canary(Verb.PROMOTE, target(two, **TWO), reporter=Recorder(),
                             connect=fleet.connect, clock=FrozenClock(),
                             client_factory=FakeSlot)
    assert promoted.exit_code == ExitCode.OK, promoted.message
    assert serving(fleet["h1"]) == [paused.release_id] * 2
    assert sorted(_weights(fleet).values()) == [100, 100]


def test_a_failed_step_restores_both_instances_even_under_stay(
        two: dict[str, Any], monkeypatch: pytest.MonkeyPatch) -> None:
    judged: list[dict[str, Any]] = []
    failed = _canary(two, monkeypatch, judged, fail=True, pause=False)
    # under on_failure "stay" a failed roll ends in 3 whatever was restored (engine.stop_roll)
    assert failed.exit_code == ExitCode.INCONSISTENT, failed.message
    assert failed.hosts["h1"].status == "reverted", failed.hosts["h1"]
    assert [j["weight"] for j in judged] == [10]
    fleet: FakeFleet = two["fleet"]
    assert serving(fleet["h1"]) == [two["v1"]] * 2
    assert sorted(_weights(fleet).values()) == [100, 100]
