"""Fake hosts whose file system is real: the rollout tier of tests, with no network and no
sleeping.

A ``FakeHost`` is a directory under the test's tmp_path. Its ``data_root`` (a host var the
test inventory sets) lies inside it, and ``LocalConnection`` runs every command of the toolkit
there for real, through ``sh -c`` and the same quoting as the SSH boundary, so the shell
scripts of ``commands`` (facts, lock, stage, files) run unchanged. What a test machine lacks is
faked at the edges only:

- ``nvidia-smi`` and ``ss`` are small scripts on the host's PATH, printing the GPUs (with
  ``gpu_used_mib`` and ``gpu_reserved_mib``), the compute processes (each running server given
  GPUs holds its pool, fraction x CUDA's total, plus ``GPU_BESIDE_POOL_MIB``; one started while
  ``cut_new_pools`` is set holds a pool its allocator cut to 0.729, three 0.9 steps), and the
  ports that
  the host's running containers, its proxy and ``extra_listening`` hold;
- HAProxy's runtime API (``socat`` to the admin socket) is answered in Python by ``FakeProxy``
  (the facts command's own ``socat`` is a script reading the proxy's state from a file);
- the Docker Engine is ``FakeDocker``: containers with labels, recording every call; starting
  the proxy's spec loads the ``haproxy.cfg`` written on disk, like HAProxy does;
- TFServing is ``FakeSlot`` (gRPC: status, signature, predict) and ``rest_problems`` (REST),
  answering from the containers that run on the host: a half_plus_two version v answers
  y = 0.5 x + v + 1.

A host can be made unreachable: then every call raises HostUnreachable.
"""

from __future__ import annotations

import functools
import itertools
import json
import os
import shlex
import shutil
import socket
import subprocess
import tempfile
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

from tfsdeploy.core.errors import HostUnreachable
from tfsdeploy.core.inventory.fleet import ResolvedHost
from tfsdeploy.core.inventory.layout import (
    ADMIN_SOCKET_NAME,
    LABEL_PREFIX,
    PROXY_ADMIN_MOUNT,
    TUNE_LABEL,
)
from tfsdeploy.core.tfserving.tensors import Tensor, tensor
from tfsdeploy.hosts.commands.containers import PROXY_CONFIG_DIR, ContainerSpec
from tfsdeploy.hosts.dockerapi import (
    ContainerFact,
    ContainerState,
    DockerFailed,
    ScratchFact,
    container_fact,
    scratch_fact,
)
from tfsdeploy.hosts.probes import VersionStatus
from tfsdeploy.hosts.ssh import Result


class FrozenClock:
    """Time moves only when something sleeps."""

    def __init__(self) -> None:
        self.t = 1000.0

    def now(self) -> float:
        return self.t

    def sleep(self, seconds: float) -> None:
        self.t += max(seconds, 0.001)


# -- HAProxy's runtime API ------------------------------------------------------------------

READY = "no check"  # what `show stat` says of a ready server without health checks


