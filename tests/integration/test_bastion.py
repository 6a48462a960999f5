"""Deploy and status through a bastion with OpenSSH's defaults.

The bastion is tbjump (`scripts/testbed up --bastion`): an sshd alone with OpenSSH's default
MaxStartups 10:30:100 and MaxSessions 10, logging each login and each MaxStartups drop. The
model ``itbastion`` (port offset 4800; v1/v2 = half_plus_two 1/2, x = 2 answers 3.0 / 4.0)
runs on tb1..tb3 with an inventory whose ``ssh_proxy_jump`` is the bastion. Each `fab` run
must log in to the bastion once (one connection shared by every host behind it), be
refused nothing there, and reach every host from the bastion's address. The 26-instance
fleet behind it, whose hosts answer the bastion alone, is benchmarks/bench_fleet.py's.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from deploy_support import GOOD, Fleet, fleet_fixture
from testbed_support import (
    BASTION_ADDRESS,
    BASTION_HOST,
    HOSTS,
    KNOWN_HOSTS,
    STATE,
    ensure_fleet,
    expected_y,
    fleet_daemons,
    run_testbed,
)

pytestmark = pytest.mark.testbed

MODEL, OFFSET = "itbastion", 4800
LOGS = STATE / "logs"


class Logs:
    """What sshd logs wrote since the last look: the bastion's, and each host's."""

    def __init__(self) -> None:
        self.paths = {name: LOGS / f"{name}-sshd.log" for name in (BASTION_HOST, *HOSTS)}
        self.marks = {name: self._size(path) for name, path in self.paths.items()}

    @staticmethod
    def _size(path: Path) -> int:
        return path.stat().st_size if path.exists() else 0

    def since(self) -> dict[str, str]:
        """Each log's lines since the last call (or since made)."""
        found = {}
        for name, path in self.paths.items():
            with path.open("rb") as log:
                log.seek(self.marks[name])
                found[name] = log.read().decode(errors="replace")
            self.marks[name] = self._size(path)
        return found


UP: dict[str, Any] = {}


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    ensure_fleet()  # a fleet that is not up is brought up; one that cannot be is a failure
    before = fleet_daemons()
    proc = run_testbed("up", "--bastion")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    UP.update(before=before, after=fleet_daemons(), out=proc.stdout)
    # the hosts' keys and the bastion's in one file, as a fleet's known_hosts holds them (a
    # copy: another session's `up` may rewrite the testbed's own meanwhile)
    known = tmp_path_factory.mktemp("bastion-keys") / "known_hosts"
    bastion = json.loads((STATE / "bastion.json").read_text())
    known.write_text(KNOWN_HOSTS.read_text() + Path(bastion["known_hosts"]).read_text())
    yield from fleet_fixture(tmp_path_factory, MODEL, OFFSET, {1: GOOD[1], 2: GOOD[2]},
                             serial=(1, "100%"), min_healthy_s=1.0,
                             extra_vars={"ssh_proxy_jump": f"root@{BASTION_ADDRESS}",
                                         "ssh_known_hosts": str(known)})


def logins(text: str, source: str) -> int:
    return len(re.findall(rf"^Accepted publickey for root from {re.escape(source)} port ",
                          text, re.M))


def assert_through_the_bastion(seen: dict[str, str]) -> None:
    """One login at the bastion for the run, nothing refused there, every host reached from
    the bastion's address."""
    assert logins(seen[BASTION_HOST], "10.87.0.1") == 1, seen[BASTION_HOST][-3000:]
    assert "past MaxStartups" not in seen[BASTION_HOST]
    assert "no more sessions" not in seen[BASTION_HOST]
    for host in HOSTS:
        assert logins(seen[host], BASTION_ADDRESS) >= 1, (host, seen[host][-2000:])


def test_up_bastion_leaves_the_serving_hosts_alone(fleet: Fleet) -> None:
    assert f"{BASTION_HOST} {BASTION_ADDRESS}" in str(UP["out"])
    assert "the others untouched" in str(UP["out"])
    assert UP["after"] == UP["before"], UP


def test_a_deploy_goes_through_the_bastion_on_one_connection(fleet: Fleet) -> None:
    logs = Logs()
    fleet.deploy(1)
    assert_through_the_bastion(logs.since())
    for host in HOSTS:
        assert fleet.served_y(host) == pytest.approx(expected_y(1))
    rolled = fleet.deploy(2)
    assert_through_the_bastion(logs.since())
    fleet.assert_serving(2)
    assert "Error reading SSH protocol banner" not in rolled.out


def test_status_goes_through_the_bastion_and_sees_every_host(fleet: Fleet) -> None:
    logs = Logs()
    run = fleet.fab("status", "--json")
    assert run.code == 0, run.describe()
    rows = {row["host"]: row for row in json.loads(run.stdout)}
    assert set(rows) == set(HOSTS), rows
    assert all(row["reachable"] and row["version"] == 2 for row in rows.values()), rows
    assert_through_the_bastion(logs.since())
