"""Helpers for the rollback, guard and convergence tests on the local fleet (scripts/testbed);
the fleet, SSH, fab runs and gRPC clients they share with the deploy tests are in
testbed_support.

Each test module deploys its OWN model (own name, own port offset: 300-800 here, 900 is
benchmarks/bench_rollback.py's; see testbed_support for the ports) so that it never collides
with another module or with the deploy tests running on the same fleet.

The model is half_plus_two under another name: version v answers y = 0.5 x + v + 1, so a
Predict of x = 2 through a host's stable port says which version serves (y = v + 2).

Everything here talks only to 10.87.0.x (the testbed hosts) and 127.0.0.1.
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from testbed_support import (
    ALT_SSH_PORT,
    HOSTS,
    MODELS,
    REPO,
    ModelFleet,
    Run,
    api,
    copy_version,
    expected_y,
    fleet_lifetime,
    grpc_predict,
    inventory_text,
    netns,
    outputs_y,
    predict_request,
    ssh,
)

SOURCE_MODEL = MODELS / "half_plus_two"
GOLDEN = SOURCE_MODEL / "catalog.json"


# -- new SSH connections refused -------------------------------------------------------------

def unblock_ssh(model: str) -> None:
    """Remove the REJECT rules that ``model``'s module may have left in a host's network
    namespace (only its own: modules running beside it keep theirs)."""
    for host in HOSTS:
        while subprocess.run(_iptables(host, "-D", model), capture_output=True).returncode == 0:
            pass


def _iptables(host: str, op: str, model: str) -> list[str]:
    # new connections only (their SYN): established SSH sessions of other runs keep working
    # (conntrack's NEW would also match the first packet of a session it had not tracked);
    # only on the second sshd port, which the inventories of modules that block SSH use
    # (make_fleet's ssh_port): the other modules' runs keep port 22
    return netns(host, "iptables", op, "INPUT", "-p", "tcp", "--dport", str(ALT_SSH_PORT),
                 "--syn", "-m",
                 "comment", "--comment", f"tfsdeploy-rollback-tests-{model}", "-j", "REJECT",
                 "--reject-with", "tcp-reset")


class ssh_blocked:
    """New SSH connections to ``host``'s second sshd port are refused while inside (always
    restored): the module's inventory must reach the hosts there (``ssh_port=ALT_SSH_PORT``).
    The rule is labelled with ``model``, whose module alone removes it."""

    def __init__(self, host: str, model: str) -> None:
        self.host, self.model = host, model

    def __enter__(self) -> ssh_blocked:
        subprocess.run(_iptables(self.host, "-I", self.model), check=True, capture_output=True)
        return self

    def __exit__(self, *exc: object) -> None:
        while subprocess.run(_iptables(self.host, "-D", self.model),
                             capture_output=True).returncode == 0:
            pass


# -- the model and its inventory ------------------------------------------------------------

@dataclass(kw_only=True)
class Fleet(ModelFleet):
    """One test module's model on the fleet: its inventory, ports and helpers."""

    fast_playbook: Path

    def slot_grpc(self, slot: str) -> int:
        return {"blue": 8510, "green": 8520}[slot] + self.offset

    def deploy(self, version: int, *args: str, inventory: Path | None = None,
               playbook: Path | None = None, fast: bool = True) -> Run:
        """A deploy that must succeed (set-up); ``fast``: with the playbook that rolls every
        host at once."""
        return super().deploy(version, *args, inventory=inventory,
                              playbook=self.fast_playbook if fast else playbook)

    # the hosts ---------------------------------------------------------------------------
    def proxy(self, host: str) -> dict[str, Any] | None:
        out = ssh(host, f"docker inspect --format '{{{{.Id}}}} {{{{.State.StartedAt}}}} "
                        f"{{{{.State.Status}}}}' tfs-proxy-{self.model}", check=False).stdout
        if not out.strip():
            return None
        cid, started, status = out.split()
        return {"id": cid, "started": started, "status": status}

    def releases(self, host: str) -> dict[str, dict[str, Any]]:
        out = ssh(host, f"for f in /srv/tfsdeploy/{self.model}/releases/*/manifest.json; do "
                        f"[ -f \"$f\" ] && cat \"$f\" && echo; done; true").stdout
        decoder, found, position = json.JSONDecoder(), {}, 0
        while position < len(out.rstrip()):
            while out[position].isspace():
                position += 1
            record, position = decoder.raw_decode(out, position)
            found[record["id"]] = record
        return found

    def lock_dir_exists(self) -> bool:
        return any(ssh(h, f"test -d /srv/tfsdeploy/{self.model}/lock", check=False).returncode
                   == 0 for h in self.hosts)

    def served_version(self, host: str, timeout: float = 5.0) -> int:
        """Which version answers on the host's stable gRPC port (by its output)."""
        y = grpc_predict(self.hosts[host], self.grpc_port, self.model, [2.0], timeout=timeout)[0]
        version = round(y - 2.0)
        assert abs(y - expected_y(version)) < 1e-5, f"{host}: unexpected output {y}"
        return version

    def assert_serving(self, version: int, hosts: tuple[str, ...] | None = None) -> None:
        """Every host's (or ``hosts``') stable port answers with ``version``'s golden
        outputs."""
        for host in self.hosts if hosts is None else hosts:
            for x in (1.0, 2.0, 5.0):
                y = grpc_predict(self.hosts[host], self.grpc_port, self.model, [x], timeout=5.0)[0]
                assert abs(y - expected_y(version, x)) < 1e-5, (
                    f"{host}: y({x}) = {y}, version {version} gives {expected_y(version, x)}")


