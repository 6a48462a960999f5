"""Where things live on a host, what containers are called, and which ports a model uses.

Pure: every function maps inventory data to names, paths and ports.

On a host (``data_root`` defaults to /srv/tfsdeploy)::

    <data_root>/models/<model>/<version>/         SavedModel versions, staged atomically
    <data_root>/<model>/releases/<release-id>/    rendered files + manifest.json
    <data_root>/<model>/current -> releases/<id>  the release taking traffic
    <data_root>/<model>/versions/<version>.sha256 digest of each staged version's files
    <data_root>/<model>/proxy/haproxy.cfg         the per-host traffic switch's config
    <data_root>/<model>/proxy/loaded              the config its running worker was loaded on
    <data_root>/<model>/proxy-admin/admin.sock    the switch's admin API (root-only directory)
    <data_root>/<model>/audit.log                 one JSON line per change, append-only
    <data_root>/<model>/lock/                     the model's part of the fleet lock
    <data_root>/<model>/lock.flock                serialises lock changes on the host
    <data_root>/gpu/reservations/<seq>.<model>.<instance>.json
                                                  a window's GPU memory, reserved host-wide
    <data_root>/gpu/overhead/<gpu>.<model>.json   what a process held beside its pool
    <data_root>/gpu/lock                          serialises the reservations (flock)
    <data_root>/<model>/tune/<trial>/             `fab tune`'s trial files (while it runs)
    <data_root>/<model>/tune.lock/                one `fab tune` of the model on the host
    <data_root>/<model>/tune.lock.flock           serialises that lock's changes
"""

from __future__ import annotations

import ipaddress
import re
from dataclasses import dataclass
from datetime import UTC, datetime

from tfsdeploy.core.inventory.catalog import Model
from tfsdeploy.core.inventory.fleet import ResolvedHost

SLOTS = ("blue", "green")
# instance k of a model uses its slot ports + k x 20: with the default slot ports, instance 0
# has 8510/8511 (blue) and 8520/8521 (green), instance 1 8530/8531 and 8540/8541, ...
INSTANCE_PORT_STRIDE = 20
LABEL_PREFIX = "tfsdeploy"
ADMIN_SOCKET_NAME = "admin.sock"
PROXY_ADMIN_MOUNT = "/run/tfsdeploy-admin"  # where the proxy container sees the admin dir


@dataclass(frozen=True)
class Ports:
    """A model's ports on one host: stable (the proxy's) and each slot's (instance 0's; an
    instance ``k`` adds ``k x instance_stride``). The proxy's admin API is a unix socket, not a
    port (``HostPaths.admin_socket``)."""

    grpc: int
    rest: int
    slots: dict[str, tuple[int, int]]
    instance_stride: int = INSTANCE_PORT_STRIDE

    def slot_grpc(self, slot: str, instance: int = 0) -> int:
        """The gRPC port of one instance's slot."""
        return self.slots[slot][0] + instance * self.instance_stride

    def slot_rest(self, slot: str, instance: int = 0) -> int:
        """The REST port of one instance's slot."""
        return self.slots[slot][1] + instance * self.instance_stride


def model_ports(host: ResolvedHost, model: Model) -> Ports:
    """The host's ports shifted by the model's ``port_offset`` (co-located models differ)."""
    shift = model.port_offset
    v = host.vars
    return Ports(grpc=v.grpc_port + shift, rest=v.rest_port + shift,
                 slots={s: (g + shift, r + shift) for s, (g, r) in v.slot_ports.items()})


def assigned_ports(ports: Ports, instances: int) -> frozenset[int]:
    """Every port the inventory gives a model on a host: its stable pair and each slot's pair
    of each of its ``instances``, whether or not something listens there now."""
    pairs = {(ports.grpc, ports.rest)} | {
        (ports.slot_grpc(slot, k), ports.slot_rest(slot, k))
        for slot in ports.slots for k in range(instances)}
    return frozenset(port for pair in pairs for port in pair)


