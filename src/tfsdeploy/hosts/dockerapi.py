"""The Docker Engine calls the toolkit makes on a host, behind one small interface.

``SdkDocker`` makes them with the docker SDK over the host's SSH connection (``dockerssh``;
a ``ContainerSpec`` reaches the SDK as ``sdk_arguments``); the unit tests pass a recording
fake. Engine errors are translated here, in one place: a
vanished connection becomes ``HostUnreachable``, anything else ``DockerFailed``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Protocol

import docker.auth
import docker.errors
import docker.utils
import requests.exceptions
from docker.types import DeviceRequest
from docker.types import Mount as SdkMount

from tfsdeploy.core.errors import ConfigError, HostUnreachable
from tfsdeploy.core.inventory.layout import GPUS_LABEL, LABEL_PREFIX, TUNE_LABEL, TUNE_RUN_LABEL
from tfsdeploy.hosts.commands.containers import ContainerSpec
from tfsdeploy.hosts.dockerssh import PullFailed, PullProgress, pull_with_progress
from tfsdeploy.hosts.logins import PullLogins


class DockerFailed(Exception):
    """The Docker Engine refused or failed a call."""


@dataclass(frozen=True)
class ContainerFact:
    """One of the model's containers, from its labels and state."""

    name: str
    role: str  # server | proxy
    release: str
    slot: str
    version: int
    instance: int
    running: bool
    status: str  # Docker's status text, e.g. "Up 3 minutes"
    state: str  # running, restarting, exited, created ...
    image: str


@dataclass(frozen=True)
class ScratchFact:
    """One of `fab tune`'s scratch instances on a host (any model's), from its labels."""

    name: str
    model: str  # the model it measures
    run: str  # the token of the tune lock that started it ("": an older tune's)
    gpus: str  # all, device ids (0,1), or "" (none)
    running: bool
    state: str  # running, restarting, exited, created ...

    def holds_gpu(self, index: int) -> bool:
        """Whether it may hold memory on GPU ``index`` (every GPU when it was given all)."""
        if not self.running and self.state != "restarting":
            return False
        return self.gpus == "all" or str(index) in self.gpus.split(",")


@dataclass(frozen=True)
class ContainerState:
    """A container's state as inspected now."""

    status: str
    restarts: int
    exit_code: int
    pid: int = 0  # State.Pid: its main process on the host (0 when it does not run)


class Docker(Protocol):
    """The Engine calls of a run."""

    def version(self) -> str:
        """The engine's version (proves it answers)."""

    def containers(self, model: str) -> list[ContainerFact]:
        """The model's containers (servers and proxy), running or not."""

    def labelled(self, label: str, value: str) -> list[str]:
        """The names of the containers whose ``label`` is ``value``, running or not."""

    def scratch(self) -> list[ScratchFact]:
        """`fab tune`'s scratch instances on the host, every model's, running or not."""

    def cpu_seconds(self, name: str) -> tuple[float, float] | None:
        """CPU time a running container used so far, (user, system) in seconds (None: no
        such container, or the engine reports no split)."""

    def run(self, spec: ContainerSpec) -> None:
        """Create and start a container."""

    def start(self, name: str) -> None:
        """Start a stopped container."""

    def stop(self, name: str) -> None:
        """Stop a container at once (TFServing ignores SIGTERM; callers drain first)."""

    def remove(self, name: str) -> None:
        """Remove a container, running or not (absent: nothing to do)."""

    def state(self, name: str) -> ContainerState | None:
        """Status, restart count and exit code (None: no such container)."""

    def logs(self, name: str, lines: int) -> str:
        """The tail of a container's log."""

    def log_lines(self, name: str, *, lines: int, since: float | None, follow: bool
                  ) -> Iterator[str]:
        """A container's log lines, each starting with its RFC 3339 time stamp; ``since`` is a
        Unix time (the SDK refuses text)."""

    def exec(self, name: str, argv: list[str]) -> tuple[int, str]:
        """Run ``argv`` inside a running container: (exit code, output)."""

    def kill(self, name: str, signal: str) -> None:
        """Send ``signal`` (``SIGUSR2``) to a running container's main process."""

    def remove_image(self, image: str) -> int:
        """Remove an image that no container uses; returns the bytes it held (0: kept, in
        use or absent)."""

    def image_present(self, image: str) -> bool:
        """Whether the image is on the host."""

    def pull(self, image: str, on_progress: Callable[[PullProgress], None]) -> None:
        """Pull an image, reporting progress."""


def container_fact(attrs: dict[str, Any]) -> ContainerFact | None:
    """One entry of the Engine's container list -> a fact (None: not one of ours)."""
    labels = attrs.get("Labels") or {}
    role = labels.get(f"{LABEL_PREFIX}.role") or (
        "proxy" if f"{LABEL_PREFIX}.proxy" in labels else "server")
    names = attrs.get("Names") or [""]
    state = str(attrs.get("State", ""))
    try:
        version = int(labels.get(f"{LABEL_PREFIX}.version", "0"))
        instance = int(labels.get(f"{LABEL_PREFIX}.instance", "0"))
    except ValueError:
        return None
    return ContainerFact(name=str(names[0]).lstrip("/"), role=role,
                         release=str(labels.get(f"{LABEL_PREFIX}.release", "")),
                         slot=str(labels.get(f"{LABEL_PREFIX}.slot", "")), version=version,
                         instance=instance, running=state == "running",
                         status=str(attrs.get("Status", "")), state=state,
                         image=str(attrs.get("Image", "")))


