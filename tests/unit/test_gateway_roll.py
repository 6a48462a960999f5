"""`fab gateway`'s roll (run/gateway.py) against fake gateway hosts: a configuration one host
refuses (`haproxy -c`) changes no host; a good one is written and reloaded host by host, with
the drains the old worker held and the recorded ones set again; a new worker with a model that
has no serving host UP puts that host back on its previous files and stops the roll (exit 2).
The same command run again after a kill between writing and reloading, or between reloading
and setting the drains, converges. A SIGTERM while a host waits for its backends puts that host
back (exit 2); one between two hosts stops before the second (exit 3)."""

from __future__ import annotations

import os
import signal
import time
from dataclasses import dataclass, field
from typing import Any

from tfsdeploy.core.errors import ExitCode
from tfsdeploy.core.inventory.fleet import Group, Host, ResolvedHost
from tfsdeploy.core.inventory.gateway import Gateway, Route
from tfsdeploy.core.inventory.load import build_inventory
from tfsdeploy.core.render.gateway_proxy import GATEWAY_FILE, plan_gateway, server_endpoints
from tfsdeploy.core.rollout.records import GatewayDrain
from tfsdeploy.hosts.dockerapi import ContainerState
from tfsdeploy.hosts.ssh import Result
from tfsdeploy.run.gateway import files_for, roll_gateway

from .fakes import FrozenClock
from .test_gateway import model


@dataclass
class FakeDocker:
    host: FakeGatewayHost

    def state(self, name: str) -> ContainerState | None:
        return ContainerState("running", 0, 0) if self.host.running else None

    def image_present(self, image: str) -> bool:
        return True

    def kill(self, name: str, signal: str) -> None:
        self.host.events.append(f"kill {signal}")
        self.host.reload()

    def run(self, spec: Any) -> None:
        self.host.events.append(f"run {spec.name}")
        self.host.reload()

    def remove(self, name: str) -> None:
        self.host.running = False


@dataclass
class FakeGatewayHost:
    """A gateway host: its live directory, the worker's pid and its servers' states."""

    name: str
    refuse: bool = False  # haproxy -c refuses
    dark: bool = False  # the new worker's servers stay DOWN
    dark_servers: set[str] = field(default_factory=set)  # ... these only
    live: dict[str, str] = field(default_factory=dict)
    loaded: dict[str, str] = field(default_factory=dict)  # the files the worker runs
    marker: str = ""  # <data_root>/gateway/loaded
    drains: dict[str, str] = field(default_factory=dict)  # "<model>/<host>" -> record
    running: bool = False
    pid: int = 100
    states: dict[str, str] = field(default_factory=dict)  # "backend/server" -> status
    events: list[str] = field(default_factory=list)
    server_state: str = ""  # the servers' states written for the next worker
    # SIGTERM to this process at the first `show stat` of the next new worker (once)
    sigterm_after_reload: bool = False
    armed: bool = False
    sigterm_at_check: bool = False  # ... or at its `haproxy -c`
    check_s: float = 0.0  # how long its `haproxy -c` takes

    def checked(self) -> None:
        """Its configuration was checked (in ``check_s``): the SIGTERM armed for it is sent
        (once)."""
        time.sleep(self.check_s)
        if self.sigterm_at_check:
            self.sigterm_at_check = False
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(0.2)

    def stat_read(self) -> None:
        """A `show stat` came: the armed SIGTERM is sent, and the signal's thread given the
        time to handle it (the run's Stop set) before the answer."""
        if self.armed:
            self.armed = self.sigterm_after_reload = False
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(0.2)

    def show_servers_state(self) -> str:
        """`show servers state` (version 1) of the running worker's servers."""
        endpoints = server_endpoints(self.loaded.get(GATEWAY_FILE, ""))
        lines = ["1", "# be_id be_name srv_id srv_name srv_addr srv_op_state ..."]
        for key, status in sorted(self.states.items()):
            at = endpoints[(key.split("/")[0], key.split("/")[1])]
            op = 0 if status.startswith("DOWN") else 2
            lines.append(f"3 {key.replace('/', ' 1 ')} {at.address} {op} 0 100 100 9 15 3 3 6 0 "
                         f"0 0 - {at.port} - 0 {at.check_port} - - 0")
        return "\n".join(lines) + "\n"

    def reload(self) -> None:
        self.running, self.pid, self.loaded = True, self.pid + 1, dict(self.live)
        self.armed = self.sigterm_after_reload
        servers = [line.split()[1] for line in self.live.get(GATEWAY_FILE, "").splitlines()
                   if line.strip().startswith("server ")]
        backends = [line.split()[1] for line in self.live.get(GATEWAY_FILE, "").splitlines()
                    if line.startswith("backend ") and line.split()[1].endswith(("-grpc",
                                                                                 "-rest"))]
        self.states = {f"{b}/{s}": "DOWN" if self.dark or s in self.dark_servers else "UP"
                       for b in backends for s in set(servers)}