FAST_PLAYBOOK = """# set-up deploys of the rollback tests: every host at once
# (the model's serial stays for `fab rollback` and for the deploys under test)
name: deploy-fast
serial: ["100%"]
forks: 10
phases:
  - {name: preflight, mode: parallel, tasks: preflight.yml}
  - {name: stage, mode: parallel, tasks: stage.yml}
  - {name: roll, mode: batches, tasks: roll_host.yml}
  - {name: finalize, mode: parallel, tasks: finalize.yml}
"""


def write_fast_playbook(tmp: Path) -> Path:
    """``tmp/playbooks/deploy-fast.yml`` (FAST_PLAYBOOK), its task lists reached through
    ``tmp/tasks`` -> the repository's (playbooks find them in ../tasks); its path."""
    (tmp / "playbooks").mkdir(exist_ok=True)
    playbook = tmp / "playbooks" / "deploy-fast.yml"
    playbook.write_text(FAST_PLAYBOOK)
    (tmp / "tasks").symlink_to(REPO / "tasks")
    return playbook


def make_fleet(tmp: Path, model: str, offset: int, *, window_s: float = 600.0,
               serial: tuple[int | str, ...] = (1,), min_healthy_s: float = 1.0,
               versions: tuple[int, ...] = (1, 2, 3), keep_releases: int = 3,
               ssh_port: int = 22, hosts: dict[str, str] = HOSTS) -> Fleet:
    """Write the model's version source (copies of half_plus_two), inventory and playbook;
    ``hosts``: the fleet (fewer than tb1..tb3 where two hosts prove the same)."""
    source = tmp / "models" / model
    source.mkdir(parents=True, exist_ok=True)
    for version in versions:
        copy_version(SOURCE_MODEL / str(version), source, version)
    inventory = tmp / "inventory.py"
    inventory.write_text(inventory_text(
        title="the rollback tests", model=model, source=source, golden=GOLDEN, offset=offset,
        # the rollback tests judge what a rollback leaves, not latency: the warmup gate's P99
        # bound is the deploy tests' 1 s, not the model's 50 ms SLO (20 samples on a machine
        # at load 14 beside the parallel tiers saw 297 ms and failed a deploy's gate)
        warmup="Warmup(samples=20, p99_ms=1000)",
        rollout=f"Rollout(serial={serial!r}, min_healthy_s={min_healthy_s!r}, "
                f"window_s={window_s!r}, keep_releases={keep_releases!r}, "
                f"load_timeout_s=120)", ssh_port=ssh_port, hosts=hosts))
    playbook = write_fast_playbook(tmp)
    return Fleet(model=model, offset=offset, tmp=tmp, inventory=inventory, source=source,
                 fast_playbook=playbook, hosts=dict(hosts))


def fleet_fixture(tmp_path_factory: pytest.TempPathFactory, model: str, offset: int,
                  **kwargs: Any) -> Iterator[Fleet]:
    """Body of a module-scoped fixture: clean model on a healthy fleet, cleaned after
    (``kwargs``: make_fleet's)."""
    yield from fleet_lifetime(
        model, lambda: make_fleet(tmp_path_factory.mktemp(model), model, offset, **kwargs),
        keep_env="TFSDEPLOY_ROLLBACK_TESTS_KEEP", tidy=lambda: unblock_ssh(model))


def deploy_v1_then_v2(fleet: Fleet) -> dict[int, str]:
    """Set-up: v1 then v2 deployed everywhere; returns tb1's release id by version."""
    fleet.deploy(1)
    fleet.deploy(2)
    fleet.assert_serving(2)
    return {m["version"]: m["id"] for m in fleet.releases("tb1").values()}