class FakeProxy:
    """One host's HAProxy: backends and servers loaded from haproxy.cfg when the proxy
    container starts, changed by runtime commands, reported by `show stat`."""

    def __init__(self, host: FakeHost) -> None:
        self.host = host
        self.running = False
        self.socket: str | None = None  # the admin socket on the host, while running
        self.binds: dict[str, int] = {}  # frontend -> port (its first bind)
        self.bound = set()  # every port its frontends bind
        self.addresses: dict[tuple[str, str], int] = {}  # (backend, server) -> port
        self.servers: dict[tuple[str, str], str] = {}  # (backend, server) -> status
        self.weights: dict[tuple[str, str], int] = {}
        self.sessions: dict[tuple[str, str], int] = {}  # requests in flight, per server
        self.admin: list[str] = []  # every runtime command received, in order
        self.worker = 100  # the worker's pid (`show info`): a reload starts another
        self.reloads = 0
        self.checked = False  # its configuration health-checks the servers

    def start(self, config_dir: str, admin_dir: str | None) -> None:
        """Load ``haproxy.cfg`` as HAProxy does when its container starts."""
        text = Path(config_dir, "haproxy.cfg").read_text()
        self.binds, self.addresses, self.servers, self.weights = {}, {}, {}, {}
        self.bound: set[int] = set()  # every port its frontends bind
        self.listeners: dict[str, list[int]] = {}  # frontend -> every port it binds
        self.socket_stats: set[str] = set()  # frontends whose listeners `show stat` reports
        section, name, socket_path = "", "", None
        for line in text.splitlines():
            words = line.split()
            if not words or words[0].startswith("#"):
                continue
            if words[0] in ("global", "defaults", "frontend", "backend"):
                section, name = words[0], (words[1] if len(words) > 1 else "")
            elif section == "frontend" and words[0] == "bind":  # the first bind is the port
                self.binds.setdefault(name, int(words[1].rsplit(":", 1)[1]))
                self.bound.add(int(words[1].rsplit(":", 1)[1]))
                self.listeners.setdefault(name, []).append(int(words[1].rsplit(":", 1)[1]))
            elif section == "frontend" and words == ["option", "socket-stats"]:
                self.socket_stats.add(name)
            elif section == "backend" and words[0] == "server":
                key = (name, words[1])
                self.addresses[key] = int(words[2].rsplit(":", 1)[1])
                self.servers[key] = "MAINT" if "disabled" in words else READY
                self.weights[key] = 1
            elif section == "global" and words[:2] == ["stats", "socket"]:
                socket_path = words[2]
            elif section == "backend" and words[0] == "default-server" and "check" in words:
                self.checked = True
        self.socket = None
        if admin_dir and socket_path == f"{PROXY_ADMIN_MOUNT}/{ADMIN_SOCKET_NAME}":
            self.socket = f"{admin_dir}/{ADMIN_SOCKET_NAME}"
            make_socket_file(self.socket)
        self.running = True

    def check(self, config_dir: str) -> str:
        """``haproxy -c``: a problem of the configuration ('' when it loads)."""
        text = Path(config_dir, "haproxy.cfg").read_text()
        return "" if "backend grpc" in text and "frontend grpc" in text else \
            "[ALERT] config : no backend 'grpc'"

    def reload(self, config_dir: str) -> None:
        """A master-worker reload: a new worker from the configuration (its servers as the
        file says, weights and drains gone), the same socket."""
        socket = self.socket
        self.start(config_dir, None)
        self.socket = socket
        self.worker += 1
        self.reloads += 1

    def stop(self) -> None:
        """The container stopped: its socket file stays, nothing answers on it."""
        self.running = False

    def answer(self, argv: list[str], stdin: bytes | None) -> tuple[int, str, str]:
        """``socat -t T - UNIX-CONNECT:<socket>`` with the commands on stdin."""
        target = argv[-1].removeprefix("UNIX-CONNECT:")
        if (len(argv) != 5 or argv[1] != "-t" or argv[3] != "-"
                or not argv[-1].startswith("UNIX-CONNECT:")):
            return 1, "", f"socat: unexpected arguments {argv[1:]}"
        if not self.running or target != self.socket or not Path(target).is_socket():
            return 1, "", f"socat: connect(, AF=1 \"{target}\", 110): Connection refused"
        commands = [c.strip() for c in (stdin or b"").decode().split(";") if c.strip()]
        self.admin += commands
        return 0, "".join(self._one(c) for c in commands), ""

    def _one(self, command: str) -> str:
        words = command.split()
        if words == ["show", "stat"]:
            return self.stat_csv()
        if words == ["show", "info"]:
            return f"Name: HAProxy\nVersion: 2.6.12\nPid: {self.worker}\n\n"
        if words[:2] == ["set", "server"] and len(words) == 5 and "/" in words[2]:
            key = tuple(words[2].split("/", 1))
            if key not in self.servers:
                return "No such server.\n\n"
            if words[3] == "state" and words[4] in ("ready", "drain", "maint"):
                self.servers[key] = {"ready": READY, "drain": "DRAIN", "maint": "MAINT"}[words[4]]
                return "\n"
            if words[3] == "weight" and words[4].isdigit() and int(words[4]) <= 256:
                self.weights[key] = int(words[4])
                return "\n"
            return "Require 'ready', 'drain' or 'maint', or a weight 0..256.\n\n"
        return "Unknown command.\n\n"

    def stat_csv(self) -> str:
        """`show stat`, with frontend and backend rows like HAProxy's."""
        rows = ["# pxname,svname,scur,status,weight,type,addr"]
        for frontend in self.binds:
            rows.append(f"{frontend},FRONTEND,0,OPEN,,0,")
            if frontend in self.socket_stats:
                rows += [f"{frontend},sock-{n},0,OPEN,,3,0.0.0.0:{port}"
                         for n, port in enumerate(self.listeners[frontend], 1)]
        for (backend, server), status in self.servers.items():
            rows.append(f"{backend},{server},{self.sessions.get((backend, server), 0)},"
                        f"{self.health(server, status)},{self.weights[(backend, server)]},2,"
                        f"127.0.0.1:{self.addresses[(backend, server)]}")
        for backend in {b for b, _ in self.servers}:
            rows.append(f"{backend},BACKEND,0,UP,1,1,")
        return "\n".join(rows) + "\n\n"

    def health(self, server: str, status: str) -> str:
        """A ready server's status as its health check makes it (with checks: UP while a
        running container holds its REST port, else DOWN); others as set."""
        if status != READY or not self.checked:
            return status
        port = self.addresses.get(("rest", server))
        return "UP" if port in self.host.listening() else "DOWN"

    def serving_port(self, backend: str = "grpc") -> int | None:
        """The port of a server of ``backend`` that takes new requests: the one, or, with one
        server per GPU, the first instance's (HAProxy balances over them all; the fake's
        stable port answers from one). Two ready slots of one instance outside a canary (at
        the configuration's weights: a canary sets both) are a fault: no answer then."""
        ready = [k for k, status in self.servers.items()
                 if k[0] == backend and self.health(k[1], status) in (READY, "UP")
                 and self.weights[k] > 0]
        instances = [k[1].split("-", 1)[0] for k in ready]
        faulty = {i for i in instances if instances.count(i) > 1 and all(
            self.weights[k] == 1 for k in ready if k[1].startswith(f"{i}-"))}
        if not ready or faulty:
            return None
        return self.addresses[ready[0]]


