"""A model's facts on one host, read once per run: containers, the proxy, release records,
``current``, the lock, staged versions, disk, GPUs, ports, tools.

Deploy, rollback, status, history, drift, ``--check``, prune and lock all read a host through
``gather`` and decide from the ``HostFacts`` it returns. The proxy is the truth of what serves:
``serving`` asks it first and falls back to the recorded ``current`` only when the proxy does
not answer (a killed run may have switched traffic without recording it).
"""

from __future__ import annotations

import re
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace

from tfsdeploy.core.errors import ConfigError, Problem
from tfsdeploy.core.gpu.holding import held_by, parse_ancestry
from tfsdeploy.core.gpu.records import (
    OverheadRecord,
    WindowReservation,
    live_reservations,
    parse_overhead,
)
from tfsdeploy.core.gpu.smi import GpuApp, GpuCard, parse_apps, parse_gpus
from tfsdeploy.core.gpu.window import Earlier
from tfsdeploy.core.inventory.layout import HostPaths, is_release_id, parse_server_name
from tfsdeploy.core.render.files import FILE_NAMES
from tfsdeploy.core.render.host_proxy import ServerState, parse_binds, parse_stat
from tfsdeploy.core.rollout.records import (
    BrokenRecord,
    LockRecord,
    ReleaseRecord,
    parse_lock,
    parse_release,
)
from tfsdeploy.hosts import proxyadmin
from tfsdeploy.hosts.commands.facts import MARK, read_facts
from tfsdeploy.hosts.commands.files import read_files
from tfsdeploy.hosts.dockerapi import ContainerFact, ScratchFact
from tfsdeploy.hosts.ssh import Connection

GpuFact = GpuCard
"""One GPU as the host's nvidia-smi reports it (index, total, used, free, reserved, uuid)."""


@dataclass(frozen=True)
class GpuTruth:
    """What a host's GPUs hold, host-wide (every model's processes), read with its facts: the
    live window reservations in the host's order and what processes were measured to hold
    beside their pools (per card and model); each compute process's holding (host pids) and
    its ancestors only when there are reservations (a deploy judges them) or when `fab status`
    asked for them (``hosts.gpu_memory.with_holdings``)."""

    apps: tuple[GpuApp, ...] = ()
    ancestry: dict[int, tuple[int, ...]] = field(default_factory=dict)
    reservations: tuple[WindowReservation, ...] = ()
    overhead: tuple[OverheadRecord, ...] = ()
    # container -> its main process's host pid (docker inspect's State.Pid): the live
    # reservations' containers (read with the facts when there are reservations), the model's
    # running servers (read by `fab status`: hosts.gpu_memory.with_holdings)
    pids: dict[str, int] = field(default_factory=dict)


@dataclass(frozen=True)
class ProxyFact:
    """The model's proxy on the host."""

    running: bool
    servers: tuple[ServerState, ...] = ()
    answered: bool = False  # the admin socket answered `show stat`
    # the running worker's listening ports per frontend (its listener rows; empty when it
    # reports none): what it binds, whatever its haproxy.cfg on disk says now
    binds: tuple[tuple[str, frozenset[int]], ...] = ()
    # the digest of the configuration the running worker was started or reloaded on, as
    # recorded once it answered ("" when none is: an older toolkit's proxy, or a run killed
    # before the record); host_proxy.shape_digest
    loaded: str = ""

    def serving_slot(self, instance: int = 0) -> str | None:
        """The one slot of ``instance`` that takes new gRPC requests (None: none or both)."""
        ready = [s.slot for s in self.servers
                 if s.backend == "grpc" and s.instance == instance and s.takes_new_requests]
        return ready[0] if len(ready) == 1 else None

    def in_flight(self, slot: str, instance: int = 0) -> int:
        """Requests in flight on one instance's slot (both backends)."""
        return sum(s.sessions for s in self.servers if s.slot == slot and s.instance == instance)

    def down_slot(self, instance: int = 0) -> str | None:
        """The slot of ``instance`` the proxy has in rotation (admin state ready) while its
        health check fails: the instance should serve and does not (its server died, its GPU
        is gone, it restarts); None when it serves or has no slot in rotation."""
        ready = [s for s in self.servers if s.backend == "grpc" and s.instance == instance
                 and s.ready and s.weight > 0]
        if not ready or any(not s.down for s in ready):
            return None
        return ready[0].slot

    def weights(self, instance: int = 0) -> dict[str, int]:
        """Slot -> gRPC weight of one instance (ready servers only)."""
        return {s.slot: s.weight for s in self.servers
                if s.backend == "grpc" and s.instance == instance and s.takes_new_requests}


