"""Each testbed host behaves like a separate machine: own address, hostname, sshd and engine."""

from __future__ import annotations

import json
import random
import socket
import subprocess
import time
import urllib.request
import uuid

import pytest
from fleet_helpers import STATE, TESTBED, Testbed, TestbedHost, run_testbed_cli

pytestmark = pytest.mark.testbed


def test_hosts_json_follows_the_contract(testbed: Testbed) -> None:
    data = json.loads((STATE / "hosts.json").read_text())
    assert data["registry"] == "10.87.0.1:5000"
    assert len(data["hosts"]) >= 2, "the host tests need at least 2 hosts (scripts/testbed up)"
    for i, host in enumerate(data["hosts"], start=1):
        assert host["name"] == f"tb{i}"
        assert host["address"] == f"10.87.0.{10 + i if i <= 10 else 100 + i}"
        for gpu in host["gpus"]:
            assert {"index", "name", "memory_mib"} <= set(gpu)
    assert testbed.ssh_key.exists() and testbed.known_hosts.exists()


def test_each_host_has_its_own_hostname_over_ssh(testbed: Testbed) -> None:
    names = [testbed.ssh(h, "hostname").stdout.strip() for h in testbed.hosts]
    assert names == [h.name for h in testbed.hosts]


def test_sshd_listens_only_on_the_hosts_own_address(testbed: Testbed) -> None:
    for host in testbed.hosts:
        listeners = testbed.ssh(host, "ss -Hltn").stdout.split("\n")
        ssh_lines = [line for line in listeners if ":22 " in line]
        assert ssh_lines and all(f"{host.address}:22" in line for line in ssh_lines), listeners
    with pytest.raises(OSError):  # nothing of the testbed answers ssh on the machine's loopback
        socket.create_connection(("127.0.0.1", 22), timeout=1).close()


def test_strict_host_key_checking_rejects_another_hosts_key(testbed: Testbed, tmp_path) -> None:
    tb1, tb2 = testbed.hosts[0], testbed.hosts[1]
    pinned = {
        ln.split()[0].split(",")[0]: ln.split()[1:3]
        for ln in testbed.known_hosts.read_text().splitlines()
        if ln.strip()
    }
    assert pinned[tb1.address] != pinned[tb2.address], "hosts must have their own host keys"
    wrong = tmp_path / "known_hosts"
    wrong.write_text(f"{tb1.address} {' '.join(pinned[tb2.address])}\n")
    argv = [
        a if not a.startswith("UserKnownHostsFile=") else f"UserKnownHostsFile={wrong}"
        for a in testbed.ssh_argv(tb1, "true")
    ]
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=30)
    assert proc.returncode != 0
    assert "HOST IDENTIFICATION HAS CHANGED" in proc.stderr or "verification failed" in proc.stderr


def test_root_password_login_is_refused(testbed: Testbed) -> None:
    host = testbed.hosts[0]
    argv = [
        "ssh",
        "-o",
        f"UserKnownHostsFile={testbed.known_hosts}",
        "-o",
        "BatchMode=yes",
        "-o",
        "PubkeyAuthentication=no",
        "-o",
        "PreferredAuthentications=password,keyboard-interactive",
        f"root@{host.address}",
        "true",
    ]
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=30)
    assert proc.returncode == 255 and "Permission denied" in proc.stderr


def test_docker_daemon_is_not_exposed_over_tcp(testbed: Testbed) -> None:
    for host in testbed.hosts:
        for port in (2375, 2376):
            with pytest.raises(OSError):
                socket.create_connection((host.address, port), timeout=1).close()


def test_each_host_has_its_own_docker_engine(testbed: Testbed) -> None:
    tb1, tb2 = testbed.hosts[0], testbed.hosts[1]
    ids = {testbed.docker(h, "info", "--format", "{{.ID}}").stdout.strip() for h in testbed.hosts}
    assert len(ids) == len(testbed.hosts)
    name = f"probe-{uuid.uuid4().hex[:8]}"
    testbed.docker(
        tb1,
        "run",
        "-d",
        "--name",
        name,
        "--entrypoint",
        "sleep",
        testbed.image("tfsdeploy-proxy"),
        "300",
    )
    try:
        seen_on_tb1 = testbed.docker(
            tb1, "ps", "-a", "--filter", f"name={name}", "-q"
        ).stdout.split()
        seen_on_tb2 = testbed.docker(
            tb2, "ps", "-a", "--filter", f"name={name}", "-q"
        ).stdout.split()
        assert len(seen_on_tb1) == 1 and seen_on_tb2 == []
    finally:
        testbed.docker(tb1, "rm", "-f", name, check=False)


def test_docker_sdk_over_ssh_with_paramiko_and_with_the_ssh_binary(testbed: Testbed) -> None:
    docker = pytest.importorskip("docker")
    for use_ssh_client in (False, True):
        for host in testbed.hosts[:2]:
            client = docker.DockerClient(
                base_url=f"ssh://root@{host.address}", use_ssh_client=use_ssh_client, timeout=60
            )
            try:
                assert client.info()["Name"] == host.name
            finally:
                client.close()


def _port_free_on(testbed: Testbed, hosts: list[TestbedHost], port: int) -> bool:
    return all(f":{port} " not in testbed.ssh(h, "ss -Hltn").stdout for h in hosts)


