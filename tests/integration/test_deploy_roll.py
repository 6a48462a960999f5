"""`fab deploy` on the local fleet: real sshd, dockerd, the emulator.

One model (``itdeploy``, port offset 1000: stable ports 9500 gRPC / 9501 REST) is rolled
through the module; tests run in file order and each one states the fleet it starts from
(``on_version``), re-deploying only when an earlier test left something else.

Assembled versions: 1 and 2 are half_plus_two 1 and 2 (y = 0.5 x + 2 / + 3), 3 is the corrupt
half_plus_two_bad/11, 4 the slow-warmup half_plus_two_bad/13, 5 the wrong-signature
half_plus_two_bad/12 (loads fine, serves `z` -> `w`).
"""

from __future__ import annotations

import re
import signal
import time
from collections.abc import Iterator

import pytest
from deploy_support import (
    CORRUPT,
    GOOD,
    SLOW,
    WRONG_SIGNATURE,
    Fleet,
    fleet_fixture,
    rest_status,
)
from testbed_support import HOSTS, Run, ssh

from tests.bounds import within

pytestmark = pytest.mark.testbed

MODEL, OFFSET = "itdeploy", 1000
# source number (b) of each assembled version: y = 0.5 x + b + 1
B = {1: 1, 2: 2}


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    yield from fleet_fixture(tmp_path_factory, MODEL, OFFSET,
                             {1: GOOD[1], 2: GOOD[2], 3: CORRUPT, 4: SLOW, 5: WRONG_SIGNATURE},
                             serial=(1, "100%"), min_healthy_s=1.0, load_timeout_s=120.0)


def on_version(fleet: Fleet, version: int) -> dict[str, object]:
    """Make sure every host serves ``version`` (deploy it if not); returns the snapshot."""
    currents = [fleet.current(h) for h in HOSTS]
    if not all(c and c.get("version") == version and c.get("status") == "serving"
               for c in currents):
        fleet.deploy(version)
    fleet.assert_serving(B[version])
    return fleet.snapshot()


# -- 1. v1 to an empty fleet, then v2 over it -------------------------------------------------

def test_first_deploy_serves_v1_on_every_hosts_stable_ports(fleet: Fleet) -> None:
    assert all(not fleet.containers(h) for h in HOSTS), "the fixture starts from nothing"
    run = fleet.fab("deploy", "--version", "1")
    assert run.code == 0, run.describe()
    assert "every host serves" in run.out
    fleet.assert_serving(B[1])  # gRPC Predict on :8500 and REST predict on :8501
    for host, address in HOSTS.items():
        status = rest_status(address, fleet.rest_port, MODEL)
        assert [(s["version"], s["state"]) for s in status] == [("1", "AVAILABLE")], host
        manifest = fleet.current(host)
        assert manifest is not None and manifest["version"] == 1, host
        assert manifest["status"] == "serving" and manifest["slot"] == "blue"
        gates = [g["gate"] for g in manifest["gates"]]
        # the GPU memory gate (the testbed's hosts have a GPU each) right after warmup
        assert gates[:5] == ["available", "signature", "warmup", "gpu_memory", "health"], \
            gates
        assert all(g["ok"] for g in manifest["gates"]), manifest["gates"]
        assert fleet.current_target(host) == f"releases/{manifest['id']}"
        containers = fleet.containers(host)
        assert [(c["version"], c["status"]) for c in containers] == [("1", "running")]
        events = {e["event"] for e in fleet.audit(host) if e["release"] == manifest["id"]}
        assert {"upload_release", "start_slot", "switch_traffic",
                "record_release"} <= events, host


def test_second_deploy_rolls_v2_keeps_v1_stopped(fleet: Fleet) -> None:
    on_version(fleet, 1)
    before = {h: fleet.current(h) for h in HOSTS}
    run = fleet.fab("deploy", "--version", "2", "--json")
    assert run.code == 0, run.describe()
    result = run.json()
    assert result["exit_code"] == 0 and result["version"] == 2
    assert {h: o["status"] for h, o in result["hosts"].items()} == dict.fromkeys(HOSTS, "rolled")
    fleet.assert_serving(B[2])
    for host in HOSTS:
        old = before[host]
        assert old is not None
        manifest = fleet.current(host)
        assert manifest is not None and manifest["id"] == result["release"], host
        assert manifest["version"] == 2 and manifest["previous"] == old["id"]
        assert manifest["slot"] == "green" and manifest["status"] == "serving"
        assert fleet.current_target(host) == f"releases/{result['release']}"
        by_release = {c["release"]: c for c in fleet.containers(host)}
        assert by_release[old["id"]]["status"] == "exited", f"{host}: v1 stopped, kept"
        assert by_release[result["release"]]["status"] == "running", host
        # the old release's record stays on the host for rollback
        assert fleet.current_target(host) != f"releases/{old['id']}"
        assert any(e["event"] == "record_release" and e["release"] == result["release"]
                   for e in fleet.audit(host))
        files = {"manifest.json", "models.config", "batching.config", "monitoring.config",
                 "tfserving.flags"}
        listed = ssh(host, f"ls /srv/tfsdeploy/{MODEL}/releases/{old['id']} "
                           f"/srv/tfsdeploy/{MODEL}/releases/{result['release']}").stdout
        assert files <= set(listed.split()), listed


