"""Deploys and rollbacks of the test model ``hp2`` on fake hosts h1..h4 (10.9.0.1-4; fewer
with ``count``), each with its own data root under the test's tmp_path."""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

from tfsdeploy.core.inventory.layout import HostPaths
from tfsdeploy.core.target import Target, load_target
from tfsdeploy.run.deploy import deploy
from tfsdeploy.run.engine import RunResult
from tfsdeploy.run.rollback import rollback

from .fakes import FakeFleet, FakeHost, FakeSlot, FrozenClock

MODEL = "hp2"
INVENTORY = '''
from tfsdeploy.core.inventory.catalog import Batching, Model, Rollout, Signature, TensorSpec
from tfsdeploy.core.inventory.fleet import Gpu, Host

host_vars = {host_vars!r}
hosts = [Host(f"h{{i}}", f"10.9.0.{{i}}", gpus=[Gpu(g, 16384) for g in range({gpus})],
              vars={{"data_root": f"{hosts}/h{{i}}/r", **host_vars.get(f"h{{i}}", {{}})}})
         for i in range(1, {count} + 1)]
defaults = {{"image": "reg/tfs:2.21.0", "proxy_image": "reg/proxy:2.6"}}
models = [Model(name="hp2", source="{source}", golden="{golden}",
                signature=Signature(inputs={{"x": TensorSpec("DT_FLOAT", (-1, 1))}},
                                    outputs={{"y": TensorSpec("DT_FLOAT", (-1, 1))}}),
                memory_mib=512, latency_slo_ms=60,
                batching=Batching(max_batch_size=8, allowed_batch_sizes=(8,)),
                rollout=Rollout(serial={serial}, on_failure="{on_failure}",
                                max_fail_percentage={max_fail}, min_healthy_s=1,
                                load_timeout_s=30, window_s={window}, keep_releases={keep},
                                deadline_s={deadline}))]
'''


class Recorder:
    """A reporter that keeps every step and note."""

    def __init__(self) -> None:
        self.steps: list[tuple[str, str, str, str]] = []
        self.details: list[str] = []
        self.notes: list[str] = []

    def step(self, host: str, phase: str, task: str, status: str, seconds: float,
             detail: str) -> None:
        self.steps.append((host, phase, task, status))
        self.details.append(detail)

    def note(self, text: str) -> None:
        self.notes.append(text)


def inventory_file(world: dict[str, Any], *, serial: str = '(1, "100%")',
                   on_failure: str = "revert", max_fail: float = 0, window: float = 0,
                   keep: int = 3, host_vars: dict[str, dict[str, Any]] | None = None,
                   count: int = 4, gpus: int = 1, deadline: float | None = None) -> str:
    """The inventory of ``count`` fake hosts (``gpus`` GPUs each: one server per GPU) with
    this rollout policy (``deadline``: its ``deadline_s``)."""
    text = INVENTORY.format(source=world["source"], golden=world["golden"],
                            hosts=world["tmp"], serial=serial, on_failure=on_failure,
                            max_fail=max_fail, window=window, keep=keep,
                            host_vars=host_vars or {}, count=count, gpus=gpus,
                            deadline=deadline)
    path = world["tmp"] / f"inv-{hashlib.sha256(text.encode()).hexdigest()[:12]}.py"
    path.write_text(text)
    return str(path)


def target(world: dict[str, Any], hosts: str | None = None, **inventory: Any) -> Target:
    """The model on the fake fleet (``hosts`` narrows the selection)."""
    return load_target(MODEL, inventory=inventory_file(world, **inventory), hosts=hosts)


def run_deploy(world: dict[str, Any], version: int, recorder: Recorder | None = None, *,
               playbook: str | None = None, **inventory: Any) -> RunResult:
    """``fab deploy --version V`` on the fake fleet."""
    fleet: FakeFleet = world["fleet"]
    return deploy(target(world, **inventory), version=version, playbook=playbook,
                  reporter=recorder or Recorder(), connect=fleet.connect, clock=FrozenClock(),
                  client_factory=FakeSlot)


def run_rollback(world: dict[str, Any], to: str | None = None, recorder: Recorder | None = None,
                 *, hosts: str | None = None, **inventory: Any) -> RunResult:
    """``fab rollback [--to R]`` on the fake fleet."""
    fleet: FakeFleet = world["fleet"]
    return rollback(target(world, hosts=hosts, **inventory), to=to,
                    reporter=recorder or Recorder(), connect=fleet.connect, clock=FrozenClock(),
                    client_factory=FakeSlot)


def paths(host: FakeHost) -> HostPaths:
    """Where hp2 lives on a fake host."""
    return HostPaths(root=str(host.dir / "r"), model=MODEL)


def current(host: FakeHost) -> str:
    """What the host's ``current`` link points at."""
    import os

    return os.readlink(paths(host).current)


def manifest(host: FakeHost, release_id: str) -> Path:
    """A release's record on a fake host."""
    return Path(paths(host).release_dir(release_id), "manifest.json")


def serving(host: FakeHost) -> list[str]:
    """Releases of hp2 running on the host."""
    return host.running(MODEL)
