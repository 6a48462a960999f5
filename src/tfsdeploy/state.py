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
    traffic_slot: str | None = None  # the slot the proxy sends requests to, when it runs

    @property
    def serving(self) -> Container | None:
        """The container that takes traffic.

        The proxy is the truth: a deploy killed between switch and record leaves ``current``
        on the old release while the new one already serves, and the next run must treat the
        serving container as the live one.
        """
        if self.traffic_slot:
            live = [c for c in self.in_slot(self.traffic_slot) if c.running]
            if live:
                return live[-1]
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


def traffic_slot(stat_csv: str) -> str | None:
    """The slot HAProxy's gRPC backend sends new requests to (neither drained nor in maint)."""
    from tfsdeploy.proxy import parse_states

    ready = [server for (backend, server), status in parse_states(stat_csv).items()
             if backend == "grpc" and not status.upper().startswith(("MAINT", "DRAIN"))]
    return ready[0] if len(ready) == 1 else None


def list_containers(runner: Runner, model: str) -> list[Container]:
    """The model's containers on the host, running or not."""
    listed = runner.run(commands.list_containers(model))
    if not listed.ok:
        raise RuntimeError(f"docker ps failed: {listed.tail()}")
    return parse_containers(listed.stdout)


def discover(runner: Runner, model: str, paths: HostPaths, admin_port: int | None = None
             ) -> HostState:
    """Read the model's containers, current manifest and proxy state (read-only)."""
    state = HostState(containers=list_containers(runner, model))
    manifest = runner.run(commands.read_file(f"{paths.current}/manifest.json"))
    if manifest.ok and manifest.stdout.strip():
        state.current = json.loads(manifest.stdout)
    proxy = runner.run(commands.inspect_state(proxy_name(model)))
    state.proxy_running = proxy.ok and proxy.stdout.startswith("running")
    if state.proxy_running and admin_port is not None:
        from tfsdeploy.proxy import ProxyAdmin

        try:
            state.traffic_slot = traffic_slot(ProxyAdmin(runner, admin_port).stat())
        except Exception:  # an unreadable proxy: fall back to the recorded release
            state.traffic_slot = None
    return state


def parse_json_stream(text: str) -> list[dict[str, Any]]:
    """Concatenated JSON objects (one `cat` of many manifests) -> list."""
    decoder = json.JSONDecoder()
    found: list[dict[str, Any]] = []
    position = 0
    while True:
        while position < len(text) and text[position].isspace():
            position += 1
        if position >= len(text):
            return found
        try:
            value, position = decoder.raw_decode(text, position)
        except json.JSONDecodeError:
            return found  # a manifest being written: the rest is unreadable now
        if isinstance(value, dict):
            found.append(value)


def read_releases(runner: Runner, paths: HostPaths) -> list[dict[str, Any]]:
    """Every retained release's manifest on the host, oldest first."""
    script = ('for f in "$1"/*/manifest.json; do [ -f "$f" ] && cat "$f" && echo; done; true')
    result = runner.run(["sh", "-c", script, "sh", paths.releases])
    return sorted(parse_json_stream(result.stdout), key=lambda m: str(m.get("id", "")))


GOOD = frozenset({"serving"})


def common_good_release(histories: dict[str, list[dict[str, Any]]],
                        current: dict[str, str | None]) -> str | None:
    """The newest release that served well on every host, was never rolled back from, and is
    not what every host already runs.

    A release current on only some hosts stays a candidate: re-running a rollback that an
    unreachable host interrupted finishes it instead of refusing.
    """
    sets = [{m["id"] for m in releases if m.get("status") in GOOD}
            for releases in histories.values()]
    if not sets:
        return None
    rolled_back = {m["id"] for releases in histories.values() for m in releases
                   if m.get("status") == "rolled_back"}
    live = [c for c in current.values() if c]
    everywhere = set(live) if len(live) == len(histories) and len(set(live)) == 1 else set()
    candidates = set.intersection(*sets) - everywhere - rolled_back
    return max(candidates) if candidates else None