def make_socket_file(path: str) -> None:
    """Leave a unix socket file at ``path`` (what `[ -S ]` on the host looks for). It is bound
    at a short name and renamed: a socket's address is limited to 107 bytes, tmp paths are
    not."""
    short = tempfile.mkdtemp(prefix="s")
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.bind(f"{short}/s")
    finally:
        sock.close()
    os.replace(f"{short}/s", path)
    os.rmdir(short)


# -- the Docker Engine ----------------------------------------------------------------------

@dataclass
class FakeContainer:
    """A container as the Engine holds it."""

    name: str
    labels: dict[str, str]
    image: str
    command: tuple[str, ...] = ()
    spec: ContainerSpec | None = None
    running: bool = True
    restarts: int = 0
    exit_code: int = 0
    log: str = ""
    # restarting under its restart policy (not running): running again after this many
    # more container lists (each poll of the run reads them once)
    restarting: int = 0
    pid: int = field(default_factory=lambda: next(_PIDS))  # its main process's host pid
    cut: bool = False  # its GPU pool was cut by the allocator (it started into a full GPU)

    def port(self, flag: str) -> int | None:
        """The port a serving container listens on (``--port``/``--rest_api_port``)."""
        for arg in self.command:
            if arg.startswith(f"{flag}="):
                return int(arg.split("=", 1)[1])
        return None

    @property
    def version(self) -> int:
        return int(self.labels.get(f"{LABEL_PREFIX}.version", "0"))

    @property
    def release(self) -> str:
        return self.labels.get(f"{LABEL_PREFIX}.release", "")


_PIDS = itertools.count(3_900_001)  # above the pids a test machine hands out
GPU_BESIDE_POOL_MIB = 256  # what a fake server holds beside its pool (the testbed T4's context)
CUT = 0.729  # a pool the allocator cut three times (0.9 x 0.9 x 0.9)
FRACTION_FLAG = "--per_process_gpu_memory_fraction="


def _engine_change(method: Callable[..., Any]) -> Callable[..., Any]:
    """A FakeDocker call that changes the Engine's state (its containers, the proxy they
    start), made under the host's lock: the run's commands on the host read that state from
    other threads (``LocalConnection.run`` writes the fake tools' outputs from it under the
    lock, in the audit append that runs beside the next step), as the real Engine
    serializes its own state."""
    @functools.wraps(method)
    def locked(self: FakeDocker, *args: Any, **kwargs: Any) -> Any:
        with self.host.lock:
            return method(self, *args, **kwargs)
    return locked