def scratch_fact(attrs: dict[str, Any]) -> ScratchFact:
    """One entry of the Engine's container list, labelled as a scratch instance -> a fact."""
    labels = attrs.get("Labels") or {}
    state = str(attrs.get("State", ""))
    return ScratchFact(name=str((attrs.get("Names") or [""])[0]).lstrip("/"),
                       model=str(labels.get(TUNE_LABEL, "")),
                       run=str(labels.get(TUNE_RUN_LABEL, "")),
                       gpus=str(labels.get(GPUS_LABEL, "all")), running=state == "running",
                       state=state)


def sdk_arguments(spec: ContainerSpec) -> dict[str, Any]:
    """The docker SDK's ``containers.run`` keyword arguments for ``spec`` (detached)."""
    arguments: dict[str, Any] = {
        "image": spec.image, "name": spec.name, "command": list(spec.command),
        "detach": True, "network_mode": "host", "labels": dict(spec.labels),
        "restart_policy": {"Name": spec.restart},
        "mounts": [SdkMount(target=m.target, source=m.source, type="bind",
                            read_only=m.read_only) for m in spec.mounts],
        "cap_drop": ["ALL"], "security_opt": ["no-new-privileges"], "read_only": True,
        "tmpfs": {path: "rw,nosuid,nodev" for path in spec.tmpfs},
    }
    if spec.entrypoint is not None:
        arguments["entrypoint"] = list(spec.entrypoint)
    if spec.user is not None:
        arguments["user"] = spec.user
    if spec.gpus is not None:
        arguments["device_requests"] = [DeviceRequest(
            count=spec.gpus.count if not spec.gpus.device_ids else None,
            device_ids=list(spec.gpus.device_ids) or None, capabilities=[["gpu"]])]
    return arguments


def registry_of(image: str) -> str:
    """The registry an image reference pulls from (``docker.io`` for Docker Hub's)."""
    repository, _ = docker.utils.parse_repository_tag(image)
    registry, _ = docker.auth.resolve_repository_name(repository)
    return str(registry)


