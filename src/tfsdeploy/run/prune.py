"""`fab prune`: free the hosts' disk of what no retained release needs, under the model's
lock; `--check` lists what would go. Its summary says what went on each host and how much
disk that freed (as the steps measured it: the version directories before their removal, the
images as Docker reports them)."""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

from tfsdeploy.core.target import Target
from tfsdeploy.hosts.ssh import ConnectionFactory, SshConnection
from tfsdeploy.run import engine, plans
from tfsdeploy.run.after import NO_EPILOGUE, Epilogue
from tfsdeploy.run.deploy import host_plan
from tfsdeploy.run.engine import HostOutcome, Reporter, RunResult


def prune(target: Target, *, playbook: str | None = None, lock_wait: float = 0.0,
          reporter: Reporter, connect: ConnectionFactory = SshConnection,
        epilogue: Epilogue = NO_EPILOGUE) -> RunResult:
    """Prune every selected host."""
    plan = plans.prune_plan(target, playbook=playbook, lock_wait=lock_wait)
    return engine.run(plan, reporter=reporter, connect=connect,
                      epilogue=replace(epilogue, summarize=summarize))


def prune_check(target: Target, *, playbook: str | None = None,
                connect: ConnectionFactory = SshConnection) -> list[dict[str, Any]]:
    """What a prune would remove on each host; touches nothing."""
    _, planned, jobs = engine.check(plans.prune_plan(target, playbook=playbook),
                                    connect=connect)
    return [host_plan(job, planned[job.name], diff=False) for job in jobs]


# what the prune steps report (operations/prune.py, operations/finalize.py, executor.py)
_RELEASES = re.compile(r"pruned (\d+) old release")
_VERSIONS = re.compile(r"\((\d+) bytes\) in version\(s\) ([\d, ]+)")
_IMAGE = re.compile(r"(\S+): [\d.]+ MiB \((\d+) bytes\) freed")
_LEFTOVERS = re.compile(r"removed (\d+) left by killed stages")


def human_size(size: int) -> str:
    """``512 bytes``, ``9.6 KiB``, ``2.0 MiB``, ``1.2 GiB``."""
    if size < 1024:
        return f"{size} bytes"
    for shift, unit in ((30, "GiB"), (20, "MiB"), (10, "KiB")):
        if size >= 1 << shift:
            return f"{size / (1 << shift):.1f} {unit}"
    return f"{size} bytes"  # unreachable: 1 KiB and more has a unit


@dataclass(frozen=True)
class Pruned:
    """What prune removed on one host, and the disk that freed (bytes)."""

    releases: int = 0
    versions: tuple[int, ...] = ()
    images: tuple[str, ...] = ()
    freed_bytes: int = 0
    leftovers: int = 0  # partial copies, sums and extract containers of killed stages

    @property
    def removed_any(self) -> bool:
        """Whether anything was removed."""
        return bool(self.releases or self.versions or self.images or self.leftovers)

    def describe(self) -> str:
        """``2 release(s), version(s) 1, 2, 1 image(s)`` (``nothing`` when clean)."""
        parts = [f"{self.releases} release(s)"] if self.releases else []
        if self.versions:
            parts.append(f"version(s) {', '.join(map(str, self.versions))}")
        if self.images:
            parts.append(f"{len(self.images)} image(s)")
        if self.leftovers:
            parts.append(f"{self.leftovers} left by killed stages")
        return ", ".join(parts) or "nothing"

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready form."""
        return {"releases": self.releases, "versions": list(self.versions),
                "images": list(self.images), "freed_bytes": self.freed_bytes,
                "leftovers": self.leftovers}


def pruned(steps: Sequence[dict[str, Any]]) -> Pruned:
    """What a host's prune steps removed, read from the steps that succeeded (pure)."""
    found: dict[str, Any] = {"releases": 0, "versions": (), "images": (), "freed_bytes": 0,
                             "leftovers": 0}
    for step in steps:
        detail = str(step.get("detail", ""))
        if not step.get("ok") or not str(step.get("step", "")).startswith("prune_"):
            continue
        if (releases := _RELEASES.search(detail)) is not None:
            found["releases"] += int(releases[1])
        if (versions := _VERSIONS.search(detail)) is not None:
            found["versions"] += tuple(int(v) for v in re.findall(r"\d+", versions[2]))
            found["freed_bytes"] += int(versions[1])
        if (left := _LEFTOVERS.search(detail)) is not None:
            found["leftovers"] += int(left[1])
        for image, size in _IMAGE.findall(detail):
            found["images"] += (image,)
            found["freed_bytes"] += int(size)
    return Pruned(**found)


def summarize(result: RunResult) -> RunResult:
    """The prune's result for people: each host ``pruned`` (or ``clean``: nothing to remove)
    instead of ``rolled``, and a message that says what was freed, not what serves."""
    freed = 0
    for outcome in result.hosts.values():
        done = pruned(outcome.steps)
        freed += done.freed_bytes
        if outcome.status == "rolled":
            outcome.status = "pruned" if done.removed_any else "clean"
    hosts = [n for n, o in result.hosts.items() if o.status in ("pruned", "clean")]
    summary = f"{human_size(freed)} freed on {len(hosts)} host(s)"
    result.message = summary if not result.message or result.exit_code == 0 \
        else f"{result.message}; {summary}"
    return result


def summary_rows(result: RunResult) -> list[tuple[str, ...]]:
    """Per host: its result, what was removed, the disk freed, the error."""
    return [_row(name, outcome) for name, outcome in result.hosts.items()]


def _row(name: str, outcome: HostOutcome) -> tuple[str, ...]:
    done = pruned(outcome.steps)
    return (name, outcome.status, done.describe(), human_size(done.freed_bytes),
            (outcome.error.splitlines() or [""])[0][:80])


def summary_data(result: RunResult) -> dict[str, Any]:
    """What the JSON result adds for a prune: per host what went, and the total freed."""
    per_host = {name: pruned(o.steps) for name, o in result.hosts.items()}
    return {"pruned": {name: p.as_dict() for name, p in per_host.items()},
            "freed_bytes": sum(p.freed_bytes for p in per_host.values())}