class FakeDocker:
    """``dockerapi.Docker`` over a fake host: every call is recorded in ``calls``."""

    def __init__(self, host: FakeHost) -> None:
        self.host = host
        self.by_name: dict[str, FakeContainer] = {}
        self.images: set[str] = set()
        self.calls: list[tuple[str, Any]] = []

    def _call(self, method: str, argument: Any) -> None:
        self.host.check_reachable()
        self.calls.append((method, argument))

    def called(self, method: str) -> list[Any]:
        """The arguments of every call of ``method``, in order."""
        return [a for m, a in self.calls if m == method]

    def add(self, name: str, labels: dict[str, str], *, image: str = "img",
            running: bool = True, command: tuple[str, ...] = ()) -> FakeContainer:
        """A container that a test plants (as another tool or a past run left it)."""
        self.by_name[name] = FakeContainer(name, labels, image, command, running=running)
        return self.by_name[name]

    def version(self) -> str:
        self._call("version", None)
        return "24.0.7"

    def containers_of(self, model: str) -> list[FakeContainer]:
        """The model's serving containers and its proxy, as the Engine's two label filters
        find them (no call recorded)."""
        return [c for c in self.by_name.values()
                if c.labels.get(f"{LABEL_PREFIX}.model") == model
                or c.labels.get(f"{LABEL_PREFIX}.proxy") == model]

    @_engine_change
    def containers(self, model: str) -> list[ContainerFact]:
        self._call("containers", model)
        for c in self.containers_of(model):
            if c.restarting:
                c.restarting -= 1
                c.running = not c.restarting
        facts = [container_fact({"Names": [f"/{c.name}"], "Labels": dict(c.labels),
                                 "State": "running" if c.running else
                                 "restarting" if c.restarting else "exited",
                                 "Status": "Up 3 minutes" if c.running else "Exited (137)",
                                 "Image": c.image}) for c in self.containers_of(model)]
        return sorted((f for f in facts if f is not None), key=lambda f: (f.release, f.name))

    @_engine_change
    def run(self, spec: ContainerSpec) -> None:
        self._call("run", spec)
        if spec.name in self.by_name:
            raise DockerFailed(f"{self.host.name}: run {spec.name}: Conflict. The container "
                               f"name \"/{spec.name}\" is already in use")
        self.by_name[spec.name] = FakeContainer(spec.name, dict(spec.labels), spec.image,
                                                   tuple(spec.command), spec,
                                                   cut=self.host.cut_new_pools)
        if spec.labels.get(f"{LABEL_PREFIX}.role") == "proxy":
            self._start_proxy(spec)

    def _start_proxy(self, spec: ContainerSpec) -> None:
        config = next(m.source for m in spec.mounts if m.target == PROXY_CONFIG_DIR)
        admin = next((m.source for m in spec.mounts if m.target == PROXY_ADMIN_MOUNT), None)
        self.host.proxy.start(config, admin)

    def _get(self, method: str, name: str) -> FakeContainer:
        if name not in self.by_name:
            raise DockerFailed(f"{self.host.name}: {method} {name}: No such container")
        return self.by_name[name]

    @_engine_change
    def start(self, name: str) -> None:
        self._call("start", name)
        container = self._get("start", name)
        container.running = True
        if container.spec and container.labels.get(f"{LABEL_PREFIX}.role") == "proxy":
            self._start_proxy(container.spec)

    @_engine_change
    def stop(self, name: str) -> None:
        self._call("stop", name)
        if name in self.by_name:
            self.by_name[name].running = False
            if self.by_name[name].labels.get(f"{LABEL_PREFIX}.role") == "proxy":
                self.host.proxy.stop()

    @_engine_change
    def remove(self, name: str) -> None:
        self._call("remove", name)
        removed = self.by_name.pop(name, None)
        if removed and removed.labels.get(f"{LABEL_PREFIX}.role") == "proxy":
            self.host.proxy.stop()

    def state(self, name: str) -> ContainerState | None:
        self._call("state", name)
        c = self.by_name.get(name)
        if c is None:
            return None
        return ContainerState(status="running" if c.running else "exited",
                              restarts=c.restarts, exit_code=c.exit_code,
                              pid=c.pid if c.running else 0)

    def logs(self, name: str, lines: int) -> str:
        self._call("logs", name)
        c = self.by_name.get(name)
        return "\n".join(c.log.splitlines()[-lines:]) if c else ""

    def labelled(self, label: str, value: str) -> list[str]:
        self._call("labelled", (label, value))
        return sorted(n for n, c in self.by_name.items() if c.labels.get(label) == value)

    def scratch(self) -> list[ScratchFact]:
        self._call("scratch", None)
        return sorted((scratch_fact({"Names": [f"/{c.name}"], "Labels": dict(c.labels),
                                     "State": "running" if c.running else "exited"})
                       for c in self.by_name.values() if TUNE_LABEL in c.labels),
                      key=lambda f: f.name)

    def cpu_seconds(self, name: str) -> tuple[float, float] | None:
        self._call("cpu_seconds", name)
        return (0.0, 0.0) if name in self.by_name else None

    def image_present(self, image: str) -> bool:
        self._call("image_present", image)
        return image in self.images

    def exec(self, name: str, argv: list[str]) -> tuple[int, str]:
        """``haproxy -c`` in the proxy checks the configuration its directory holds."""
        self._call("exec", (name, argv))
        container = self._get("exec", name)
        if argv[:2] == ["haproxy", "-c"] and container.spec is not None:
            config = next(m.source for m in container.spec.mounts
                          if m.target == PROXY_CONFIG_DIR)
            problem = self.host.proxy.check(config)
            return (1, problem) if problem else (0, "")
        return 0, ""

    @_engine_change
    def kill(self, name: str, signal: str) -> None:
        """SIGUSR2 to the proxy: HAProxy's master-worker reload."""
        self._call("kill", (name, signal))
        container = self._get("kill", name)
        if signal == "SIGUSR2" and container.spec is not None and \
                container.labels.get(f"{LABEL_PREFIX}.role") == "proxy":
            config = next(m.source for m in container.spec.mounts
                          if m.target == PROXY_CONFIG_DIR)
            self.host.proxy.reload(config)

    def pull(self, image: str, on_progress: Any) -> None:
        self._call("pull", image)
        self.images.add(image)