@dataclass(frozen=True)
class HostPaths:
    """Paths of one model on one host."""

    root: str
    model: str

    @property
    def model_dir(self) -> str:
        """Base path holding the model's numeric version directories."""
        return f"{self.root}/models/{self.model}"

    def version_dir(self, version: int) -> str:
        """One version's SavedModel directory."""
        return f"{self.model_dir}/{version}"

    @property
    def home(self) -> str:
        """The model's release area."""
        return f"{self.root}/{self.model}"

    @property
    def releases(self) -> str:
        """Directory of retained releases."""
        return f"{self.home}/releases"

    def release_dir(self, release_id: str) -> str:
        """One release's files."""
        return f"{self.releases}/{release_id}"

    @property
    def current(self) -> str:
        """Symlink to the release taking traffic."""
        return f"{self.home}/current"

    @property
    def proxy_dir(self) -> str:
        """The proxy's config directory (mounted read-only into the proxy container)."""
        return f"{self.home}/proxy"

    @property
    def proxy_loaded(self) -> str:
        """The digest of the configuration the proxy's running worker was started or reloaded
        on (``host_proxy.shape_digest``), written once it answered."""
        return f"{self.proxy_dir}/loaded"

    @property
    def audit_log(self) -> str:
        """Append-only audit log."""
        return f"{self.home}/audit.log"

    @property
    def lock_dir(self) -> str:
        """The model's part of the fleet lock."""
        return f"{self.home}/lock"

    @property
    def lock_guard(self) -> str:
        """The file ``flock`` holds while the lock directory is read and changed."""
        return f"{self.home}/lock.flock"

    @property
    def tune_dir(self) -> str:
        """`fab tune`'s trial files (one directory per trial)."""
        return f"{self.home}/tune"

    @property
    def tune_lock_dir(self) -> str:
        """The lock of `fab tune` on this host: one tune of the model at a time."""
        return f"{self.home}/tune.lock"

    @property
    def tune_lock_guard(self) -> str:
        """The file ``flock`` holds while the tune lock is read and changed."""
        return f"{self.home}/tune.lock.flock"

    @property
    def digests(self) -> str:
        """Digests of the staged versions' files (``<version>.sha256``)."""
        return f"{self.home}/versions"

    def digest_file(self, version: int) -> str:
        """The digest record of one staged version: ``<digest> <boot id>``, the sha256 of its
        sums and the host kernel's boot id when it was staged or last verified."""
        return f"{self.digests}/{version}.sha256"

    def sums_file(self, version: int) -> str:
        """The sha256 of every file of one staged version (``sha256sum`` lines), recorded at
        staging: what a reuse after a reboot verifies the files against."""
        return f"{self.digests}/{version}.sums"

    @property
    def admin_dir(self) -> str:
        """Root-only directory holding the proxy's admin socket."""
        return f"{self.home}/proxy-admin"

    @property
    def admin_socket(self) -> str:
        """The proxy's admin socket, as the host sees it."""
        return f"{self.admin_dir}/{ADMIN_SOCKET_NAME}"

    @property
    def gpu_dir(self) -> str:
        """The host-wide GPU records every model shares (reservations, measured overhead)."""
        return f"{self.root}/gpu"

    def overhead_file(self, gpu: int) -> str:
        """What this model's process was last measured to hold beside its pool on ``gpu``."""
        return f"{self.gpu_dir}/overhead/{gpu}.{self.model}.json"


def host_paths(host: ResolvedHost, model: Model) -> HostPaths:
    """Paths of ``model`` on ``host``."""
    return HostPaths(root=host.vars.data_root.rstrip("/"), model=model.name)


# what new_release_id makes, matched whole (fullmatch: re.match's $ would let a trailing
# newline through) and with ASCII digits only (\d takes any Unicode digit)
RELEASE_ID = re.compile(r"r[0-9]{8}-[0-9]{9}-v[1-9][0-9]{0,18}")


def new_release_id(version: int, now: datetime | None = None) -> str:
    """``r<YYYYmmdd>-<HHMMSSmmm>-v<version>``: sortable by time (to the millisecond, so two
    deploys started in the same second differ), names the version."""
    moment = (now or datetime.now(UTC)).astimezone(UTC)
    return f"r{moment:%Y%m%d-%H%M%S}{moment.microsecond // 1000:03d}-v{version}"


def is_release_id(value: object) -> bool:
    """Whether ``value`` is a release id this toolkit makes (and so safe in paths)."""
    return isinstance(value, str) and RELEASE_ID.fullmatch(value) is not None


def container_name(model: str, release_id: str, instance: int = 0) -> str:
    """The serving container of one instance of one release."""
    return f"tfs-{model}-{release_id}-i{instance}"


def server_name(slot: str, instance: int = 0) -> str:
    """The proxy's backend server of one instance's slot."""
    return f"i{instance}-{slot}"


def parse_server_name(name: str) -> tuple[int, str] | None:
    """(instance, slot) of a proxy server name, or None when it is not one of ours."""
    head, _, slot = name.partition("-")
    if not re.fullmatch(r"i[0-9]{1,4}", head) or slot not in SLOTS:
        return None
    return int(head[1:]), slot


TUNE_LABEL = f"{LABEL_PREFIX}.tune"  # `fab tune`'s scratch instances: the model they measure
TUNE_RUN_LABEL = f"{LABEL_PREFIX}.tune-run"  # the token of the tune lock that started it
GPUS_LABEL = f"{LABEL_PREFIX}.gpus"  # the GPUs a scratch instance was given (all, ids, none)


def scratch_name(model: str, trial: int) -> str:
    """`fab tune`'s scratch instance of one trial."""
    return f"tfs-{model}-tune-{trial}"


def proxy_name(model: str) -> str:
    """The per-host proxy container of a model."""
    return f"tfs-proxy-{model}"


def other_slot(slot: str) -> str:
    """The slot that is not ``slot``."""
    return SLOTS[1] if slot == SLOTS[0] else SLOTS[0]


def host_port(address: str, port: int) -> str:
    """``address:port`` for a URL or a gRPC target: an IPv6 literal in brackets (RFC 3986
    section 3.2.2, the IP-literal of an authority; gRPC's target names take the same
    ``[::1]:8500``, grpc doc/naming.md), a zone id's ``%`` written ``%25`` (RFC 6874).
    Without the brackets ``fd00::11:8511`` reads as the address ``fd00::11:8511``."""
    try:
        parsed = ipaddress.ip_address(address)
    except ValueError:
        return f"{address}:{port}"  # a DNS name
    if parsed.version == 4:
        return f"{address}:{port}"
    return f"[{address.replace('%', '%25')}]:{port}"