def test_same_version_again_changes_nothing(fleet: Fleet) -> None:
    before = on_version(fleet, 2)
    run = fleet.fab("deploy", "--version", "2", "--json")
    assert run.code == 0, run.describe()
    assert {h: o["status"] for h, o in run.json()["hosts"].items()} == dict.fromkeys(
        HOSTS, "unchanged")
    assert fleet.snapshot() == before


def test_check_diff_shows_the_plan_and_touches_nothing(fleet: Fleet) -> None:
    before = on_version(fleet, 2)
    run = fleet.fab("deploy", "--version", "1", "--check", "--diff")
    assert run.code == 0, run.describe()
    for host in HOSTS:
        assert f"{host}:live/models.config" in run.out and f"{host}:new/models.config" in run.out
    assert "nothing was changed" in run.out
    assert fleet.snapshot() == before


# -- 2. a broken version stops at the first host ------------------------------------------------

def test_corrupt_version_stops_at_the_canary_which_keeps_serving_v2(fleet: Fleet) -> None:
    before = on_version(fleet, 2)
    run = fleet.fab("deploy", "--version", "3")
    assert run.code == 2, run.describe()
    assert "gate_available" in run.out, "the output names the failing gate"
    assert "server log (tail)" in run.out and "saved_model.pb" in run.out, (
        "the output carries the server's log tail with the load error")
    assert "every host serves its previous release" in run.out
    fleet.assert_serving(B[2])
    after = fleet.snapshot()
    # tb1: the new container was removed, the v2 container never restarted; tb2/tb3 untouched
    assert after == before, "same containers (ids, start times) and releases everywhere"
    for host in ("tb2", "tb3"):  # staged (the version is uploaded everywhere first), not rolled
        steps = {e["event"] for e in fleet.audit(host) if e["release"] == _release_of(run)}
        assert steps <= {"stage_model"}, (host, steps)


def _release_of(run: object) -> str:
    text = run.out  # type: ignore[attr-defined]
    found = re.search(r"as (r\d{8}-\d+-v\d+)", text)
    assert found, text
    return found.group(1)


def test_wrong_signature_is_refused_by_the_signature_gate(fleet: Fleet) -> None:
    before = on_version(fleet, 2)
    run = fleet.fab("deploy", "--version", "5")
    assert run.code == 2, run.describe()
    assert "gate_signature" in run.out and "['z'] != contract ['x']" in run.out, run.describe()
    fleet.assert_serving(B[2])
    assert fleet.snapshot() == before


# -- 3. a version that loads too slowly hits its deadline ---------------------------------------

def test_slow_version_hits_the_load_deadline_and_is_restored(fleet: Fleet) -> None:
    before = on_version(fleet, 2)
    impatient = fleet.inventory_variant("impatient", load_timeout_s=10.0)
    started = time.monotonic()
    run = fleet.fab("deploy", "--version", "4", inventory=impatient)
    assert run.code == 2, run.describe()
    assert "gate_available" in run.out and "deadline" in run.out, run.describe()
    # the slow version needs 25-60 s to warm up: the roll must give up at ~10 s, not wait
    # measured in a full run (2 cores, 4 workers beside it): 13.7 s, margin 8.77x;
    # scripts/test prints it every run
    within("deploy past its 10 s load deadline, s", time.monotonic() - started, below=120,
           detail=run.describe())
    fleet.assert_serving(B[2])
    assert fleet.snapshot() == before


# -- 6. two deploys at once; 7. Ctrl-C and SIGTERM mid-roll --------------------------------------

def interrupted_v1_roll(fleet: Fleet, variant: str, min_healthy_s: float, waits: list[str],
                        signum: signal.Signals) -> Run:
    """A v1 deploy over v2 with a long health gate, sent ``signum`` once each of ``waits``
    (output patterns) has shown; returns the finished run."""
    slow = fleet.inventory_variant(variant, min_healthy_s=min_healthy_s)
    roll = fleet.background("deploy", "--version", "1", inventory=slow)
    try:
        for pattern in waits:
            roll.wait_for(pattern, timeout=240)
        roll.send(signum)
        return roll.finish(timeout=180)
    finally:
        roll.kill()


def assert_v2_serves_and_lock_free(fleet: Fleet) -> None:
    """After an interrupted roll: the lock is released and every host serves v2 again."""
    free, shown = fleet.lock_free()
    assert free, shown.describe()
    fleet.assert_serving(B[2])