@dataclass(frozen=True)
class HostFacts:
    """Everything read of one host for one model, typed."""

    host: str
    containers: tuple[ContainerFact, ...] = ()
    proxy: ProxyFact = field(default_factory=lambda: ProxyFact(running=False))
    releases: tuple[ReleaseRecord, ...] = ()
    broken: tuple[BrokenRecord, ...] = ()
    current: str | None = None  # the release the `current` link names
    live_files: dict[str, str] = field(default_factory=dict)  # current's files -> sha256
    proxy_config: str = ""  # the proxy's haproxy.cfg as the host holds it ('' when none)
    lock: LockRecord | None = None
    lock_present: bool = False  # a lock directory exists (its record may be unreadable)
    lock_digest: str = "none"  # sha256 of the lock record's bytes ("none": no record file)
    tune_lock: LockRecord | None = None  # who holds `fab tune`'s lock of the model here
    scratch: tuple[ScratchFact, ...] = ()  # `fab tune`'s scratch instances, every model's
    versions: dict[int, str] = field(default_factory=dict)  # staged version -> digest or ""
    # staged version -> the boot id of the kernel it was staged (or last verified) under
    version_boots: dict[int, str] = field(default_factory=dict)
    boot_id: str = ""  # the host kernel's boot id now
    # (instance, slot) of the servers the proxy's haproxy.cfg enables: what a restarted proxy
    # would serve, whatever its runtime state now
    configured_slots: frozenset[tuple[int, str]] = frozenset()
    disk_free_mib: int | None = None
    gpus: tuple[GpuFact, ...] = ()
    listening: frozenset[int] = frozenset()
    tools: frozenset[str] = frozenset()
    images: dict[str, bool] = field(default_factory=dict)
    docker_version: str = ""
    seconds: float = 0.0  # how long reading them took
    gpu_truth: GpuTruth = field(default_factory=lambda: GpuTruth())  # every model's processes

    @property
    def holds_model(self) -> bool:
        """Whether the host holds anything of the model: containers, its proxy, release
        records, staged versions, a ``current`` link."""
        return bool(self.containers or self.releases or self.broken or self.versions
                    or self.current)

    @property
    def servers(self) -> tuple[ContainerFact, ...]:
        """The serving containers (not the proxy)."""
        return tuple(c for c in self.containers if c.role == "server")

    def in_slot(self, slot: str, instance: int = 0) -> list[ContainerFact]:
        """Serving containers of one instance's slot."""
        return [c for c in self.servers if c.slot == slot and c.instance == instance]

    def of_release(self, release_id: str) -> list[ContainerFact]:
        """Serving containers of one release."""
        return [c for c in self.servers if c.release == release_id]

    def record(self, release_id: str | None) -> ReleaseRecord | None:
        """The record of one release, if the host keeps it."""
        return next((r for r in self.releases if r.id == release_id), None)

    @property
    def proxy_container(self) -> ContainerFact | None:
        """The model's proxy container."""
        return next((c for c in self.containers if c.role == "proxy"), None)

    def taking_requests(self, instance: int = 0) -> list[ContainerFact]:
        """The running containers of ``instance`` whose slots take requests: one, or two
        while a canary shares the traffic between them (as the proxy says)."""
        ready = {s.slot for s in self.proxy.servers
                 if s.backend == "grpc" and s.instance == instance and s.takes_new_requests}
        return [c for c in self.servers
                if c.instance == instance and c.running and c.slot in ready]

    def serving(self, instance: int = 0) -> ContainerFact | None:
        """The container that takes ``instance``'s traffic: the proxy's serving slot, or, when
        the proxy does not answer, the running container of the recorded ``current``."""
        if self.proxy.running and self.proxy.answered:
            slot = self.proxy.serving_slot(instance)
            live = [c for c in self.in_slot(slot, instance) if c.running] if slot else []
            return live[-1] if live else None
        return next((c for c in self.servers if c.release == self.current
                     and c.instance == instance and c.running), None)

    def down(self, instance: int = 0) -> ContainerFact | None:
        """The container that should serve ``instance`` and does not: in the slot the proxy
        has in rotation while its health check fails (or, when the proxy does not answer, the
        recorded ``current`` release's container when it is not running). None when the
        instance serves, or nothing of it is left to point at."""
        if self.proxy.running and self.proxy.answered:
            slot = self.proxy.down_slot(instance)
            here = self.in_slot(slot, instance) if slot else []
            return (sorted(here, key=lambda c: (c.running, c.release))[-1] if here else None)
        if self.serving(instance) is not None:
            return None
        return next((c for c in self.servers if c.release == self.current
                     and c.instance == instance), None)


    def gpu_held(self, container: str) -> dict[int, int] | None:
        """GPU index -> MiB the container's processes hold (nvidia-smi on the host: pool and
        what they hold beside it); None when its main pid is not known (it does not run)."""
        pid = self.gpu_truth.pids.get(container, 0)
        if pid <= 0:
            return None
        return held_by(pid, self.gpu_truth.apps, self.gpu_truth.ancestry, self.gpus)

    def gpu_earlier(self) -> tuple[Earlier, ...]:
        """The live window reservations, each with what its containers already hold."""
        found = []
        for r in self.gpu_truth.reservations:
            held: dict[int, int] = {}
            for container in r.containers:
                for gpu, mib in (self.gpu_held(container) or {}).items():
                    held[gpu] = held.get(gpu, 0) + mib
            found.append(Earlier(r, held))
        return tuple(found)

    @property
    def serving_release(self) -> str | None:
        """The release serving instance 0 (the host's live release)."""
        live = self.serving(0)
        return live.release if live else None