# -- a host ---------------------------------------------------------------------------------

_SOCAT = """#!/bin/sh
# socat as the facts command uses it: `show stat` on the proxy's admin socket
[ -f "{stat}" ] || {{ echo "socat: Connection refused" >&2; exit 1; }}
read -r command
exec cat "{stat}"
"""
_CAT = '#!/bin/sh\nexec cat "{file}"\n'
# nvidia-smi: the compute processes for --query-compute-apps, the GPUs otherwise
_NVIDIA_SMI = ('#!/bin/sh\ncase "$*" in *--query-compute-apps*) exec cat "{apps}";; esac\n'
               'exec cat "{gpus}"\n')


def gpu_uuid(host: str, index: int) -> str:
    """A fake GPU's UUID, stable per host and index."""
    return f"GPU-{host}-{index:04d}"
# sync: the arguments must exist, as for coreutils' sync (it opens each); no fsync, which on
# the test machine's disk would cost every write a few milliseconds (the argv builders' own
# tests and the fleet's check the real one)
_SYNC = '#!/bin/sh\n[ "$1" = -- ] && shift\nfor f in "$@"; do [ -e "$f" ] || exit 1; done\n'
# the docker CLI of a fake host: `ps` prints docker-ps.txt (what a test planted), `rm` logs its
# arguments to docker-rm.log; nothing else is faked (the real CLI would reach this machine's
# engine)
_DOCKER = ('#!/bin/sh\ncase "$1" in\n  ps) cat "{dir}/docker-ps.txt" 2>/dev/null; exit 0;;\n'
           '  rm) shift; echo "$@" >> "{dir}/docker-rm.log";;\n'
           '  *) echo "fake docker: $1 is not faked" >&2; exit 1;;\nesac\n')


