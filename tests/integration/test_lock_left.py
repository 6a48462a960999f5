"""Lock liveness on the real testbed: the lock's acquisition script itself, killed with kill -9
on tb2 between its mkdir and its rename (held there by an ``mv`` that sleeps, on that one
invocation's PATH), leaves an empty lock directory; it must not block the free majority: the
next deploy takes the lock (tb2's part too) and runs, exit 0, and leaves no lock behind."""

from __future__ import annotations

import shlex
from collections.abc import Iterator

import pytest
from rollback_support import Fleet, fleet_fixture
from testbed_support import HOSTS, ssh

from tfsdeploy.core.layout import HostPaths
from tfsdeploy.hosts import lock
from tfsdeploy.hosts.commands import lock as lock_commands

pytestmark = pytest.mark.testbed

MODEL, OFFSET = "itlockleft", 3350


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    yield from fleet_fixture(tmp_path_factory, MODEL, OFFSET, window_s=0.0)


def kill_acquisition_midway(host: str) -> None:
    """Run the real acquisition on ``host`` and kill -9 it once its record's temporary file
    exists and before the rename (its ``mv`` sleeps): the state a killed acquisition leaves."""
    paths = HostPaths(root="/srv/tfsdeploy", model=MODEL)
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
