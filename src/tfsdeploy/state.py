"""What is live on a host for one model: containers, the current release, the proxy."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from tfsdeploy import commands
from tfsdeploy.layout import LABEL_PREFIX, HostPaths, proxy_name
from tfsdeploy.remote import Runner


@dataclass(frozen=True)
class Container:
    """A serving container of the model, from its labels."""

    name: str
    release: str
    slot: str
    version: int
    running: bool
    status: str


@dataclass
class HostState:
    """The model's live state on one host."""

    containers: list[Container] = field(default_factory=list)
    current: dict[str, Any] | None = None  # the current release's manifest
    proxy_running: bool = False

    @property
    def serving(self) -> Container | None:
        """The container of the current release, if it runs."""
        if not self.current:
            return None
        return next((c for c in self.containers
                     if c.release == self.current.get("id") and c.running), None)

    def in_slot(self, slot: str) -> list[Container]:
        """Containers that live in ``slot``."""
        return [c for c in self.containers if c.slot == slot]


def parse_containers(ps_output: str) -> list[Container]:
    """`docker ps --format '{{json .}}'` lines -> containers (labels carry our metadata)."""
    found = []
    for line in ps_output.splitlines():
        if not line.strip():
            continue
        row = json.loads(line)
        labels = dict(item.split("=", 1) for item in row.get("Labels", "").split(",")
                      if "=" in item)
        release = labels.get(f"{LABEL_PREFIX}.release")
        if not release:
            continue
        found.append(Container(name=row["Names"], release=release,
                               slot=labels.get(f"{LABEL_PREFIX}.slot", ""),
                               version=int(labels.get(f"{LABEL_PREFIX}.version", "0")),
                               running=row.get("State") == "running",
                               status=row.get("Status", "")))
    return sorted(found, key=lambda c: c.release)


def discover(runner: Runner, model: str, paths: HostPaths) -> HostState:
    """Read the model's containers, current manifest and proxy state (read-only)."""
    listed = runner.run(commands.list_containers(model))
    if not listed.ok:
        raise RuntimeError(f"docker ps failed: {listed.tail()}")
    state = HostState(containers=parse_containers(listed.stdout))
    manifest = runner.run(commands.read_file(f"{paths.current}/manifest.json"))
    if manifest.ok and manifest.stdout.strip():
        state.current = json.loads(manifest.stdout)
    proxy = runner.run(commands.inspect_state(proxy_name(model)))
    state.proxy_running = proxy.ok and proxy.stdout.startswith("running")
    return state
