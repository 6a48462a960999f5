"""The GPU's truth on the local fleet's simulated GPU: what each TFServing process really holds
(nvidia-smi on the host, by host pid), against what the memory plan gave it.

Two models share GPU 0 of the suite fleet's two-GPU host tb4 (testbed_support.GPU_HOST), each
with a pool of 0.236 x 16384 = 3866 MiB (memory_mib 3220) and the 256 MiB the simulated T4's
processes hold beside it: one window fits beside the other model's release (3 x 4122 MiB), two
windows at once do not (4 x 4122 = 16488 MiB > 16384). Deployed at once, one of them is
refused (its window would overcommit the GPU, and TensorFlow's allocator would silently cut the
last process's pool), the other rolls with no failed request; every serving process holds its
planned pool; `fab status` shows planned and held. Then something else takes the GPU between
the checks and the start (a playbook's `local` step): the new process's pool is cut, its gate
fails before any traffic moves, exit 2, the old release serving.

Models itgpua (port offset 5000) and itgpub (5100), on tb4 only, GPU 0 (``Model.gpus``). The
module is in the xdist group "gpu-host": no other module uses tb4 while it runs.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import sys
from collections.abc import Iterator
from contextlib import suppress
from pathlib import Path
from typing import Any

import pytest
from deploy_support import GOOD, Fleet, Traffic, fleet_fixture
from rollback_support import json_from
from testbed_support import ADDRESSES, GPU_HOST, REPO, STATE, SUITE_FLEET, run_testbed, ssh

pytestmark = [pytest.mark.testbed, pytest.mark.xdist_group("gpu-host")]

A, A_OFFSET = "itgpua", 5000
B, B_OFFSET = "itgpub", 5100
HOST = GPU_HOST
HOSTS = {HOST: ADDRESSES[HOST]}
MEMORY_MIB = 3220  # ceil(3220 x 1.2 / 16384, 3 places) = 0.236
POOL = int(0.236 * 16384)  # 3866 MiB
BESIDE = 256  # what a simulated T4's process holds beside its pool (testbed card t4)
CONTEXT = 128  # gpu_context_mib: below BESIDE, so the measured figure is what gets planned
VERSIONS = {1: GOOD[1], 2: GOOD[2], 3: GOOD[3]}


def ensure_wide_host() -> None:
    """The suite's fleet shape (a fleet brought up by hand may lack tb4 or its GPUs)."""
    hosts = json.loads((STATE / "hosts.json").read_text())["hosts"]
    if {h["name"]: len(h["gpus"]) for h in hosts}.get(HOST) != 2:
        proc = run_testbed("up", *SUITE_FLEET)
        assert proc.returncode == 0, f"scripts/testbed up failed:\n{proc.stdout}\n{proc.stderr}"


def forget_gpu_records(model: str) -> None:
    """The host-wide GPU records of ``model`` (what it was measured to hold, its windows)."""
    ssh(HOST, f"rm -f /srv/tfsdeploy/gpu/overhead/*.{model}.json "
              f"/srv/tfsdeploy/gpu/reservations/*.{model}.*.json", check=False)


def model_on_gpu0(tmp_path_factory: pytest.TempPathFactory, model: str,
                  offset: int) -> Iterator[Fleet]:
    ensure_wide_host()
    forget_gpu_records(model)
    for made in fleet_fixture(tmp_path_factory, model, offset, VERSIONS, serial=(1,),
                              memory_mib=MEMORY_MIB, hosts=HOSTS, gpus={HOST: 2}):
        text = made.inventory.read_text()
        for old, new in (('"docker_gpus": "all",', f'"docker_gpus": "all", '
                                                   f'"gpu_context_mib": {CONTEXT},'),
                         ("port_offset=", "gpus=(0,),\n        port_offset=")):
            assert old in text
            text = text.replace(old, new, 1)
        made.inventory.write_text(text)
        yield made
    forget_gpu_records(model)


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    """Model itgpua (its fab runs are dumped when a test fails)."""
    yield from model_on_gpu0(tmp_path_factory, A, A_OFFSET)


