"""The run layer on the local fleet: what differs per host is honoured per host, a check
plans exactly what the run then does, and a rollback that can reach no host says so.

Model ``itrun`` on tb1..tb3, port offset 1600.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from deploy_support import GOOD, Fleet, fleet_fixture
from rollback_support import json_from
from testbed_support import HOSTS, REGISTRY, ssh

pytestmark = pytest.mark.testbed

MODEL, OFFSET = "itrun", 1600
IMAGE = f"{REGISTRY}/tfserving-emulator:2.21.0"
OTHER_IMAGE = f"{REGISTRY}/tfserving-emulator:2.21.0-itrun"
RELEASE = re.compile(r"r\d{8}-\d{9}-v\d+")


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    yield from fleet_fixture(tmp_path_factory, MODEL, OFFSET, {1: GOOD[1], 2: GOOD[2]},
                             serial=(1, "100%"))


@pytest.fixture(scope="module")
def other_image() -> str:
    """The emulator image under a second name in the registry (the same bits: a host that
    runs it serves like the others, but the name tells which image its container runs)."""
    ssh("tb1", f"docker tag {IMAGE} {OTHER_IMAGE} && docker push -q {OTHER_IMAGE}",
        timeout=300)
    return OTHER_IMAGE


def with_host_image(fleet: Fleet, image: str) -> Path:
    """The fleet's inventory, but tb2's `image` var names ``image``."""
    text = fleet.inventory.read_text()
    marker = "hosts = [Host(name, address,"
    assert marker in text
    text = text.replace(marker, "hosts = [Host(name, address, vars=(\n"
                        f"    {{'image': {image!r}}} if name == 'tb2' else {{}}),")
    path = fleet.tmp / "inventory_tb2_image.py"
    path.write_text(text)
    return path


def image_of(host: str, release: str) -> str:
    return ssh(host, f"docker inspect --format '{{{{.Config.Image}}}}' "
                     f"tfs-{MODEL}-{release}-i0").stdout.strip()


def test_a_host_image_var_is_the_image_that_host_runs(fleet: Fleet, other_image: str) -> None:
    run = fleet.fab("deploy", "--version", "1", "--json",
                    inventory=with_host_image(fleet, other_image))
    assert run.code == 0, run.describe()
    release = json_from(run.stdout)["release"]
    assert image_of("tb2", release) == other_image
    for host in ("tb1", "tb3"):
        assert image_of(host, release) == IMAGE
    assert fleet.current("tb2")["image"] == other_image
    assert fleet.current("tb1")["image"] == IMAGE
    fleet.assert_serving(1)


def _planned(check: list[dict[str, Any]]) -> dict[str, list[tuple[str, str]]]:
    """Per host: (step, change) of every change the check plans that the audit log records
    (checks of gates change nothing and are not recorded), release ids normalised."""
    return {row["host"]: [(step["step"], RELEASE.sub("R", change["what"]))
                          for step in row["steps"] for change in step["changes"]
                          if change["kind"] != "check"]
            for row in check}


def _audited(fleet: Fleet, host: str, release: str) -> list[tuple[str, str]]:
    return [(entry["event"], RELEASE.sub("R", entry["details"]["change"]))
            for entry in fleet.audit(host)
            if entry["release"] == release and "change" in entry.get("details", {})]


def test_the_check_plans_exactly_what_the_deploy_then_does(fleet: Fleet) -> None:
    fleet.assert_serving(1)
    check = fleet.fab("deploy", "--version", "2", "--check", "--diff", "--json")
    assert check.code == 0, check.describe()
    plan = json_from(check.stdout)
    assert {row["host"] for row in plan} == set(HOSTS)
    assert all("+" in row["diff"] for row in plan), "the diff shows the new version's files"
    planned = _planned(plan)
    run = fleet.fab("deploy", "--version", "2", "--json")
    assert run.code == 0, run.describe()
    release = json_from(run.stdout)["release"]
    for host in HOSTS:
        recorded = _audited(fleet, host, release)
        assert recorded == planned[host], (host, recorded, planned[host])
        kinds = {step for step, _ in recorded}
        assert {"start_slot", "switch_traffic", "drain_old", "record_release",
                "retire_old"} <= kinds
    fleet.assert_serving(2)


def test_rollback_to_a_release_with_the_selected_host_unreachable_exits_3(
        fleet: Fleet) -> None:
    release = fleet.current("tb1")["id"]
    text = fleet.inventory.read_text().replace(
        '"data_root": "/srv/tfsdeploy",', '"data_root": "/srv/tfsdeploy",\n    "ssh_port": 2,')
    dead = fleet.tmp / "inventory_no_ssh.py"
    dead.write_text(text)
    run = fleet.fab("rollback", "--to", release, inventory=dead)
    assert run.code == 3, run.describe()
    assert "Traceback" not in run.out and "StopIteration" not in run.out
    assert "unreachable" in run.out or "answer" in run.out, run.describe()
    one = fleet.fab("rollback", "--to", release, "--hosts", "tb2",
                    inventory=with_port_on(fleet, "tb2"))
    assert one.code == 3, one.describe()
    assert "every selected host is unreachable" in one.out, one.describe()
    assert "Traceback" not in one.out
    fleet.assert_serving(2)


def with_port_on(fleet: Fleet, host: str) -> Path:
    """The fleet's inventory with ``host`` reachable only on a closed SSH port."""
    text = fleet.inventory.read_text()
    marker = "hosts = [Host(name, address,"
    text = text.replace(marker, "hosts = [Host(name, address, vars=(\n"
                        f"    {{'ssh_port': 2}} if name == {host!r} else {{}}),")
    path = fleet.tmp / f"inventory_{host}_unreachable.py"
    path.write_text(text)
    return path
