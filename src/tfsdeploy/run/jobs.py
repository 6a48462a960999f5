"""The data a run's operations read: the run's verb, its fleet-wide context, each host's job,
and the session the engine lends a planner.

``RunContext`` holds only what is the same on every host (model, version, release id, who,
clock, golden requests). Everything that can differ per host lives in its ``HostJob``: the
host's rendered files and GPU plan, its image, its facts, the decisions taken from them (the
free slot, the release it replaces) and what the run has done there so far.
"""

from __future__ import annotations

import hashlib
import threading
from collections.abc import Callable, Mapping
from concurrent.futures import Future
from dataclasses import dataclass, field
from enum import StrEnum
from typing import TYPE_CHECKING, Any

from tfsdeploy.core.errors import HostUnreachable
from tfsdeploy.core.gpu.records import OverheadRecord
from tfsdeploy.core.inventory.canary_policy import CanaryPolicy
from tfsdeploy.core.inventory.catalog import Model
from tfsdeploy.core.inventory.fleet import ResolvedHost
from tfsdeploy.core.inventory.layout import (
    HostPaths,
    Ports,
    container_name,
    host_paths,
    model_ports,
)
from tfsdeploy.core.render.files import FLAGS, HostRender
from tfsdeploy.core.render.host_proxy import PortMove
from tfsdeploy.core.rollout.gate_diagnosis import Diagnosis
from tfsdeploy.core.rollout.gates import Clock
from tfsdeploy.core.rollout.records import (
    GateRecord,
    InstanceRecord,
    ReleaseRecord,
    ReleaseStatus,
    StepRecord,
    now_iso,
)
from tfsdeploy.core.tfserving.golden import GoldenExample
from tfsdeploy.hosts.commands.containers import GpuRequest, parse_gpus
from tfsdeploy.hosts.commands.files import append_lines
from tfsdeploy.hosts.dockerapi import ContainerFact
from tfsdeploy.hosts.facts import HostFacts, read_release_files
from tfsdeploy.hosts.ssh import Connection, ConnectionFactory

if TYPE_CHECKING:
    # a pull's progress as the hosts report it (what a reporter's ``progress`` is given)
    from tfsdeploy.hosts.dockerssh import PullProgress as PullProgress

ClientFactory = Callable[[str, int, str], Any]
FRACTION_FLAG = "--per_process_gpu_memory_fraction"
DEFAULT_MAX_PULLS = 8  # see benchmarks/model_transfer.py for the measurement


class Verb(StrEnum):
    """What a run does: the command that asked for it (a promote's context says ``deploy``:
    it rolls the paused release on as a deploy does)."""

    DEPLOY = "deploy"
    ROLLBACK = "rollback"
    PROMOTE = "promote"
    ABORT = "abort"
    PRUNE = "prune"
    STAGE = "stage"
    RETIRE = "retire"


@dataclass
class RunContext:
    """The fleet-wide facts of one run (the same on every host)."""

    verb: Verb
    model: Model
    version: int
    release_id: str
    who: str
    clock: Clock
    golden: list[GoldenExample]
    source_dir: str
    archive: Any = None  # operations.stage.VersionArchive, built when first uploaded
    packed: Any = None  # publish.PackedVersion, the version as an image (model_transfer pull)
    published: dict[str, Any] = field(default_factory=dict)  # model_registry -> Published
    publish_lock: threading.Lock = field(default_factory=threading.Lock)
    # model_transfer pull: at most this many hosts pull at once (--max-pulls)
    pull_slots: threading.BoundedSemaphore = field(
        default_factory=lambda: threading.BoundedSemaphore(DEFAULT_MAX_PULLS))
    client_factory: ClientFactory | None = None  # tests pass a fake TFServing client
    check: bool = False  # --check: plan only
    reason: str = ""  # "guard": a rollback the SLO guard started
    canary: CanaryPolicy | None = None  # weighted steps on the first batch (None: none)
    canary_hosts: frozenset[str] = frozenset()  # the first batch, set when the roll starts
    gateway: GatewayLink | None = None  # the gateway hosts routing the model
    lock: threading.Lock = field(default_factory=threading.Lock)
    lock_token: str = ""  # the fleet lock's token this run holds ("": --check, no lock)

    @property
    def rollback(self) -> bool:
        """Returning to a retained release (its record stays as it is)."""
        return self.verb is Verb.ROLLBACK


