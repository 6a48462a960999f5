"""A gateway host's HAProxy: its files, the configuration check in its own image, the
container, the seamless reload and the runtime API (through the host's SSH connection)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from tfsdeploy.core.inventory.layout import LABEL_PREFIX, PROXY_ADMIN_MOUNT
from tfsdeploy.core.render.gateway_proxy import (
    CONTAINER_FILES_DIR,
    GATEWAY_CONTAINER,
    GATEWAY_FILE,
    GatewayPaths,
    GatewayServer,
    kept_server_state,
    parse_gateway_stat,
)
from tfsdeploy.core.rollout.gates import Clock, Verdict, poll
from tfsdeploy.core.rollout.records import GatewayDrain, parse_gateway_drain
from tfsdeploy.hosts.commands.containers import PROXY_CONFIG_DIR, ContainerSpec, Mount
from tfsdeploy.hosts.commands.files import mkdir, read_files, remove_tree, write_file
from tfsdeploy.hosts.commands.gateway import (
    check_config,
    list_files,
    read_if_present,
    read_records,
    remove_files,
)
from tfsdeploy.hosts.proxyadmin import RELOAD_SIGNAL, ProxyRefused, send, worker_pid
from tfsdeploy.hosts.ssh import Connection


class GatewayRefused(RuntimeError):
    """A gateway host refused a step (its configuration check, the reload, a command)."""


def live_files(conn: Connection, paths: GatewayPaths) -> dict[str, str]:
    """The files of the gateway's configuration directory now ({} when there is none)."""
    names = [n for n in conn.run(list_files(paths.config_dir), timeout=30).stdout.split() if n]
    if not names:
        return {}
    return _files(conn.run(read_files(paths.config_dir, tuple(names)), timeout=30).stdout)


def _files(output: str) -> dict[str, str]:
    """``@@file <name>`` sections up to ``@@end`` -> name -> text."""
    files: dict[str, str] = {}
    current: str | None = None
    for line in output.splitlines(keepends=True):
        if line.startswith("@@file "):
            current = line[len("@@file "):].rstrip("\n")
            files[current] = ""
        elif line.rstrip("\n") == "@@end":
            break
        elif current is not None:
            files[current] += line
    # the readers add one newline after each file
    return {name: text[:-1] if text.endswith("\n") else text for name, text in files.items()}


def drains(conn: Connection, paths: GatewayPaths) -> list[GatewayDrain]:
    """The drains recorded on the gateway host. A record that cannot be read still records
    its drain (its path names the model and host), with an unknown run."""
    found = []
    for name, text in _files(conn.run(read_records(paths.drains_dir), timeout=30).stdout
                             ).items():
        model, _, host = name.partition("/")
        record = parse_gateway_drain(text)
        if record is None or (record.model, record.host) != (model, host):
            record = GatewayDrain(model=model, host=host, run="unknown",
                                  reason=f"unreadable record {paths.drains_dir}/{name}")
        found.append(record)
    return sorted(found, key=lambda d: (d.model, d.host))


def record_drain(conn: Connection, paths: GatewayPaths, drain: GatewayDrain) -> None:
    """Record ``drain`` on the gateway host (atomically), before it is made."""
    path = paths.drain_record(drain.model, drain.host)
    _must(conn, mkdir(path.rsplit("/", 1)[0]), "create the drains directory")
    _must(conn, write_file(path), f"record the drain of {drain.host} for {drain.model}",
          stdin=drain.to_json())


def forget_drain(conn: Connection, paths: GatewayPaths, model: str, host: str) -> None:
    """Remove the record of ``host`` drained for ``model`` (none: nothing to do), before the
    host is put back."""
    directory = f"{paths.drains_dir}/{model}"
    _must(conn, remove_files(directory, [host]), f"remove the drain record of {host}")


def loaded_digest(conn: Connection, paths: GatewayPaths) -> str:
    """The digest of the files the running worker was loaded on, as recorded once it
    answered ('' when none is recorded)."""
    return conn.run(read_if_present(paths.loaded), timeout=30).stdout.strip()


def mark_loaded(conn: Connection, paths: GatewayPaths, digest: str) -> None:
    """Record that the running worker answers on the files of ``digest``."""
    _must(conn, write_file(paths.loaded), "record the loaded configuration",
          stdin=f"{digest}\n".encode())


