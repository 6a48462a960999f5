"""Weighted canaries on the local fleet, judged on live traffic from an independent client:
each weight's share of responses, a slower release stopped by the latency analysis, a release
answering differently stopped by the prediction comparison, pause then promote or abort from
new processes.

Model ``itcanary`` on tb1..tb3 (serial [1, 100%]: tb1 is the canary), port offset 1800.
Versions: 1 and 2 good and answering alike (both half_plus_two/2: y = 0.5 x + 3, so the
prediction comparison passes; the responses' model_spec.version tells them apart),
3 = half_plus_two_bad/16 (answers as 2, 40 ms slower), 4 = half_plus_two_bad/17 (answers as 2,
but +1 for x > 100).
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from typing import Any

import pytest
from deploy_support import GOOD, Fleet, Traffic, fleet_fixture
from rollback_support import json_from
from testbed_support import HOSTS

# the canary analysis compares the new slot's P99 over a few dozen requests with the old
# slot's: on 2 cores busy with the parallel tiers one slow request decides it
pytestmark = [pytest.mark.testbed, pytest.mark.quiet]

MODEL, OFFSET = "itcanary", 1800
SLOWER, DIFFERENT = ("half_plus_two_bad", 16), ("half_plus_two_bad", 17)
CANARY = ("CanaryPolicy(weights=(25,), step_s=8, min_requests=40, max_p99_ratio=1.5, "
          "latency_slack_ms=5, comparison=ComparisonPolicy(corpus={corpus!r}, samples=30))")


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    for made in fleet_fixture(tmp_path_factory, MODEL, OFFSET,
                              {1: GOOD[2], 2: GOOD[2], 3: SLOWER, 4: DIFFERENT},
                              serial=(1, "100%")):
        corpus = made.tmp / "corpus.jsonl"
        corpus.write_text("".join(json.dumps({"signature": "serving_default", "inputs": {
            "x": {"dtype": "DT_FLOAT", "shape": [1, 1], "values": [[float(x)]]}}}) + "\n"
            for x in (1, 50, 150, 250, 400, 900)))
        text = made.inventory.read_text().replace(
            "from tfsdeploy.core.catalog import",
            "from tfsdeploy.core.canary_policy import CanaryPolicy, ComparisonPolicy\n"
            "from tfsdeploy.core.catalog import").replace(
            "Rollout(", "Rollout(canary=" + CANARY.format(corpus=str(corpus)) + ", ", 1)
        made.inventory.write_text(text)
        yield made


def Client(fleet: Fleet) -> Traffic:
    """An independent client of tb1's stable gRPC port (the canary host)."""
    return Traffic(fleet, "tb1")


def serving(fleet: Fleet, version: int) -> None:
    """Every host's stable ports answer as half_plus_two/2 and its live release is
    ``version``."""
    fleet.assert_serving(2)
    for host in HOSTS:
        record = fleet.current(host)
        assert record is not None and record["version"] == version, (host, record)


def deploy(fleet: Fleet, version: int, *args: str) -> Any:
    run = fleet.fab("deploy", "--version", str(version), "--json", *args, timeout=900)
    return run


def test_each_weight_gives_the_new_version_its_share(fleet: Fleet) -> None:
    fleet.deploy(1)
    with Client(fleet) as client:
        for weight in (5, 25, 50):
            run = deploy(fleet, 2, "--canary-weights", str(weight), "--step-s", "6",
                         "--pause")
            assert run.code == 6, run.describe()  # paused
            share, seen = client.share_since(time.monotonic(), 2)
            assert abs(share * 100 - weight) <= 3, (weight, share, seen)
            status = fleet.fab("lock")
            assert "paused canary" in status.out, status.describe()
            aborted = fleet.fab("abort", "--json")
            assert aborted.code == 0, aborted.describe()
            assert fleet.fab("lock").out.count("free") >= 1
            serving(fleet, 1)
        assert not client.failures, client.failures[:5]


