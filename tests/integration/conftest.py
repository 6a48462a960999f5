"""Fixtures of the integration test modules. Each module defines its own module-scoped
``fleet`` (its model on the local fleet: deploy_support.Fleet or rollback_support.Fleet)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from rollback_support import Fleet, deploy_v1_then_v2
from testbed_support import ModelFleet, Watched, forget_connections


@pytest.fixture(autouse=True)
def _dump_on_failure(request: pytest.FixtureRequest, fleet: ModelFleet) -> Iterator[None]:
    """When the test failed, print the fleet's fab runs, containers, their logs and audit tails
    (the call's report is logged before teardown, so ``testsfailed`` already counts it). A fab
    command the test started in the background and left running is killed first: a test that
    failed mid-way must not leave a deploy holding the lock for the next one."""
    before = request.session.testsfailed
    yield
    Watched.stop_left_running()  # before the dump, which then shows what they printed
    if request.session.testsfailed > before:
        print(fleet.dump())


@pytest.fixture(scope="module", autouse=True)
def _close_shared_connections() -> Iterator[None]:
    """The module's shared ssh masters (testbed_support.ssh) close with it."""
    yield
    forget_connections()


@pytest.fixture(scope="module")
def releases(fleet: Fleet) -> dict[int, str]:
    """(rollback tests) v1 then v2 deployed everywhere; tb1's release id by version."""
    return deploy_v1_then_v2(fleet)