class FakeConnection:
    def __init__(self, host: ResolvedHost, fake: FakeGatewayHost) -> None:
        self.host, self.fake = host, fake
        self.docker = FakeDocker(fake)

    def run(self, argv: list[str], *, timeout: float | None = None,
            stdin: bytes | None = None) -> Result:
        fake, text = self.fake, (stdin or b"").decode()
        out, code = "", 0
        if argv[0] == "socat":
            for command in (c.strip() for c in text.split(";")):
                fake.events.append(command)
                if command == "show info":
                    out += f"Pid: {fake.pid}\n"
                elif command == "show servers state":
                    out += fake.show_servers_state()
                elif command == "show stat":
                    fake.stat_read()
                    out += "# pxname,svname,scur,status\n" + "".join(
                        f"{k.split('/')[0]},{k.split('/')[1]},0,{v}\n"
                        for k, v in fake.states.items())
                elif command.startswith("set server "):
                    fake.states[command.split()[2]] = command.split()[-1].upper()
        elif argv[:2] == ["docker", "run"]:
            fake.events.append("haproxy -c")
            fake.checked()
            code, out = (1, "[ALERT] parsing [haproxy.cfg:12]: unknown keyword") \
                if fake.refuse else (0, "Configuration file is valid")
        elif argv[:2] == ["sh", "-c"] and "for f in */*" in argv[2]:
            out = "".join(f"@@file {n}\n{t}\n" for n, t in fake.drains.items()) + "@@end\n"
        elif argv[:2] == ["sh", "-c"] and "for f in *" in argv[2]:
            out = "\n".join(fake.live) if argv[-1].endswith("/config") else ""
        elif argv[:2] == ["sh", "-c"] and "@@file" in argv[2]:
            out = "".join(f"@@file {n}\n{fake.live[n]}\n" for n in argv[5:]) + "@@end\n"
        elif argv[:2] == ["sh", "-c"] and "2>/dev/null; true" in argv[2]:
            out = fake.marker if argv[4].endswith("/gateway/loaded") else ""
        elif argv[:2] == ["sh", "-c"] and "cat >" in argv[2]:
            self._write(argv[4], text)
        elif argv[:2] == ["sh", "-c"] and "rm -f" in argv[2]:
            for name in argv[5:]:
                if argv[4].endswith("/config"):
                    fake.live.pop(name, None)
                else:
                    fake.drains.pop(f"{argv[4].rsplit('/', 1)[1]}/{name}", None)
        return Result(tuple(argv), code, out, "")

    def _write(self, path: str, text: str) -> None:
        fake, name = self.fake, path.rsplit("/", 1)[1]
        if "/config/" in path:
            fake.live[name] = text
            fake.events.append(f"write {name}")
        elif path.endswith("/gateway/loaded"):
            fake.marker = text
        elif path.endswith("/gateway/admin/servers.state"):
            fake.server_state = text
            fake.events.append("states written")
        else:
            raise AssertionError(f"a write the fake gateway host does not expect: {path}")

    def put_bytes(self, data: bytes, path: str, *, mode: int = 0o644) -> None:
        self.fake.events.append(f"stage {path.rsplit('/', 1)[1]}")

    def close(self) -> None:
        pass