@dataclass
class FakeHost:
    """One host: a directory holding its data root and its fake tools, an Engine, a proxy."""

    name: str
    address: str
    dir: Path
    gpus: list[tuple[int, int]] = field(default_factory=list)  # (index, total MiB)
    gpu_used_mib: int = 1000
    gpu_reserved_mib: int = 0  # nvidia-smi's memory.reserved, on every GPU
    cut_new_pools: bool = False  # servers started from now on get a cut pool
    extra_listening: set[int] = field(default_factory=set)  # ports another service holds
    unreachable: bool = False
    log: list[list[str]] = field(default_factory=list)  # every argv run
    writes: list[str] = field(default_factory=list)  # every file written or uploaded
    on_upload: Callable[[Path], None] | None = None  # changes an upload in transit
    docker: FakeDocker = field(init=False)
    proxy: FakeProxy = field(init=False)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def __post_init__(self) -> None:
        self.docker = FakeDocker(self)
        self.proxy = FakeProxy(self)
        self.bin = self.dir / "bin"
        self.bin.mkdir(parents=True, exist_ok=True)
        self._tool("nvidia-smi", _NVIDIA_SMI.format(gpus=self.dir / "gpus.csv",
                                                    apps=self.dir / "apps.csv"))
        self._tool("ss", _CAT.format(file=self.dir / "listening.txt"))
        self._tool("socat", _SOCAT.format(stat=self.dir / "proxy.stat"))
        self._tool("sync", _SYNC)
        self._tool("docker", _DOCKER.format(dir=self.dir))

    def _tool(self, name: str, text: str) -> None:
        path = self.bin / name
        path.write_text(text)
        path.chmod(0o755)

    def check_reachable(self) -> None:
        """Raise as SSH does when the host does not answer."""
        if self.unreachable:
            raise HostUnreachable(f"{self.name} ({self.address}): NoValidConnectionsError: "
                                  "connection refused")

    def ran(self, *prefix: str) -> list[list[str]]:
        """Commands that start with ``prefix``."""
        return [a for a in self.log if a[:len(prefix)] == list(prefix)]

    def listening(self) -> set[int]:
        """Ports held on the host: running containers', the proxy's, another service's."""
        ports = set(self.extra_listening)
        for c in self.docker.by_name.values():
            if c.running:
                ports |= {p for p in (c.port("--port"), c.port("--rest_api_port")) if p}
        if self.proxy.running:
            ports |= self.proxy.bound
        return ports

    def sync_tools(self) -> None:
        """Write what the fake tools print, from the host's state now."""
        (self.dir / "gpus.csv").write_text(
            "index, uuid, memory.total [MiB], memory.used [MiB], memory.free [MiB], "
            "memory.reserved [MiB]\n" + "".join(
                f"{i}, {gpu_uuid(self.name, i)}, {total}, {self.gpu_used_mib}, "
                f"{max(0, total - self.gpu_reserved_mib - self.gpu_used_mib)}, "
                f"{self.gpu_reserved_mib}\n" for i, total in self.gpus))
        (self.dir / "apps.csv").write_text("".join(
            f"{c.pid}, {mib}, {gpu_uuid(self.name, index)}\n"
            for c in self.docker.by_name.values() if c.running
            for index, mib in self.held(c).items()))
        (self.dir / "listening.txt").write_text(
            "".join(f"LISTEN 0      4096         0.0.0.0:{p}      0.0.0.0:*\n"
                    for p in sorted(self.listening())))
        stat = self.dir / "proxy.stat"
        if self.proxy.running:
            stat.write_text(self.proxy.stat_csv())
        else:
            stat.unlink(missing_ok=True)

    def held(self, container: FakeContainer) -> dict[int, int]:
        """GPU index -> MiB a running server holds: its pool (fraction x CUDA's total, cut
        when its release is in ``cut_pools``) and what it holds beside it, on every GPU its
        spec asks for (nothing without a GPU request or a fraction)."""
        request = container.spec.gpus if container.spec else None
        fraction = next((float(a[len(FRACTION_FLAG):]) for a in container.command
                         if a.startswith(FRACTION_FLAG)), None)
        if request is None or fraction is None:
            return {}
        wanted = {int(d) for d in request.device_ids} or {i for i, _ in self.gpus}
        scale = CUT if container.cut else 1.0
        return {i: int(int(fraction * (total - self.gpu_reserved_mib)) * scale)
                + GPU_BESIDE_POOL_MIB for i, total in self.gpus if i in wanted}

    def running(self, model: str) -> list[str]:
        """Releases of ``model`` whose serving containers run, sorted."""
        return sorted(c.release for c in self.docker.containers_of(model)
                      if c.running and c.release)

    def serving_version(self) -> int:
        """The version of the container behind the proxy's serving gRPC server (0: none)."""
        port = self.proxy.serving_port("grpc") if self.proxy.running else None
        return next((c.version for c in self.docker.by_name.values()
                     if c.running and port is not None and c.port("--port") == port), 0)


