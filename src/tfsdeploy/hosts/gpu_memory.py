"""What a container's processes really hold on the host's GPUs: nvidia-smi run on the host
(host pids), each process's ancestors from /proc, and the container's main process from the
Engine (``State.Pid``); the pure judgement is ``core.gpu.holding``."""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from tfsdeploy.core.gpu.holding import Ancestry, held_by, parse_ancestry, reported
from tfsdeploy.core.gpu.smi import GpuApp, GpuCard, parse_apps, parse_gpus
from tfsdeploy.hosts.commands.gpu import read_gpu_apps
from tfsdeploy.hosts.facts import HostFacts, parse_sections
from tfsdeploy.hosts.ssh import Connection


@dataclass(frozen=True)
class GpuReading:
    """One read of a host's GPUs: the cards, the compute processes, their ancestors."""

    cards: tuple[GpuCard, ...] = ()
    apps: tuple[GpuApp, ...] = ()
    ancestry: Ancestry = field(default_factory=dict)

    def held(self, pid: int) -> dict[int, int]:
        """GPU index -> MiB held by the processes at and below host pid ``pid``."""
        return held_by(pid, self.apps, self.ancestry, self.cards)

    def reported(self, pid: int) -> bool:
        """Whether nvidia-smi gave a figure for each of those processes."""
        return reported(pid, self.apps, self.ancestry)


def parse_reading(sections: dict[str, list[tuple[str, str]]]) -> GpuReading:
    """The GPU sections of an answer (``commands.gpu``)."""
    def body(name: str) -> str:
        found = sections.get(name)
        return found[0][1] if found else ""

    return GpuReading(cards=parse_gpus(body("gpus")), apps=parse_apps(body("gpuapps")),
                      ancestry=parse_ancestry(body("gpuancestry")))


def read(conn: Connection, cards: tuple[GpuCard, ...]) -> GpuReading:
    """Read what the host's GPUs hold now, in one command: every process and its ancestors;
    ``cards`` are the GPUs as already read (with the facts: their indexes and UUIDs do not
    change)."""
    result = conn.run(read_gpu_apps(), timeout=30)
    sections = parse_sections(result.stdout)
    if not result.ok or "end" not in sections:
        raise RuntimeError(f"{conn.host.name}: reading the GPUs failed: {result.tail()}")
    reading = parse_reading(sections)
    return GpuReading(cards, reading.apps, reading.ancestry)


def with_holdings(conn: Connection, facts: HostFacts) -> HostFacts:
    """The facts with what every process holds on the host's GPUs now, and the host pid of
    each of the model's running servers (for `fab status`); unchanged on a host without GPU."""
    if not facts.gpus:
        return facts
    reading = read(conn, facts.gpus)
    truth = replace(facts.gpu_truth, apps=reading.apps, ancestry=dict(reading.ancestry))
    pids = dict(truth.pids)
    for container in (c for c in facts.servers if c.running and c.name not in pids):
        pid = main_pid(conn, container.name)
        if pid > 0:
            pids[container.name] = pid
    return replace(facts, gpu_truth=replace(truth, pids=pids))


def main_pid(conn: Connection, container: str) -> int:
    """The host pid of a container's main process (0: it does not run)."""
    state = conn.docker.state(container)
    return state.pid if state is not None and state.status == "running" else 0
