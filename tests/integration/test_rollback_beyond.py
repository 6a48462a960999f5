"""`fab rollback` beyond the window (window_s=0: the old release's container is stopped) and
`fab rollback --to` an older release, on the real testbed: tb1 and tb2 (serial [1, "100%"]:
a first and a second batch; every assertion is per host)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from rollback_support import (
    Fleet,
    Prober,
    fleet_fixture,
    json_from,
    release_of,
)
from testbed_support import TWO_HOSTS

pytestmark = pytest.mark.testbed

MODEL, OFFSET = "rbk2", 400


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    yield from fleet_fixture(tmp_path_factory, MODEL, OFFSET, window_s=0.0,
                             serial=(1, "100%"), keep_releases=5, hosts=TWO_HOSTS)


def test_rollback_beyond_the_window_starts_the_old_release_again(fleet: Fleet) -> None:
    fleet.deploy(1)
    fleet.deploy(2)
    v1, v2 = release_of(fleet, 1), release_of(fleet, 2)
    before = {}
    for host in fleet.hosts:
        state = {c["release"]: c for c in fleet.containers(host)}
        assert state[v1]["status"] == "exited", f"{host}: beyond the window v1 is stopped"
        assert state[v2]["status"] == "running"
        before[host] = state[v1]

    with Prober(fleet) as prober:
        run = fleet.fab("rollback", "--json")
    assert run.code == 0, run.describe()
    result = json_from(run.stdout)
    assert result["release"] == v1 and result["exit_code"] == 0
    fleet.assert_serving(1)
    assert not prober.failures(), prober.summary()

    for host in fleet.hosts:
        outcome = result["hosts"][host]
        steps = {s["step"]: s for s in outcome["steps"]}
        # started again (the stopped container, from its record), then gated like a deploy
        assert "started again" in steps["resume_release"]["detail"], steps["resume_release"]
        for gate in ("gate_available", "gate_signature", "gate_health"):
            assert steps[gate]["ok"], steps[gate]
        state = {c["release"]: c for c in fleet.containers(host)}
        assert state[v1]["status"] == "running"
        assert state[v1]["id"] == before[host]["id"], "the retained container was reused"
        assert state[v1]["started"] != before[host]["started"], "v1 was started again"
        assert fleet.current(host)["id"] == v1
        assert fleet.releases(host)[v2]["status"] == "rolled_back"
        # after the rollback the release rolled back from is stopped (beyond the window)
        assert state[v2]["status"] == "exited", state[v2]


def test_rollback_to_an_older_release_recreates_it_from_its_record(fleet: Fleet) -> None:
    """v1, v2, v3 in turn (v1 and v3 share a slot); `fab rollback --to` v1 re-creates v1's
    container from its record on the host (files, image, version) in the other slot."""
    fleet.deploy(2)
    fleet.deploy(3)
    fleet.assert_serving(3)
    v1 = release_of(fleet, 1)
    records = {h: fleet.releases(h)[v1] for h in fleet.hosts}
    with Prober(fleet) as prober:
        run = fleet.fab("rollback", "--to", v1, "--json")
    assert run.code == 0, run.describe()
    result = json_from(run.stdout)
    assert result["release"] == v1
    fleet.assert_serving(1)
    assert not prober.failures(), prober.summary()
    for host in fleet.hosts:
        steps = {s["step"]: s for s in result["hosts"][host]["steps"]}
        assert "re-created from its record" in steps["resume_release"]["detail"], steps
        # a fresh container is not warm: the warmup gate ran
        assert steps["gate_warmup"]["ok"] and "skipped" not in steps["gate_warmup"]["detail"]
        running = [c for c in fleet.containers(host) if c["status"] == "running"]
        assert [c["release"] for c in running] == [v1], running
        current = fleet.current(host)
        assert current["id"] == v1 and current["status"] == "serving"
        # the release is the one recorded by the first deploy: same version, image, files
        for key in ("version", "image", "files", "flags", "gpu_fraction"):
            assert current[key] == records[host][key], (key, current[key], records[host][key])
        assert current["slot"] == running[0]["slot"], (current["slot"], running[0])


def test_default_rollback_never_returns_to_a_rolled_back_release(fleet: Fleet) -> None:
    """On v1 after `--to v1`: the default target is v3 (rolled back from, excluded) or v2
    (served well, never rolled back from), never a release marked rolled_back."""
    statuses = {}
    for host in fleet.hosts:
        statuses[host] = {m["id"]: (m["version"], m["status"])
                          for m in fleet.releases(host).values()}
    run = fleet.fab("rollback", "--json")
    result = json_from(run.stdout)
    target = result["release"]
    for host in fleet.hosts:
        assert statuses[host][target][1] == "serving", (target, statuses[host])
    assert run.code == 0, run.describe()
    fleet.assert_serving(statuses["tb1"][target][0])
