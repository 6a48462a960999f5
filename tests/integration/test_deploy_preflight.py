"""Preflight refusals on the local fleet: exit 1, nothing changed.

Model ``itpreflight`` (port offset 1100): versions 1 and 2 are half_plus_two 1 and 2, on tb1,
tb2 and the suite fleet's GPU host tb4, whose GPU the filler test fills: the module is in the
xdist group "gpu-host", so no other module deploys to tb4 meanwhile.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from deploy_support import (
    GOOD,
    Fleet,
    assemble_source,
    fleet_fixture,
    gpu_reservation,
    gpu_used_mib,
    write_inventory,
)
from testbed_support import (
    ADDRESSES,
    GPU_HOST,
    clean_model,
    grpc_predict,
    ssh,
)

pytestmark = [pytest.mark.testbed, pytest.mark.xdist_group("gpu-host")]

MODEL, OFFSET = "itpreflight", 1100
FULL = GPU_HOST  # the host whose GPU the filler test fills
HOSTS = {name: ADDRESSES[name] for name in ("tb1", "tb2", FULL)}


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    yield from fleet_fixture(tmp_path_factory, MODEL, OFFSET, {1: GOOD[1], 2: GOOD[2]},
                             serial=("100%",), min_healthy_s=1.0, hosts=HOSTS,
                             gpus={FULL: 2})


def nothing_on_hosts(model: str) -> None:
    for host in HOSTS:
        out = ssh(host, f"ls -d /srv/tfsdeploy/{model} /srv/tfsdeploy/models/{model} 2>/dev/null;"
                        f" docker ps -aq --filter label=tfsdeploy.model={model}; "
                        f"docker ps -aq --filter name=tfs-proxy-{model}; true").stdout
        assert not out.strip(), f"{host} holds {model} state: {out}"


def test_a_model_too_big_for_two_slots_is_refused_before_any_host(fleet: Fleet) -> None:
    # 6500 MiB x 1.2 / 16384 MiB = 0.477 per release; two releases = 0.954 > 1 - 0.1
    big = fleet.inventory_variant("big", memory_mib=6500)
    render = fleet.fab("render", "--out", str(fleet.tmp / "render"), inventory=big)
    assert render.code == 1, render.describe()
    for host in HOSTS:
        assert f"{host}: {MODEL} does not fit this GPU (2 release(s) at once)" in render.out \
            or f"[host {host}" in render.out, render.describe()
    assert "= 0.477" in render.out and "0.954" in render.out and "0.900" in render.out
    deploy = fleet.fab("deploy", "--version", "1", inventory=big)
    assert deploy.code == 1, deploy.describe()
    assert "does not fit this GPU" in deploy.out and "nothing was changed" in deploy.out
    nothing_on_hosts(MODEL)


def test_a_full_gpu_is_refused_in_preflight_with_the_numbers(fleet: Fleet) -> None:
    fleet.deploy(1)
    fleet.assert_serving(1)
    before = fleet.snapshot()
    total, _ = gpu_used_mib(FULL)
    # at most 100 MiB free on the host whatever else runs there: the new release needs its
    # pool, ceil(512 x 1.2 / 16384, 3 places) = 0.038 x 16384 = 622 MiB, and what it holds
    # beside it (gpu_context_mib, 1024)
    with gpu_reservation(FULL, total - 100):
        run = fleet.fab("deploy", "--version", "2")
    assert run.code == 1, run.describe()
    assert "check_gpu" in run.out and FULL in run.out, run.describe()
    assert "1646 MiB free on GPU 0" in run.out, "names what it needs"
    assert "MiB free (" in run.out and f"of {total} MiB that CUDA can allocate used" in run.out, \
        "names what it saw"
    fleet.assert_serving(1)
    assert fleet.snapshot() == before
    for host in HOSTS:  # preflight refused: the version was not even staged
        assert ssh(host, f"test -e /srv/tfsdeploy/models/{MODEL}/2", check=False).returncode


def test_a_model_on_ports_already_taken_is_refused(fleet: Fleet) -> None:
    """Another model configured on the same ports must be refused (exit 1), not deployed
    beside the live one: HAProxy would share the port with SO_REUSEPORT (bug B3)."""
    if not all(fleet.current(h) for h in HOSTS):
        fleet.deploy(1)
    clash_model = "itclash"
    clean_model(clash_model, HOSTS)
    tmp = fleet.tmp / "clash"
    tmp.mkdir(exist_ok=True)
    source, golden = assemble_source(tmp, {1: GOOD[3]})
    inventory = write_inventory(tmp / "inventory.py", model=clash_model, source=source,
                                golden=golden, offset=OFFSET, serial=("100%",), hosts=HOSTS,
                                gpus={FULL: 2})
    try:
        run = fleet.fab("deploy", "--version", "1", model=clash_model, inventory=inventory)
        # every new connection to the first model's stable port must still reach it
        answers = set()
        for _ in range(12):
            try:
                answers.add(round(grpc_predict(ADDRESSES["tb1"], fleet.grpc_port, MODEL,
                                               [2.0])[0]))
            except Exception as error:
                answers.add(f"{type(error).__name__}: {str(error)[:300]}")
        assert answers == {3}, f"{MODEL}'s stable port answered {answers} after the clash"
        assert run.code == 1, run.describe()
        assert str(fleet.grpc_port) in run.out, "the refusal names the taken port"
    finally:
        clean_model(clash_model, HOSTS)
