"""`fab tune`'s scratch instances outside the tune that made them (fake hosts): they never
restart on their own; one tune of a model per host at a time (the tune lock); what a killed
tune (kill -9) left is named by `fab status`, removed by the next deploy, rollback, prune or
retire (saying so) and by the next tune; a running tune's are kept, and `check_gpu` names them
when the GPU has no room. The fleet's own test: tests/integration/test_tune_scratch.py."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest

from tfsdeploy.core.errors import ConfigError, ExitCode
from tfsdeploy.core.inventory.layout import HostPaths, Ports
from tfsdeploy.core.rollout.records import LockRecord
from tfsdeploy.core.tuning.options import TuneOptions
from tfsdeploy.hosts import lock, scratch
from tfsdeploy.hosts.commands.containers import (
    GpuRequest,
    proxy_spec,
    scratch_spec,
    server_spec,
)
from tfsdeploy.hosts.dockerapi import sdk_arguments
from tfsdeploy.run import views
from tfsdeploy.run.prune import prune
from tfsdeploy.run.retire import retire
from tfsdeploy.run.tune import tune

from . import runs
from .fakes import FakeFleet, FakeHost
from .runs import Recorder, paths, run_deploy, run_rollback

SCRATCH = "tfs-hp2-tune-0"
SCRATCH_MIB = 15000  # what the scratch instance holds on its GPU (16384 MiB, 1000 used)


def _dead_pid() -> int:
    child = subprocess.Popen(["true"])
    child.wait()
    return child.pid


def _killed() -> LockRecord:
    """The tune lock of a `fab tune` on this machine killed with -9."""
    mine = lock.new_lock_record("fab tune --host h1")
    return mine.model_copy(update={"token": "dead" * 8, "pid": _dead_pid(),
                                   "pid_start": 12345})


def _running(host: str = "h1") -> LockRecord:
    """The tune lock of a `fab tune` that runs (this test's own process)."""
    return lock.new_lock_record(f"fab tune --host {host}")


def _left_by(host: FakeHost, record: LockRecord, *, gpu_mib: int = 0) -> None:
    """What a tune holding ``record`` leaves on ``host``: its lock, a trial's files and a
    running scratch instance (holding ``gpu_mib`` of the GPU until it is removed)."""
    where = paths(host)
    Path(where.tune_lock_dir).mkdir(parents=True)
    Path(where.tune_lock_dir, "info.json").write_text(record.model_dump_json())
    Path(where.tune_dir, "0").mkdir(parents=True)
    Path(where.tune_dir, "0", "tfserving.flags").write_text("--port=14000\n")
    host.docker.run(scratch_spec(model="hp2", trial=0, version=1, image="reg/tfs:2.21.0",
                                 paths=where, config_dir=f"{where.tune_dir}/0",
                                 ports=(14000, 14001), flags=["--model_name=hp2"],
                                 gpus=GpuRequest(device_ids=("0",)), run=record.token))
    if gpu_mib:
        host.gpu_used_mib += gpu_mib
        remove = host.docker.remove

        def freeing(name: str) -> None:
            if name == SCRATCH and name in host.docker.by_name:
                host.gpu_used_mib -= gpu_mib  # its process ends: the memory is free
            remove(name)

        host.docker.remove = freeing  # type: ignore[method-assign]


def _audited(host: FakeHost, step: str) -> list[str]:
    lines = Path(paths(host).audit_log).read_text().splitlines()
    return [json.loads(line)["details"].get("change", "") for line in lines
            if json.loads(line)["event"] == step]


def _gone(host: FakeHost) -> bool:
    where = paths(host)
    return (SCRATCH not in host.docker.by_name and not Path(where.tune_dir).exists()
            and not Path(where.tune_lock_dir).exists())


def test_a_scratch_instance_never_restarts_and_carries_its_tune_and_gpus() -> None:
    where = HostPaths(root="/srv/tfsdeploy", model="hp2")
    spec = scratch_spec(model="hp2", trial=3, version=2, image="img", paths=where,
                        config_dir=f"{where.tune_dir}/3", ports=(14000, 14001), flags=[],
                        gpus=GpuRequest(device_ids=("1",)), run="ab" * 16)
    assert sdk_arguments(spec)["restart_policy"] == {"Name": "no"}
    assert spec.labels["tfsdeploy.tune"] == "hp2"
    assert spec.labels["tfsdeploy.tune-run"] == "ab" * 16
    assert spec.labels["tfsdeploy.gpus"] == "1"
    assert "tfsdeploy.model" not in spec.labels  # never one of the model's servers
    # what serves comes back after a crash or an engine restart
    server = server_spec(model="hp2", release_id="r1", slot="blue", version=2, image="img",
                         paths=where, ports=Ports(8500, 8501, {"blue": (8510, 8511)}),
                         flags=[], gpus=None)
    assert sdk_arguments(server)["restart_policy"] == {"Name": "unless-stopped"}
    proxy = proxy_spec(model="hp2", image="haproxy", paths=where)
    assert sdk_arguments(proxy)["restart_policy"] == {"Name": "unless-stopped"}


def test_status_names_a_killed_tunes_scratch_instance_and_a_running_tunes(
        world: dict[str, Any]) -> None:
    assert run_deploy(world, 1, count=2).exit_code == ExitCode.OK
    fleet: FakeFleet = world["fleet"]
    _left_by(fleet["h1"], _killed())
    running = _running("h2")
    _left_by(fleet["h2"], running)
    rows = {r["host"]: r for r in views.status(runs.target(world, count=2),
                                               connect=fleet.connect)}
    (left,) = rows["h1"]["scratch"]
    assert left["name"] == SCRATCH and left["left"] is True and left["gpus"] == "0"
    assert left["note"] == (
        f"{SCRATCH} (running, GPU 0): fab tune's scratch instance left by a tune that no "
        "longer runs; the next fab deploy, rollback, prune or retire of hp2 removes it")
    (kept,) = rows["h2"]["scratch"]
    assert kept["left"] is False
    assert kept["note"] == (f"{SCRATCH} (running, GPU 0): the scratch instance of "
                            f"{running.describe()}, which holds the model's tune lock")


def test_the_next_deploy_removes_what_a_killed_tune_left_and_says_so(
        world: dict[str, Any]) -> None:
    assert run_deploy(world, 1, count=2).exit_code == ExitCode.OK
    fleet: FakeFleet = world["fleet"]
    h1 = fleet["h1"]
    _left_by(h1, _killed(), gpu_mib=SCRATCH_MIB)
    recorder = Recorder()
    result = run_deploy(world, 2, recorder, count=2)
    # without the removal, check_gpu would find 384 MiB free on h1's GPU and refuse
    assert result.exit_code == ExitCode.OK, result.message
    assert _gone(h1)
    assert runs.serving(h1) and h1.serving_version() == 2
    said = [d for (host, _, task, _), d in zip(recorder.steps, recorder.details, strict=True)
            if host == "h1" and task == "remove_scratch"]
    assert len(said) == 1 and said[0].startswith("broke a stale tune lock on h1: fab tune "
                                                 "--host h1 by "), said
    assert said[0].endswith(f"removed {SCRATCH}: fab tune's scratch instance(s) that a tune "
                            "no longer running left"), said
    assert _audited(h1, "remove_scratch") == [
        f"remove fab tune's scratch instance(s) of hp2 a killed tune left ({SCRATCH})"]
    assert _audited(fleet["h2"], "remove_scratch") == []  # nothing was left there


def test_a_rollback_removes_what_a_killed_tune_left(world: dict[str, Any]) -> None:
    first = run_deploy(world, 1, count=2)
    assert run_deploy(world, 2, count=2).exit_code == ExitCode.OK
    fleet: FakeFleet = world["fleet"]
    _left_by(fleet["h2"], _killed(), gpu_mib=SCRATCH_MIB)
    result = run_rollback(world, to=first.release_id, count=2)
    assert result.exit_code == ExitCode.OK, result.message
    assert _gone(fleet["h2"]) and fleet["h2"].serving_version() == 1


def test_a_running_tunes_scratch_instance_is_kept_and_check_gpu_names_it(
        world: dict[str, Any]) -> None:
    assert run_deploy(world, 1, count=2).exit_code == ExitCode.OK
    fleet: FakeFleet = world["fleet"]
    h1 = fleet["h1"]
    running = _running()
    _left_by(h1, running, gpu_mib=SCRATCH_MIB)
    result = run_deploy(world, 2, count=2)
    assert result.exit_code == ExitCode.INVALID, result.message
    error = result.hosts["h1"].error
    assert error.startswith("check_gpu: expected ") and "saw 384 MiB free" in error, error
    assert error.endswith(f"; held beside it: {SCRATCH} (running, GPU 0): the scratch "
                          f"instance of {running.describe()}, which holds the model's tune "
                          "lock"), error
    assert SCRATCH in h1.docker.by_name and Path(paths(h1).tune_lock_dir).is_dir()
    assert h1.serving_version() == 1


def test_the_removal_keeps_the_instances_of_a_tune_that_took_the_lock_meanwhile(
        world: dict[str, Any]) -> None:
    """The facts showed a killed tune's instance; a new tune took the lock since: the removal
    (under the tune lock) leaves the new tune's trials alone."""
    fleet: FakeFleet = world["fleet"]
    target = runs.target(world, count=1)
    conn = fleet.connect(target.hosts[0])
    running = _running()
    _left_by(fleet["h1"], running)
    done = scratch.clear_left(conn, "hp2", paths(fleet["h1"]), lock.new_lock_record("fab deploy"))
    assert done == (f"kept fab tune's scratch instances: they are {running.describe()}'s")
    assert SCRATCH in fleet["h1"].docker.by_name


def test_prune_and_retire_remove_what_a_killed_tune_left(world: dict[str, Any]) -> None:
    assert run_deploy(world, 1, count=2).exit_code == ExitCode.OK
    fleet: FakeFleet = world["fleet"]
    _left_by(fleet["h1"], _killed())
    _left_by(fleet["h2"], _killed())
    pruned = prune(runs.target(world, hosts="h1", count=2), reporter=Recorder(),
                   connect=fleet.connect)
    assert pruned.exit_code == ExitCode.OK, pruned.message
    assert _gone(fleet["h1"]) and SCRATCH in fleet["h2"].docker.by_name
    assert len(_audited(fleet["h1"], "remove_scratch")) == 1
    retired = retire(runs.target(world, hosts="h2", count=2), reporter=Recorder(),
                     connect=fleet.connect)
    assert retired.exit_code == ExitCode.OK, retired.message
    assert _gone(fleet["h2"])
    assert len(_audited(fleet["h2"], "remove_scratch")) == 1


def _tune(world: dict[str, Any], notes: list[str]) -> None:
    fleet: FakeFleet = world["fleet"]
    target = runs.target(world, count=1)
    tune(target, target.hosts[0], TuneOptions(budget_s=1), note=notes.append,
         connect=fleet.connect)


def test_a_second_tune_is_refused_naming_the_first_and_touches_nothing(
        world: dict[str, Any]) -> None:
    assert run_deploy(world, 1, count=1).exit_code == ExitCode.OK
    fleet: FakeFleet = world["fleet"]
    h1 = fleet["h1"]
    first = _running()
    _left_by(h1, first)
    before = dict(h1.docker.by_name)
    notes: list[str] = []
    with pytest.raises(scratch.TuneHeld) as refused:
        _tune(world, notes)
    assert refused.value.exit_code == ExitCode.LOCKED
    assert str(refused.value).startswith(
        f"another fab tune of hp2 runs on h1: {first.describe()}; its scratch instances "
        "there are its own.\n    fix: wait until it ends"), str(refused.value)
    assert h1.docker.by_name == before and h1.docker.called("remove") == []
    held = json.loads(Path(paths(h1).tune_lock_dir, "info.json").read_text())
    assert held["token"] == first.token and notes == []


def test_a_tune_breaks_a_killed_tunes_lock_removes_what_it_left_and_gives_its_lock_back(
        world: dict[str, Any]) -> None:
    fleet: FakeFleet = world["fleet"]
    target = runs.target(world, count=1)
    fleet.connect(target.hosts[0])  # the fake host exists
    killed = _killed()
    _left_by(fleet["h1"], killed)
    notes: list[str] = []
    with pytest.raises(ConfigError, match="nothing of hp2 serves on h1"):
        _tune(world, notes)  # nothing serves: the search cannot start
    assert notes[0].startswith(f"broke a stale tune lock on h1: {killed.describe()} ("), notes
    assert f"removed {SCRATCH}, a scratch instance an earlier fab tune left" in notes, notes
    assert _gone(fleet["h1"])