class FakeFleet:
    """Every fake host of a test, created on first connection from the inventory's host
    (its directory is the parent of its ``data_root``)."""

    def __init__(self) -> None:
        self.hosts: dict[str, FakeHost] = {}
        self._lock = threading.Lock()

    def host(self, resolved: ResolvedHost) -> FakeHost:
        """The fake of an inventory host."""
        with self._lock:
            if resolved.name not in self.hosts:
                self.hosts[resolved.name] = FakeHost(
                    resolved.name, resolved.address, Path(resolved.vars.data_root).parent,
                    gpus=[(g.index, g.memory_mib) for g in resolved.gpus])
            return self.hosts[resolved.name]

    def __getitem__(self, name: str) -> FakeHost:
        return self.hosts[name]

    def by_address(self, address: str) -> FakeHost:
        """The host at ``address``."""
        return next(h for h in self.hosts.values() if h.address == address)

    def connect(self, resolved: ResolvedHost) -> LocalConnection:
        """A connection factory for the engine and the CLI."""
        return LocalConnection(resolved, self)


class LocalConnection:
    """``remote.Connection`` to a fake host: commands run locally, in the host's directory,
    quoted once exactly as SSH quotes them; ``socat`` reaches the FakeProxy."""

    def __init__(self, host: ResolvedHost, fleet: FakeFleet) -> None:
        self.host = host
        self.fake = fleet.host(host)
        self.closed = False

    def run(self, argv: list[str], *, timeout: float | None = None,
            stdin: bytes | None = None) -> Result:
        fake = self.fake
        fake.check_reachable()
        with fake.lock:
            fake.log.append(list(argv))
        if argv[:1] == ["socat"]:
            with fake.lock:
                code, out, err = fake.proxy.answer(argv, stdin)
            return Result(tuple(argv), code, out, err)
        with fake.lock:
            fake.sync_tools()
        env = {"PATH": f"{fake.bin}:/usr/bin:/bin", "HOME": str(fake.dir), "LC_ALL": "C"}
        try:
            # quoted once, as SSH quotes it; `exec`: no second process
            done = subprocess.run(["sh", "-c", "exec " + shlex.join(argv)], input=stdin or b"",
                                  capture_output=True, env=env, cwd=fake.dir,
                                  timeout=timeout or 120, check=False)
        except subprocess.TimeoutExpired:
            raise HostUnreachable(f"{self.host.name}: `{argv[0]} ...` gave no answer") from None
        return Result(tuple(argv), done.returncode, done.stdout.decode(errors="replace"),
                      done.stderr.decode(errors="replace"))

    def put_bytes(self, data: bytes, path: str, *, mode: int = 0o644) -> None:
        self.fake.check_reachable()
        target = Path(path)
        if not target.parent.is_dir():  # SFTP cannot create parents either
            raise HostUnreachable(f"{self.host.name}: writing {path}: No such file")
        temp = target.with_name(f"{target.name}.tmp-fake")
        temp.write_bytes(data)
        temp.chmod(mode)
        os.replace(temp, target)
        self.fake.writes.append(path)

    def put_file(self, local: str, path: str) -> None:
        self.fake.check_reachable()
        if not Path(path).parent.is_dir():
            raise HostUnreachable(f"{self.host.name}: uploading to {path}: No such file")
        shutil.copyfile(local, path)
        self.fake.writes.append(path)
        if self.fake.on_upload is not None:
            self.fake.on_upload(Path(path))

    @property
    def docker(self) -> FakeDocker:
        return self.fake.docker

    def close(self) -> None:
        self.closed = True


# -- TFServing --------------------------------------------------------------------------------