def _plan(limit: int | None = None, deadline_s: float | None = None) -> Any:
    hosts = [Host("s1", "10.0.0.1"), Host("s2", "10.0.0.2"), Host("gw1", "10.0.0.9"),
             Host("gw2", "10.0.0.10")]
    inv = build_inventory("inv.py", hosts=hosts, groups={"gateway": Group(["gw1", "gw2"])},
                          defaults={}, models=[model("m1")],
                          gateway=Gateway(routes=[Route("m1", grpc_port=9500, rest_port=9501,
                                                        rate_limit_rps=limit)],
                                          deadline_s=deadline_s))
    return plan_gateway(inv)


def _roll(plan: Any, fakes: dict[str, FakeGatewayHost], **options: Any) -> Any:
    lines: list[str] = []
    result = roll_gateway(plan, say=lines.append, clock=FrozenClock(),
                          connect=lambda h: FakeConnection(h, fakes[h.name]), **options)
    return result, lines


def _rolled_once() -> dict[str, FakeGatewayHost]:
    """Two gateway hosts that a first `fab gateway` configured and started."""
    fakes = {"gw1": FakeGatewayHost("gw1"), "gw2": FakeGatewayHost("gw2")}
    first, _ = _roll(_plan(), fakes)
    assert first.exit_code == ExitCode.OK, first.hosts
    return fakes


def test_a_configuration_one_host_refuses_changes_no_host() -> None:
    fakes = {"gw1": FakeGatewayHost("gw1"), "gw2": FakeGatewayHost("gw2", refuse=True)}
    result, lines = _roll(_plan(), fakes)
    assert result.exit_code == ExitCode.INVALID
    assert any(line.startswith("gw2: refused before any host changed") for line in lines)
    assert "haproxy -c in" in result.hosts["gw2"] and "unknown keyword" in result.hosts["gw2"]
    for fake in fakes.values():
        assert not fake.live and not fake.running
        assert not any(e.startswith(("write", "run", "kill")) for e in fake.events)


def test_the_roll_goes_host_by_host_and_carries_the_drains_over() -> None:
    fakes = {"gw1": FakeGatewayHost("gw1"), "gw2": FakeGatewayHost("gw2")}
    first, _ = _roll(_plan(), fakes)
    assert first.exit_code == ExitCode.OK, first.hosts
    assert all(f.running and f.live[GATEWAY_FILE] for f in fakes.values())
    assert fakes["gw1"].events.index("haproxy -c") < fakes["gw1"].events.index("run tfs-gateway")
    # a start carries no server state: the file holds its version line only
    assert fakes["gw1"].events.index("states written") < \
        fakes["gw1"].events.index("run tfs-gateway")
    assert fakes["gw1"].server_state == "1\n"
    # checked on both hosts before the first one changes
    assert fakes["gw2"].events.index("haproxy -c") < fakes["gw2"].events.index("run tfs-gateway")
    again, _ = _roll(_plan(), fakes)
    assert again.hosts == {"gw1": "up to date; m1 2/2 up", "gw2": "up to date; m1 2/2 up"}
    fakes["gw1"].states["m1-grpc/s2"] = "DRAIN"  # a deploy drained s2 there
    seen = len(fakes["gw1"].events)
    changed, _ = _roll(_plan(limit=50), fakes)
    assert changed.exit_code == ExitCode.OK, changed.hosts
    assert "m1.rate-limited.grpc.http" in fakes["gw1"].live
    events = fakes["gw1"].events[seen:]
    assert events.index("write m1.rate-limited.grpc.http") < events.index("write haproxy.cfg")
    # the old worker's states, written for the new one before the reload: every server kept
    assert events.index("show servers state") < events.index("states written") < \
        events.index("kill SIGUSR2")
    carried = [line.split()[1:4:2] for line in fakes["gw1"].server_state.splitlines()[2:]]
    assert carried == [["m1-grpc", "s1"], ["m1-grpc", "s2"], ["m1-rest", "s1"],
                       ["m1-rest", "s2"]], fakes["gw1"].server_state
    assert events[events.index("kill SIGUSR2"):].count("set server m1-grpc/s2 state drain") == 1
    assert fakes["gw1"].states["m1-grpc/s2"] == "DRAIN"
    assert "reloaded: worker" in changed.hosts["gw1"]


