"""`fab tune`'s scratch instances on the local fleet, outside the tune that made them: one left
by a tune killed with -9 keeps running, never restarts after a crash, is named by `fab status`
and removed by the next `fab deploy` (which says so); two tunes of one model on one host at
once: the second is refused, naming the first, and the first's trial runs on.

Model ``ittunescratch`` (port offset 5200) on tb3; its scratch instances listen above 14000.
"""

from __future__ import annotations

import json
import signal
import time
from collections.abc import Iterator

import pytest
from deploy_support import GOOD, Fleet, fleet_fixture
from testbed_support import ADDRESSES, Watched, ssh

pytestmark = [pytest.mark.testbed]

MODEL, OFFSET, HOST = "ittunescratch", 5200, "tb3"
SCRATCH = f"tfs-{MODEL}-tune-0"
HOME = f"/srv/tfsdeploy/{MODEL}"


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    for made in fleet_fixture(tmp_path_factory, MODEL, OFFSET, {1: GOOD[1], 2: GOOD[2]},
                              serial=("100%",), hosts={HOST: ADDRESSES[HOST]}):
        made.deploy(1)
        yield made


def scratch() -> dict[str, str]:
    """The model's scratch instances on the host: name -> state, restarts and policy."""
    fmt = "{{.Name}} {{.State.Status}} {{.RestartCount}} {{.HostConfig.RestartPolicy.Name}}"
    out = ssh(HOST, f"ids=$(docker ps -aq --filter label=tfsdeploy.tune={MODEL}); "
                    f"[ -z \"$ids\" ] || docker inspect --format '{fmt}' $ids").stdout
    return {line.split()[0].lstrip("/"): " ".join(line.split()[1:])
            for line in out.splitlines() if line.strip()}


def trial_started(fleet: Fleet, *args: str, own_session: bool = False) -> Watched:
    """A `fab tune` on the host whose first scratch instance runs."""
    tune = Watched(fleet.argv("tune", "--host", HOST, "--budget", "5m", "--step", "1s",
                              "--out", str(fleet.tmp / f"tune-{time.monotonic_ns()}"), *args),
                   fleet.log, own_session=own_session)
    tune.wait_for(r"trial 0: batch", timeout=120)
    deadline = time.monotonic() + 120
    while scratch().get(SCRATCH, "").split()[:1] != ["running"]:
        assert time.monotonic() < deadline, tune.text()
        time.sleep(0.5)
    return tune


def leftovers() -> str:
    return ssh(HOST, f"ls -d {HOME}/tune {HOME}/tune.lock 2>/dev/null", check=False).stdout


def test_a_killed_tunes_scratch_instance_is_named_by_status_and_removed_by_the_next_deploy(
        fleet: Fleet) -> None:
    tune = trial_started(fleet, own_session=True)
    tune.kill()  # kill -9 of fab tune and its ssh children: no clean-up runs
    assert scratch() == {SCRATCH: "running 0 no"}  # still up, holding its GPU and ports

    status = fleet.fab("status", "--json")
    (row,) = json.loads(status.stdout)
    (found,) = row["scratch"]
    assert found["name"] == SCRATCH and found["left"] is True, found
    assert found["note"].endswith(
        "fab tune's scratch instance left by a tune that no longer runs; the next fab "
        f"deploy, rollback, prune or retire of {MODEL} removes it"), found
    shown = fleet.fab("status")
    assert f"{HOST}: {SCRATCH} (running" in shown.out, shown.describe()

    # its process crashes: restart policy "no", it stays down (a served one would restart)
    ssh(HOST, f"kill -9 $(docker inspect --format '{{{{.State.Pid}}}}' {SCRATCH})")
    time.sleep(3)
    assert scratch()[SCRATCH].split()[:2] == ["exited", "0"], scratch()

    run = fleet.fab("deploy", "--version", "2")
    assert run.code == 0, run.describe()
    assert f"removed {SCRATCH}: fab tune's scratch instance(s) that a tune no longer " \
           "running left" in run.out, run.describe()
    assert "broke a stale tune lock on tb3: fab tune --host tb3 by " in run.out, run.describe()
    assert scratch() == {} and leftovers() == ""
    fleet.assert_serving(2)


def test_a_second_tune_of_the_model_on_the_host_is_refused_naming_the_first(
        fleet: Fleet) -> None:
    first = trial_started(fleet)
    try:
        before = ssh(HOST, f"docker inspect --format '{{{{.Id}}}}' {SCRATCH}").stdout
        second = fleet.fab("tune", "--host", HOST, "--budget", "1m", "--out",
                           str(fleet.tmp / "second"), timeout=120)
        assert second.code == 4, second.describe()
        assert f"another fab tune of {MODEL} runs on {HOST}: fab tune --host {HOST} by " \
               in second.out, second.describe()
        assert f"(pid {first.proc.pid})" in second.out, second.describe()
        # the first tune's trial is untouched
        assert ssh(HOST, f"docker inspect --format '{{{{.Id}}}}' {SCRATCH}").stdout == before
        assert scratch()[SCRATCH].startswith("running")
    finally:
        first.send(signal.SIGINT)
        ended = first.finish(timeout=120)
    assert ended.code == 2, ended.describe()
    assert scratch() == {} and leftovers() == ""
    fleet.assert_serving(fleet_version(fleet))


def fleet_version(fleet: Fleet) -> int:
    """The half_plus_two number the model's live release answers with (the tests of this
    module may run in either order: 1 before the deploy of the first test, 2 after)."""
    (row,) = json.loads(fleet.fab("status", "--json").stdout)
    return int(row["version"])
