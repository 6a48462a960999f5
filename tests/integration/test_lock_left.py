"""Lock liveness on the real testbed: the lock's acquisition script itself, killed with kill -9
on tb2 between its mkdir and its rename (held there by an ``mv`` that sleeps, on that one
invocation's PATH), leaves an empty lock directory; it must not block the free majority: the
next deploy takes the lock (tb2's part too) and runs, exit 0, and leaves no lock behind. A
paused canary aborted while tb3 cannot be reached leaves its lock part on tb3: once tb3 is
back, the next deploy clears it (the canary is finished on every host) and runs, exit 0."""

from __future__ import annotations

import re
import shlex
from collections.abc import Iterator
from pathlib import Path

import pytest
from rollback_support import Fleet, Prober, fleet_fixture, ssh_blocked
from testbed_support import ALT_SSH_PORT, DATA_ROOT, HOSTS, ssh

from tfsdeploy.core.inventory.layout import HostPaths
from tfsdeploy.hosts import lock
from tfsdeploy.hosts.commands import lock as lock_commands

# cuts new SSH connections to a host's second sshd port, which the other modules that cut one
# use too: the modules of the group "ssh-cut" run one after another (tests/conftest.py)
pytestmark = [pytest.mark.testbed, pytest.mark.xdist_group("ssh-cut")]

MODEL, OFFSET = "itlockleft", 3350


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    # the module's runs reach the hosts on sshd's second port, the one ssh_blocked cuts
    yield from fleet_fixture(tmp_path_factory, MODEL, OFFSET, window_s=0.0,
                             serial=(1, "100%"), ssh_port=ALT_SSH_PORT)


def kill_acquisition_midway(host: str) -> None:
    """Run the real acquisition on ``host`` and kill -9 it once its record's temporary file
    exists and before the rename (its ``mv`` sleeps): the state a killed acquisition leaves."""
    paths = HostPaths(root=DATA_ROOT, model=MODEL)
    record = lock.new_lock_record(f"deploy {MODEL}")
    argv = shlex.join(lock_commands.acquire(paths, record.model_dump_json()))
    script = (
        "bin=$(mktemp -d) && printf '#!/bin/sh\\nexec sleep 60\\n' > \"$bin/mv\" && "
        "chmod 755 \"$bin/mv\" && "
        f"{{ PATH=\"$bin:$PATH\" setsid {argv} </dev/null >/dev/null 2>&1 & }}; pid=$!; "
        f"i=0; while [ ! -e {paths.lock_dir}/info.json.tmp ] && [ $i -lt 100 ]; do "
        "sleep 0.1; i=$((i + 1)); done; "
        "kill -9 -- -$pid; rm -rf \"$bin\"; "
        f"test -d {paths.lock_dir} && test ! -e {paths.lock_dir}/info.json")
    ssh(host, script)


def test_a_killed_acquisition_on_one_host_does_not_block(fleet: Fleet) -> None:
    fleet.deploy(1)
    kill_acquisition_midway("tb2")
    shown = fleet.fab("lock")
    assert "tb2: a lock with an unreadable record" in shown.out, shown.describe()
    run = fleet.fab("deploy", "--version", "2")
    assert run.code == 0, run.describe()
    fleet.assert_serving(2)
    assert not fleet.lock_dir_exists()
    for host in HOSTS:
        assert fleet.current(host)["version"] == 2


def canary_inventory(fleet: Fleet) -> Path:
    """The module's inventory with a canary policy that accepts the next version (each
    version adds 1 to y) and judges 20 requests per slot. This module proves the lock, not
    the latency analysis (tests/integration/test_canary.py does, alone): a second of slack,
    since beside the other modules one slow request decides a P99 over 20 (33.6 ms against
    18.6 ms has failed the step)."""
    text = fleet.inventory.read_text().replace(
        "Rollout(serial", "Rollout(canary=CanaryPolicy(min_requests=20, "
        "latency_slack_ms=1000, comparison="
        "ComparisonPolicy(outputs={'y': OutputRule(kind='regressor', atol=1.5)})), serial", 1)
    path = fleet.tmp / "inventory-canary.py"
    path.write_text("from tfsdeploy.core.inventory.canary_policy import (CanaryPolicy, "
                    "ComparisonPolicy, OutputRule)\n" + text)
    return path


def test_a_paused_canary_s_part_left_on_a_host_down_at_abort_is_cleared(
        fleet: Fleet) -> None:
    fleet.deploy(2)  # (unchanged after the test above: nothing to do)
    inventory = canary_inventory(fleet)
    with Prober(fleet, interval_s=0.02):  # the canary step judges live traffic
        paused = fleet.fab("deploy", "--version", "3", "--canary-weights", "50",
                           "--step-s", "10", "--pause", inventory=inventory, timeout=400)
        assert paused.code == 6, paused.describe()
        with ssh_blocked("tb3", MODEL):
            aborted = fleet.fab("abort", timeout=400)
        # tb1, the canary host, is back on v2; tb3 could not be reached: exit 3 (the
        # runbook's exit codes: a host could not be reached)
        assert aborted.code == 3, aborted.describe()
        assert re.search(r"tb1 +abort +record_attempt +ok .* recorded as reverted", aborted.out
                         ), aborted.describe()
        assert re.search(r"tb3 +│ unreachable", aborted.out), aborted.describe()
        shown = fleet.fab("lock")
        assert "tb3: the paused canary of release" in shown.out, shown.describe()
        run = fleet.fab("deploy", "--version", "3", timeout=400)
        assert run.code == 0, run.describe()
        assert "cleared the lock part that the finished canary" in run.out, run.describe()
    fleet.assert_serving(3)
    assert not fleet.lock_dir_exists()