@dataclass
class InstanceJob:
    """One TFServing instance's part of a host's run (one per GPU, or one per host)."""

    index: int
    gpus: tuple[int, ...]  # the host GPUs it sees
    fraction: float | None  # its --per_process_gpu_memory_fraction (None: no GPU)
    new_slot: str = "blue"
    old: ContainerFact | None = None  # what serves this instance now
    # what should serve it and does not (its server fails the proxy's health check: died,
    # lost its GPU, restarts): replaced by the run, never counted as the release that serves
    down: ContainerFact | None = None
    warm: bool = False  # the target container was already running and loaded
    started: bool = False  # the run created the new container (restore removes it)
    resumed: bool = False  # the run started a retained, stopped container (restore stops it)
    switched: bool = False  # traffic moved to the new slot (restore moves it back)
    took_traffic: bool = False  # the new release served (restore makes it "reverted")
    out_of_rotation: bool = False  # "recreate": its old release was taken out of rotation
    weighted: bool = False  # canary: its slots' weights were changed (a switch resets them)
    pid: int = 0  # its new container's main process, host pid, as last inspected (GPU gates)
    # what its new process held beside its pool after warmup, per GPU (release_gpu records it)
    overhead: list[OverheadRecord] = field(default_factory=list)

    @property
    def touched(self) -> bool:
        """Whether the run changed this instance (a rescue has something to undo)."""
        return self.started or self.resumed or self.switched or self.out_of_rotation


def _delegated(name: str) -> property:
    """A HostJob attribute that is the current instance's."""
    return property(lambda job: getattr(job.instance, name),
                    lambda job, value: setattr(job.instance, name, value),
                    doc=f"The current instance's ``{name}``.")


class AuditTrail:
    """A host's audit appends in a run's steps, made one at a time and in order, each while
    the next step runs (an append is a round trip and an fsync on the host: off the roll's
    path). A new append, and the end of a host's task list, first wait for the one before;
    an append that failed (the connection lost) is raised there."""

    def __init__(self) -> None:
        self._pending: Future[None] | None = None

    def later(self, conn: Connection, path: str, lines: list[str]) -> None:
        """Append ``lines`` to ``path`` on the host, once the previous append ended."""
        self.wait()
        done: Future[None] = Future()

        def append() -> None:
            try:
                conn.run(append_lines(path, lines))
            except BaseException as error:  # raised to the run by the next wait
                done.set_exception(error)
            else:
                done.set_result(None)

        threading.Thread(target=append, name=f"audit {conn.host.name}", daemon=True).start()
        self._pending = done

    def wait(self) -> None:
        """Until the last append ended; raise what made it fail."""
        pending, self._pending = self._pending, None
        if pending is not None:
            pending.result()


