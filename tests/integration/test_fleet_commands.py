"""The fleet commands a release engineer reads during an incident, on the local fleet: `fab
logs --since` and `--follow`, `fab status`, `fab exec`, the lock-held error and `fab bench`,
with a paused canary on tb1 (two containers of instance 0 sharing its requests).

Model ``itfleetcmds`` on tb1..tb3 (serial [1, 100%]: tb1 is the canary), port offset 2600.
Versions 1-3 good (y = 0.5 x + v + 1), 4 = half_plus_two_bad/12 (its warmup records send the
input ``z``, which versions 1-3 refuse: every request fails).
"""

from __future__ import annotations

import json
import re
import signal
import subprocess
import time
from collections.abc import Iterator
from datetime import UTC, datetime

import pytest
from deploy_support import GOOD, WRONG_SIGNATURE, Fleet, Traffic, fleet_fixture
from rollback_support import json_from
from testbed_support import HOSTS, REPO, Run, fab_env

pytestmark = pytest.mark.testbed

MODEL, OFFSET = "itfleetcmds", 2600
CANARY = ("CanaryPolicy(weights=(25,), step_s=6, min_requests=20, max_p99_ratio=3.0, "
          "latency_slack_ms=50, comparison=ComparisonPolicy(enabled=False))")


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    for made in fleet_fixture(tmp_path_factory, MODEL, OFFSET,
                              {1: GOOD[1], 2: GOOD[2], 3: GOOD[3], 4: WRONG_SIGNATURE},
                              serial=(1, "100%")):
        text = made.inventory.read_text().replace(
            "from tfsdeploy.core.inventory.catalog import",
            "from tfsdeploy.core.inventory.canary_policy import CanaryPolicy, ComparisonPolicy\n"
            "from tfsdeploy.core.inventory.catalog import").replace(
                "Rollout(", f"Rollout(canary={CANARY}, ", 1)
        made.inventory.write_text(text)
        yield made


def labels(run: Run) -> set[str]:
    """The host[/instance][/slot] labels of `fab logs` lines."""
    return {line.split()[1] for line in run.stdout.splitlines() if line.strip()}


def test_logs_since_a_span_or_a_time_and_a_bad_value_before_any_host(fleet: Fleet) -> None:
    fleet.deploy(1)
    recent = fleet.fab("logs", "--since", "10m", "--lines", "3")
    assert recent.code == 0, recent.describe()
    # every host's serving container, and a host's proxy where it logged (its start)
    assert {label for label in labels(recent) if not label.endswith("/proxy")} == set(HOSTS)
    assert labels(recent) <= set(HOSTS) | {f"{h}/proxy" for h in HOSTS}, recent.describe()
    now = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    quiet = fleet.fab("logs", "--since", now)  # the servers logged nothing since
    assert quiet.code == 0 and quiet.stdout.strip() == "", quiet.describe()
    bad = fleet.fab("logs", "--since", "yesterday")
    assert bad.code == 1, bad.describe()
    assert "[field --since] --since 'yesterday': is neither a time span" in bad.out
    assert "unreachable" not in bad.out


def reload_config_fails_on(fleet: Fleet, port: int) -> None:
    """A ReloadConfig request with no config: TFServing refuses it and logs one line (and
    changes nothing)."""
    import grpc
    from tensorflow_serving.apis import model_management_pb2, model_service_pb2_grpc

    with grpc.insecure_channel(f"{HOSTS['tb1']}:{port}") as channel:
        stub = model_service_pb2_grpc.ModelServiceStub(channel)
        with pytest.raises(grpc.RpcError) as refused:
            stub.HandleReloadConfigRequest(model_management_pb2.ReloadConfigRequest(),
                                           timeout=10)
    assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT


def test_a_paused_canary_through_the_fleet_commands(fleet: Fleet) -> None:
    old = fleet.deploy(1)
    assert old.code == 0
    with Traffic(fleet, "tb1"):  # the canary step judges live requests
        paused = fleet.fab("deploy", "--version", "2", "--pause", "--json", timeout=900)
    assert paused.code == 6, paused.describe()
    new = json_from(paused.stdout)["release"]
    try:
        old_release = check_status(fleet, new)
        check_exec(fleet, old_release, new)
        check_follow(fleet)
        check_lock_held(fleet)
        check_bench(fleet)
    finally:
        aborted = fleet.fab("abort", timeout=600)
    assert aborted.code == 0, aborted.describe()


def check_status(fleet: Fleet, new: str) -> str:
    """The canary's shares and state in `fab status`; returns tb1's old release."""
    run = fleet.fab("status", "--json")
    assert run.code == 0, run.describe()
    rows = {r["host"]: r for r in json.loads(run.stdout)}
    assert rows["tb1"]["instances"][0]["traffic"] == {"blue": 75, "green": 25}, rows["tb1"]
    assert rows["tb1"]["canary"] == {"release": new, "state": "paused"}
    for host in ("tb2", "tb3"):
        assert rows[host]["instances"][0]["traffic"] == {"blue": 100}, rows[host]
        assert rows[host]["canary"] is None
    table = fleet.fab("status")
    assert table.code == 0 and "blue 75 / green 25;" in table.out, table.describe()
    return str(rows["tb1"]["current"])


def check_exec(fleet: Fleet, old: str, new: str) -> None:
    argv = [*fleet.argv("exec"), "--", "sh", "-c", "echo $HOSTNAME"]
    started = time.monotonic()
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=300, cwd=REPO,
                          env=fab_env())
    run = Run(argv, proc.returncode, proc.stdout, proc.stderr, time.monotonic() - started)
    fleet.log.append(run.describe())
    assert run.code == 0, run.describe()  # a paused canary does not refuse it
    assert "exit codes: tb1/blue 0, tb1/green 0, tb2 0, tb3 0" in run.stdout, run.describe()
    assert (f"tb1: blue serves {old} (v1) 75% of new requests, green serves {new} (v2) 25% "
            "of new requests") in run.stdout, run.describe()
    assert {line.split()[0] for line in run.stdout.splitlines()[:4]} == {
        "tb1/blue", "tb1/green", "tb2", "tb3"}, run.describe()


def check_follow(fleet: Fleet) -> None:
    follow = fleet.background("logs", "--follow", "--lines", "1")
    try:
        for slot in ("blue", "green"):
            follow.wait_for(rf"^\S+ tb1/{slot} ", timeout=60)
        reload_config_fails_on(fleet, 8510 + OFFSET)  # blue's gRPC port
        reload_config_fails_on(fleet, 8520 + OFFSET)  # green's
        for slot in ("blue", "green"):
            follow.wait_for(rf"^\S+ tb1/{slot} .*ReloadConfig failed", timeout=60)
        follow.send(signal.SIGINT)
        run = follow.finish(timeout=30)
    finally:
        follow.kill()
    assert run.code == 0, run.describe()
    assert "Traceback" not in run.out and "interrupted" not in run.out, run.describe()


def check_lock_held(fleet: Fleet) -> None:
    run = fleet.fab("deploy", "--version", "3")
    assert run.code == 4, run.describe()
    assert re.search(r"a canary of itfleetcmds is paused: release r\S+-v2 holds the lock",
                     run.out), run.describe()
    assert "`fab promote --model itfleetcmds`" in run.out
    assert "`fab abort --model itfleetcmds`" in run.out
    assert "--break" not in run.out


def check_bench(fleet: Fleet) -> None:
    # the newest version in the source is 4; every host's live release is version 1
    paced = fleet.fab("bench", "--duration", "2s", "--rps", "20", "--slo-p99", "1000")
    assert paced.code == 0, paced.describe()
    assert ("request data: warmup records of version 1, live on tb1, tb2, tb3"
            in paced.out), paced.describe()
    assert "PASS duration: sustained" in paced.out, paced.describe()
    failing = fleet.fab("bench", "--duration", "2s", "--version", "4")
    assert failing.code == 2, failing.describe()
    assert "FAIL slo-p99: no successful request" in failing.out, failing.describe()