def test_pause_then_promote_from_a_new_process_rolls_every_host(fleet: Fleet) -> None:
    serving(fleet, 1)
    with Client(fleet) as client:
        run = deploy(fleet, 2, "--canary-weights", "25", "--step-s", "6", "--pause")
        assert run.code == 6, run.describe()
        nothing = fleet.fab("abort", "--json")  # idempotence: abort, then abort again
        assert nothing.code == 0, nothing.describe()
        again = fleet.fab("abort")
        assert again.code in (0, 1) and "abort" in again.out, again.describe()
        aborted = fleet.current("tb1")  # tb1 is back on v1; the aborted v2 stays recorded
        records = fleet.records("tb1")
        assert aborted is not None and aborted["version"] == 1
        # every v2 canary aborted so far (here and in the weights test) is recorded so
        assert {r["canary"]["state"] for r in records if r["version"] == 2} == {"aborted"}
        refused = fleet.fab("promote")  # an aborted canary is never promoted
        assert refused.code == 1 and "aborted" in refused.out, refused.describe()
        serving(fleet, 1)
        run = deploy(fleet, 2, "--canary-weights", "25", "--step-s", "6", "--pause")
        assert run.code == 6, run.describe()
        promoted = fleet.fab("promote", "--json", timeout=900)
        assert promoted.code == 0, promoted.describe()
    assert not client.failures, client.failures[:5]
    serving(fleet, 2)
    twice = fleet.fab("promote")
    assert twice.code == 0, twice.describe()  # already promoted: nothing to do
    for host in HOSTS:
        record = fleet.current(host)
        assert record is not None and record["version"] == 2, host
    assert fleet.current("tb1")["canary"]["state"] == "done"  # type: ignore[index]


def test_a_slower_release_is_stopped_at_its_first_step(fleet: Fleet) -> None:
    serving(fleet, 2)
    with Client(fleet) as client:
        run = deploy(fleet, 3)
    assert run.code == 2, run.describe()
    assert "canary step 25% failed" in run.out and "P99 new" in run.out, run.describe()
    assert not client.failures, client.failures[:5]
    serving(fleet, 2)


def test_a_release_answering_differently_is_stopped_by_the_comparison(fleet: Fleet) -> None:
    serving(fleet, 2)
    with Client(fleet) as client:
        run = deploy(fleet, 4)
    assert run.code == 2, run.describe()
    assert "comparison fail" in run.out, run.describe()
    assert not client.failures, client.failures[:5]
    serving(fleet, 2)
    result: dict[str, Any] = json_from(run.stdout)
    assert result["hosts"]["tb1"]["status"] in ("reverted", "restored"), result["hosts"]



def test_the_guard_aborts_a_paused_canary_slower_than_the_old_release(fleet: Fleet) -> None:
    serving(fleet, 2)
    # deployed under a lenient policy (it pauses), judged by the guard under the strict one
    lenient = fleet.tmp / "inventory_lenient.py"
    lenient.write_text(fleet.inventory.read_text().replace(
        "max_p99_ratio=1.5, latency_slack_ms=5", "max_p99_ratio=100.0, latency_slack_ms=1000"))
    with Client(fleet) as client:
        run = fleet.fab("deploy", "--version", "3", "--canary-weights", "25", "--step-s", "6",
                        "--pause", "--json", inventory=lenient, timeout=900)
        assert run.code == 6, run.describe()
        guarded = fleet.fab("guard", "--for-s", "10", "--interval-s", "2", "--duration-s",
                            "180", timeout=600)
    assert guarded.code == 2, guarded.describe()
    assert "aborted the paused canary" in guarded.out, guarded.describe()
    assert not client.failures, client.failures[:5]
    for host in HOSTS:
        record = fleet.current(host)
        assert record is not None and record["version"] == 2, host
    assert "paused" not in fleet.fab("lock").out
