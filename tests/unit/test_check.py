"""`fab deploy --check` lists exactly what the deploy that follows does: the check's planned
changes equal the changes the run records in each host's audit log, step by step."""

from __future__ import annotations

import re
from functools import partial
from typing import Any

import pytest

from tfsdeploy.core.errors import ExitCode
from tfsdeploy.core.rollout.records import parse_audit
from tfsdeploy.run import engine
from tfsdeploy.run.deploy import check
from tfsdeploy.run.engine import PlannedStep

from . import runs
from .fakes import FakeFleet, FakeHost
from .runs import MODEL

# two hosts are enough for what these tests show
run_deploy = partial(runs.run_deploy, count=2)
target = partial(runs.target, count=2)

Plan = dict[str, list[PlannedStep]]


def _checked(world: dict[str, Any], version: int, monkeypatch: pytest.MonkeyPatch,
             gpus: int = 1) -> tuple[str, Plan, list[dict[str, Any]]]:
    """Run `deploy --check` and keep the engine's plan (its changes, with their kinds)."""
    seen: list[Any] = []
    real = engine.check

    def spy(*args: Any, **kwargs: Any) -> Any:
        seen.append(real(*args, **kwargs))
        return seen[-1]

    monkeypatch.setattr(engine, "check", spy)
    fleet: FakeFleet = world["fleet"]
    rows = check(target(world, gpus=gpus), version=version, connect=fleet.connect)
    context, plans, _ = seen[0]
    assert all(isinstance(p, list) for p in plans.values())
    return context.release_id, plans, rows


def _planned(plan: list[PlannedStep], checked_id: str, run_id: str) -> list[tuple[str, ...]]:
    return [(s.step, c.kind, c.describe().replace(checked_id, run_id))
            for s in plan for c in s.changes if c.audited]


def _recorded(host: FakeHost, run_id: str) -> list[tuple[str, ...]]:
    entries = parse_audit((host.dir / "r" / MODEL / "audit.log").read_text())
    return [(e.event, e.details["kind"], e.details["change"]) for e in entries
            if e.release == run_id and "change" in e.details]


def _without_record_sizes(lines: list[tuple[str, ...]]) -> list[tuple[str, ...]]:
    return [(*line[:2], RECORD_SIZE.sub("manifest.json", line[2])) for line in lines]


RECORD_SIZE = re.compile(r"manifest\.json \(\d+ bytes\)")
VERSIONS = pytest.mark.parametrize("versions", [(1,), (1, 2)], ids=["first deploy", "roll to v2"])


def _check_then_run(world: dict[str, Any], versions: tuple[int, ...],
                    monkeypatch: pytest.MonkeyPatch, gpus: int = 1
                    ) -> dict[str, tuple[list[tuple[str, ...]], list[tuple[str, ...]]]]:
    """Per host: (the check's planned changes, the run's recorded changes)."""
    for version in versions[:-1]:
        assert run_deploy(world, version, gpus=gpus).exit_code == ExitCode.OK
    checked_id, plans, rows = _checked(world, versions[-1], monkeypatch, gpus)
    # what the check prints is the engine's plan, change by change
    assert [c["what"] for row in rows for step in row["steps"] for c in step["changes"]] == [
        c.describe() for row in rows for s in plans[row["host"]] for c in s.changes]
    run = run_deploy(world, versions[-1], gpus=gpus)
    assert run.exit_code == ExitCode.OK, run.message
    fleet: FakeFleet = world["fleet"]
    compared = {name: (_planned(plan, checked_id, run.release_id),
                       _recorded(fleet[name], run.release_id)) for name, plan in plans.items()}
    assert len(compared) == 2 and all(planned for planned, _ in compared.values())
    return compared


@VERSIONS
@pytest.mark.parametrize("gpus", [1, 2], ids=["one GPU", "one server per GPU on two"])
def test_the_check_plans_what_the_run_then_does(world: dict[str, Any], versions: tuple[int, ...],
                                                gpus: int, monkeypatch: pytest.MonkeyPatch
                                                ) -> None:
    compared = _check_then_run(world, versions, monkeypatch, gpus)
    for name, (planned, recorded) in compared.items():
        assert _without_record_sizes(recorded) == _without_record_sizes(planned), name
        started = [line for line in recorded if line[0] == "start_slot"]
        assert len(started) == gpus, started


@VERSIONS
def test_the_check_plans_the_records_the_run_writes_byte_for_byte(
        world: dict[str, Any], versions: tuple[int, ...], monkeypatch: pytest.MonkeyPatch) -> None:
    for name, (planned, recorded) in _check_then_run(world, versions, monkeypatch).items():
        assert recorded == planned, name
