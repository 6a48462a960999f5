"""Runbook features on the local fleet: hooks around a deploy, notifications to a receiver that
is dead, fleet logs and exec across the hosts, prune that frees old versions (and says how
much) and never breaks a rollback to a retained release, a rollback whose hooks and events name
the release it returns to, hook output printed as it comes.

Model ``itrunbook`` on tb1 and tb2 (every feature here acts per host: two show it across
hosts), port offset 1700.
"""

from __future__ import annotations

import json
import socket
import stat
import subprocess
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from deploy_support import GOOD, Fleet, fleet_fixture
from rollback_support import json_from
from testbed_support import REPO, TWO_HOSTS, Run, fab_env, ssh

from tests.bounds import within

pytestmark = pytest.mark.testbed

MODEL, OFFSET = "itrunbook", 1700


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    yield from fleet_fixture(tmp_path_factory, MODEL, OFFSET,
                             {1: GOOD[1], 2: GOOD[2], 3: GOOD[3]}, serial=("100%",),
                             keep_releases=2, hosts=TWO_HOSTS)


def hook(directory: Path, name: str, body: str) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / name
    path.write_text("#!/bin/sh\n" + body)
    path.chmod(path.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    return path


def recorder(directory: Path, name: str) -> Path:
    """A hook that writes its TFSDEPLOY_* variables (and its result file) as JSON."""
    out = directory / f"{name}.json"
    hook(directory, name, "python3 - <<'EOF'\nimport json, os\n"
         "env = {k: v for k, v in os.environ.items() if k.startswith('TFSDEPLOY_')}\n"
         "path = env.get('TFSDEPLOY_RESULT_FILE')\n"
         "env['result'] = json.load(open(path)) if path else None\n"
         f"json.dump(env, open({str(out)!r}, 'w'))\nEOF\n")
    return out


def test_a_failing_pre_deploy_hook_touches_no_host(fleet: Fleet) -> None:
    hooks = fleet.tmp / "hooks-refuse"
    hook(hooks, "pre-deploy", "echo 'no change ticket for this release'; exit 7\n")
    run = fleet.fab("deploy", "--version", "1", "--hooks", str(hooks))
    assert run.code == 1, run.describe()
    assert "no change ticket for this release" in run.out, run.describe()
    for host in fleet.hosts:
        assert fleet.containers(host) == [], host
        assert ssh(host, f"test -e /srv/tfsdeploy/{MODEL}", check=False).returncode != 0


def test_post_deploy_and_on_failure_hooks_get_the_run(fleet: Fleet) -> None:
    hooks = fleet.tmp / "hooks-record"
    post, failure = recorder(hooks, "post-deploy"), recorder(hooks, "on-failure")
    ok = fleet.fab("deploy", "--version", "1", "--hooks", str(hooks), "--json")
    assert ok.code == 0, ok.describe()
    seen = json.loads(post.read_text())
    release = json_from(ok.stdout)["release"]
    assert seen["TFSDEPLOY_COMMAND"] == "deploy" and seen["TFSDEPLOY_MODEL"] == MODEL
    assert seen["TFSDEPLOY_VERSION"] == "1" and seen["TFSDEPLOY_RELEASE"] == release
    assert seen["TFSDEPLOY_RESULT"] == "ok" and seen["TFSDEPLOY_EXIT_CODE"] == "0"
    assert seen["TFSDEPLOY_HOSTS"] == "tb1,tb2"
    assert seen["result"]["release"] == release
    assert not failure.exists(), "on-failure runs only when the run fails"
    post.unlink()
    # a failed run (a warmup threshold no release meets: every host restored, exit 2): the
    # post-deploy hook reports it, and on-failure runs too
    bad = fleet.fab("deploy", "--version", "2", "--hooks", str(hooks), "--lock-wait", "0",
                    inventory=fleet.inventory_variant("broken_gate", warmup_p99_ms=0.001))
    assert bad.code == 2, bad.describe()
    seen = json.loads(failure.read_text())
    assert seen["TFSDEPLOY_RESULT"] == "rolled_back" and seen["TFSDEPLOY_EXIT_CODE"] == "2"
    assert json.loads(post.read_text())["TFSDEPLOY_RESULT"] == "rolled_back"
    fleet.assert_serving(1)


def test_a_dead_notification_receiver_adds_under_a_second(fleet: Fleet) -> None:
    with socket.socket() as refusing:  # bound, never listening: connections are refused
        refusing.bind(("127.0.0.1", 0))
        dead = f"http://127.0.0.1:{refusing.getsockname()[1]}/hook"
        quiet = fleet.fab("deploy", "--version", "1", "--json")  # unchanged: a short run
        started = time.monotonic()
        noisy = fleet.fab("deploy", "--version", "1", "--json", "--notify", dead)
        took = time.monotonic() - started
    assert quiet.code == 0 and noisy.code == 0, noisy.describe()
    report = json_from(noisy.stdout)["notifications"]
    # what the run waited for the receiver, as it measured it; the wall time a dead receiver
    # adds is a speed figure, printed by benchmarks/bench_notify.py (not a timed test)
    assert not report["ok"], report
    # a refused connection answers at once: no retry waits out a timeout
    # measured in a full run (2 cores, 4 workers beside it): 0.32 s, margin 3.12x;
    # scripts/test prints it every run
    within("run's wait for a refused receiver, s", report["waited_s"], below=1.0,
           detail=report)
    print(f"\ndead receiver: run took {took:.1f} s, the same run without it "
          f"{quiet.seconds:.1f} s")


def test_logs_and_exec_across_the_hosts(fleet: Fleet) -> None:
    logs = fleet.fab("logs", "--lines", "5")
    assert logs.code == 0, logs.describe()
    stamps = [line.split()[0] for line in logs.stdout.splitlines() if line.strip()]
    assert stamps == sorted(stamps) and len(stamps) >= 3
    hosts = {line.split()[1] for line in logs.stdout.splitlines() if line.strip()}
    assert {h for h in hosts if not h.endswith("/proxy")} == set(fleet.hosts), hosts
    assert hosts <= set(fleet.hosts) | {f"{h}/proxy" for h in fleet.hosts}, hosts
    run = fab_exec(fleet, "sh", "-c", "id -u; echo $HOSTNAME")
    assert run.code == 0, run.describe()
    assert "exit codes: tb1 0, tb2 0" in run.stdout
    assert run.stdout.count("65534") == 2, "the servers run as an unprivileged user"
    failed = fab_exec(fleet, "false")
    assert failed.code == 3 and "tb1 1" in failed.stdout, failed.describe()


def fab_exec(fleet: Fleet, *command: str) -> Run:
    """``fab exec --model M --inventory I -- COMMAND ...`` (the command after ``--``, last)."""
    argv = [*fleet.argv("exec"), "--", *command]
    started = time.monotonic()
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=300, cwd=REPO,
                          env=fab_env())
    run = Run(argv, proc.returncode, proc.stdout, proc.stderr, time.monotonic() - started)
    fleet.log.append(run.describe())
    return run


