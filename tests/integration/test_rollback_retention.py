"""Retention must keep what a rollback needs: after failed deploy attempts, the release the
fleet last rolled from (the one `fab rollback` returns to) is still retained, on every host
(tb1 and tb2)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from rollback_support import Fleet, fleet_fixture
from testbed_support import MODELS, TWO_HOSTS, copy_version

pytestmark = pytest.mark.testbed

MODEL, OFFSET = "rbk6", 800
BAD = 12  # half_plus_two_bad/12: loads, but serves the wrong signature (z -> w)


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    yield from fleet_fixture(tmp_path_factory, MODEL, OFFSET, window_s=0.0,
                             serial=("100%",), keep_releases=2, versions=(1, 2),
                             hosts=TWO_HOSTS)  # retention is per host: two prove it


def test_failed_attempts_never_prune_the_rollback_target(fleet: Fleet) -> None:
    copy_version(MODELS / "half_plus_two_bad" / str(BAD), fleet.source, BAD)
    fleet.deploy(1)
    v1 = next(iter(fleet.releases("tb1")))
    bad = fleet.fab("deploy", "--version", str(BAD))
    assert bad.code == 2 and "gate_signature" in bad.out, bad.describe()
    fleet.assert_serving(1)
    fleet.deploy(2)
    fleet.assert_serving(2)
    for host in fleet.hosts:
        statuses = {r: m["status"] for r, m in fleet.releases(host).items()}
        assert v1 in statuses, (
            f"{host}: v1 ({v1}), the release v2 replaced and the only one to roll back to, "
            f"was pruned while a failed release was kept: {statuses}")
    run = fleet.fab("rollback")
    assert run.code == 0, run.describe()
    fleet.assert_serving(1)
