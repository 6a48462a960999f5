"""A canary on a host with two GPU instances, on the local fleet, from an independent client's
live traffic: the weight is the share of the HOST's requests (both instances step and pause at
it together), so a paused 30 % canary answers 30 +- 3 % of the host's requests from the new
version; abort and promote act on both instances; no request fails.

Model ``itcanarygpu`` on the suite fleet's two-GPU host tb4 (testbed_support.GPU_HOST) and tb1
(tb4 first: the canary host), port offset 5600; versions as canary_support says (1 and 2 both
good, told apart by the answering version). The module is in the xdist group "gpu-host": no
other module uses tb4 while it runs.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest
from canary_support import Client, canary_fleet, deploy
from deploy_support import Fleet
from rollback_support import json_from
from test_per_gpu import ensure_wide_host
from testbed_support import ADDRESSES, GPU_HOST

pytestmark = [pytest.mark.testbed, pytest.mark.xdist_group("gpu-host")]

MODEL, OFFSET = "itcanarygpu", 5600
WIDE = GPU_HOST
HOSTS = {name: ADDRESSES[name] for name in (WIDE, "tb1")}


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    ensure_wide_host()
    # 10 requests per side for a verdict: these tests judge shares over 1,000 answers of
    # their own client, not latency
    for made in canary_fleet(tmp_path_factory, MODEL, OFFSET, min_requests=10, hosts=HOSTS,
                             wide=WIDE):
        made.deploy(1)
        yield made


def serving(fleet: Fleet, version: int) -> None:
    """Both hosts' live release is ``version``, on every instance."""
    for host in HOSTS:
        record = fleet.current(host)
        assert record is not None and record["version"] == version, (host, record)
        assert len(record["instances"]) == (2 if host == WIDE else 1), record


def test_a_paused_30_percent_canary_answers_30_percent_of_the_host_then_aborts(
        fleet: Fleet) -> None:
    serving(fleet, 1)
    with Client(fleet, WIDE) as client:
        run = deploy(fleet, 2, "--canary-weights", "30", "--step-s", "6", "--pause")
        assert run.code == 6, run.describe()  # paused
        share, seen = client.share_since(time.monotonic(), 2)
        assert abs(share * 100 - 30) <= 3, (share, seen)
        result: dict[str, Any] = json_from(run.stdout)
        (step,) = result["hosts"][WIDE]["canary"]["steps"]
        assert step["weight"] == 30 and step["verdict"] == "pass", step
        # both instances' slots were judged together: the old side's requests are the host's
        assert {m["metric"] for m in step["metrics"]} >= {"latency", "p99", "errors"}
        aborted = fleet.fab("abort", "--json")
        assert aborted.code == 0, aborted.describe()
        serving(fleet, 1)
        back, _ = client.share_since(time.monotonic(), 2, count=300)
        assert back == 0.0, back
    assert not client.failures, client.failures[:5]


def test_pause_then_promote_rolls_both_instances(fleet: Fleet) -> None:
    serving(fleet, 1)
    with Client(fleet, WIDE) as client:
        run = deploy(fleet, 2, "--canary-weights", "10,30", "--step-s", "6", "--pause")
        assert run.code == 6, run.describe()
        share, seen = client.share_since(time.monotonic(), 2)
        assert abs(share * 100 - 30) <= 3, (share, seen)
        promoted = fleet.fab("promote", "--json", timeout=900)
        assert promoted.code == 0, promoted.describe()
        serving(fleet, 2)
        after, _ = client.share_since(time.monotonic(), 2, count=300)
        assert after == 1.0, after
    assert not client.failures, client.failures[:5]
    # back to v1 for the module's next test run (keeps the tests independent of order)
    assert fleet.fab("rollback").code == 0
    serving(fleet, 1)
