"""A model added beside another and then taken off a host, on the local fleet: the first deploy
of ``itretire`` on hosts that serve ``itbeside`` drops none of itbeside's requests; once the
inventory no longer places itretire on tb2, `fab status` and `fab deploy --check` name tb2
until `fab retire --hosts tb2` takes it off (drained, containers, proxy and files removed, the
audit log kept with the retirement in it), again with no failed request for itbeside.

Models ``itretire`` (port offset 3800) and ``itbeside`` (3900), on tb1 and tb2.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from deploy_support import GOOD, Fleet, Traffic, fleet_fixture
from rollback_support import json_from
from testbed_support import ADDRESSES, ssh

pytestmark = [pytest.mark.testbed]

MODEL, OFFSET = "itretire", 3800
BESIDE, BESIDE_OFFSET = "itbeside", 3900
HOSTS = {name: ADDRESSES[name] for name in ("tb1", "tb2")}


@pytest.fixture(scope="module")
def beside(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    for made in fleet_fixture(tmp_path_factory, BESIDE, BESIDE_OFFSET, {1: GOOD[1]},
                              serial=(1, "100%"), hosts=HOSTS):
        made.deploy(1)
        yield made


@pytest.fixture(scope="module")
def fleet(beside: Fleet, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    yield from fleet_fixture(tmp_path_factory, MODEL, OFFSET, {1: GOOD[1]},
                             serial=("100%",), hosts=HOSTS)


def test_a_model_added_beside_another_then_retired_from_a_host(fleet: Fleet,
                                                               beside: Fleet) -> None:
    with Traffic(beside, "tb2") as client:
        fleet.deploy(1)
    assert not client.failures, client.failures[:5]
    assert client.ok > 20, client.ok
    fleet.assert_serving(1)

    text = fleet.inventory.read_text()
    narrowed = fleet.tmp / "inventory_narrowed.py"
    narrowed.write_text(text.replace(f"port_offset={OFFSET!r},",
                                     f'port_offset={OFFSET!r}, hosts="tb1",'))
    note = f"no longer in the inventory for {MODEL}: fab retire --model {MODEL} --hosts tb2"
    status = fleet.fab("status", "--json", inventory=narrowed)
    assert status.code == 0, status.describe()
    rows = {r["host"]: r for r in json_from(status.stdout)}
    assert rows["tb2"]["orphan"] and rows["tb2"]["note"] == note, rows["tb2"]
    checked = fleet.fab("deploy", "--check", "--json", inventory=narrowed)
    assert checked.code == 0, checked.describe()
    planned = {r["host"]: r for r in json_from(checked.stdout)}
    assert planned["tb2"]["action"] == note, planned

    with Traffic(beside, "tb2") as client:
        retired = fleet.fab("retire", "--hosts", "tb2", "--json", inventory=narrowed)
    assert retired.code == 0, retired.describe()
    assert not client.failures, client.failures[:5]
    result = json_from(retired.stdout)
    assert result["hosts"]["tb2"]["status"] == "retired", result["hosts"]["tb2"]
    assert fleet.containers("tb2") == []
    left = ssh("tb2", f"ls -A /srv/tfsdeploy/{MODEL}; docker ps -aq --filter "
                      f"name=tfs-proxy-{MODEL}; ls /srv/tfsdeploy/models").stdout.split()
    assert "audit.log" in left and "releases" not in left and MODEL not in left, left
    changes = [e["details"].get("change", "") for e in fleet.audit("tb2")
               if e["event"] == "remove_containers"]
    assert f"remove container tfs-proxy-{MODEL}" in changes, changes
    beside.assert_serving(1)
    fleet.assert_serving(1, hosts=("tb1",))
    after = fleet.fab("status", "--json", inventory=narrowed)
    assert [r["host"] for r in json_from(after.stdout)] == ["tb1"], after.describe()
