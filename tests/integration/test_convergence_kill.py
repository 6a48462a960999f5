"""kill -9 of `fab deploy` at several points, each followed by `fab deploy` again (converges,
breaks the dead process's stale lock) and by `fab rollback` (works), while every host's stable
port is probed from background threads: no probe may ever fail (v1 serves before the first
kill, so some release always exists).

Two hosts (tb1, tb2) prove what three would: with serial [1, "100%"] tb1 is batch 1 and tb2
batch 2, so every kill point has a host rolled and a host not yet started."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from rollback_support import (
    Fleet,
    Prober,
    fleet_fixture,
    json_from,
)
from testbed_support import TWO_HOSTS

pytestmark = pytest.mark.testbed

MODEL, OFFSET = "rbk5", 700

# where to kill: the first progress line matching the pattern (serial [1, "100%"]: tb1 is the
# canary, so "tb1 ... switch_traffic ok" kills with tb1 switched and tb2 not yet started)
KILL_POINTS = {
    "after_start_slot": r"tb1 +roll +start_slot +ok",
    "during_gate_health": r"tb1 +roll +gate_warmup +ok",
    "after_switch_traffic": r"tb1 +roll +switch_traffic +ok",
    "during_second_batch": r"== batch 2/2",
    "during_finalize": r"finalize +retire_old +ok",
}


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    # keep_releases is raised so that the many v2 releases of the killed deploys never prune
    # v1, the rollback target (retention itself is tested in test_rollback_retention.py)
    yield from fleet_fixture(tmp_path_factory, MODEL, OFFSET, window_s=0.0,
                             serial=(1, "100%"), keep_releases=20, hosts=TWO_HOSTS)


@pytest.fixture(scope="module")
def v1(fleet: Fleet) -> str:
    fleet.deploy(1)
    fleet.assert_serving(1)
    return next(iter(fleet.releases("tb1")))


@pytest.mark.parametrize("point", list(KILL_POINTS))
def test_kill_9_then_deploy_then_rollback(fleet: Fleet, v1: str, point: str) -> None:
    fleet.assert_serving(1)
    log = fleet.tmp / f"killed-{point}.log"
    with Prober(fleet) as prober:
        prober.mark("the deploy to be killed")
        killed = fleet.background("deploy", "--version", "2", "--log-file", str(log),
                                  own_session=True)
        line = killed.kill_when(KILL_POINTS[point])
        assert killed.proc.returncode == -9, killed.describe()
        assert fleet.lock_dir_exists(), "the dead deploy's lock should still be there"

        # (a) deploy again: breaks the stale lock, converges, every host on v2
        prober.mark("`fab deploy` again")
        again = fleet.fab("deploy", "--version", "2", "--json")
        assert again.code == 0, f"killed at: {line}\n{again.describe()}"
        assert "broke a stale lock" in again.out, again.describe()
        result = json_from(again.stdout)
        assert set(result["hosts"]) == set(fleet.hosts)
        fleet.assert_serving(2)
        for host in fleet.hosts:
            running = [c for c in fleet.containers(host) if c["status"] == "running"]
            assert len(running) == 1 and running[0]["version"] == "2", (host, running)
            current = fleet.current(host)
            assert current["version"] == 2 and current["id"] == running[0]["release"], (
                host, current["id"], running)
            assert fleet.proxy(host)["status"] == "running"
        assert not fleet.lock_dir_exists()
        deployed = {h: fleet.current(h)["id"] for h in fleet.hosts}

        # (b) roll back: v1 everywhere again
        prober.mark("`fab rollback`")
        back = fleet.fab("rollback", "--json")
        assert back.code == 0, f"killed at: {line}\n{back.describe()}"
        assert json_from(back.stdout)["release"] == v1
        fleet.assert_serving(1)
        for host in fleet.hosts:
            assert fleet.current(host)["id"] == v1
            assert fleet.releases(host)[deployed[host]]["status"] == "rolled_back"
            running = [c for c in fleet.containers(host) if c["status"] == "running"]
            assert [c["release"] for c in running] == [v1], (host, running)
    failures = prober.failures()
    assert prober.count() > 100 and not failures, f"killed at: {line}\n{prober.summary()}"
    for host in fleet.hosts:
        assert set(prober.versions(host)) <= {1, 2}


def test_kill_9_of_a_rollback_then_rollback_again(fleet: Fleet, v1: str) -> None:
    """A rollback killed right after its first switch (tb1 back on v1, not recorded; tb2 still
    on v2): `fab rollback` again finishes it, with no failed probe."""
    fleet.assert_serving(1)
    fleet.deploy(2, fast=False)
    fleet.assert_serving(2)
    with Prober(fleet) as prober:
        prober.mark("the rollback to be killed")
        killed = fleet.background("rollback", own_session=True)
        line = killed.kill_when(r"tb1 +roll +switch_traffic +ok")
        assert killed.proc.returncode == -9, killed.describe()
        prober.mark("the kill's aftermath")
        fleet.assert_serving(1, ("tb1",))
        prober.mark("`fab rollback` again (its progress is in the fab runs below)")
        again = fleet.fab("rollback", "--json")
        assert again.code == 0, f"killed at: {line}\n{again.describe()}"
        assert "broke a stale lock" in again.out, again.describe()
        assert json_from(again.stdout)["release"] == v1
        fleet.assert_serving(1)
        for host in fleet.hosts:
            assert fleet.current(host)["id"] == v1, host
            running = [c for c in fleet.containers(host) if c["status"] == "running"]
            assert [c["release"] for c in running] == [v1], (host, running)
    assert prober.count() > 50 and not prober.failures(), f"killed at: {line}\n" \
        + prober.summary()