def test_two_hosts_serve_the_same_port_with_host_networking(testbed: Testbed) -> None:
    tb1, tb2 = testbed.hosts[0], testbed.hosts[1]
    # 8500 as TFServing would, unless a deploy on the shared fleet holds it right now
    port = next(
        p
        for p in (8500, *random.sample(range(20000, 30000), 20))
        if _port_free_on(testbed, [tb1, tb2], p)
    )
    name = f"port{port}-{uuid.uuid4().hex[:8]}"
    script = f"mkdir -p /w && hostname > /w/name && cd /w && exec python3 -m http.server {port}"
    try:
        for host in (tb1, tb2):
            testbed.docker(
                host,
                "run",
                "-d",
                "--network",
                "host",
                "--name",
                name,
                "--entrypoint",
                "sh",
                testbed.image("tfserving-emulator"),
                "-c",
                script,
            )
        for host in (tb1, tb2):
            body = _get_with_retry(f"http://{host.address}:{port}/name")
            assert body.strip() == host.name
    finally:
        for host in (tb1, tb2):
            testbed.docker(host, "rm", "-f", name, check=False)


def _get_with_retry(url: str, deadline_s: float = 30) -> str:
    deadline = time.monotonic() + deadline_s
    while True:
        try:
            with urllib.request.urlopen(url, timeout=2) as resp:
                return resp.read().decode()
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)


def test_hosts_cannot_reach_beyond_the_testbed_network(testbed: Testbed) -> None:
    host = testbed.hosts[0]
    routes = testbed.ssh(host, "ip -4 route").stdout
    assert "default" not in routes
    assert routes.strip().startswith("10.87.0.0/24")


def test_registry_serves_the_testbed_images(testbed: Testbed) -> None:
    with urllib.request.urlopen(f"http://{testbed.registry}/v2/_catalog", timeout=5) as resp:
        catalog = json.loads(resp.read())["repositories"]
    assert {"tfserving-emulator", "tfsdeploy-proxy"} <= set(catalog)


def test_registry_push_on_one_host_pull_on_another(testbed: Testbed) -> None:
    tb1, tb2 = testbed.hosts[0], testbed.hosts[1]
    probe = f"{testbed.registry}/testbed-probe:{uuid.uuid4().hex[:8]}"
    source = testbed.image("tfsdeploy-proxy")
    try:
        testbed.docker(tb1, "tag", source, probe)
        testbed.docker(tb1, "push", probe)
        testbed.docker(tb2, "pull", probe)
        id1 = testbed.docker(tb1, "image", "inspect", "--format", "{{.Id}}", probe).stdout.strip()
        id2 = testbed.docker(tb2, "image", "inspect", "--format", "{{.Id}}", probe).stdout.strip()
        assert id1 == id2 != ""
    finally:
        for host in (tb1, tb2):
            testbed.docker(host, "rmi", probe, check=False)


def test_every_host_has_both_images(testbed: Testbed) -> None:
    for host in testbed.hosts:
        for image in ("tfserving-emulator", "tfsdeploy-proxy"):
            testbed.docker(host, "image", "inspect", testbed.image(image))


def test_emulator_image_starts_like_tensorflow_serving(testbed: Testbed) -> None:
    host = testbed.hosts[0]
    fmt = "{{json .Config.Entrypoint}} {{json .Config.Env}} {{json .Config.ExposedPorts}}"
    out = testbed.docker(
        host, "image", "inspect", "--format", fmt, testbed.image("tfserving-emulator")
    ).stdout
    assert '["/usr/bin/tf_serving_entrypoint.sh"]' in out
    assert "MODEL_NAME=model" in out and "MODEL_BASE_PATH=/models" in out
    assert "8500/tcp" in out and "8501/tcp" in out
    versions = testbed.docker(
        host,
        "run",
        "--rm",
        "--entrypoint",
        "python",
        testbed.image("tfserving-emulator"),
        "-c",
        "import importlib.metadata as m; print(m.version("
        "'tensorflow-cpu'), m.version('tensorflow-serving-api'))",
    ).stdout.split()
    assert versions == ["2.21.0", "2.21.0"]


def test_proxy_image_runs_haproxy_2_6(testbed: Testbed) -> None:
    host = testbed.hosts[0]
    out = testbed.docker(
        host, "run", "--rm", "--entrypoint", "haproxy", testbed.image("tfsdeploy-proxy"), "-v"
    ).stdout
    assert "version 2.6" in out
    entry = testbed.docker(
        host,
        "image",
        "inspect",
        "--format",
        "{{json .Config.Entrypoint}}",
        testbed.image("tfsdeploy-proxy"),
    ).stdout
    assert json.loads(entry) == ["haproxy", "-W", "-db", "-f", "/usr/local/etc/haproxy/haproxy.cfg"]


def test_up_on_a_healthy_fleet_changes_nothing(testbed: Testbed) -> None:
    before = json.loads(run_testbed_cli("status", "--json").stdout)
    proc = run_testbed_cli("up", "--hosts", str(len(testbed.hosts)), "--no-images")
    assert proc.returncode == 0, proc.stderr
    after = json.loads(run_testbed_cli("status", "--json").stdout)
    assert [(h["sshd"], h["dockerd"]) for h in before["hosts"]] == [
        (h["sshd"], h["dockerd"]) for h in after["hosts"]
    ]
    assert "restarted" not in proc.stdout and "started" not in proc.stdout.replace("(running)", "")
    assert TESTBED.exists()