def test_prune_frees_old_versions_and_keeps_rollback_working(fleet: Fleet) -> None:
    for version in (2, 3):
        run = fleet.fab("deploy", "--version", str(version), "--json")
        assert run.code == 0, run.describe()
    staged = ssh("tb1", f"ls /srv/tfsdeploy/models/{MODEL}").stdout.split()
    assert {"1", "2", "3"} <= set(staged)
    check = fleet.fab("prune", "--check", "--json")
    assert check.code == 0, check.describe()
    run = fleet.fab("prune", "--json")
    assert run.code == 0, run.describe()
    result = json_from(run.stdout)
    details = " ".join(s["detail"] for o in result["hosts"].values() for s in o["steps"])
    assert "bytes) in version(s) 1" in details, details
    # the summary says what went and what it freed, per host; it names no release
    assert {o["status"] for o in result["hosts"].values()} == {"pruned"}, result["hosts"]
    assert all(1 in p["versions"] and p["freed_bytes"] > 0 for p in result["pruned"].values())
    assert result["message"].endswith(" freed on 2 host(s)"), result["message"]
    for host in fleet.hosts:
        left = ssh(host, f"ls /srv/tfsdeploy/models/{MODEL}").stdout.split()
        assert "1" not in left and {"2", "3"} <= set(left), (host, left)
    back = fleet.fab("rollback", "--json")
    assert back.code == 0, back.describe()
    fleet.assert_serving(2)


class Receiver:
    """A notification receiver on 127.0.0.1 that keeps every event."""

    def __init__(self) -> None:
        self.events: list[dict[str, Any]] = []
        events = self.events

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                events.append(json.loads(self.rfile.read(int(self.headers["content-length"]))))
                self.send_response(204)
                self.end_headers()

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/events"

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def test_a_rollback_names_its_release_in_every_hook_and_event(fleet: Fleet) -> None:
    hooks = fleet.tmp / "hooks-rollback"
    pre, post = recorder(hooks, "pre-rollback"), recorder(hooks, "post-rollback")
    (hooks / "pre-rollback").write_text(
        (hooks / "pre-rollback").read_text()
        + 'echo "checking the rollback to $TFSDEPLOY_RELEASE"\n')
    # version 2 serves (unchanged after the prune test's rollback), then 3: the rollback's
    # release is version 2's, however the module's tests are chosen
    for version in (2, 3):
        up = fleet.fab("deploy", "--version", str(version), "--json")
        assert up.code == 0, up.describe()
    receiver = Receiver()
    try:
        back = fleet.fab("rollback", "--hooks", str(hooks), "--notify", receiver.url)
    finally:
        receiver.close()
    assert back.code == 0, back.describe()
    seen = json.loads(pre.read_text())
    release, version = seen["TFSDEPLOY_RELEASE"], seen["TFSDEPLOY_VERSION"]
    assert version == "2" and release.endswith("-v2"), seen
    assert f"pre-rollback | checking the rollback to {release}" in back.out, back.describe()
    after = json.loads(post.read_text())
    assert (after["TFSDEPLOY_RELEASE"], after["TFSDEPLOY_VERSION"]) == (release, version)
    assert after["TFSDEPLOY_RESULT"] == "ok"
    kinds = [e["event"] for e in receiver.events]
    assert kinds[0] == "run_started" and kinds[-2:] == ["rollback", "finished"], kinds
    assert {(e["command"], e["release"], e["version"]) for e in receiver.events} == \
        {("rollback", release, int(version))}
    assert receiver.events[-2]["to_release"] == release
    assert receiver.events[-2]["text"].endswith(f"tb1, tb2 back on {release}")
    fleet.assert_serving(int(version))
