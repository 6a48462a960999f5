"""The GPU's truth in a roll, on fake hosts whose nvidia-smi lists each running server by host
pid with what it holds: the gate reads the new process's holding after AVAILABLE and after
warmup, a cut pool fails it (exit 2, the old release serving), what a process holds beside
its pool is recorded and used by the next plan, a window is reserved host-wide and given back,
another run's live window refuses the deploy, and `fab status` shows planned and held."""

from __future__ import annotations

import json
from functools import partial
from pathlib import Path
from typing import Any

from tfsdeploy.cli.output import status_row
from tfsdeploy.core.errors import ExitCode
from tfsdeploy.core.gpu.records import WindowReservation
from tfsdeploy.core.inventory.layout import HostPaths
from tfsdeploy.hosts import gpu_reservation
from tfsdeploy.run import views as fleet_cli

from . import runs
from .fakes import GPU_BESIDE_POOL_MIB, FakeFleet, FakeHost, read_json
from .runs import MODEL, Recorder, manifest, paths, serving

GPU = {"docker_gpus": "all"}
run_deploy = partial(runs.run_deploy, count=2, host_vars={"h1": GPU, "h2": GPU})
POOL = int(0.038 * 16384)  # hp2: ceil(512 MiB x 1.2 / 16384 MiB, 3 places) = 0.038


def gpu_dir(host: FakeHost) -> Path:
    return Path(paths(host).gpu_dir)


def reservations(host: FakeHost) -> list[str]:
    folder = gpu_dir(host) / "reservations"
    return sorted(p.name for p in folder.glob("*.json")) if folder.is_dir() else []


def test_a_healthy_roll_holds_its_pool_records_the_overhead_and_gives_the_window_back(
        world: dict[str, Any]) -> None:
    recorder = Recorder()
    result = run_deploy(world, 1, recorder)
    assert result.exit_code == ExitCode.OK, result.message
    fleet: FakeFleet = world["fleet"]
    h1 = fleet["h1"]
    record = read_json(manifest(h1, result.release_id))
    gates = {g["gate"]: g for g in record["gates"]}
    assert gates["gpu_memory"]["ok"] and "gpu_memory_warm" not in gates
    assert (f"GPU 0: holds {POOL + GPU_BESIDE_POOL_MIB} MiB >= pool {POOL} MiB "
            f"(+{GPU_BESIDE_POOL_MIB} beside it)") == gates["gpu_memory"]["detail"]
    overhead = read_json(gpu_dir(h1) / "overhead" / f"0.{MODEL}.json")
    assert (overhead["model"], overhead["release"], overhead["pool_mib"],
            overhead["overhead_mib"]) == (MODEL, result.release_id, POOL, GPU_BESIDE_POOL_MIB)
    # the window's reservation was taken before the start and given back after retire_old
    steps = [s[2] for s in recorder.steps if s[0] == "h1"]
    assert steps.index("reserve_gpu") < steps.index("start_slot")
    assert steps.index("retire_old") < steps.index("release_gpu")
    assert reservations(h1) == []
    assert (gpu_dir(h1) / "seq").read_text().strip() == "1"


def test_a_pool_the_allocator_cut_fails_the_gate_and_the_old_release_keeps_serving(
        world: dict[str, Any]) -> None:
    first = run_deploy(world, 1)
    fleet: FakeFleet = world["fleet"]
    h1 = fleet["h1"]
    h1.cut_new_pools = True  # something else took the GPU after the checks
    result = run_deploy(world, 2)
    assert result.exit_code == ExitCode.ROLLED_BACK, result.message
    assert serving(h1) == [first.release_id]
    error = result.hosts["h1"].error
    cut = int(POOL * 0.729) + GPU_BESIDE_POOL_MIB
    # a small pool: what the process holds beside it hides the cut from the first reading
    # (709 MiB held >= 622 planned); after warmup it holds less than a whole pool and the
    # 256 MiB this model's processes held beside theirs at the last deploy (less 128 slack)
    whole = POOL + GPU_BESIDE_POOL_MIB - 128
    assert (f"GPU 0: planned {POOL} MiB, held {cut} MiB (a whole pool holds at least {whole} "
            "MiB here)") in error, error
    diagnosis = result.hosts["h1"].diagnosis
    assert diagnosis is not None and diagnosis["kind"] == "gpu_pool_cut"
    assert "strategy 'recreate'" in diagnosis["fix"] and "fewer models" in diagnosis["fix"]
    assert reservations(h1) == []  # the rescue gave the window back
    record = read_json(manifest(h1, result.release_id))
    assert [g["gate"] for g in record["gates"] if not g["ok"]] == ["gpu_memory"]
    assert not any(c.running and c.release == result.release_id
                   for c in h1.docker.by_name.values())


def test_what_processes_hold_beside_their_pools_is_used_by_the_next_plan(
        world: dict[str, Any]) -> None:
    small = {**GPU, "gpu_context_mib": 128}
    deploy = partial(runs.run_deploy, count=2, host_vars={"h1": small, "h2": small})
    assert deploy(world, 1).exit_code == ExitCode.OK
    recorder = Recorder()
    second = deploy(world, 2, recorder)
    assert second.exit_code == ExitCode.OK, second.message
    said = [d for (h, _, task, _), d in zip(recorder.steps, recorder.details, strict=True)
            if h == "h1" and task == "check_gpu"]
    assert len(said) == 1
    assert (f"GPU 0: processes were measured holding {GPU_BESIDE_POOL_MIB} MiB beside their "
            f"pools ({MODEL} release ") in said[0]
    assert f"more than gpu_context_mib 128: planned with {GPU_BESIDE_POOL_MIB}" in said[0]