@dataclass
class HostJob:
    """One host's part of a run: what it runs, what was read of it, what was done.

    The roll goes instance by instance: ``instance`` is the one being rolled, and the
    per-instance attributes (``new_slot``, ``old``, ``started``, ...) are its.
    """

    run: RunContext
    host: ResolvedHost
    conn: Connection
    render: HostRender
    image: str
    facts: HostFacts = field(default_factory=lambda: HostFacts(host=""))
    instances: list[InstanceJob] = field(default_factory=list)
    instance: InstanceJob = field(default_factory=lambda: InstanceJob(0, (), None))
    unchanged: bool = False
    recorded: bool = False  # `current` points at the new release
    proxy_started: bool = False  # this run started the model's proxy on the host
    uploaded: bool = False  # the release's directory and record exist on the host
    touched: bool = False  # a container or the proxy was changed (no longer "nothing changed")
    # the current step started, stopped or removed a serving process, or one became AVAILABLE
    # (the engine reads it for the step's event, then clears it)
    processes_changed: bool = False
    unreachable: HostUnreachable | None = None  # the facts could not be read
    gates: list[GateRecord] = field(default_factory=list)
    steps: list[StepRecord] = field(default_factory=list)
    previous_record: ReleaseRecord | None = None
    canary_steps: list[dict[str, Any]] = field(default_factory=list)  # StepResult.as_dict()
    canary_comparison: dict[str, Any] | None = None
    diagnosis: Diagnosis | None = None  # the known failure a gate recognised (cause and fix)
    live_files: dict[str, str] | None = None  # --check --diff: the live release's files
    # instances the proxy serves that the plan no longer has (fewer GPUs, placement "host")
    # -> the slot serving each: they serve until finalize drains and removes them
    retiring: dict[int, str | None] = field(default_factory=dict)
    port_move: PortMove = field(default_factory=PortMove)  # old ports the proxy keeps
    audit: AuditTrail = field(default_factory=AuditTrail)  # the steps' audit appends
    gateway_drained: bool = False  # the gateway hosts route none of the model's requests here
    gpu_reserved: bool = False  # this run took a window reservation on the host's GPUs
    # (instance, slot) of every server the proxy has in rotation while its health check fails
    # (planned instances and retiring ones): out of rotation before any traffic moves
    down_slots: frozenset[tuple[int, str]] = frozenset()
    # GPUs of the inventory the host does not report: their instances are left out
    absent_gpus: tuple[int, ...] = ()
    # a canary host's instances move together up to the end of its canary steps: a failure
    # then restores every instance the run changed, whatever on_failure says
    together: bool = False

    new_slot = _delegated("new_slot")
    old = _delegated("old")
    warm = _delegated("warm")
    started = _delegated("started")
    resumed = _delegated("resumed")
    switched = _delegated("switched")
    took_traffic = _delegated("took_traffic")
    weighted = _delegated("weighted")

    def __post_init__(self) -> None:
        if not self.instances:
            self.instances = [InstanceJob(i.index, i.gpus, i.plan.fraction if i.plan else None)
                              for i in self.render.instances]
        self.instance = self.instances[0]

    def on(self, instance: InstanceJob) -> HostJob:
        """Make ``instance`` the one the next steps act on."""
        self.instance = instance
        return self

    @property
    def canary_host(self) -> bool:
        """Whether this host runs the run's canary steps (the first batch's hosts)."""
        return self.run.canary is not None and self.name in self.run.canary_hosts

    @property
    def last_instance(self) -> bool:
        """Whether the current instance is the host's last to roll."""
        return self.instance is self.instances[-1]

    @property
    def took_any_traffic(self) -> bool:
        """Whether any instance's new release served."""
        return any(i.took_traffic for i in self.instances)

    @property
    def name(self) -> str:
        """The host's name."""
        return self.host.name

    @property
    def model(self) -> Model:
        """The model being rolled."""
        return self.run.model

    @property
    def paths(self) -> HostPaths:
        """Where the model lives on this host."""
        return host_paths(self.host, self.run.model)

    @property
    def ports(self) -> Ports:
        """The model's ports on this host."""
        return model_ports(self.host, self.run.model)

    @property
    def container(self) -> str:
        """The new release's container of the current instance."""
        return container_name(self.run.model.name, self.run.release_id, self.instance.index)

    @property
    def gpus(self) -> GpuRequest | None:
        """Docker's GPU request for the current instance: its own GPUs when the host asks
        for GPUs at all (``docker_gpus``) and the instance has some."""
        request = parse_gpus(self.host.vars.docker_gpus)
        if request is None or not self.instance.gpus:
            return request
        return GpuRequest(device_ids=tuple(str(g) for g in self.instance.gpus))

    @property
    def target_running(self) -> bool:
        """The release being brought in already runs here (a rollback within the window)."""
        return any(c.running for c in self.facts.of_release(self.run.release_id))

    def flag_lines(self, instance: InstanceJob | None = None) -> list[str]:
        """The server flags of the release for an instance (the current one by default: its
        own GPU fraction), without comments."""
        chosen = instance or self.instance
        lines = [line.strip() for line in self.render.file(FLAGS).text.splitlines()
                 if line.strip().startswith("--")]
        if chosen.fraction is None:
            return lines
        return [f"{FRACTION_FLAG}={chosen.fraction:.3f}"
                if line.startswith(FRACTION_FLAG + "=") else line for line in lines]

    def file_hashes(self) -> dict[str, str]:
        """sha256 of each rendered file."""
        return {f.name: hashlib.sha256(f.text.encode()).hexdigest() for f in self.render.files}

    def release_record(self, status: ReleaseStatus) -> ReleaseRecord:
        """The release's record on this host, as it stands now (the first instance's slot,
        container and fraction are the host's; every instance is listed)."""
        first = self.instances[0]
        name = self.run.model.name
        previous = next((i.old.release for i in self.instances if i.old), None)
        return ReleaseRecord(
            id=self.run.release_id, model=name, version=self.run.version,
            image=self.image, slot=first.new_slot, status=status,
            container=container_name(name, self.run.release_id, first.index),
            flags=tuple(self.flag_lines(first)), files=self.file_hashes(),
            gpu_fraction=first.fraction,
            instances=tuple(InstanceRecord(
                index=i.index, slot=i.new_slot, gpus=i.gpus, gpu_fraction=i.fraction,
                container=container_name(name, self.run.release_id, i.index))
                for i in self.instances),
            previous=previous, deployed_by=self.run.who,
            updated_at=now_iso(), gates=tuple(self.gates), steps=tuple(self.steps),
            restored_by=self.run.reason if self.run.rollback else "",
            canary=self.canary_summary(),
            diagnosis=self.diagnosis.as_dict() if self.diagnosis else None,
            stable_ports=(self.ports.grpc, self.ports.rest))

    def canary_summary(self) -> dict[str, Any] | None:
        """The canary's steps and comparison on this host (None: it ran none here)."""
        if not self.canary_steps and self.canary_comparison is None:
            return None
        return {"state": "done", "steps": self.canary_steps,
                "comparison": self.canary_comparison}



