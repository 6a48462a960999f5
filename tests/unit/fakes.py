"""A recording fake of hosts (Runner), of HAProxy's admin socket, of TFServing slots, and a
frozen clock: the rollout tier of tests, with no network and no sleeping."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, ClassVar

import numpy as np

from tfsdeploy.inventory import ResolvedHost
from tfsdeploy.probes import VersionStatus
from tfsdeploy.remote import HostUnreachable, Result


class FrozenClock:
    """Time moves only when something sleeps."""

    def __init__(self) -> None:
        self.t = 1000.0

    def now(self) -> float:
        return self.t

    def sleep(self, seconds: float) -> None:
        self.t += max(seconds, 0.001)


@dataclass
class FakeContainer:
    labels: dict[str, str]
    running: bool = True
    restarts: int = 0


@dataclass
class FakeHost:
    """What one host holds; every command is recorded in ``log``."""

    name: str
    files: dict[str, bytes] = field(default_factory=dict)
    containers: dict[str, FakeContainer] = field(default_factory=dict)
    admin: list[str] = field(default_factory=list)
    log: list[list[str]] = field(default_factory=list)
    unreachable: bool = False
    gpu_used_mib: int = 1000
    servers: dict[tuple[str, str], str] = field(default_factory=dict)  # HAProxy's states

    def ran(self, *prefix: str) -> list[list[str]]:
        """Commands that start with ``prefix``."""
        return [a for a in self.log if a[:len(prefix)] == list(prefix)]


class FakeSocket:
    """HAProxy's admin socket: records commands, answers `show stat` with no session."""

    def __init__(self, host: FakeHost) -> None:
        self.host = host
        self.reply = b""

    def sendall(self, data: bytes) -> None:
        commands = [c.strip() for c in data.decode().strip().split(";")]
        self.host.admin += commands
        states = {"ready": "UP", "drain": "DRAIN", "maint": "MAINT"}
        for command in commands:
            words = command.split()
            if words[:2] == ["set", "server"]:
                backend, server = words[2].split("/")
                self.host.servers[(backend, server)] = states[words[-1]]
        if "show stat" in commands:
            rows = ["# pxname,svname,scur,status"]
            rows += [f"{b},{s},0,{state}" for (b, s), state in self.host.servers.items()]
            self.reply = ("\n".join(rows) + "\n").encode()

    def recv(self, size: int) -> bytes:
        data, self.reply = self.reply, b""
        return data

    def close(self) -> None:
        pass