@pytest.fixture(scope="module")
def b(fleet: Fleet, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    """Model itgpub, on the same GPU."""
    yield from model_on_gpu0(tmp_path_factory, B, B_OFFSET)


def gpu_memory(fleet: Fleet) -> dict[str, Any]:
    """``fab status --json``'s GPU memory of the model's instance on the host."""
    run = fleet.fab("status", "--json")
    assert run.code == 0, run.describe()
    (row,) = [r for r in json_from(run.stdout) if r["host"] == HOST]
    (instance,) = row["instances"]
    return {"instance": instance["gpu_memory_mib"], "beside": row["gpu_beside_pool_mib"]}


def compute_apps() -> list[tuple[int, int]]:
    """(host pid, MiB) of each process on the host's GPU 0, as its nvidia-smi lists them."""
    out = ssh(HOST, "nvidia-smi -i 0 --query-compute-apps=pid,used_memory "
                    "--format=csv,noheader,nounits").stdout
    return [(int(p), int(m)) for p, m in (line.split(",") for line in out.splitlines() if line)]


def test_two_models_deployed_at_once_onto_one_gpu_never_overcommit_it(
        fleet: Fleet, b: Fleet) -> None:
    a = fleet
    a.deploy(1)
    b.deploy(1)
    with Traffic(a, HOST) as to_a, Traffic(b, HOST) as to_b:
        runs = {"a": a.background("deploy", "--version", "2"),
                "b": b.background("deploy", "--version", "2")}
        done = {name: run.finish(600) for name, run in runs.items()}
    assert not to_a.failures and not to_b.failures, (to_a.failures[:3], to_b.failures[:3])
    assert to_a.ok > 20 and to_b.ok > 20
    codes = {name: run.code for name, run in done.items()}
    winner = next((n for n, c in codes.items() if c == 0), None)
    assert winner is not None, "\n".join(r.describe() for r in done.values())
    loser = "b" if winner == "a" else "a"
    # the windows fit alone but not together: the second is refused before its process starts,
    # by the step that saw the other window first: preflight's check_gpu (nothing changed:
    # exit 1) or, both past preflight at once, its reservation (the host restored: exit 2)
    other = A if winner == "a" else B
    refusal = done[loser].out
    refused_by = re.findall(r"\s(check_gpu|reserve_gpu)\s+failed\s", refusal)
    assert len(set(refused_by)) == 1, done[loser].describe()
    assert codes[loser] == {"check_gpu": 1, "reserve_gpu": 2}[refused_by[0]], \
        done[loser].describe()
    assert f"other runs' windows open on this GPU: {other} release" in refusal, refusal
    winning, losing = (a, b) if winner == "a" else (b, a)
    winning.assert_serving(2)
    losing.assert_serving(1)
    # the winner planned with what its processes were measured to hold beside their pools
    assert (f"GPU 0: processes were measured holding {BESIDE} MiB beside their pools"
            in done[winner].out), done[winner].describe()
    assert f"more than gpu_context_mib {CONTEXT}: planned with {BESIDE}" in done[winner].out
    # no serving process ends with less than its planned pool
    for fleet in (a, b):
        memory = gpu_memory(fleet)["instance"]
        assert memory == {"planned": POOL, "held": POOL + BESIDE}, memory
    assert sorted(m for _, m in compute_apps()) == [POOL + BESIDE] * 2
    assert ssh(HOST, "ls /srv/tfsdeploy/gpu/reservations").stdout.split() == []
    # once that window has ended, the refused model rolls
    with Traffic(losing, HOST) as traffic:
        losing.deploy(2)
    assert not traffic.failures, traffic.failures[:3]
    losing.assert_serving(2)


def test_status_shows_each_instances_planned_pool_and_what_it_holds(fleet: Fleet) -> None:
    a = fleet
    memory = gpu_memory(a)
    assert memory["instance"]["held"] >= memory["instance"]["planned"] == POOL
    assert memory["beside"]["0"]["mib"] == BESIDE
    table = a.fab("status")
    assert table.code == 0, table.describe()
    assert "GPU MiB planned/held" in table.out or "planned/held" in table.out, table.out
    assert f"{POOL}/{POOL + BESIDE}" in table.out, table.out


def _playbook_with_a_gpu_thief(tmp: Path, pidfile: Path) -> Path:
    """deploy.yml whose roll lets another process take the GPU, leaving 3000 MiB free, right
    after the window's reservation and before the new release starts."""
    shutil.copytree(REPO / "tasks", tmp / "tasks")
    (tmp / "playbooks").mkdir()
    shutil.copy(REPO / "playbooks" / "deploy.yml", tmp / "playbooks" / "deploy.yml")
    roll = tmp / "tasks" / "roll_host.yml"
    text = roll.read_text()
    anchor = "  action: reserve_gpu\n"
    assert anchor in text
    filler = Path(__file__).with_name("gpu_filler.py")
    argv = [sys.executable, str(filler), str(STATE / "hosts" / HOST / "run" / "simgpu"), "0",
            "3000", str(pidfile)]
    roll.write_text(text.replace(anchor, anchor + (
        "- name: another process takes the GPU after the checks\n"
        "  action: local\n"
        f"  with: {{argv: {json.dumps(argv)}}}\n"), 1))
    return tmp / "playbooks" / "deploy.yml"


def test_a_pool_the_allocator_cut_fails_its_gate_and_the_old_release_serves(
        fleet: Fleet) -> None:
    a = fleet
    a.assert_serving(2)
    pidfile = a.tmp / "gpu-filler.pid"
    playbook = _playbook_with_a_gpu_thief(a.tmp / "thief", pidfile)
    try:
        with Traffic(a, HOST) as traffic:
            run = a.fab("deploy", "--version", "3", playbook=playbook)
    finally:
        if pidfile.exists():  # the filler this test's playbook started (on this machine)
            with suppress(ProcessLookupError):
                os.kill(int(pidfile.read_text()), signal.SIGTERM)
    assert not traffic.failures, traffic.failures[:3]
    assert run.code == 2, run.describe()
    assert "gate_gpu_memory" in run.out and f"GPU 0: planned {POOL} MiB, held" in run.out, \
        run.describe()
    assert "the allocator cut the pool" in run.out or "allocator cut the pool" in run.out
    assert "strategy 'recreate'" in run.out
    a.assert_serving(2)
    running = [c for c in a.containers(HOST) if c["status"] == "running"]
    assert [c["version"] for c in running] == ["2"], running
    record = a.current(HOST)
    assert record is not None and record["version"] == 2