Facts = dict[str, HostFacts | HostUnreachable]
"""Every selected host's facts, or why they could not be read."""


@dataclass(frozen=True)
class GatewayLink:
    """The gateway hosts that route the run's model, and a connection to each (opened when
    first used): a host leaving the rotation is drained there first."""

    hosts: tuple[ResolvedHost, ...]
    connections: Mapping[str, Connection]


@dataclass
class Session:
    """What the engine owns for one run and lends its planner: one connection per host, the
    run's clock (cancellable: a Ctrl-C ends its waits) and the factory of TFServing clients."""

    connections: Mapping[str, Connection]
    clock: Clock
    client_factory: ClientFactory | None = None
    gateway: GatewayLink | None = None  # the model's gateway hosts (None: no gateway routes it)
    # opens the connections to hosts outside the model's that a pass reads (an orphan's, a
    # Prometheus host's): kept with the run's, closed with them
    connect: ConnectionFactory | None = None
    opened: dict[str, Connection] = field(default_factory=dict)
    opening: threading.Lock = field(default_factory=threading.Lock)
    # set once the run or look is over or stopped (a signal, its deadline), before its
    # connections close: a read that fails after it failed because of that close
    ended: threading.Event = field(default_factory=threading.Event)

    def connection(self, host: ResolvedHost) -> Connection:
        """The run's connection to ``host``: the run's own, or one opened on first use."""
        if host.name in self.connections:
            return self.connections[host.name]
        with self.opening:
            if host.name not in self.opened:
                if self.connect is None:
                    raise HostUnreachable(f"{host.name}: not among the run's hosts")
                self.opened[host.name] = self.connect(host)
            return self.opened[host.name]

    def release_files(self, host: ResolvedHost, model: Model, release_id: str
                      ) -> dict[str, str]:
        """The rendered files ``host`` keeps of a retained release (read over its
        connection)."""
        return read_release_files(self.connections[host.name], host_paths(host, model),
                                  release_id)


Planner = Callable[[Facts, Session], tuple[RunContext, list[HostJob]]]
"""A verb's planner: every selected host's facts and the run's session -> the run's context
and one job per host. It reads nothing of a host itself; a rollback asks the session for the
files of the release it chose."""
