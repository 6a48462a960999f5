"""What the toolkit asks the Docker Engine to run: container specs (pure).

A spec is plain data; ``dockerapi.sdk_arguments`` turns it into the docker SDK's
``containers.run`` keyword arguments. Serving containers and the proxy are hardened as far as
they allow: no capabilities, ``no-new-privileges``, a read-only root file system with a tmpfs
for /tmp, the model and release files mounted read-only.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace

from tfsdeploy.core.inventory.layout import (
    GPUS_LABEL,
    LABEL_PREFIX,
    PROXY_ADMIN_MOUNT,
    TUNE_LABEL,
    TUNE_RUN_LABEL,
    HostPaths,
    Ports,
    container_name,
    proxy_name,
    scratch_name,
)
from tfsdeploy.core.render.files import CONTAINER_CONFIG_DIR, CONTAINER_MODEL_ROOT

SERVER_BINARY = "/usr/bin/tensorflow_model_server"
# Docker's restart policies (moby api/types/container/hostconfig.go: RestartPolicyDisabled is
# "no", RestartPolicyUnlessStopped "unless-stopped"): what serves comes back after a crash or a
# reboot of the host's engine; a scratch instance never does
RESTART_SERVING = "unless-stopped"
RESTART_NEVER = "no"
# TFServing reads its model and config files and writes nothing: it runs as an unprivileged
# user (nobody), whatever user the image names
SERVER_USER = "65534:65534"
PROXY_CONFIG_DIR = "/usr/local/etc/haproxy"


@dataclass(frozen=True)
class Mount:
    """A host directory mounted into the container."""

    source: str
    target: str
    read_only: bool = True


@dataclass(frozen=True)
class GpuRequest:
    """Docker's ``--gpus``: all GPUs (count -1), a count, or given device ids."""

    count: int = 0
    device_ids: tuple[str, ...] = ()


@dataclass(frozen=True)
class ContainerSpec:
    """Everything ``docker run`` is given for one container."""

    name: str
    image: str
    command: tuple[str, ...] = ()
    entrypoint: tuple[str, ...] | None = None
    labels: Mapping[str, str] = field(default_factory=dict)
    mounts: tuple[Mount, ...] = ()
    gpus: GpuRequest | None = None
    user: str | None = None
    tmpfs: tuple[str, ...] = ("/tmp",)
    restart: str = RESTART_SERVING

    def describe(self) -> str:
        """One line for plans and logs."""
        gpus = ""
        if self.gpus:
            gpus = (f", GPUs {','.join(self.gpus.device_ids)}" if self.gpus.device_ids
                    else ", all GPUs" if self.gpus.count < 0 else f", {self.gpus.count} GPU(s)")
        return f"{self.name} from {self.image}{gpus}"


def parse_gpus(value: str | None) -> GpuRequest | None:
    """The ``docker_gpus`` var (docker's ``--gpus`` syntax: all, N, device=0,1) as a request."""
    if not value:
        return None
    if value == "all":
        return GpuRequest(count=-1)
    if value.startswith("device="):
        return GpuRequest(device_ids=tuple(d.strip() for d in value[7:].split(",") if d.strip()))
    return GpuRequest(count=int(value))


def server_spec(*, model: str, release_id: str, slot: str, version: int, image: str,
                paths: HostPaths, ports: Ports, flags: Sequence[str], gpus: GpuRequest | None,
                instance: int = 0) -> ContainerSpec:
    """One instance of a release in ``slot``: host network, model and release files read-only,
    the slot's ports appended to the release's flags."""
    labels = {f"{LABEL_PREFIX}.model": model, f"{LABEL_PREFIX}.role": "server",
              f"{LABEL_PREFIX}.release": release_id, f"{LABEL_PREFIX}.slot": slot,
              f"{LABEL_PREFIX}.version": str(version),
              f"{LABEL_PREFIX}.instance": str(instance)}
    mounts = (Mount(paths.model_dir, f"{CONTAINER_MODEL_ROOT}/{model}"),
              Mount(paths.release_dir(release_id), CONTAINER_CONFIG_DIR))
    command = (*flags, f"--port={ports.slot_grpc(slot, instance)}",
               f"--rest_api_port={ports.slot_rest(slot, instance)}")
    return ContainerSpec(name=container_name(model, release_id, instance), image=image,
                         command=command, entrypoint=(SERVER_BINARY,), labels=labels,
                         mounts=mounts, gpus=gpus, user=SERVER_USER)


def scratch_spec(*, model: str, trial: int, version: int, image: str, paths: HostPaths,
                 config_dir: str, ports: tuple[int, int], flags: Sequence[str],
                 gpus: GpuRequest | None, run: str) -> ContainerSpec:
    """A scratch instance of ``model`` for `fab tune`: a serving container as ``server_spec``
    makes it (the same binary, user, mounts and hardening) on ``ports`` (gRPC, REST) with
    its configuration from ``config_dir``, labelled as a tuning trial of the tune whose lock
    token is ``run`` (with the GPUs it holds) and not as one of the model's servers: no
    proxy sends it a request and no release counts it. It never restarts on its own: one
    left by a killed tune stays down after a crash or a reboot until a deploy, prune, retire
    or the next tune removes it."""
    spec = server_spec(model=model, release_id=f"tune{trial}", slot="tune", version=version,
                       image=image, paths=paths,
                       ports=Ports(grpc=ports[0], rest=ports[1], slots={"tune": ports}),
                       flags=flags, gpus=gpus)
    labels = {TUNE_LABEL: model, f"{LABEL_PREFIX}.role": "tune",
              f"{LABEL_PREFIX}.trial": str(trial), f"{LABEL_PREFIX}.version": str(version),
              TUNE_RUN_LABEL: run, GPUS_LABEL: gpus_label(gpus)}
    mounts = (spec.mounts[0], Mount(config_dir, CONTAINER_CONFIG_DIR))
    return replace(spec, name=scratch_name(model, trial), labels=labels, mounts=mounts,
                   restart=RESTART_NEVER)


def gpus_label(gpus: GpuRequest | None) -> str:
    """What a scratch instance's GPU label says: ``all`` (every GPU, or a count Docker
    chooses), the device ids (``0,1``), or ``""`` (none)."""
    if gpus is None or not (gpus.device_ids or gpus.count):
        return ""
    return ",".join(gpus.device_ids) if gpus.device_ids else "all"


def proxy_spec(*, model: str, image: str, paths: HostPaths) -> ContainerSpec:
    """The model's traffic switch (HAProxy): config read-only, the admin socket's directory
    writable. It runs as root inside the container (with no capabilities) because the admin
    directory on the host is root's only."""
    # not labelled with the model: "the model's containers" are its servers
    labels = {f"{LABEL_PREFIX}.role": "proxy", f"{LABEL_PREFIX}.proxy": model}
    mounts = (Mount(paths.proxy_dir, PROXY_CONFIG_DIR),
              Mount(paths.admin_dir, PROXY_ADMIN_MOUNT, read_only=False))
    return ContainerSpec(name=proxy_name(model), image=image, labels=labels, mounts=mounts,
                         user="0", tmpfs=("/tmp", "/run"))
