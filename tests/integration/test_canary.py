"""Weighted canaries judged on latency and answers, on the local fleet, from an independent
client's live traffic: a slower release stopped by the latency analysis at its first step, a
release answering differently stopped by the prediction comparison, and the guard aborting a
paused canary slower than the old release. Every one ends with the old release serving and no
failed request. The shares of each weight and pause/promote/abort are in test_canary_steps.py.

Model ``itcanary`` on tb1..tb3, port offset 1800; versions as canary_support says: v1 is
deployed once, then 3 (40 ms slower) and 4 (answers +1 for x > 100) are tried against it.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from canary_support import Client, canary_fleet, deploy, serving
from deploy_support import Fleet
from rollback_support import json_from
from testbed_support import HOSTS

# the guard's judgement of the paused canary compares the live traffic's median and P99 (the
# guard sends no requests of its own), and the slower release is 40 ms slower: on 2 cores
# busy with the parallel tiers the old slot's own P99 can reach that
pytestmark = [pytest.mark.testbed, pytest.mark.quiet]

MODEL, OFFSET = "itcanary", 1800


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    for made in canary_fleet(tmp_path_factory, MODEL, OFFSET):
        made.deploy(1)
        yield made


def test_a_slower_release_is_stopped_at_its_first_step(fleet: Fleet) -> None:
    serving(fleet, 1)
    with Client(fleet) as client:
        run = deploy(fleet, 3)
    assert run.code == 2, run.describe()
    assert "canary step 25% failed" in run.out, run.describe()
    # the judge's own requests: +40 ms on a few ms, the critical latency metric alone
    assert "latency +" in run.out and "high (critical)" in run.out, run.describe()
    assert not client.failures, client.failures[:5]
    serving(fleet, 1)


def test_a_release_answering_differently_is_stopped_by_the_comparison(fleet: Fleet) -> None:
    serving(fleet, 1)
    with Client(fleet) as client:
        run = deploy(fleet, 4)
    assert run.code == 2, run.describe()
    assert "comparison fail" in run.out, run.describe()
    assert not client.failures, client.failures[:5]
    serving(fleet, 1)
    result: dict[str, Any] = json_from(run.stdout)
    # tb1, the canary host, took its share at 25% before the comparison ran
    # (operations/canary.py: the weight, then the comparison): its rescue reverted it
    assert result["hosts"]["tb1"]["status"] == "reverted", result["hosts"]


def test_the_guard_aborts_a_paused_canary_slower_than_the_old_release(fleet: Fleet) -> None:
    serving(fleet, 1)
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
        assert record is not None and record["version"] == 1, host
    assert "paused" not in fleet.fab("lock").out
