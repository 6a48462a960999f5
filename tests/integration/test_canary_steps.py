"""Weighted canary steps on the local fleet, on live traffic from an independent client: each
weight's share of responses, pause then promote or abort from new processes. What a step's
verdict on latency says is in test_canary.py (alone: it judges latency); these judge shares
and the pause's state machine, which the rest of the fleet's load does not move, so they run
in the fleet phase (a good release's step is judged by core/canary/judge.py's tests: a
busy machine's slow requests land on both sides alike, and one slow request is chance, not a
slower release).

Model ``itcanarysteps`` on tb1..tb3, port offset 4900; versions as canary_support says.
"""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest
from canary_support import Client, canary_fleet, deploy, serving
from deploy_support import Fleet
from testbed_support import HOSTS, proxy_stat, ssh

from tfsdeploy.core.render.haproxy_stat import stat_rows

pytestmark = [pytest.mark.testbed]

MODEL, OFFSET = "itcanarysteps", 4900


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    # 10 requests per slot for a verdict: these tests judge shares (over 1,000 answers of
    # their own client), not latency, and a 5 % step of a busy machine's client (20 QPS seen)
    # gives the new slot 18 requests in its 6 s and two extensions
    yield from canary_fleet(tmp_path_factory, MODEL, OFFSET, min_requests=10)


def proxy_view(host: str = "tb1") -> str:
    """What a share needs explained: the host proxy's servers (status, weight, times taken
    out, seconds down, requests taken, retried, redispatched) and its last log lines."""
    rows = stat_rows(proxy_stat(host, MODEL))
    fields = ("pxname", "svname", "status", "weight", "chkdown", "downtime", "lbtot", "wretr",
              "wredis")
    lines = [" ".join(f"{f}={row.get(f)}" for f in fields) for row in rows
             if row.get("type") == "2"]  # servers (0 frontend, 1 backend, 3 listener)
    log = ssh(host, f"docker logs --tail 20 tfs-proxy-{MODEL} 2>&1", check=False).stdout
    return "\n".join([*lines, log])


def test_each_weight_gives_the_new_version_its_share(fleet: Fleet) -> None:
    fleet.deploy(1)
    with Client(fleet) as client:
        for weight in (5, 25, 50):
            run = deploy(fleet, 2, "--canary-weights", str(weight), "--step-s", "6",
                         "--pause")
            assert run.code == 6, run.describe()  # paused
            try:
                share, seen = client.share_since(time.monotonic(), 2)
                # one client, one request after another: round robin over the two slots
                # alternates them at 50/50, so a share off by more than 3 points means a slot
                # missed requests (out of rotation, or a request retried on the other)
                assert abs(share * 100 - weight) <= 3, (weight, share, seen, proxy_view())
                status = fleet.fab("lock")
                assert "paused canary" in status.out, status.describe()
            finally:  # a failed check leaves no paused canary to the next test
                aborted = fleet.fab("abort", "--json")
            assert aborted.code == 0, aborted.describe()
            lock = fleet.fab("lock").out
            assert f"{MODEL}: free (0 of {len(HOSTS)} hosts hold a lock record)" in lock, lock
            serving(fleet, 1)
        assert not client.failures, client.failures[:5]


def test_pause_then_promote_from_a_new_process_rolls_every_host(fleet: Fleet) -> None:
    serving(fleet, 1)
    with Client(fleet) as client:
        run = deploy(fleet, 2, "--canary-weights", "25", "--step-s", "6", "--pause")
        assert run.code == 6, run.describe()
        nothing = fleet.fab("abort", "--json")  # idempotence: abort, then abort again
        assert nothing.code == 0, nothing.describe()
        again = fleet.fab("abort")  # nothing left to do: exit 0 (core/canary/steps.plan_abort)
        assert again.code == 0 and "is already aborted" in again.out, again.describe()
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