def test_second_deploy_gets_exit_4_naming_the_holder_then_ctrl_c_restores(fleet: Fleet) -> None:
    before = on_version(fleet, 2)
    slow = fleet.inventory_variant("slow_health", min_healthy_s=20.0)
    first = fleet.background("deploy", "--version", "1", inventory=slow)
    try:
        first.wait_for(r"== deploy itdeploy version 1 .* lock on tb1", timeout=180)
        second = fleet.fab("deploy", "--version", "1")
        assert second.code == 4, second.describe()
        assert f"pid {first.proc.pid}" in second.out and "holds the lock" in second.out
        shown = fleet.fab("lock")
        assert shown.code == 0 and f"pid {first.proc.pid}" in shown.out, shown.describe()
        # Ctrl-C while the canary is in its health gate (the step after warmup)
        first.wait_for(r"tb1 +roll +gate_warmup +ok", timeout=240)
        first.send(signal.SIGINT)
        run = first.finish(timeout=180)
    finally:
        first.kill()
    assert run.code == 2, run.describe()
    assert "interrupted" in run.out and "every host serves its previous release" in run.out
    assert_v2_serves_and_lock_free(fleet)
    assert fleet.snapshot() == before


def test_sigterm_mid_roll_restores_and_unlocks(fleet: Fleet) -> None:
    before = on_version(fleet, 2)
    run = interrupted_v1_roll(fleet, "slow_health", 20.0, [r"tb1 +roll +gate_warmup +ok"],
                              signal.SIGTERM)
    assert run.code == 2, run.describe()
    assert_v2_serves_and_lock_free(fleet)
    assert fleet.snapshot() == before


def test_lock_wait_queues_the_second_deploy_until_the_first_is_done(fleet: Fleet) -> None:
    on_version(fleet, 2)
    slow = fleet.inventory_variant("slow_health_short", min_healthy_s=4.0)
    first = fleet.background("deploy", "--version", "1", inventory=slow)
    try:
        first.wait_for(r"== deploy itdeploy version 1 .* lock on tb1", timeout=180)
        queued = fleet.fab("deploy", "--version", "2", "--lock-wait", "400")
        done = first.finish(timeout=400)
    finally:
        first.kill()
    assert done.code == 0, done.describe()
    assert queued.code == 0, queued.describe()
    assert "every host serves" in queued.out
    fleet.assert_serving(B[2])
    for host in HOSTS:
        manifest = fleet.current(host)
        assert manifest is not None and manifest["version"] == 2, (host, manifest)
        assert manifest["previous"] and manifest["previous"].endswith("-v1"), (
            f"{host}: the queued deploy rolled over the first one's v1")


def test_ctrl_c_in_batch_2_reverts_the_canary_too(fleet: Fleet) -> None:
    before = on_version(fleet, 2)
    run = interrupted_v1_roll(fleet, "slow_health_10", 10.0,
                              [r"tb1 +roll +record_release +ok", r"tb[23] +roll +gate_warmup +ok"],
                              signal.SIGINT)
    assert run.code == 2, run.describe()
    assert "every host serves its previous release" in run.out
    assert re.search(r"tb1 +restore +restore +ok", run.out), "the canary was reverted"
    assert_v2_serves_and_lock_free(fleet)
    after = fleet.snapshot()
    for host in HOSTS:
        assert after[host]["current"] == before[host]["current"], host
        # the v2 container kept running throughout (same id, never restarted)
        assert [c for c in after[host]["containers"] if c[2] == "running"] == [
            c for c in before[host]["containers"] if c[2] == "running"], host


def test_ctrl_c_pressed_repeatedly_still_restores_and_unlocks(fleet: Fleet) -> None:
    """A person hammering Ctrl-C: the restore and the lock release must still finish and
    the exit code stay 2 (bug B5: exit 1, no summary, lock left behind)."""
    before = on_version(fleet, 2)
    slow = fleet.inventory_variant("slow_health", min_healthy_s=20.0)
    roll = fleet.background("deploy", "--version", "1", inventory=slow)
    try:
        roll.wait_for(r"tb1 +roll +gate_warmup +ok", timeout=240)
        for _ in range(25):  # every 0.2 s for up to 5 s, until the hosts are restored
            if roll.proc.poll() is not None or re.search(
                    r"restore +restore|every host serves|rolled_back", roll.text()):
                break
            roll.send(signal.SIGINT)
            time.sleep(0.2)
        run = roll.finish(timeout=180)
    finally:
        roll.kill()
    free, lock = fleet.lock_free()
    if not free:
        fleet.fab("lock", "--break")  # leave the module usable
    assert run.code == 2, run.describe()
    assert "every host serves its previous release" in run.out, run.describe()
    assert free, lock.describe()
    fleet.assert_serving(B[2])
    assert fleet.snapshot() == before
