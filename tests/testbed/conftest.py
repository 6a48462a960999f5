"""Fixtures for tests against the local fleet (scripts/testbed).

`testbed` (session): brings the fleet up once if it is not already healthy and yields what
hosts.json says.  A fleet that was already up when the session started belongs to someone else
(a person, another test run) and is never taken down; a fleet this session started is taken
down at the end unless TFSDEPLOY_TESTBED_KEEP=1.

Tests that stop or break the fleet (tests/testbed/test_lifecycle.py) run only when this session
started the fleet or TFSDEPLOY_TESTBED_DESTRUCTIVE=1; TFSDEPLOY_TESTBED_DESTRUCTIVE=0 skips them.
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest
from fleet_helpers import Testbed, ensure_up, load_testbed, run_testbed_cli, testbed_healthy


@pytest.fixture(scope="session")
def testbed() -> Iterator[Testbed]:
    if os.geteuid() != 0:
        pytest.fail("the local fleet needs root (namespaces, bridges, dockerd): run the "
                    "fleet tiers as root")
    started_here = not testbed_healthy()
    if started_here:
        ensure_up()
    yield load_testbed(started_here)
    if started_here and os.environ.get("TFSDEPLOY_TESTBED_KEEP") != "1":
        run_testbed_cli("down")


@pytest.fixture
def destructive(testbed: Testbed) -> Testbed:
    """For tests that stop or break the fleet: only on a fleet nobody else is using."""
    allowed = os.environ.get("TFSDEPLOY_TESTBED_DESTRUCTIVE")
    if allowed == "0" or (allowed != "1" and not testbed.started_here):
        pytest.skip(
            "the fleet was already up (someone may be using it); set "
            "TFSDEPLOY_TESTBED_DESTRUCTIVE=1 to run tests that stop and break it"
        )
    return testbed
