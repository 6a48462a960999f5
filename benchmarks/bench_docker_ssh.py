"""Per-call latency of the Docker Engine calls a deploy makes, over one host's SSH connection:
the docker SDK through tfsdeploy.hosts.dockerssh (HTTP over a pooled `docker system dial-stdio`
channel) against the `docker` CLI run over the same connection (SshConnection.run, the argv of
tfsdeploy.hosts.commands).

    python benchmarks/bench_docker_ssh.py [--host tb1] [--calls 50]

Prints the median and 90th percentile (ms) of each call three ways: the CLI on the connection
as SshConnection leaves it, the CLI after docker_client has set TCP_NODELAY on that connection, and
the SDK (interleaved with the second); then the cost of making a client (the /_ping probe that
picks the API version, and the first channel). Needs the fleet up (``scripts/testbed up``) and
root; talks only to 10.87.0.x. A container ``dockerssh-bench`` of the proxy image is created on
the host for the calls and removed after.
"""

from __future__ import annotations

import argparse
import socket
import statistics
import sys
import time
from collections.abc import Callable
from contextlib import suppress
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "integration"))
sys.path.insert(0, str(ROOT / "src"))

import docker  # noqa: E402
import docker.errors  # noqa: E402
import paramiko  # noqa: E402
from testbed_support import HOSTS, KNOWN_HOSTS, REGISTRY, SSH_KEY, ensure_fleet  # noqa: E402

from tfsdeploy.core.inventory.fleet import HostVars, ResolvedHost  # noqa: E402
from tfsdeploy.hosts import commands  # noqa: E402
from tfsdeploy.hosts.dockerssh import docker_client  # noqa: E402
from tfsdeploy.hosts.ssh import SshConnection  # noqa: E402

NAME = MODEL = "dockerssh-bench"
IMAGE = f"{REGISTRY}/tfsdeploy-proxy:2.6"
WARMUP = 3


def connect(host: str) -> SshConnection:
    """The toolkit's runner for ``host``, connected."""
    vars_ = HostVars(ssh_key=str(SSH_KEY), ssh_known_hosts=str(KNOWN_HOSTS))
    runner = SshConnection(ResolvedHost(host, HOSTS[host], (), (), vars_))
    runner.run(["true"])
    return runner


def cli(runner: SshConnection, argv: list[str]) -> Callable[[], object]:
    def call() -> object:
        result = runner.run(argv)
        if not result.ok:
            raise SystemExit(f"`{' '.join(argv)}` failed: {result.tail()}")
        return result.stdout
    return call


def cli_calls(runner: SshConnection) -> list[tuple[str, Callable[[], object]]]:
    """(what, the CLI call) for each measured call, as the toolkit runs it today."""
    return [
        ("list containers (label filter)", cli(runner, commands.list_containers(MODEL))),
        ("inspect container state", cli(runner, commands.inspect_state(NAME))),
        ("image present? (image id)", cli(runner, commands.image_id(IMAGE))),
        ("engine version", cli(runner, commands.docker_version())),
        ("log tail (30 lines)", cli(runner, commands.container_logs(NAME, 30))),
    ]


def sdk_calls(client: docker.DockerClient) -> list[Callable[[], object]]:
    """The SDK's call for each of cli_calls, in the same order."""
    api = client.api
    return [
        lambda: api.containers(all=True, filters={"label": f"tfsdeploy.model={MODEL}"}),
        lambda: api.inspect_container(NAME)["State"],
        lambda: api.inspect_image(IMAGE)["Id"],
        lambda: api.version()["Version"],
        lambda: api.logs(NAME, tail=30),
    ]


def timed(call: Callable[[], object]) -> float:
    started = time.perf_counter()
    call()
    return (time.perf_counter() - started) * 1000


def summary(samples: list[float]) -> tuple[float, float]:
    ordered = sorted(samples)
    return statistics.median(ordered), ordered[int(0.9 * (len(ordered) - 1))]


def sample(calls: list[Callable[[], object]], n: int) -> list[list[float]]:
    """``n`` timings (ms) of each call, the calls interleaved, after a warm-up."""
    for _ in range(WARMUP):
        for call in calls:
            call()
    found: list[list[float]] = [[] for _ in calls]
    for _ in range(n):
        for i, call in enumerate(calls):
            found[i].append(timed(call))
    return found


def no_delay(runner: SshConnection) -> bool:
    sock = transport_of(runner).sock
    return isinstance(sock, socket.socket) and bool(
        sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY))


def transport_of(runner: SshConnection) -> paramiko.Transport:
    transport: paramiko.Transport | None = runner.transport()
    assert transport is not None
    return transport


def measure(runner: SshConnection, calls: int) -> None:
    """CLI on the connection as SshConnection leaves it; then a client (which sets TCP_NODELAY on
    the connection) and CLI and SDK interleaved."""
    named = cli_calls(runner)
    before_label = "CLI (TCP_NODELAY)" if no_delay(runner) else "CLI (Nagle on)"
    before = sample([call for _, call in named], calls)
    client = docker_client(transport_of(runner), host=runner.host.name)
    after = sample([call for _, call in named] + sdk_calls(client), calls)
    cli_after, sdk = after[:len(named)], after[len(named):]
    print(f"{'call':32} {before_label:>19} {'CLI (TCP_NODELAY)':>19} {'SDK (dial-stdio)':>19}")
    print(f"{'':32} {'median    p90':>19} {'median    p90':>19} {'median    p90':>19}")
    for (what, _), one, two, three in zip(named, before, cli_after, sdk, strict=True):
        cells = [summary(x) for x in (one, two, three)]
        print(f"{what:32} " + " ".join(f"{m:8.1f}ms {p:6.1f}ms" for m, p in cells))
    totals = [sum(statistics.median(x) for x in group) for group in (before, cli_after, sdk)]
    print(f"{'sum of medians (the 5 calls)':32} " + " ".join(f"{t:8.1f}ms {'':8}" for t in totals))
    client.api.remove_container(NAME, force=True)
    client.close()


def measure_setup(runner: SshConnection, calls: int) -> None:
    made = []
    for _ in range(max(5, calls // 5)):
        started = time.perf_counter()
        client = docker_client(transport_of(runner))
        made.append((time.perf_counter() - started) * 1000)
        client.close()
    median, p90 = summary(made)
    print(f"client set-up (/_ping probe + first channel): median {median:.1f} ms, "
          f"p90 {p90:.1f} ms (once per host and run)")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--host", default="tb1", choices=sorted(HOSTS))
    parser.add_argument("--calls", type=int, default=50, help="samples per call and way")
    args = parser.parse_args()
    ensure_fleet()
    # the bench container, made over a connection of its own so that the measured one starts
    # as SshConnection leaves it
    setup = connect(args.host)
    maker = docker_client(transport_of(setup), host=args.host)
    with suppress(docker.errors.NotFound):  # left by an interrupted run
        maker.api.remove_container(NAME, force=True)
    maker.containers.run(IMAGE, ["trap 'exit 0' TERM USR1; seq 1 100; sleep 3600"],
                         entrypoint=["/bin/sh", "-c"], name=NAME,
                         labels={"tfsdeploy.model": MODEL}, detach=True)
    runner = connect(args.host)
    try:
        print(f"host {args.host}: {args.calls} samples per call and way, one SSH connection\n")
        measure(runner, args.calls)
        print()
        measure_setup(runner, args.calls)
    finally:
        with suppress(docker.errors.NotFound):
            maker.api.remove_container(NAME, force=True)
        maker.close()
        setup.close()
        runner.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