class SdkDocker:
    """``Docker`` through a docker SDK client (``docker.DockerClient``). Every pull states the
    host's login (``logins``; none: anonymous), and a container is created from an image
    already on the host, never pulled on the way (docker-py's ``containers.run`` would pull a
    missing image with this machine's own docker login)."""

    def __init__(self, client: Any, host: str, logins: PullLogins | None = None) -> None:
        self._client = client
        self._host = host
        self._logins = logins

    @contextmanager
    def _calls(self, what: str) -> Iterator[None]:
        try:
            yield
        except docker.errors.NotFound:
            raise
        except docker.errors.APIError as error:
            raise DockerFailed(f"{self._host}: {what}: {error.explanation or error}") from None
        except (requests.exceptions.ConnectionError, OSError, EOFError) as error:
            raise HostUnreachable(f"{self._host}: the Docker connection was lost during "
                                  f"{what}: {error}") from None

    def version(self) -> str:
        """The engine's API version, as its ping gave it when the client was made (asking
        for the engine's own version costs a runtime call on the host)."""
        return f"API {self._client.api.api_version}"

    def containers(self, model: str) -> list[ContainerFact]:
        """The model's serving containers and its proxy."""
        with self._calls("list containers"):
            listed = [*self._client.api.containers(
                all=True, filters={"label": f"{LABEL_PREFIX}.model={model}"}),
                *self._client.api.containers(
                all=True, filters={"label": f"{LABEL_PREFIX}.proxy={model}"})]
        facts = [container_fact(attrs) for attrs in listed]
        return sorted((f for f in facts if f is not None), key=lambda f: (f.release, f.name))

    def labelled(self, label: str, value: str) -> list[str]:
        """Names of the containers labelled ``label=value``."""
        with self._calls("list containers"):
            listed = self._client.api.containers(all=True, filters={"label": f"{label}={value}"})
        return sorted(str((c.get("Names") or [""])[0]).lstrip("/") for c in listed)

    def scratch(self) -> list[ScratchFact]:
        """Every container with the scratch label (a label filter without a value matches
        the key, whatever its value)."""
        with self._calls("list containers"):
            listed = self._client.api.containers(all=True, filters={"label": TUNE_LABEL})
        return sorted((scratch_fact(c) for c in listed), key=lambda f: f.name)

    def cpu_seconds(self, name: str) -> tuple[float, float] | None:
        """One stats read: the cgroup's user and system CPU time (the Engine reports both,
        in ns, as cpu_stats.cpu_usage.usage_in_usermode / usage_in_kernelmode)."""
        try:
            with self._calls(f"stats {name}"):
                stats = self._client.api.stats(name, stream=False, one_shot=True)
        except docker.errors.NotFound:
            return None
        usage = (stats.get("cpu_stats") or {}).get("cpu_usage") or {}
        user, system = usage.get("usage_in_usermode"), usage.get("usage_in_kernelmode")
        if user is None or system is None:
            return None
        return int(user) / 1e9, int(system) / 1e9

    def run(self, spec: ContainerSpec) -> None:
        """Create and start (an image missing on the host is an error, not a pull)."""
        try:
            with self._calls(f"run {spec.name}"):
                self._client.containers.create(**sdk_arguments(spec)).start()
        except docker.errors.NotFound as missing:
            raise DockerFailed(f"{self._host}: run {spec.name}: "
                               f"{missing.explanation or missing}") from None

    def start(self, name: str) -> None:
        """Start."""
        try:
            with self._calls(f"start {name}"):
                self._client.api.start(name)
        except docker.errors.NotFound:
            raise DockerFailed(f"{self._host}: start {name}: no such container") from None

    def stop(self, name: str) -> None:
        """Stop at once."""
        try:
            with self._calls(f"stop {name}"):
                self._client.api.stop(name, timeout=0)
        except docker.errors.NotFound:
            return

    def remove(self, name: str) -> None:
        """Remove, forced; absent is fine."""
        try:
            with self._calls(f"remove {name}"):
                self._client.api.remove_container(name, force=True)
        except docker.errors.NotFound:
            return

    def state(self, name: str) -> ContainerState | None:
        """Inspect."""
        try:
            with self._calls(f"inspect {name}"):
                attrs = self._client.api.inspect_container(name)
        except docker.errors.NotFound:
            return None
        state = attrs.get("State") or {}
        return ContainerState(status=str(state.get("Status", "")),
                              restarts=int(attrs.get("RestartCount") or 0),
                              exit_code=int(state.get("ExitCode") or 0),
                              pid=int(state.get("Pid") or 0))

    def logs(self, name: str, lines: int) -> str:
        """Log tail (stdout and stderr)."""
        try:
            with self._calls(f"logs {name}"):
                data = self._client.api.logs(name, tail=lines)
        except docker.errors.NotFound:
            return ""
        return data.decode(errors="replace") if isinstance(data, bytes) else str(data)

    def log_lines(self, name: str, *, lines: int, since: float | None, follow: bool
                  ) -> Iterator[str]:
        """Log lines with time stamps; with ``follow``, as they come."""
        with self._calls(f"logs {name}"):
            stream = self._client.api.logs(name, stdout=True, stderr=True, timestamps=True,
                                           tail=lines, since=since, stream=True,
                                           follow=follow)
        buffered = b""
        with self._calls(f"logs {name}"):
            for chunk in stream:
                buffered += chunk
                *complete, buffered = buffered.split(b"\n")
                for line in complete:
                    yield line.decode(errors="replace")
        if buffered:
            yield buffered.decode(errors="replace")

    def exec(self, name: str, argv: list[str]) -> tuple[int, str]:
        """docker exec: create, start (output collected), inspect the exit code."""
        with self._calls(f"exec in {name}"):
            created = self._client.api.exec_create(name, argv, stdout=True, stderr=True)
            output = self._client.api.exec_start(created["Id"])
            code = self._client.api.exec_inspect(created["Id"]).get("ExitCode")
        text = output.decode(errors="replace") if isinstance(output, bytes) else str(output)
        return int(code if code is not None else -1), text

    def kill(self, name: str, signal: str) -> None:
        """docker kill --signal: the signal goes to the container's PID 1."""
        with self._calls(f"signal {signal} to {name}"):
            self._client.api.kill(name, signal=signal)

    def remove_image(self, image: str) -> int:
        """Remove an unused image (never forced: an image in use stays)."""
        try:
            with self._calls(f"inspect image {image}"):
                size = int(self._client.api.inspect_image(image).get("Size") or 0)
            self._client.api.remove_image(image, force=False, noprune=False)
        except docker.errors.NotFound:
            return 0
        except docker.errors.APIError:  # in use by a container: kept
            return 0
        return size

    def image_present(self, image: str) -> bool:
        """Inspect the image."""
        try:
            with self._calls(f"inspect image {image}"):
                self._client.api.inspect_image(image)
        except docker.errors.NotFound:
            return False
        return True

    def pull(self, image: str, on_progress: Callable[[PullProgress], None]) -> None:
        """Pull with the host's login for the image's registry, streaming per-layer
        progress."""
        try:
            auth = self._logins.auth_config(registry_of(image)) if self._logins else {}
            with self._calls(f"pull {image}"):
                pull_with_progress(self._client, image, on_progress, auth_config=auth)
        except PullFailed as error:
            raise DockerFailed(str(error)) from None
        except ConfigError as error:
            raise DockerFailed(f"{self._host}: pull {image}: "
                               + "; ".join(p.render() for p in error.problems)) from None