class FakeSlot:
    """A TFServing gRPC client (``probes.SlotClient``'s calls) of one port of a fake host.

    A slot port reaches the container listening on it; the stable port reaches the container
    behind the proxy's serving server. ``behaviour[address]``: ok (default), slow (never
    loads), broken (load fails with ``load_error``), laggy (each Predict takes 200 ms),
    renamed (its serving_default takes z and returns w), vanish (the host drops off the
    network at the first Predict), cut (the host drops off the network at the signature
    gate: its gRPC call times out, as a real one does when the network drops its packets),
    refuse (the stable port refuses connections).
    """

    behaviour: ClassVar[dict[str, str]] = {}
    fleet: ClassVar[FakeFleet]
    load_error: ClassVar[str] = "Could not load the SavedModel"  # a broken load's message

    def __init__(self, address: str, port: int, model: str) -> None:
        self.address, self.port, self.model = address, port, model

    def _host(self) -> FakeHost:
        return self.fleet.by_address(self.address)

    def _stable(self) -> bool:
        host = self._host()
        return host.proxy.running and self.port == host.proxy.binds.get("grpc")

    def _container(self) -> FakeContainer:
        found = [c for c in self._host().docker.by_name.values()
                 if c.running and c.port("--port") == self.port]
        if not found:
            raise ConnectionRefusedError(f"{self.address}:{self.port}: connection refused")
        return found[0]

    def status(self, *, timeout: float = 5.0) -> list[VersionStatus]:
        version = self._container().version
        mode = self.behaviour.get(self.address, "ok")
        if mode == "slow":
            return [VersionStatus(version, "LOADING", 0, "")]
        if mode == "broken":
            return [VersionStatus(version, "END", 3, self.load_error)]
        return [VersionStatus(version, "AVAILABLE", 0, "")]

    def signatures(self, version: int, *, timeout: float = 10.0) -> dict[str, Any]:
        self._container()
        if self.behaviour.get(self.address) == "cut":
            self._host().unreachable = True
            raise TimeoutError("Deadline Exceeded")
        if self.behaviour.get(self.address) == "renamed":
            return {"serving_default": {"inputs": {"z": ("DT_FLOAT", (-1, 1))},
                                        "outputs": {"w": ("DT_FLOAT", (-1, 1))}}}
        return {"serving_default": {"inputs": {"x": ("DT_FLOAT", (-1, 1))},
                                    "outputs": {"y": ("DT_FLOAT", (-1, 1))}}}

    def predict(self, inputs: dict[str, Tensor], *, version: int | None = None,
                signature: str = "serving_default", timeout: float = 30.0
                ) -> tuple[dict[str, Tensor], float]:
        mode = self.behaviour.get(self.address)
        if mode == "vanish":
            self._host().unreachable = True
        if self._stable():
            if mode == "refuse":
                raise ConnectionRefusedError("stable port: connection refused")
            served = self._behind_proxy()
        else:
            served = self._container().version
            if version is not None and version != served:
                raise RuntimeError(f"Servable not found for request: Specific({self.model}, "
                                   f"{version})")
        x = inputs["x"]
        took = 0.2 if mode == "laggy" else 0.002
        return {"y": tensor([v * 0.5 + 2 + served - 1 for v in x.values], x.dtype, x.shape)}, took

    def _behind_proxy(self) -> int:
        """The version of the container the host's proxy sends new requests to."""
        served = self._host().serving_version()
        if not served:
            raise ConnectionRefusedError("stable port: no server available")
        return served

    def close(self) -> None:
        pass


def rest_problems(fleet: FakeFleet, address: str, port: int, model: str, version: int, *,
                  metrics_path: str | None, timeout_s: float = 3.0) -> list[str]:
    """``probes.rest_problems`` answered by the container listening on ``port``."""
    host = fleet.by_address(address)
    found = [c for c in host.docker.by_name.values()
             if c.running and c.port("--rest_api_port") == port]
    if not found:
        return [f"REST :{port}: ConnectError: connection refused"]
    if found[0].version != version or FakeSlot.behaviour.get(address) in ("slow", "broken"):
        return [f"GET /v1/models/{model}/versions/{version}: HTTP 404"]
    return []


def read_json(path: Path) -> Any:
    """A JSON file on a fake host."""
    return json.loads(path.read_text())