def test_check_and_diff_touch_nothing() -> None:
    fakes = {"gw1": FakeGatewayHost("gw1"), "gw2": FakeGatewayHost("gw2")}
    result, _ = _roll(_plan(), fakes, check=True, diff=True)
    assert result.hosts == {"gw1": "would change", "gw2": "would change"}
    assert "+++ gw1:rendered/gateway/haproxy.cfg" in result.diffs["gw1"]
    assert all(f.events == [] and not f.live for f in fakes.values())


def test_a_new_worker_with_no_serving_host_up_puts_the_host_back() -> None:
    fakes = _rolled_once()
    before = dict(fakes["gw1"].live)
    fakes["gw1"].dark = True
    result, _ = _roll(_plan(limit=50), fakes)
    assert result.exit_code == ExitCode.ROLLED_BACK, result.hosts
    assert "no serving host up for m1" in result.hosts["gw1"]
    assert fakes["gw1"].live == before  # the previous files, reloaded
    assert "m1.rate-limited.grpc.http" not in fakes["gw2"].live  # the roll stopped there



def test_a_sigterm_while_a_host_waits_for_its_backends_puts_it_back() -> None:
    fakes = _rolled_once()
    before = dict(fakes["gw1"].live)
    fakes["gw1"].dark = True  # the new worker's gate waits ...
    fakes["gw1"].sigterm_after_reload = True  # ... and a SIGTERM comes in its first read
    result, lines = _roll(_plan(limit=50), fakes)
    assert result.exit_code == ExitCode.ROLLED_BACK, result.hosts
    assert result.hosts == {"gw1": "interrupted"}
    assert "SIGTERM: finishing the current steps, then restoring; the lock is released at the " \
        "end" in lines
    assert "gw1: FAILED: interrupted" in lines
    assert fakes["gw1"].live == before and fakes["gw1"].loaded == before  # reloaded on them
    assert "m1.rate-limited.grpc.http" not in fakes["gw2"].live  # never reached
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL  # the engine's handler is gone


def test_a_sigterm_between_two_hosts_stops_before_the_second() -> None:
    fakes = _rolled_once()
    fakes["gw1"].sigterm_after_reload = True  # in gw1's gate, which then passes
    result, lines = _roll(_plan(limit=50), fakes)
    assert result.exit_code == ExitCode.INCONSISTENT, result.hosts
    assert result.hosts["gw2"] == "not rolled: interrupted"
    assert "m1.rate-limited.grpc.http" in fakes["gw1"].loaded  # gw1 finished its roll
    assert "m1.rate-limited.grpc.http" not in fakes["gw2"].live
    assert "interrupted before gw2: gw1 runs the new configuration, gw2 and the hosts after it " \
        "the previous one: run `fab gateway` again" in lines
    again, _ = _roll(_plan(limit=50), fakes)  # the same command again converges
    assert again.exit_code == ExitCode.OK, again.hosts
    assert "m1.rate-limited.grpc.http" in fakes["gw2"].loaded


def test_a_sigterm_while_the_hosts_are_checked_changes_no_host() -> None:
    fakes = {"gw1": FakeGatewayHost("gw1", sigterm_at_check=True), "gw2": FakeGatewayHost("gw2")}
    result, lines = _roll(_plan(), fakes)
    assert result.exit_code == ExitCode.INVALID, result.hosts
    assert result.hosts == {"gw2": "not rolled: interrupted"}
    assert "interrupted before gw2: no gateway host was changed" in lines
    for fake in fakes.values():
        assert not fake.live and not fake.running


