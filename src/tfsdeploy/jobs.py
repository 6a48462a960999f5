"""The data a run's operations read: the run's fleet-wide context, and each host's job.

``RunContext`` holds only what is the same on every host (model, version, release id, who,
clock, golden requests). Everything that can differ per host lives in its ``HostJob``: the
host's rendered files and GPU plan, its image, its facts, the decisions taken from them (the
free slot, the release it replaces) and what the run has done there so far.
"""

from __future__ import annotations

import hashlib
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from tfsdeploy.catalog import Model
from tfsdeploy.commands.containers import GpuRequest, parse_gpus
from tfsdeploy.dockerapi import ContainerFact
from tfsdeploy.errors import HostUnreachable
from tfsdeploy.facts import HostFacts
from tfsdeploy.gates import Clock
from tfsdeploy.golden import GoldenExample
from tfsdeploy.inventory import ResolvedHost
from tfsdeploy.layout import HostPaths, Ports, container_name, host_paths, model_ports
from tfsdeploy.records import (
    GateRecord,
    InstanceRecord,
    ReleaseRecord,
    ReleaseStatus,
    StepRecord,
    now_iso,
)
from tfsdeploy.remote import Connection
from tfsdeploy.render import FLAGS, HostRender

ClientFactory = Callable[[str, int, str], Any]


@dataclass
class RunContext:
    """The fleet-wide facts of one run (the same on every host)."""

    verb: str  # deploy | rollback
    model: Model
    version: int
    release_id: str
    who: str
    clock: Clock
    golden: list[GoldenExample]
    source_dir: str
    archive: Any = None  # operations.stage.VersionArchive, built when first uploaded
    client_factory: ClientFactory | None = None  # tests pass a fake TFServing client
    check: bool = False  # --check: plan only
    reason: str = ""  # "guard": a rollback the SLO guard started
    lock: threading.Lock = field(default_factory=threading.Lock)

    @property
    def rollback(self) -> bool:
        """Returning to a retained release (its record stays as it is)."""
        return self.verb == "rollback"


@dataclass
class HostJob:
    """One host's part of a run: what it runs, what was read of it, what was done."""

    run: RunContext
    host: ResolvedHost
    conn: Connection
    render: HostRender
    image: str
    facts: HostFacts = field(default_factory=lambda: HostFacts(host=""))
    new_slot: str = "blue"
    old: ContainerFact | None = None
    unchanged: bool = False
    warm: bool = False  # the target container was already running and loaded
    started: bool = False  # the run created the new container (restore removes it)
    resumed: bool = False  # the run started a retained, stopped container (restore stops it)
    switched: bool = False  # traffic moved to the new slot (restore moves it back)
    recorded: bool = False  # `current` points at the new release
    uploaded: bool = False  # the release's directory and record exist on the host
    took_traffic: bool = False  # the new release served (restore makes it "reverted")
    touched: bool = False  # a container or the proxy was changed (no longer "nothing changed")
    unreachable: HostUnreachable | None = None  # the facts could not be read
    gates: list[GateRecord] = field(default_factory=list)
    steps: list[StepRecord] = field(default_factory=list)
    previous_record: ReleaseRecord | None = None

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
        """The new release's container (instance 0)."""
        return container_name(self.run.model.name, self.run.release_id)

    @property
    def gpus(self) -> GpuRequest | None:
        """Docker's GPU request for the host's serving container."""
        return parse_gpus(self.host.vars.docker_gpus)

    @property
    def target_running(self) -> bool:
        """The release being brought in already runs here (a rollback within the window)."""
        return any(c.running for c in self.facts.of_release(self.run.release_id))

    def flag_lines(self) -> list[str]:
        """The server flags of the release, without comments."""
        return [line.strip() for line in self.render.file(FLAGS).text.splitlines()
                if line.strip().startswith("--")]

    def file_hashes(self) -> dict[str, str]:
        """sha256 of each rendered file."""
        return {f.name: hashlib.sha256(f.text.encode()).hexdigest() for f in self.render.files}

    def release_record(self, status: ReleaseStatus) -> ReleaseRecord:
        """The release's record on this host, as it stands now."""
        gpu = self.render.gpu
        return ReleaseRecord(
            id=self.run.release_id, model=self.run.model.name, version=self.run.version,
            image=self.image, slot=self.new_slot, status=status, container=self.container,
            flags=tuple(self.flag_lines()), files=self.file_hashes(),
            gpu_fraction=gpu.fraction if gpu else None,
            instances=(InstanceRecord(index=0, slot=self.new_slot, container=self.container,
                                      gpu_fraction=gpu.fraction if gpu else None),),
            previous=self.old.release if self.old else None, deployed_by=self.run.who,
            updated_at=now_iso(), gates=tuple(self.gates), steps=tuple(self.steps),
            restored_by=self.run.reason if self.run.rollback else "")


Planner = Callable[[dict[str, HostFacts | HostUnreachable]], tuple[RunContext, list[HostJob]]]
"""A verb's planner: every selected host's facts (or why they could not be read) -> the
run's context and one job per host."""