DIGITS = re.compile(r"[0-9]{1,18}")  # str.isdigit() also takes "²", which int() refuses
SHA256 = re.compile(r"[0-9a-f]{64}")
# /proc/sys/kernel/random/boot_id: a random UUID the kernel draws at each boot
BOOT_ID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")


def parse_sections(text: str) -> dict[str, list[tuple[str, str]]]:
    """The facts command's output -> section name -> [(argument, body)]."""
    sections: dict[str, list[tuple[str, str]]] = {}
    name, argument = "", ""
    body: list[str] = []
    for line in text.splitlines():
        if line.startswith(MARK):
            if name:
                sections.setdefault(name, []).append((argument, "\n".join(body).strip()))
            name, _, argument = line[len(MARK):].partition(" ")
            body = []
        else:
            body.append(line)
    if name:
        sections.setdefault(name, []).append((argument, "\n".join(body).strip()))
    return sections


def _body(sections: dict[str, list[tuple[str, str]]], name: str) -> str:
    found = sections.get(name)
    return found[0][1] if found else ""


def parse_facts(host: str, text: str, containers: Sequence[ContainerFact], *,
                images: dict[str, bool] | None = None, docker_version: str = "",
                scratch: Sequence[ScratchFact] = ()) -> HostFacts:
    """Facts from the facts command's output and the Engine's container list (pure).

    Every record is parsed on its own: a truncated or edited one is reported in ``broken``
    and never hides the others. Release ids and the ``current`` link are validated.
    """
    sections = parse_sections(text)
    if "end" not in sections:
        raise ValueError(f"{host}: the facts command's output is incomplete")
    releases, broken = [], []
    for path, body in sections.get("record", []):
        parsed = parse_release(body, path)
        if isinstance(parsed, ReleaseRecord) and path.endswith(f"/{parsed.id}/manifest.json"):
            releases.append(parsed)
        else:
            broken.append(parsed if isinstance(parsed, BrokenRecord) else BrokenRecord(
                path=path, error=f"records release {parsed.id}, which is not its directory"))
    link = _body(sections, "current").rsplit("/", 1)[-1]
    staged = _versions(_body(sections, "versions"))
    lock_text = _body(sections, "lock")
    tune_text = _body(sections, "tunelock")
    return HostFacts(
        host=host, containers=tuple(c for c in containers
                                    if c.role == "proxy" or is_release_id(c.release)),
        proxy=_proxy(containers, _body(sections, "proxy"), _body(sections, "proxyloaded")),
        releases=tuple(sorted(releases, key=lambda r: r.id)), broken=tuple(broken),
        current=link if is_release_id(link) else None,
        live_files=_sums(_body(sections, "live")),
        proxy_config=_body(sections, "proxycfg"),
        lock=parse_lock(lock_text) if lock_text else None,
        lock_digest=_lock_digest(sections),
        lock_present="lockdir" in sections,
        tune_lock=parse_lock(tune_text) if tune_text else None, scratch=tuple(scratch),
        versions={v: digest for v, (digest, _) in staged.items()},
        version_boots={v: boot for v, (_, boot) in staged.items() if boot},
        boot_id=_boot(_body(sections, "boot")),
        configured_slots=_configured(_body(sections, "proxycfg")),
        disk_free_mib=_disk(_body(sections, "disk")), gpus=_gpus(_body(sections, "gpus")),
        listening=_listening(_body(sections, "listen")),
        tools=frozenset(_body(sections, "tools").split()), images=dict(images or {}),
        docker_version=docker_version, gpu_truth=gpu_truth(sections))


