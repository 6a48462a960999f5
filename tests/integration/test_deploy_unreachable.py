"""A host that becomes unreachable in the middle of a roll.

Model ``itunreach`` (port offset 1200), versions 1 and 2 = half_plus_two 1 and 2, batches
[tb1], [tb2, tb3]. While batch 2 rolls, tb2 is cut off from the deploy process without a
reset (iptables DROP in tb2's network namespace: the deploy's established SSH connection, new
SSH connections, and the model's ports). The module's inventory reaches the hosts on their
second sshd port (2222), the only one cut, so the other modules' runs keep port 22.
"""

from __future__ import annotations

import re
import time
from collections.abc import Iterator

import pytest
from deploy_support import (
    GOOD,
    Fleet,
    Partition,
    fleet_fixture,
    remove_partition_rules,
)
from testbed_support import ALT_SSH_PORT, HOSTS, expected_y, grpc_predict

# cuts new SSH connections to a host's second sshd port, which the other modules that cut one
# use too: the modules of the group "ssh-cut" run one after another (tests/conftest.py)
pytestmark = [pytest.mark.testbed, pytest.mark.xdist_group("ssh-cut")]

MODEL, OFFSET = "itunreach", 1200


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    yield from fleet_fixture(tmp_path_factory, MODEL, OFFSET, {1: GOOD[1], 2: GOOD[2]},
                             serial=(1, "100%"), min_healthy_s=1.0,
                             tidy=remove_partition_rules, ssh_port=ALT_SSH_PORT)


def served(fleet: Fleet, host: str) -> int:
    """Which assembled version answers on ``host``'s stable gRPC port (1 or 2)."""
    y = grpc_predict(HOSTS[host], fleet.grpc_port, MODEL, [2.0], timeout=5)[0]
    for version in (1, 2):
        if abs(y - expected_y(version)) < 1e-5:
            return version
    raise AssertionError(f"{host} answered y = {y}")


def test_host_unreachable_during_batch_2_stops_the_roll_others_keep_serving(
        fleet: Fleet) -> None:
    fleet.deploy(1)
    fleet.assert_serving(1)
    # a longer health gate keeps batch 2 busy while tb2 goes away
    slow = fleet.inventory_variant("slow_health", min_healthy_s=8.0)
    roll = fleet.background("deploy", "--version", "2", inventory=slow)
    try:
        roll.wait_for(r"tb2 +roll +start_slot +ok", timeout=300)
        cut_at = time.monotonic()
        with Partition("tb2", roll.proc.pid, (OFFSET + 8500, OFFSET + 8599)) as cut:
            assert len(cut.rules) >= 3, "the deploy's own SSH connection to tb2 was found"
            during = {h: served(fleet, h) for h in ("tb1", "tb3")}
            # bounded: a silent host must become an error, not a hang (bug B1). Measured: the
            # deploy ended 63 s after the cut (tb2's gate gave up on the lost connection after
            # 41 s, its restore after 10 s) on 2 cores beside the other fleet modules; 240 s
            # is that with a margin of almost 4
            run = roll.finish(timeout=240)
            gave_up_after = time.monotonic() - cut_at
    finally:
        roll.kill()
    print(f"\nunreachable: deploy ended {gave_up_after:.1f} s after tb2 was cut off, "
          f"exit {run.code}")
    print(run.describe())
    # tb2 cannot be restored while it is cut off: the fleet is not known to be consistent,
    # exit 3 (docs/runbook.md); the reachable hosts are reverted to v1 (on_failure: revert)
    assert run.code == 3, run.describe()
    assert "SSH connection lost" in run.out, run.describe()
    results = dict(re.findall(r"^│ (tb\d) +│ (\w+) ", run.out, re.M))
    assert results == {"tb1": "reverted", "tb2": "unknown", "tb3": "reverted"}, run.describe()
    assert set(during.values()) <= {1, 2}, during
    assert {h: served(fleet, h) for h in ("tb1", "tb3")} == {"tb1": 1, "tb3": 1}
    # tb2 is back on the network: its traffic never moved off its old slot, which still serves
    assert served(fleet, "tb2") == 1
    # the fleet converges with the next deploy
    fleet.deploy(2)
    fleet.assert_serving(2)
    free, shown = fleet.lock_free()
    assert free, shown.describe()


def test_no_second_deploy_while_the_lock_host_is_unreachable_from_it(fleet: Fleet) -> None:
    """Deploy A holds the lock (on tb1). For deploy B, started elsewhere, tb1 does not answer
    (new SSH connections to tb1 are dropped; A's established connection keeps working).
    B must not run beside A: exit 4, never a second lock on another host."""
    fleet.deploy(1)
    slow = fleet.inventory_variant("slow_health_15", min_healthy_s=15.0)
    first = fleet.background("deploy", "--version", "2", inventory=slow)
    try:
        first.wait_for(r"== deploy itunreach version 2 .* lock on tb1", timeout=180)
        with Partition("tb1", None, None):
            second = fleet.fab("deploy", "--version", "1", "--hosts", "tb2,tb3", timeout=300)
        done = first.finish(timeout=400)
    finally:
        first.kill()
    print(second.describe())
    assert done.code == 0, done.describe()
    # B reaches tb2 and tb3, where A's lock is: exit 4, never a second lock
    assert second.code == 4, (
        "a second deploy ran while the first held the lock (split lock):\n"
        + second.describe())
    assert re.search(r"another deploy of itunreach holds the lock on tb[23]\b", second.out), \
        second.describe()
    # B never started a roll: no "== deploy ... lock on ..." line of its own
    assert not re.search(r"== deploy itunreach version 1 .* lock on", second.out), \
        second.describe()
    fleet.deploy(2)
    fleet.assert_serving(2)