def _plant_window(host: FakeHost, *, need: int, token: str, lock: bool) -> None:
    """Another model's run holding a window on the host's GPU 0 (its lock held with
    ``token`` when ``lock``), its new process not started yet."""
    root = Path(paths(host).root)
    folder = root / "gpu" / "reservations"
    folder.mkdir(parents=True, exist_ok=True)
    record = WindowReservation(model="other", release="20260101-000000-v4", lock_token=token,
                               who="bob@deploy2", started="2026-01-01T00:00:00+00:00",
                               need_mib={0: need}, containers=("tfs-other-new",))
    (folder / "000000000007.other.0.json").write_bytes(record.to_json())
    (root / "other" / "lock").mkdir(parents=True, exist_ok=True)
    (root / "other" / "lock" / "info.json").write_text(
        json.dumps({"token": token if lock else "0123abcd"}))


def test_another_runs_live_window_refuses_the_deploy_and_names_it(
        world: dict[str, Any]) -> None:
    assert run_deploy(world, 1).exit_code == ExitCode.OK
    fleet: FakeFleet = world["fleet"]
    h1 = fleet["h1"]
    before = serving(h1)
    _plant_window(h1, need=15000, token="feedbeef", lock=True)
    refused = run_deploy(world, 2)
    assert refused.exit_code == ExitCode.INVALID, refused.message
    error = refused.hosts["h1"].error
    assert ("reserved by other runs' windows; other runs' windows open on this GPU: other "
            "release 20260101-000000-v4") in error, error
    assert "by bob@deploy2" in error and "deploy again once they have ended" in error
    assert serving(h1) == before
    # its run ended (the lock is another's now): the reservation holds nothing any more
    _plant_window(h1, need=15000, token="feedbeef", lock=False)
    assert run_deploy(world, 2).exit_code == ExitCode.OK


def test_the_host_orders_reservations_and_the_later_one_is_refused(
        world: dict[str, Any]) -> None:
    assert run_deploy(world, 1).exit_code == ExitCode.OK
    fleet: FakeFleet = world["fleet"]
    h1 = fleet["h1"]
    conn = fleet.connect(runs.target(world, count=2).hosts[0])
    root = paths(h1).root
    for name, token in (("a", "aaaa1111"), ("b", "bbbb2222")):
        (Path(root) / name / "lock").mkdir(parents=True)
        (Path(root) / name / "lock" / "info.json").write_text(json.dumps({"token": token}))

    def window(name: str, token: str, need: int) -> WindowReservation:
        return WindowReservation(model=name, release="20260101-000000-v1", lock_token=token,
                                 who="w", started="t", need_mib={0: need},
                                 containers=(f"tfs-{name}",))

    # 1000 MiB used of 16384 (the fake's baseline): each window fits alone, not both
    a = gpu_reservation.take(conn, HostPaths(root, "a"), window("a", "aaaa1111", 9000))
    b = gpu_reservation.take(conn, HostPaths(root, "b"), window("b", "bbbb2222", 9000))
    assert a.refusal is None and a.name.endswith(".a.0.json")
    assert b.refusal is not None and [r.model for r in b.refusal.holders] == ["a"]
    assert int(b.name.split(".")[0]) == int(a.name.split(".")[0]) + 1
    assert reservations(h1) == [a.name]  # the refused one is gone
    # another run's token gives back nothing; the holder's gives back its own
    assert gpu_reservation.release(conn, HostPaths(root, "a"), "bbbb2222") == ""
    assert gpu_reservation.release(conn, HostPaths(root, "a"), "aaaa1111") == \
        f"released {a.name}"
    assert gpu_reservation.take(conn, HostPaths(root, "b"),
                                window("b", "bbbb2222", 9000)).refusal is None


def test_a_card_whose_driver_reserves_memory_the_inventory_omits_is_refused(
        world: dict[str, Any]) -> None:
    fleet: FakeFleet = world["fleet"]
    target = runs.target(world, count=2, host_vars={"h1": GPU, "h2": GPU})
    fleet.host(target.hosts[0]).gpu_reserved_mib = 616
    refused = run_deploy(world, 1)
    assert refused.exit_code == ExitCode.INVALID, refused.message
    error = refused.hosts["h1"].error
    assert "fraction 0.038 x 15768 MiB that CUDA can allocate = 599 MiB" in error, error
    assert "fix it to Gpu(0, 16384, reserved_mib=616) as nvidia-smi reports" in error


def test_status_gives_each_instance_its_planned_pool_and_what_it_holds(
        world: dict[str, Any]) -> None:
    assert run_deploy(world, 1).exit_code == ExitCode.OK
    fleet: FakeFleet = world["fleet"]
    rows = {r["host"]: r for r in fleet_cli.status(
        runs.target(world, count=2, host_vars={"h1": GPU, "h2": GPU}), connect=fleet.connect)}
    for host in ("h1", "h2"):
        memory = rows[host]["instances"][0]["gpu_memory_mib"]
        assert memory == {"planned": POOL, "held": POOL + GPU_BESIDE_POOL_MIB}
        assert memory["held"] >= memory["planned"]
        assert rows[host]["gpu_beside_pool_mib"]["0"]["mib"] == GPU_BESIDE_POOL_MIB
    assert status_row(rows["h1"])[-1] == f"{POOL}/{POOL + GPU_BESIDE_POOL_MIB}; beside pool " \
        f"GPU 0 {GPU_BESIDE_POOL_MIB}"