def release_of(fleet: Fleet, version: int, *, status: str | None = None) -> str:
    """The one release of ``version`` (with ``status``) that every host holds."""
    found: set[str] = {m["id"] for h in fleet.hosts for m in fleet.releases(h).values()
                       if m["version"] == version and (status is None or m["status"] == status)}
    assert len(found) == 1, f"one release of v{version} on every host: {found}"
    return found.pop()


# -- probes through the stable ports --------------------------------------------------------

@dataclass
class Sample:
    when: float
    host: str
    ok: bool
    version: int | None
    error: str = ""


class Prober:
    """Predict on every host's stable port, over long-lived channels, every ``interval_s``,
    from a background thread per host; records every answer and every failure.

    ``bad_ratio`` > 0 sends that share of requests with a wrong input name (INVALID_ARGUMENT
    from the server: counted as an error by TFServing's metrics, not by this prober)."""

    def __init__(self, fleet: Fleet, hosts: tuple[str, ...] | None = None,
                 interval_s: float = 0.05, bad_ratio: float = 0.0) -> None:
        hosts = tuple(fleet.hosts) if hosts is None else hosts
        self.fleet, self.hosts, self.interval_s, self.bad_ratio = fleet, hosts, interval_s, \
            bad_ratio
        self.samples: list[Sample] = []
        self.bad_sent = 0
        self.began = time.monotonic()
        self.marks: list[tuple[float, str]] = []  # (when, what the test did then)
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._loop, args=(h,), daemon=True)
                         for h in hosts]
        self._lock = threading.Lock()

    def __enter__(self) -> Prober:
        api()
        for thread in self._threads:
            thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def stop(self) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(timeout=30)

    def _loop(self, host: str) -> None:
        grpc = api()["grpc"]

        channel = grpc.insecure_channel(f"{self.fleet.hosts[host]}:{self.fleet.grpc_port}")
        stub = api()["service"].PredictionServiceStub(channel)
        good = predict_request(self.fleet.model, [2.0])
        bad = predict_request(self.fleet.model, [2.0], input_name="not_x")
        count = 0
        try:
            while not self._stop.is_set():
                count += 1
                send_bad = self.bad_ratio > 0 and (count % round(1 / self.bad_ratio)) == 0
                now = time.monotonic()
                try:
                    reply = stub.Predict(bad if send_bad else good, timeout=5)
                    if send_bad:
                        sample = Sample(now, host, False, None, "bad request answered OK")
                    else:
                        y = outputs_y(reply)[0]
                        sample = Sample(now, host, True, round(y - 2.0))
                except grpc.RpcError as error:
                    if send_bad and error.code() == grpc.StatusCode.INVALID_ARGUMENT:
                        with self._lock:
                            self.bad_sent += 1
                        self._stop.wait(self.interval_s)
                        continue
                    sample = Sample(now, host, False, None,
                                    f"{error.code().name}: {error.details()}")
                with self._lock:
                    self.samples.append(sample)
                self._stop.wait(self.interval_s)
        finally:
            channel.close()

    def mark(self, what: str) -> None:
        """Note what the test starts now: a failure's summary names the last mark before it."""
        with self._lock:
            self.marks.append((time.monotonic(), what))

    def _when(self, sample: Sample) -> str:
        """A sample's time from the start, and from the last mark before it."""
        at = f"+{sample.when - self.began:.1f} s"
        before = [(t, what) for t, what in self.marks if t <= sample.when]
        return f"{at}, {sample.when - before[-1][0]:.1f} s into {before[-1][1]}" if before \
            else at

    def failures(self) -> list[Sample]:
        with self._lock:
            return [s for s in self.samples if not s.ok]

    def versions(self, host: str) -> list[int | None]:
        with self._lock:
            return [s.version for s in self.samples if s.host == host and s.ok]

    def count(self) -> int:
        with self._lock:
            return len(self.samples)

    def summary(self) -> str:
        with self._lock:
            failed = [s for s in self.samples if not s.ok]
        first = failed[:5]
        return (f"{self.count()} probes, {len(failed)} failed; first failures: "
                + "; ".join(f"{s.host} {s.error} (sent at {self._when(s)})" for s in first))


def step_seconds(result_json: dict[str, Any], prefix: str = "gate_") -> float:
    """Sum over hosts of the seconds of the steps whose name starts with ``prefix``."""
    return float(sum(step["seconds"] for host in result_json["hosts"].values()
                     for step in host.get("steps", []) if step["step"].startswith(prefix)))


def json_from(stdout: str) -> Any:
    """The JSON document `--json` printed on stdout."""
    starts = [i for i in (stdout.find("{"), stdout.find("[")) if i >= 0]
    assert starts, f"no JSON on stdout: {stdout[-3000:]!r}"
    return json.JSONDecoder().raw_decode(stdout, min(starts))[0]


if str(REPO / "src") not in sys.path:
    sys.path.insert(0, str(REPO / "src"))
