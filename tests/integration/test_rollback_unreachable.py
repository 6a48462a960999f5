"""`fab rollback` while one host is unreachable (new SSH connections to tb3 refused in its
network namespace, on the second sshd port that this module's inventory reaches the hosts on):
the others are rolled back, tb3 is reported, exit 3; `fab status` and `fab history` show it
UNREACHABLE with exit 3. Afterwards the rollback can be finished."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from rollback_support import (
    Fleet,
    Prober,
    fleet_fixture,
    json_from,
    ssh_blocked,
)
from testbed_support import ALT_SSH_PORT, HOSTS

# cuts new SSH connections to a host's second sshd port, which the other modules that cut one
# use too: the modules of the group "ssh-cut" run one after another (tests/conftest.py)
pytestmark = [pytest.mark.testbed, pytest.mark.xdist_group("ssh-cut")]

MODEL, OFFSET = "rbk3", 500
DOWN = "tb3"
UP = tuple(h for h in HOSTS if h != DOWN)


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    yield from fleet_fixture(tmp_path_factory, MODEL, OFFSET, window_s=600.0, serial=(1,),
                             ssh_port=ALT_SSH_PORT)


def test_rollback_with_one_host_unreachable(fleet: Fleet, releases: dict[int, str]) -> None:
    with ssh_blocked(DOWN, MODEL), Prober(fleet) as prober:
        run = fleet.fab("rollback", "--json", timeout=300)
        status = fleet.fab("status", "--json", timeout=120)
        table = fleet.fab("status", timeout=120)
        history = fleet.fab("history", timeout=120)
    assert run.code == 3, run.describe()
    result = json_from(run.stdout)
    assert result["exit_code"] == 3 and result["release"] == releases[1], result
    assert result["hosts"][DOWN]["status"] == "unreachable", result["hosts"][DOWN]
    assert DOWN in result["message"], result["message"]
    for host in UP:
        assert result["hosts"][host]["status"] == "rolled", result["hosts"][host]
    # the reachable hosts serve v1, the unreachable one still serves v2 (its proxy is fine)
    fleet.assert_serving(1, UP)
    fleet.assert_serving(2, (DOWN,))
    assert not prober.failures(), prober.summary()

    assert status.code == 3, status.describe()
    rows = {r["host"]: r for r in json_from(status.stdout)}
    assert rows[DOWN]["reachable"] is False and rows[DOWN]["error"], rows[DOWN]
    for host in UP:
        assert rows[host]["reachable"] and rows[host]["current"] == releases[1], rows[host]
    assert table.code == 3 and "UNREACHABLE" in table.stdout, table.describe()
    assert history.code == 3 and "UNREACHABLE" in history.stdout, history.describe()
    # the lock was released (the next rollback can run)
    assert not fleet.lock_dir_exists()


def test_status_after_the_host_is_back(fleet: Fleet, releases: dict[int, str]) -> None:
    run = fleet.fab("status", "--json")
    assert run.code == 0, run.describe()
    rows = {r["host"]: r for r in json_from(run.stdout)}
    assert rows[DOWN]["reachable"] and rows[DOWN]["current"] == releases[2], rows[DOWN]


def test_rerunning_the_rollback_finishes_it(fleet: Fleet, releases: dict[int, str]) -> None:
    """After exit 3, running the same `fab rollback` again (what a person or a cron job
    does) brings the host that was away back to the release the others returned to."""
    with Prober(fleet) as prober:
        run = fleet.fab("rollback", "--json")
    assert run.code == 0, run.describe()
    assert json_from(run.stdout)["release"] == releases[1]
    fleet.assert_serving(1)
    assert not prober.failures(), prober.summary()


def test_rollback_to_finishes_it(fleet: Fleet, releases: dict[int, str]) -> None:
    """`--to` the release the other hosts are on: they are unchanged, tb3 is rolled back."""
    with Prober(fleet) as prober:
        run = fleet.fab("rollback", "--to", releases[1], "--json")
    assert run.code == 0, run.describe()
    result = json_from(run.stdout)
    fleet.assert_serving(1)
    assert not prober.failures(), prober.summary()
    for host in UP:
        assert result["hosts"][host]["status"] == "unchanged", result["hosts"][host]
    assert fleet.current(DOWN)["id"] == releases[1]
    assert fleet.releases(DOWN)[releases[2]]["status"] == "rolled_back"