def _proxy(containers: Sequence[ContainerFact], stat: str, loaded: str) -> ProxyFact:
    proxy = next((c for c in containers if c.role == "proxy"), None)
    servers = parse_stat(stat) if stat else ()
    binds = tuple(sorted(parse_binds(stat).items())) if stat else ()
    digest = loaded.strip()
    return ProxyFact(running=bool(proxy and proxy.running), servers=servers,
                     answered=bool(servers), binds=binds,
                     loaded=digest if re.fullmatch(r"[0-9a-f]{64}", digest) else "")


def _lock_digest(sections: dict[str, list[tuple[str, str]]]) -> str:
    found = _body(sections, "lockdigest").split()
    return found[0] if found and len(found[0]) == 64 else "none"


def _sums(text: str) -> dict[str, str]:
    found = {}
    for line in text.splitlines():
        digest, _, name = line.partition("  ")
        if len(digest) == 64 and name:
            found[name.strip()] = digest
    return found


def _versions(text: str) -> dict[int, tuple[str, str]]:
    """``<version> [<digest> [<boot id>]]`` lines -> version -> (digest, boot id)."""
    found = {}
    for line in text.splitlines():
        number, *recorded = line.split() or [""]
        if DIGITS.fullmatch(number) and int(number) > 0:
            digest = recorded[0] if recorded and SHA256.fullmatch(recorded[0]) else ""
            boot = recorded[1] if len(recorded) > 1 and BOOT_ID.fullmatch(recorded[1]) else ""
            found[int(number)] = (digest, boot)
    return found


def _boot(text: str) -> str:
    found = text.strip()
    return found if BOOT_ID.fullmatch(found) else ""


def _configured(text: str) -> frozenset[tuple[int, str]]:
    """The servers haproxy.cfg's ``server`` lines enable (``server i0-blue 127.0.0.1:8510 ...``,
    without ``disabled``)."""
    found = set()
    for line in text.splitlines():
        words = line.split()
        parsed = parse_server_name(words[1]) if len(words) > 1 and words[0] == "server" else None
        if parsed is not None and "disabled" not in words:
            found.add(parsed)
    return frozenset(found)


def _disk(text: str) -> int | None:
    fields = text.split()
    return int(fields[3]) if len(fields) >= 4 and DIGITS.fullmatch(fields[3]) else None


def _gpus(text: str) -> tuple[GpuFact, ...]:
    return parse_gpus(text)


def gpu_truth(sections: dict[str, list[tuple[str, str]]]) -> GpuTruth:
    """The GPU sections of a facts (or reservation) answer."""
    locks = dict(sections.get("gpulock", []))
    return GpuTruth(
        apps=parse_apps(_body(sections, "gpuapps")),
        ancestry=parse_ancestry(_body(sections, "gpuancestry")),
        reservations=live_reservations([(name, text, locks.get(name, "")) for name, text in
                                        sections.get("gpureservation", [])]),
        overhead=tuple(r for r in (parse_overhead(text) for _, text in
                                   sections.get("gpuoverhead", [])) if r))


