"""`fab rollback` within the rollback window, and the unattended outputs, on the real testbed.

v1 then v2 are deployed with Rollout(window_s=600): v1's container stays running (drained)
beside v2. A rollback must then be a gated switch back: no `docker run`, no `docker start`,
the same containers (ids, start times), v1's outputs on every host's stable port.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from rollback_support import (
    Fleet,
    Prober,
    deploy_v1_then_v2,
    fleet_fixture,
    json_from,
    release_of,
    step_seconds,
)
from testbed_support import HOSTS, Run

pytestmark = pytest.mark.testbed

MODEL, OFFSET = "rbk1", 300


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    yield from fleet_fixture(tmp_path_factory, MODEL, OFFSET, window_s=600.0, serial=(1,))


@pytest.fixture(scope="module")
def v1_then_v2(fleet: Fleet) -> dict[str, str]:
    """v1 then v2 deployed everywhere; returns each release id by version."""
    deploy_v1_then_v2(fleet)
    return {f"v{version}": release_of(fleet, version) for version in (1, 2)}


@dataclass(frozen=True)
class InWindowRollback:
    """The rollback the module's tests look at, run once under a prober, with what the
    hosts held before and after it and its unattended outputs (``out``)."""

    run: Run
    out: Path
    before: dict[str, list[dict[str, Any]]]
    after: dict[str, list[dict[str, Any]]]
    proxies_before: dict[str, dict[str, Any] | None]
    proxies_after: dict[str, dict[str, Any] | None]
    audit: dict[str, list[dict[str, Any]]]  # each host's audit lines the rollback wrote
    prober: Prober


@pytest.fixture(scope="module")
def rolled_back(fleet: Fleet, v1_then_v2: dict[str, str]) -> InWindowRollback:
    """`fab rollback` within the window, with the unattended outputs, under live probes."""
    before = {h: fleet.containers(h) for h in HOSTS}
    proxies = {h: fleet.proxy(h) for h in HOSTS}
    audit_before = {h: len(fleet.audit(h)) for h in HOSTS}
    out = fleet.tmp / "unattended"
    with Prober(fleet) as prober:
        run = fleet.fab("rollback", "--log-file", str(out / "rollback.log"),
                        "--json-file", str(out / "rollback.json"),
                        "--metrics-file", str(out / "tfsdeploy.prom"))
    return InWindowRollback(
        run=run, out=out, before=before, after={h: fleet.containers(h) for h in HOSTS},
        proxies_before=proxies, proxies_after={h: fleet.proxy(h) for h in HOSTS},
        audit={h: fleet.audit(h)[audit_before[h]:] for h in HOSTS}, prober=prober)


def test_instant_rollback_within_the_window(v1_then_v2: dict[str, str],
                                            rolled_back: InWindowRollback, fleet: Fleet) -> None:
    v1, v2 = v1_then_v2["v1"], v1_then_v2["v2"]
    for host, containers in rolled_back.before.items():
        assert {c["release"]: c["status"] for c in containers} == {v1: "running",
                                                                   v2: "running"}, (
            f"{host}: within the window both releases run: {containers}")
    run, prober = rolled_back.run, rolled_back.prober
    assert run.code == 0, run.describe()
    # within the window a rollback is a gated switch back: what proves it is below (no
    # container created or started, the same proxy, only the switch's steps); its speed is
    # benchmarks/bench_rollback.py's figure
    result = json.loads((rolled_back.out / "rollback.json").read_text())
    print(f"in-window rollback: {result['seconds']:.1f} s, "
          f"{step_seconds(result):.1f} s of it in gates")
    assert result["release"] == v1 and result["exit_code"] == 0

    fleet.assert_serving(1)
    assert not prober.failures(), prober.summary()
    for host in HOSTS:
        seen = prober.versions(host)
        assert seen and seen[-1] == 1 and set(seen) <= {1, 2}, f"{host}: {seen[-20:]}"

    # no container was created, started or restarted: the very same ones, same start times
    for host in HOSTS:
        assert [(c["id"], c["started"], c["status"], c["restarts"])
                for c in rolled_back.after[host]] == \
               [(c["id"], c["started"], c["status"], c["restarts"])
                for c in rolled_back.before[host]], (
            f"{host}: containers changed during an in-window rollback")
        assert rolled_back.proxies_after[host] == rolled_back.proxies_before[host], (
            f"{host}: the proxy was restarted")
        audit = rolled_back.audit[host]
        steps = [e["event"] for e in audit]  # one line per change: the steps, in order
        steps = [s for i, s in enumerate(steps) if i == 0 or steps[i - 1] != s]
        assert steps == ["switch_traffic", "drain_old", "record_release"], (
            f"{host}: an in-window rollback is a switch back, nothing else: {audit}")
    assert "still running" in run.stdout and "no model load" in run.stdout, run.describe()
    assert "skipped: the container was already running and warm" in run.stdout, run.describe()

    # the records: v1 current, v2 rolled back
    for host in HOSTS:
        assert fleet.current(host)["id"] == v1
        releases = fleet.releases(host)
        assert releases[v2]["status"] == "rolled_back", releases[v2]
        assert releases[v1]["status"] == "serving", releases[v1]


@pytest.mark.usefixtures("rolled_back")  # the state the rollback left
def test_status_shows_traffic_on_the_old_slot(fleet: Fleet, v1_then_v2: dict[str, str]
                                              ) -> None:
    v1 = v1_then_v2["v1"]
    run = fleet.fab("status", "--json")
    assert run.code == 0, run.describe()
    rows = {r["host"]: r for r in json_from(run.stdout)}
    assert set(rows) == set(HOSTS)
    for host, row in rows.items():
        assert row["reachable"] and row["current"] == v1 and row["version"] == 1, row
        v1_slot = next(c["slot"] for c in fleet.containers(host) if c["release"] == v1)
        assert row["traffic_slot"] == v1_slot, row
        assert row["drift"] == [], row
        assert row["lock"] is None, row
        served = next(c for c in row["slots"][v1_slot] if c["release"] == v1)
        assert served["running"] and any(v.get("version") == 1 and v.get("state") ==
                                         "AVAILABLE" for v in served["versions"]), served
    table = fleet.fab("status")
    assert table.code == 0, table.describe()
    assert v1 in table.stdout


@pytest.mark.usefixtures("rolled_back")  # the state the rollback left
def test_history_shows_the_rollback(fleet: Fleet, v1_then_v2: dict[str, str]) -> None:
    v1, v2 = v1_then_v2["v1"], v1_then_v2["v2"]
    run = fleet.fab("history", "--json")
    assert run.code == 0, run.describe()
    rows = {r["host"]: r for r in json_from(run.stdout)}
    for row in rows.values():
        statuses = {r["id"]: r["status"] for r in row["releases"]}
        assert statuses[v1] == "serving" and statuses[v2] == "rolled_back", statuses
        events = [(e["event"], e["release"]) for e in row["audit"]]
        assert ("switch_traffic", v1) in events and ("record_release", v1) in events, events
        # the switch back is after v2's record
        assert events.index(("record_release", v1), events.index(("record_release", v2))) > 0
    table = fleet.fab("history")
    assert table.code == 0 and "rolled_back" in table.stdout, table.describe()


def test_unattended_outputs_of_the_rollback(rolled_back: InWindowRollback) -> None:
    """The files the in-window rollback wrote for cron: log lines, JSON, textfile."""
    out = rolled_back.out
    result = json.loads((out / "rollback.json").read_text())
    assert result["command"] == "rollback" and result["exit_code"] == 0
    assert result["result"] == "ok" and set(result["hosts"]) == set(HOSTS)
    assert all(h["status"] == "rolled" for h in result["hosts"].values()), result["hosts"]
    lines = (out / "rollback.log").read_text().splitlines()
    stamped = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d \[\s*\d+\.\d+s\] ")
    assert lines and all(stamped.match(line) or line.startswith(" ") for line in lines), lines
    assert any("switch_traffic" in line and "ok" in line for line in lines), lines
    check_textfile((out / "tfsdeploy.prom").read_text(), MODEL, "rollback", 0)


@pytest.mark.usefixtures("rolled_back")  # the state the rollback left
def test_failing_rollback_is_never_exit_0(fleet: Fleet, v1_then_v2: dict[str, str]) -> None:
    out = fleet.tmp / "unattended"
    before = {h: fleet.current(h)["id"] for h in HOSTS}
    run = fleet.fab("rollback", "--to", "r20000101-000000000-v9", "--json-file",
                    str(out / "bad.json"), "--metrics-file", str(out / "tfsdeploy.prom"),
                    "--log-file", str(out / "bad.log"))
    assert run.code == 1, run.describe()
    assert "not retained" in run.out, run.describe()
    assert {h: fleet.current(h)["id"] for h in HOSTS} == before
    # the unattended outputs must say it failed too (a cron job reads only those)
    samples = parse_textfile((out / "tfsdeploy.prom").read_text())
    key = f'tfsdeploy_last_run_exit_code{{command="rollback",model="{MODEL}"}}'
    assert key in samples, samples
    assert samples[key] != 0, (
        f"the textfile still says the last rollback exited {samples[key]:g} after a rollback "
        f"that exited {run.code}:\n" + (out / "tfsdeploy.prom").read_text())
    assert (out / "bad.json").exists(), "no --json-file written for a failed rollback"
    assert json.loads((out / "bad.json").read_text())["exit_code"] == 1


@pytest.mark.usefixtures("rolled_back")  # the state the rollback left
def test_rollback_json_on_stdout(fleet: Fleet, v1_then_v2: dict[str, str]) -> None:
    """`--json`: the result as JSON on stdout; nothing to do (v1 serves already) is still a
    valid run, exit 0, every host unchanged."""
    run = fleet.fab("rollback", "--to", v1_then_v2["v1"], "--json")
    data = json_from(run.stdout)
    assert data["exit_code"] == run.code and data["command"] == "rollback", run.describe()
    assert run.code == 0, run.describe()
    assert {h: r["status"] for h, r in data["hosts"].items()} == dict.fromkeys(HOSTS,
                                                                            "unchanged"), data
    fleet.assert_serving(1)


SAMPLE = re.compile(r'^(?P<name>[a-zA-Z_:][a-zA-Z0-9_:]*)(?P<labels>\{[^}]*\})?\s+(?P<value>\S+)$')


def parse_textfile(text: str) -> dict[str, float]:
    """node_exporter textfile format: HELP/TYPE comments, then ``name{labels} value``."""
    samples = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            assert re.match(r"^# (HELP|TYPE) \S+ .+$", line) or not line, line
            continue
        match = SAMPLE.match(line)
        assert match, f"not a sample line: {line!r}"
        float(match["value"])
        samples[match["name"] + (match["labels"] or "")] = float(match["value"])
    return samples


def check_textfile(text: str, model: str, command: str, exit_code: int) -> dict[str, float]:
    samples = parse_textfile(text)
    types = dict(re.findall(r"^# TYPE (\S+) (\S+)$", text, re.M))
    labels = f'{{command="{command}",model="{model}"}}'
    for name in ("tfsdeploy_last_run_exit_code", "tfsdeploy_last_run_timestamp_seconds",
                 "tfsdeploy_last_run_duration_seconds"):
        assert name + labels in samples, (name, text)
        assert types.get(name) == "gauge", (name, types)
    assert samples["tfsdeploy_last_run_exit_code" + labels] == exit_code
    if exit_code == 0:
        assert "tfsdeploy_last_success_timestamp_seconds" + labels in samples, text
    return samples
