"""Where things live on a host, what containers are called, and which ports a model uses.

Pure: every function maps inventory data to names, paths and ports.

On a host (``data_root`` defaults to /srv/tfsdeploy)::

    <data_root>/models/<model>/<version>/         SavedModel versions, staged atomically
    <data_root>/<model>/releases/<release-id>/    rendered files + manifest.json
    <data_root>/<model>/current -> releases/<id>  the release taking traffic
    <data_root>/<model>/proxy/haproxy.cfg         the per-host traffic switch's config
    <data_root>/<model>/audit.log                 one JSON line per action, append-only
    <data_root>/<model>/lock/                     the fleet lock (on the fleet's first host)
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime

from tfsdeploy.catalog import Model
from tfsdeploy.inventory import ResolvedHost

SLOTS = ("blue", "green")
LABEL_PREFIX = "tfsdeploy"


@dataclass(frozen=True)
class Ports:
    """A model's ports on one host: stable (the proxy), per slot, and the proxy's admin port."""

    grpc: int
    rest: int
    slots: dict[str, tuple[int, int]]
    admin: int

    def slot_grpc(self, slot: str) -> int:
        """The slot's gRPC port."""
        return self.slots[slot][0]

    def slot_rest(self, slot: str) -> int:
        """The slot's REST port."""
        return self.slots[slot][1]


def model_ports(host: ResolvedHost, model: Model) -> Ports:
    """The host's ports shifted by the model's ``port_offset`` (co-located models differ)."""
    shift = model.port_offset
    v = host.vars
    return Ports(grpc=v.grpc_port + shift, rest=v.rest_port + shift,
                 slots={s: (g + shift, r + shift) for s, (g, r) in v.slot_ports.items()},
                 admin=v.proxy_admin_port + shift)


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
    def audit_log(self) -> str:
        """Append-only audit log."""
        return f"{self.home}/audit.log"

    @property
    def lock_dir(self) -> str:
        """The fleet lock directory (used on the fleet's first host)."""
        return f"{self.home}/lock"


def host_paths(host: ResolvedHost, model: Model) -> HostPaths:
    """Paths of ``model`` on ``host``."""
    return HostPaths(root=host.vars.data_root.rstrip("/"), model=model.name)


def new_release_id(version: int, now: datetime | None = None) -> str:
    """``r<YYYYmmdd>-<HHMMSSmmm>-v<version>``: sortable by time (to the millisecond, so two
    deploys started in the same second differ), names the version."""
    moment = (now or datetime.now(UTC)).astimezone(UTC)
    return f"r{moment:%Y%m%d-%H%M%S}{moment.microsecond // 1000:03d}-v{version}"


def container_name(model: str, release_id: str) -> str:
    """The serving container of one release."""
    return f"tfs-{model}-{release_id}"


def proxy_name(model: str) -> str:
    """The per-host proxy container of a model."""
    return f"tfs-proxy-{model}"


def other_slot(slot: str) -> str:
    """The slot that is not ``slot``."""
    return SLOTS[1] if slot == SLOTS[0] else SLOTS[0]