def test_the_gateways_deadline_stops_the_run_as_a_signal_does() -> None:
    # the deadline passes in gw1's 3 s check (what comes before it, on fakes, takes
    # milliseconds: 1 s leaves a busy machine's stalls room)
    fakes = {"gw1": FakeGatewayHost("gw1", check_s=3.0), "gw2": FakeGatewayHost("gw2")}
    result, lines = _roll(_plan(deadline_s=1.0), fakes)
    assert result.exit_code == ExitCode.INVALID, result.hosts
    assert result.hosts == {"gw2": "not rolled: stopped at its 1 s deadline "
                                   "(gateway.deadline_s)"}
    assert "the run's 1 s deadline passed: finishing the current steps, then restoring; " \
        "the lock is released at the end" in lines
    for fake in fakes.values():
        assert not fake.live and not fake.running
    again, _ = _roll(_plan(deadline_s=30), fakes)  # with time enough, it converges
    assert again.exit_code == ExitCode.OK, again.hosts


def test_a_failed_gate_after_a_host_changed_is_exit_3() -> None:
    fakes = _rolled_once()
    before = dict(fakes["gw2"].live)
    fakes["gw2"].dark = True
    result, _ = _roll(_plan(limit=50), fakes)
    assert result.exit_code == ExitCode.INCONSISTENT, result.hosts  # gw1 runs the new one
    assert "m1.rate-limited.grpc.http" in fakes["gw1"].loaded
    assert fakes["gw2"].live == before and fakes["gw2"].loaded == before


def test_files_written_but_never_loaded_are_loaded_by_the_next_run() -> None:
    """A run killed between writing a host's files and its reload leaves the new files and
    the old worker: the same command run again reloads it (equal files are not current)."""
    fakes = _rolled_once()
    limited = _plan(limit=50)
    fakes["gw1"].live = files_for(limited)["gw1"]  # what the killed run wrote
    assert fakes["gw1"].loaded != fakes["gw1"].live
    seen = len(fakes["gw1"].events)
    again, lines = _roll(limited, fakes)
    assert again.exit_code == ExitCode.OK, again.hosts
    assert "kill SIGUSR2" in fakes["gw1"].events[seen:], lines
    assert not any(e.startswith("write") for e in fakes["gw1"].events[seen:])  # already there
    assert "gw1: its worker was not loaded on these files" in "\n".join(lines)
    assert all(f.loaded == f.live == files_for(limited)[name] for name, f in fakes.items())
    third, _ = _roll(limited, fakes)
    assert third.hosts == {"gw1": "up to date; m1 2/2 up", "gw2": "up to date; m1 2/2 up"}


def test_recorded_drains_are_set_on_a_worker_that_lacks_them() -> None:
    """A run killed after its reload, before it set the drains again: the new worker runs
    the files (up to date) with every server ready; the drain recorded on the host is set
    on it by the next run, and a record of a server the configuration no longer has goes."""
    fakes = _rolled_once()
    for fake in fakes.values():
        fake.drains = {"m1/s2": GatewayDrain(model="m1", host="s2", reason="recreate",
                                             run="deploy m1 r1").model_dump_json(),
                       "m1/old": "{}"}
    again, lines = _roll(_plan(), fakes)
    assert again.exit_code == ExitCode.OK, again.hosts
    for fake in fakes.values():
        assert fake.states["m1-grpc/s2"] == fake.states["m1-rest/s2"] == "DRAIN"
        assert fake.states["m1-grpc/s1"] == "UP"
        assert list(fake.drains) == ["m1/s2"]
    assert again.hosts["gw1"] == "up to date; m1 1/2 up"
    assert "gw1: old is no longer a server of m1: its drain record removed" in "\n".join(lines)


def test_the_gate_counts_only_servers_that_take_requests() -> None:
    """s1 never passes its check behind the new worker and s2 is drained there: no server of
    m1 takes a request, the gate fails and the host goes back to its previous files."""
    fakes = _rolled_once()
    before = dict(fakes["gw1"].live)
    fakes["gw1"].states["m1-grpc/s2"] = "DRAIN"  # a deploy drained s2 there
    fakes["gw1"].dark_servers = {"s1"}
    result, _ = _roll(_plan(limit=50), fakes)
    assert result.exit_code == ExitCode.ROLLED_BACK, result.hosts
    assert "no serving host up for m1 (m1 0/2 up)" in result.hosts["gw1"]
    assert fakes["gw1"].live == fakes["gw1"].loaded == before
    assert fakes["gw1"].states["m1-grpc/s2"] == "DRAIN"  # set again after the restore
