"""A host that changes shape, carried out by `fab deploy` alone under steady load: a GPU added
(one instance -> two), then the same model version with other flags and one instance fewer
(placement per_gpu -> host), with 0 failed requests on the stable ports; the proxy is
reloaded seamlessly when its servers change and its runtime state applied again.

Model ``itshape`` on the suite fleet's two-GPU host tb4 only (testbed_support.GPU_HOST), port
offset 3700 (two instances: 12200-12241). The host keeps its two GPUs; the inventory first
limits the model to GPU 0 (``gpus=(0,)``: one instance), which is how a GPU added looks to a
deploy. The module is in the xdist group "gpu-host": no other module uses tb4 while it runs.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from deploy_support import GOOD, Fleet, Traffic, fleet_fixture
from rollback_support import json_from
from test_per_gpu import ensure_wide_host
from testbed_support import ADDRESSES, GPU_HOST, expected_y, grpc_predict, proxy_stat

pytestmark = [pytest.mark.testbed, pytest.mark.xdist_group("gpu-host")]

MODEL, OFFSET = "itshape", 3700
MOVED = 3750  # the offset the last test moves the model to (12250-12271, one instance)
WIDE = GPU_HOST


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    ensure_wide_host()
    yield from fleet_fixture(tmp_path_factory, MODEL, OFFSET,
                             {1: GOOD[1], 2: GOOD[2]}, serial=(1,),
                             hosts={WIDE: ADDRESSES[WIDE]}, gpus={WIDE: 2})


def variant(fleet: Fleet, name: str, model_line: str) -> Path:
    """The module's inventory with one more argument of the model."""
    text = fleet.inventory.read_text()
    marker = f"port_offset={OFFSET!r},"
    assert marker in text
    path = fleet.tmp / f"inventory_{name}.py"
    path.write_text(text.replace(marker, f"{marker} {model_line}"))
    return path


def proxy_servers() -> set[str]:
    """The proxy's gRPC servers, from its admin socket."""
    out = proxy_stat(WIDE, MODEL, check=True)
    return {line.split(",")[1] for line in out.splitlines()
            if line.startswith("grpc,") and line.split(",")[1].startswith("i")}


def instances(fleet: Fleet) -> list[tuple[int, list[int]]]:
    record = fleet.current(WIDE)
    assert record is not None
    return [(i["index"], i["gpus"]) for i in record["instances"]]


def step_details(run_stdout: str, step: str) -> list[str]:
    result = json_from(run_stdout)
    return [s["detail"] for s in result["hosts"][WIDE]["steps"] if s["step"] == step]


def test_a_gpu_added_then_removed_drops_no_request(fleet: Fleet) -> None:
    one_gpu = variant(fleet, "gpu0", "gpus=(0,),")
    fleet.deploy(1, inventory=one_gpu)
    assert instances(fleet) == [(0, [0])]
    assert proxy_servers() == {"i0-blue", "i0-green"}

    # a GPU added: the proxy gets the second instance's servers before traffic moves
    with Traffic(fleet, WIDE, rest=True) as client:
        grown = fleet.deploy(2, "--json")
    assert not client.failures, client.failures[:5]
    assert client.ok > 50, client.ok
    assert instances(fleet) == [(0, [0]), (1, [1])]
    assert proxy_servers() == {"i0-blue", "i0-green", "i1-blue", "i1-green"}
    (reshaped, *_) = step_details(grown.stdout, "reshape_proxy")
    assert "i1 added" in reshaped and "reloaded" in reshaped, reshaped
    fleet.assert_serving(2)

    # the same version, other flags, one instance fewer: i1 drained, then removed
    one_instance = variant(fleet, "host", 'placement="host",')
    with Traffic(fleet, WIDE, rest=True) as client:
        shrunk = fleet.deploy(2, "--json", inventory=one_instance)
    assert not client.failures, client.failures[:5]
    assert client.ok > 50, client.ok
    assert instances(fleet) == [(0, [0, 1])]
    assert proxy_servers() == {"i0-blue", "i0-green"}
    (removed, *_) = step_details(shrunk.stdout, "remove_instances")
    assert "i1 drained and removed" in removed, removed
    running = [c for c in fleet.containers(WIDE) if c["status"] == "running"]
    assert len(running) == 1 and running[0]["version"] == "2", running
    fleet.assert_serving(2)


def test_ports_moved_keep_serving_the_old_ones_until_the_next_deploy(fleet: Fleet) -> None:
    moved = fleet.tmp / "inventory_moved.py"
    moved.write_text(variant(fleet, "host", 'placement="host",').read_text().replace(
        f"port_offset={OFFSET!r},", f"port_offset={MOVED!r},"))
    with Traffic(fleet, WIDE, rest=True) as client:  # a client of the old stable ports
        run = fleet.deploy(1, "--json", inventory=moved)
    assert not client.failures, client.failures[:5]
    assert client.ok > 50, client.ok
    (discovered, *_) = step_details(run.stdout, "discover")
    assert f"stable ports :{8500 + OFFSET}/:{8501 + OFFSET} -> :{8500 + MOVED}/" in discovered
    fleet.assert_serving(1)  # the old ports: served until the next deploy
    new = grpc_predict(ADDRESSES[WIDE], 8500 + MOVED, MODEL, [2.0])
    assert new == pytest.approx([expected_y(1, 2.0)]), new
