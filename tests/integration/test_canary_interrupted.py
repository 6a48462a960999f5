"""An interrupted canary on the real testbed: `fab deploy --canary-weights 50` killed with
kill -9 while tb1's proxy splits the traffic between v1 and v2 (no paused record: the run died
in its step). `fab status` says so; `fab guard` aborts it (tb1 back on v1 at 100 %) instead of
rolling back past the last good release; `fab promote` finishes another such canary. Every
host's stable port is probed throughout: no request fails."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest
from rollback_support import Fleet, Prober, fleet_fixture, json_from, release_of
from testbed_support import HOSTS, proxy_stat

from tfsdeploy.core.render.host_proxy import parse_stat

pytestmark = pytest.mark.testbed

MODEL, OFFSET = "itcanarykill", 3250
CANARY = ("--canary-weights", "50", "--step-s", "30")


# each version of the rollback fleet adds 1 to y: the accepted change (else the prediction
# comparison, made at the first weight, stops the canary within seconds of its split)
POLICY = ("CanaryPolicy(comparison=ComparisonPolicy(outputs={'y': OutputRule("
          "kind='regressor', atol=1.5)}))")


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    for made in fleet_fixture(tmp_path_factory, MODEL, OFFSET, window_s=0.0,
                              serial=(1, "100%"), keep_releases=10):
        text = made.inventory.read_text()
        assert "Rollout(" in text
        made.inventory.write_text(text.replace(
            "from tfsdeploy.core.inventory.catalog import",
            "from tfsdeploy.core.inventory.canary_policy import (CanaryPolicy, "
            "ComparisonPolicy, OutputRule)\nfrom tfsdeploy.core.inventory.catalog import").replace(
            "Rollout(", f"Rollout(canary={POLICY}, ", 1))
        yield made


def split_on_tb1() -> bool:
    """Whether tb1's proxy sends new gRPC requests to both slots (a canary's weights)."""
    ready = [s for s in parse_stat(proxy_stat("tb1", MODEL))
             if s.backend == "grpc" and s.takes_new_requests]
    return len(ready) == 2


def killed_at_a_split(fleet: Fleet) -> str:
    """A canary deploy of v2 killed (-9, its whole process group) once tb1 splits its
    traffic; returns the canary's release."""
    run = fleet.background("deploy", "--version", "2", *CANARY, own_session=True)
    run.wait_for(r"tb1 +roll +gate_rest +ok", timeout=240)
    end = time.monotonic() + 30
    while not split_on_tb1():
        assert time.monotonic() < end, "tb1's proxy never split its traffic"
        time.sleep(0.2)
    run.kill()
    assert run.proc.returncode == -9, run.describe()
    records = [r for r in fleet.releases("tb1").values() if r["version"] == 2
               and r["status"] == "starting"]
    assert len(records) == 1 and not records[0].get("canary"), records
    return str(records[0]["id"])


def test_status_says_so_and_the_guard_aborts_it(fleet: Fleet) -> None:
    fleet.deploy(1)
    old = release_of(fleet, 1)
    with Prober(fleet) as prober:
        canary = killed_at_a_split(fleet)
        shown = fleet.fab("status", "--json")
        rows = {r["host"]: r for r in json_from(shown.stdout)}
        assert rows["tb1"]["canary"] == {"release": canary, "state": "interrupted"}, \
            shown.describe()
        assert rows["tb2"]["canary"] is None
        table = fleet.fab("status")
        assert "interrupted" in table.out, table.describe()
        guard = fleet.fab("guard", "--for-s", "2", "--interval-s", "1", "--min-requests", "5",
                          "--slo-p99-ms", "0.001", "--duration-s", "60", timeout=300)
        assert guard.code == 2, guard.describe()
        assert f"aborted the interrupted canary {canary}" in guard.out, guard.describe()
    fleet.assert_serving(1)
    for host in HOSTS:
        running = [c for c in fleet.containers(host) if c["status"] == "running"]
        assert [c["release"] for c in running] == [old], (host, running)
    assert not split_on_tb1()
    assert not fleet.lock_dir_exists()
    assert fleet.releases("tb1")[canary]["status"] == "reverted"
    assert fleet.releases("tb1")[canary]["canary"]["state"] == "aborted"
    assert prober.count() > 50 and not prober.failures(), prober.summary()


def test_promote_finishes_an_interrupted_canary(fleet: Fleet) -> None:
    fleet.assert_serving(1)
    with Prober(fleet) as prober:
        canary = killed_at_a_split(fleet)
        promoted = fleet.fab("promote", "--json", timeout=300)
        assert promoted.code == 0, promoted.describe()
        assert json_from(promoted.stdout)["release"] == canary
    fleet.assert_serving(2)
    for host in HOSTS:
        assert fleet.current(host)["id"] == canary, host
    assert not split_on_tb1()
    assert not fleet.lock_dir_exists()
    assert not prober.failures(), prober.summary()