class FakeRunner:
    """A Runner over a FakeHost."""

    def __init__(self, host: ResolvedHost, fleet: dict[str, FakeHost]) -> None:
        self.host = host
        self.fake = fleet.setdefault(host.name, FakeHost(host.name))

    def _check(self) -> None:
        if self.fake.unreachable:
            raise HostUnreachable(f"{self.host.name}: connection refused")

    def run(self, argv: list[str], *, timeout: float | None = None) -> Result:
        self._check()
        self.fake.log.append(list(argv))
        code, out = self._dispatch(argv)
        return Result(tuple(argv), code, out, "" if code == 0 else "failed")

    def _dispatch(self, argv: list[str]) -> tuple[int, str]:
        fake = self.fake
        if argv[:2] == ["docker", "ps"]:
            model = argv[argv.index("--filter") + 1].split("=", 2)[2]
            return 0, "".join(json.dumps({
                "Names": name, "State": "running" if c.running else "exited",
                "Status": "Up", "Labels": ",".join(f"{k}={v}" for k, v in c.labels.items())})
                + "\n" for name, c in fake.containers.items()
                if c.labels.get("tfsdeploy.model") == model)
        if argv[:2] == ["docker", "run"]:
            name = argv[argv.index("--name") + 1]
            labels = dict(argv[i + 1].split("=", 1) for i, a in enumerate(argv) if a == "--label")
            fake.containers[name] = FakeContainer(labels)
            if name.startswith("tfs-proxy-"):
                self._proxy_started(name.removeprefix("tfs-proxy-"))
            return 0, name
        if argv[:2] == ["docker", "inspect"]:
            c = fake.containers.get(argv[-1])
            if c is None:
                return 1, ""
            return 0, f"{'running' if c.running else 'exited'} {c.restarts} 0"
        if argv[:2] == ["docker", "rm"]:
            fake.containers.pop(argv[-1], None)
            return 0, ""
        if argv[:2] == ["docker", "stop"]:
            if argv[-1] in fake.containers:
                fake.containers[argv[-1]].running = False
            return 0, ""
        if argv[:2] in (["docker", "version"], ["docker", "image"], ["docker", "logs"]):
            return 0, "24.0.0"
        if argv[0] == "nvidia-smi":
            return 0, f"0, 16384, {fake.gpu_used_mib}\n"
        if argv[0] == "readlink":
            link = fake.files.get(argv[1], b"")
            return (0, link[2:].decode()) if link.startswith(b"->") else (1, "")
        if argv[0] == "tail":
            data = fake.files.get(argv[-1])
            return (0, data.decode()) if data is not None else (1, "")
        if argv[:2] == ["docker", "start"]:
            if argv[-1] not in fake.containers:
                return 1, ""
            fake.containers[argv[-1]].running = True
            return 0, ""
        if argv[0] == "cat":
            data = fake.files.get(self._resolve(argv[1]))
            return (0, data.decode()) if data is not None else (1, "")
        if argv[0] == "test":
            path = argv[2]
            present = path in fake.files or any(k.startswith(path + "/") for k in fake.files)
            return (0, "") if present else (1, "")
        if argv[0] == "ls":
            prefix = argv[-1].rstrip("/") + "/"
            return 0, "\n".join(sorted({k[len(prefix):].split("/")[0] for k in fake.files
                                        if k.startswith(prefix)}))
        if argv[0] == "rm":
            for key in [k for k in fake.files if k == argv[-1] or k.startswith(argv[-1] + "/")]:
                del fake.files[key]
            return 0, ""
        if argv[0] == "sh":
            return self._script(argv)
        return 0, ""

    def _proxy_started(self, model: str) -> None:
        config = self.fake.files[f"/srv/tfsdeploy/{model}/proxy/haproxy.cfg"].decode()
        for line in config.splitlines():
            words = line.split()
            if words[:1] == ["backend"]:
                backend = words[1]
            elif words[:1] == ["server"]:
                self.fake.servers[(backend, words[1])] = "MAINT" if "disabled" in words else "UP"

    def _script(self, argv: list[str]) -> tuple[int, str]:
        script, args = argv[2], argv[4:]
        fake = self.fake
        if "mkdir \"$1\" 2>/dev/null" in script:  # the lock
            if any(k.startswith(args[0] + "/") for k in fake.files):
                return 1, ""
            fake.files[f"{args[0]}/info.json"] = args[1].encode()
            return 0, ""
        if "ln -sfn" in script:
            fake.files[args[1]] = b"->" + args[0].encode()
            if len(args) >= 5:  # record_current: the audit line, and the rolled-back manifest
                fake.files[args[2]] = fake.files.get(args[2], b"") + args[3].encode() + b"\n"
                if args[4] in fake.files:
                    record = json.loads(fake.files[args[4]])
                    record["status"] = "rolled_back"
                    fake.files[args[4]] = json.dumps(record, indent=2).encode()
            return 0, ""
        if "df -Pm" in script:
            return 0, "/dev/x 100000 1000 99000 1% /\n"
        if "sha256sum" in script:
            fake.files[f"{args[1]}/saved_model.pb"] = b"pb"
            return 0, "published\n"
        if "manifest.json; do" in script:  # read every retained release's manifest
            prefix = args[0] + "/"
            return 0, "\n".join(v.decode() for k, v in sorted(fake.files.items())
                                 if k.startswith(prefix) and k.endswith("/manifest.json"))
        if ">>" in script:
            fake.files[args[1]] = fake.files.get(args[1], b"") + args[0].encode() + b"\n"
        return 0, ""

    def _resolve(self, path: str) -> str:
        for link, target in self.fake.files.items():
            if target.startswith(b"->") and path.startswith(link + "/"):
                base = link.rsplit("/", 1)[0]
                return f"{base}/{target[2:].decode()}{path[len(link):]}"
        return path

    def put_bytes(self, data: bytes, path: str) -> None:
        self._check()
        self.fake.files[path] = data

    def put_file(self, local: str, path: str) -> None:
        self._check()
        self.fake.files[path] = b"archive"

    def tunnel(self, port: int) -> FakeSocket:
        self._check()
        return FakeSocket(self.fake)

    def close(self) -> None:
        pass


class FakeSlot:
    """A TFServing slot: AVAILABLE unless the host is set to fail; half_plus_two outputs."""

    behaviour: ClassVar[dict[str, str]] = {}
    fleet: ClassVar[dict[str, FakeHost]] = {}

    def __init__(self, address: str, port: int, model: str) -> None:
        self.address = address
        self.port = port

    def status(self, *, timeout: float = 5.0) -> list[VersionStatus]:
        mode = self.behaviour.get(self.address, "ok")
        if mode == "slow":
            return [VersionStatus(v, "LOADING", 0, "") for v in (1, 2, 3)]
        if mode == "broken":
            return [VersionStatus(v, "END", 3, "Could not load the SavedModel") for v in (1, 2, 3)]
        return [VersionStatus(v, "AVAILABLE", 0, "") for v in (1, 2, 3)]

    def signature(self, version: int, name: str, *, timeout: float = 10.0) -> dict[str, Any]:
        return {"inputs": {"x": ("DT_FLOAT", (-1, 1))}, "outputs": {"y": ("DT_FLOAT", (-1, 1))}}

    def predict(self, inputs: dict[str, np.ndarray], *, version: int | None = None,
                signature: str = "serving_default", timeout: float = 30.0
                ) -> tuple[dict[str, np.ndarray], float]:
        mode = self.behaviour.get(self.address)
        if mode == "vanish":  # the host drops off the network
            self._host().unreachable = True
        if mode == "refuse" and version is None:  # nothing answers behind the stable port
            raise ConnectionRefusedError("stable port: connection refused")
        x = inputs["x"]
        served = version or self._behind_proxy()
        return {"y": x * 0.5 + 2 + served - 1}, 0.002

    def _host(self) -> FakeHost:
        """The fake host at this slot's address (10.9.0.N is hN)."""
        return self.fleet[f"h{self.address.rsplit('.', 1)[1]}"]

    def _behind_proxy(self) -> int:
        """The version of the container in the slot the host's proxy sends requests to."""
        host = self._host()
        active = [s for (b, s), state in host.servers.items() if b == "grpc" and state == "UP"]
        versions = [int(c.labels["tfsdeploy.version"]) for c in host.containers.values()
                    if c.running and c.labels.get("tfsdeploy.slot") in active]
        return max(versions) if versions else 0

    def close(self) -> None:
        pass
