"""The fakes agree with the parsers of the real thing: what FakeProxy and a fake host's tools
print is what HAProxy and the host's tools print, as far as the toolkit reads it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tfsdeploy.core.errors import HostUnreachable
from tfsdeploy.core.inventory.layout import model_ports
from tfsdeploy.core.render.host_proxy import (
    parse_stat,
    render_proxy_config,
    switch_commands,
    weight_commands,
)
from tfsdeploy.hosts import proxyadmin
from tfsdeploy.hosts.facts import gather

from .fakes import FakeFleet, LocalConnection
from .runs import MODEL, paths, target


def _connection(world: dict[str, Any]) -> tuple[LocalConnection, Any]:
    aim = target(world, count=1)
    fleet: FakeFleet = world["fleet"]
    return LocalConnection(aim.hosts[0], fleet), aim


def test_the_fake_proxy_speaks_the_runtime_api(world: dict[str, Any]) -> None:
    conn, aim = _connection(world)
    where = paths(conn.fake)
    Path(where.proxy_dir).mkdir(parents=True)
    Path(where.admin_dir).mkdir(mode=0o700)
    ports = model_ports(aim.hosts[0], aim.model)
    Path(where.proxy_dir, "haproxy.cfg").write_text(
        render_proxy_config(aim.hosts[0], aim.model, ports, {0: "blue"}))
    conn.fake.proxy.start(where.proxy_dir, where.admin_dir)
    servers = parse_stat(proxyadmin.stat(conn, where.admin_socket))
    # in rotation, but nothing listens on blue's ports: its health check fails
    assert {(s.backend, s.slot, s.status, s.takes_new_requests) for s in servers} == {
        ("grpc", "blue", "DOWN", False), ("grpc", "green", "MAINT", False),
        ("rest", "blue", "DOWN", False), ("rest", "green", "MAINT", False)}
    for slot in ("blue", "green"):
        conn.fake.docker.add(f"tfs-{slot}", {}, command=(
            f"--port={ports.slot_grpc(slot, 0)}", f"--rest_api_port={ports.slot_rest(slot, 0)}"))
    servers = parse_stat(proxyadmin.stat(conn, where.admin_socket))
    assert {(s.backend, s.slot, s.takes_new_requests) for s in servers} == {
        ("grpc", "blue", True), ("grpc", "green", False), ("rest", "blue", True),
        ("rest", "green", False)}
    proxyadmin.send(conn, where.admin_socket,
                    switch_commands(0, "green", "blue") + weight_commands(0, "green", 64))
    servers = parse_stat(proxyadmin.stat(conn, where.admin_socket))
    assert {(s.backend, s.slot): (s.status, s.weight) for s in servers} == {
        ("grpc", "blue"): ("DRAIN", 1), ("grpc", "green"): ("UP", 64),
        ("rest", "blue"): ("DRAIN", 1), ("rest", "green"): ("UP", 64)}
    with pytest.raises(proxyadmin.ProxyRefused, match="No such server"):
        proxyadmin.send(conn, where.admin_socket, ["set server grpc/i0-red state ready"])
    conn.fake.proxy.stop()
    with pytest.raises(proxyadmin.ProxyRefused, match="did not answer"):
        proxyadmin.stat(conn, where.admin_socket)


def test_a_fake_hosts_facts_read_like_a_real_hosts(world: dict[str, Any]) -> None:
    conn, _ = _connection(world)
    conn.fake.gpu_used_mib = 1234
    conn.fake.extra_listening = {8500, 9100}
    facts = gather(conn, MODEL, paths(conn.fake), images=["reg/tfs:2.21.0"])
    assert [(g.index, g.total_mib, g.used_mib) for g in facts.gpus] == [(0, 16384, 1234)]
    assert facts.listening == frozenset({8500, 9100})
    assert {"socat", "flock", "sha256sum", "tar", "nvidia-smi"} <= facts.tools
    assert facts.disk_free_mib is not None and facts.disk_free_mib > 0
    assert facts.images == {"reg/tfs:2.21.0": False}
    assert (facts.current, facts.releases, facts.lock, facts.proxy.running) == (
        None, (), None, False)


def test_an_unreachable_fake_host_answers_nothing(world: dict[str, Any], tmp_path: Path) -> None:
    conn, _ = _connection(world)
    conn.fake.unreachable = True
    calls = [lambda: conn.run(["true"]), lambda: conn.put_bytes(b"x", str(tmp_path / "x")),
             lambda: conn.put_file(__file__, str(tmp_path / "y")),
             lambda: conn.docker.version(), lambda: conn.docker.containers(MODEL),
             lambda: conn.docker.remove("c"), lambda: conn.docker.state("c")]
    for call in calls:
        with pytest.raises(HostUnreachable, match="connection refused"):
            call()
    assert not list(tmp_path.glob("x*")) and not (tmp_path / "y").exists()
