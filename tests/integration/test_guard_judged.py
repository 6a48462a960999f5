"""`fab guard` acts only on what it judged, on the real testbed: it judges release A (v2) bad
on tb2 and tb3 while a deploy of B (v3) holds the lock; its rollback waits for the lock
(--lock-wait), B finishes, and the guard, reading under the lock that B is live now, refuses
(exit 3, naming both) instead of rolling B back."""

from __future__ import annotations

import re
from collections.abc import Iterator

import pytest
from rollback_support import Fleet, Prober, fleet_fixture, release_of
from testbed_support import HOSTS

pytestmark = pytest.mark.testbed

MODEL, OFFSET = "itguardpin", 3200
# any request is slower than 1 us: every window with traffic breaches, whatever serves
GUARD = ("--for-s", "2", "--interval-s", "1", "--min-requests", "5", "--slo-p99-ms", "0.001",
         "--lock-wait", "180", "--duration-s", "120", "--limit", "tb2,tb3")


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    # serial [1, 100%] and 8 s of health gate: tb1 alone takes well over 10 s, so tb2 and tb3
    # keep serving A while the guard judges them
    yield from fleet_fixture(tmp_path_factory, MODEL, OFFSET, window_s=600.0,
                             serial=(1, "100%"), min_healthy_s=8.0)


def test_a_fix_deployed_while_the_guard_waits_for_the_lock_is_not_rolled_back(
        fleet: Fleet) -> None:
    fleet.deploy(2)  # A, everywhere at once
    judged = release_of(fleet, 2)
    with Prober(fleet) as prober:
        fix = fleet.background("deploy", "--version", "3")
        fix.wait_for(r"== deploy .* lock on tb1, tb2, tb3", timeout=120)
        guard = fleet.background("guard", *GUARD)
        guard.wait_for(r"tb[23] +guard +slo +breach", timeout=60)
        deployed = fix.finish(timeout=300)
        watched = guard.finish(timeout=300)
    assert deployed.code == 0, deployed.describe()
    live = release_of(fleet, 3)
    assert watched.code == 3, watched.describe()
    out = watched.stdout
    assert re.search(rf"tb2: judged {judged}, live now {live}", out), watched.describe()
    assert "the guard acts only on what it judged" in out, watched.describe()
    assert "rolled back" not in out, watched.describe()
    fleet.assert_serving(3)
    for host in HOSTS:
        assert fleet.current(host)["id"] == live
        assert fleet.releases(host)[live]["status"] == "serving", host
    assert not prober.failures(), prober.summary()
    assert not fleet.lock_dir_exists()