def _listening(text: str) -> frozenset[int]:
    ports = set()
    for line in text.splitlines():
        fields = line.split()
        if len(fields) >= 4 and DIGITS.fullmatch(fields[3].rsplit(":", 1)[-1]):
            ports.add(int(fields[3].rsplit(":", 1)[-1]))
    return frozenset(ports)


def gather(conn: Connection, model: str, paths: HostPaths, *,
           images: Sequence[str] = ()) -> HostFacts:
    """Read one host's facts: one command and, while it runs (on a channel of its own), the
    Engine's container lists and ``images`` inspected."""
    started = time.monotonic()
    with ThreadPoolExecutor(max_workers=1) as pool:
        script = pool.submit(conn.run, read_facts(paths), timeout=60)
        docker = conn.docker
        version = docker.version()
        containers = docker.containers(model)
        present = {image: docker.image_present(image) for image in dict.fromkeys(images)}
        scratch = docker.scratch()
        result = script.result()
    if not result.ok:
        raise RuntimeError(f"{conn.host.name}: reading the host's state failed: "
                           f"{result.tail()}")
    facts = parse_facts(conn.host.name, result.stdout, containers, images=present,
                        docker_version=version, scratch=scratch)
    facts = with_gpu_pids(conn, facts)
    return replace(facts, seconds=time.monotonic() - started)


# a container the Engine runs, or restarts under its restart policy: it may serve again
COMING_BACK = frozenset({"running", "restarting"})


def coming_back(facts: HostFacts) -> list[str]:
    """What a reboot or a crash is bringing back (pure): the model's proxy while it restarts
    (or runs without its admin socket answering yet), then each server in rotation whose
    health check fails while its container runs or restarts (its model loading again)."""
    proxy = facts.proxy_container
    if proxy is not None and (proxy.state == "restarting"
                              or (proxy.running and not facts.proxy.answered)):
        return [proxy.name]  # its servers' health is known once it answers
    if not (facts.proxy.running and facts.proxy.answered):
        return [c.name for c in facts.servers
                if c.release == facts.current and c.state == "restarting"]
    found = []
    for index in sorted({s.instance for s in facts.proxy.servers}):
        slot = facts.proxy.down_slot(index)
        if slot and any(c.state in COMING_BACK for c in facts.in_slot(slot, index)):
            found.append(f"i{index}-{slot}")
    return found


def reread_serving(conn: Connection, facts: HostFacts, model: str, paths: HostPaths
                   ) -> HostFacts:
    """``facts`` with what serves read again: the model's containers and its proxy's
    ``show stat`` (no answer: the proxy is not serving)."""
    containers = conn.docker.containers(model)
    try:
        stat = proxyadmin.stat(conn, paths.admin_socket)
    except proxyadmin.ProxyRefused:
        stat = ""
    return replace(facts, containers=tuple(c for c in containers if c.role == "proxy"
                                           or is_release_id(c.release)),
                   proxy=_proxy(containers, stat, facts.proxy.loaded))


def with_gpu_pids(conn: Connection, facts: HostFacts) -> HostFacts:
    """The facts with the host pid of each live reservation's container (what it already
    holds is not still to come): one inspection each, only when there are reservations."""
    truth = facts.gpu_truth
    if not truth.apps:
        return facts
    names = [n for r in truth.reservations for n in r.containers]
    pids = {}
    for name in dict.fromkeys(names):
        state = conn.docker.state(name)
        if state is not None and state.pid > 0:
            pids[name] = state.pid
    return replace(facts, gpu_truth=replace(truth, pids=pids))


def read_release_files(conn: Connection, paths: HostPaths, release_id: str) -> dict[str, str]:
    """The rendered files a host keeps of a retained release."""
    directory = paths.release_dir(release_id)
    result = conn.run(read_files(directory, FILE_NAMES))
    texts = split_files(result.stdout) if result.ok else {}
    missing = [n for n in FILE_NAMES if n not in texts]
    if missing:
        raise ConfigError(Problem(f"release {release_id} on {conn.host.name} lacks "
                                  f"{', '.join(missing)}", fix="pick another release "
                                  "(`fab history`)", host=conn.host.name, file=directory))
    return texts


def split_files(text: str) -> dict[str, str]:
    """``read_files`` output -> file name -> content."""
    return {argument: body + "\n" for argument, body in parse_sections(text).get("file", [])}