def check_staged(conn: Connection, paths: GatewayPaths, files: Mapping[str, str],
                 image: str) -> None:
    """Write ``files`` to a staging directory beside the live one and check them with
    ``haproxy -c`` in ``image``; raises GatewayRefused with HAProxy's words when refused.
    Nothing live changes."""
    staging = f"{paths.root}/gateway/staging"
    conn.run(remove_tree(staging, root=paths.root), timeout=30)
    _must(conn, mkdir(staging), "create the staging directory")
    for name, text in files.items():
        conn.put_bytes(text.encode(), f"{staging}/{name}")
    result = conn.run(check_config(image, staging, CONTAINER_FILES_DIR, GATEWAY_FILE),
                      timeout=120)
    if not result.ok:
        raise GatewayRefused(f"haproxy -c in {image} refused the configuration: "
                             f"{result.tail(8)}")


def install(conn: Connection, paths: GatewayPaths, files: Mapping[str, str]) -> None:
    """Make ``files`` the live configuration: each written atomically into the live directory
    (the container's mount follows the directory, so it is never replaced), haproxy.cfg last
    so that it names no answer file that is not there yet; files no longer rendered go."""
    _must(conn, mkdir(paths.config_dir), "create the configuration directory")
    _must(conn, mkdir(paths.admin_dir, mode="0700"), "create the admin directory")
    before = set(conn.run(list_files(paths.config_dir), timeout=30).stdout.split())
    for name in sorted(files, key=lambda n: n == GATEWAY_FILE):
        _must(conn, write_file(f"{paths.config_dir}/{name}"), f"write {name}",
              stdin=files[name].encode())
    stale = sorted(before - set(files))
    if stale:
        _must(conn, remove_files(paths.config_dir, stale), "remove old answer files")


def gateway_spec(image: str, paths: GatewayPaths) -> ContainerSpec:
    """The gateway's HAProxy: host network, its configuration read-only, the admin socket's
    directory writable; root inside the container with no capability (as the proxies)."""
    labels = {f"{LABEL_PREFIX}.role": "gateway"}
    mounts = (Mount(paths.config_dir, PROXY_CONFIG_DIR),
              Mount(paths.admin_dir, PROXY_ADMIN_MOUNT, read_only=False))
    return ContainerSpec(name=GATEWAY_CONTAINER, image=image, labels=labels, mounts=mounts,
                         user="0", tmpfs=("/tmp", "/run"))


def stat(conn: Connection, paths: GatewayPaths) -> tuple[GatewayServer, ...]:
    """The gateway's backend servers (``show stat``)."""
    return parse_gateway_stat(send(conn, paths.admin_socket, ["show stat"]))


def commands(conn: Connection, paths: GatewayPaths, lines: Sequence[str]) -> str:
    """Runtime commands on the gateway's admin socket."""
    return send(conn, paths.admin_socket, lines)


def running(conn: Connection) -> bool:
    """Whether the gateway's container runs."""
    state = conn.docker.state(GATEWAY_CONTAINER)
    return state is not None and state.status == "running"


def start_or_reload(conn: Connection, paths: GatewayPaths, image: str, config: str, *,
                    clock: Clock, deadline_s: float = 30.0) -> str:
    """Start the gateway on the live configuration (``config``, its haproxy.cfg), or reload
    it seamlessly: the running worker's server states kept for ``config``
    (``kept_server_state``) written where the new worker reads them, then SIGUSR2 to the
    master (see proxyadmin's RELOAD_SIGNAL): the new worker takes the listening sockets over,
    the old one finishes its requests. A start carries no state. Done when a new worker
    answers the admin socket."""
    state = conn.docker.state(GATEWAY_CONTAINER)
    running = state is not None and state.status == "running"
    old_pid = worker_pid(conn, paths.admin_socket) if running else None
    held = send(conn, paths.admin_socket, ["show servers state"]) if running else ""
    _must(conn, write_file(paths.server_state, mode=0o600), "write the servers' states",
          stdin=kept_server_state(held, config).encode())
    if running:
        conn.docker.kill(GATEWAY_CONTAINER, RELOAD_SIGNAL)
        action = "reloaded"
    else:
        if state is not None:
            conn.docker.remove(GATEWAY_CONTAINER)
        conn.docker.run(gateway_spec(image, paths))
        action = "started"

    def answers() -> Verdict:
        try:
            pid = worker_pid(conn, paths.admin_socket)
        except ProxyRefused as error:
            return Verdict.wait(str(error))
        if pid is None or pid == old_pid:
            return Verdict.wait(f"worker {old_pid} still answers")
        return Verdict.ok(f"worker {pid}")

    seen = poll(answers, step="gateway", expected="a new HAProxy worker on the admin socket",
                deadline_s=deadline_s, clock=clock, interval_s=0.1, max_interval_s=0.5)
    return f"{action}: {seen.seen}"


def _must(conn: Connection, argv: list[str], what: str, stdin: bytes | None = None) -> None:
    result = conn.run(argv, timeout=60, stdin=stdin)
    if not result.ok:
        raise GatewayRefused(f"could not {what}: {result.tail()}")
