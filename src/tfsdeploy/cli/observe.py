"""`fab observe` and the targets every run keeps current.

``write_observability`` writes what ``core.observe`` renders (prometheus.yml, a rules file per
model) and the Grafana dashboards (``core.dashboards``, imported here only). ``publish_targets``
reads which serving processes run on a model's hosts and rewrites the model's file_sd file
where the inventory's ``monitoring`` says (beside this machine's inventory and/or on its
Prometheus hosts), so that the scraped series follow the process and carry its release and
version.
"""

from __future__ import annotations

import json
import os
import sys
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from tfsdeploy.core.inventory.catalog import Model
from tfsdeploy.core.inventory.load import Inventory
from tfsdeploy.core.inventory.monitoring import Monitoring
from tfsdeploy.core.observe.prometheus import (
    ServingProcess,
    prometheus_config,
    rule_groups,
    target_groups,
    targets_file,
    to_yaml,
)
from tfsdeploy.core.target import Target
from tfsdeploy.hosts.localfiles import write_durable

LOCAL_TARGETS = "targets"  # beside prometheus.yml when no place is named


def local_targets_dir(inventory: Inventory) -> Path | None:
    """``monitoring.local_targets_dir``, relative to the inventory's directory."""
    place = inventory.monitoring.local_targets_dir
    if place is None:
        return None
    return Path(os.path.dirname(os.path.abspath(inventory.path))) / place


def scraped_targets_dir(inventory: Inventory) -> str:
    """The targets directory as Prometheus reads it: on the monitoring hosts, else this
    machine's local one, else ``targets/`` beside prometheus.yml."""
    if inventory.monitoring.hosts is not None:
        return inventory.monitoring.targets_dir
    local = local_targets_dir(inventory)
    return str(local) if local is not None else LOCAL_TARGETS


def chosen_models(inventory: Inventory, name: str | None) -> list[Model]:
    """The catalog's models, or the one ``--model`` names."""
    if name is None:
        return list(inventory.models.values())
    return [inventory.model(name)]


def write_observability(inventory: Inventory, models: Sequence[Model], out: Path
                        ) -> list[Path]:
    """DIR/prometheus/prometheus.yml, DIR/prometheus/rules/<model>.yml and
    DIR/grafana/{fleet,<model>}.json; returns the paths written."""
    from tfsdeploy.core.observe.dashboards import fleet_dashboard, model_dashboard

    monitoring = inventory.monitoring
    written: list[Path] = []

    def put(path: Path, text: str) -> None:
        write_durable(path, text, mode=0o644)  # Prometheus and Grafana read them
        written.append(path)

    config = prometheus_config(models, monitoring, targets_dir=scraped_targets_dir(inventory))
    put(out / "prometheus" / "prometheus.yml", to_yaml(config))
    local = local_targets_dir(inventory) if monitoring.hosts is None else None
    if monitoring.hosts is None:
        # the targets files exist from the start: Prometheus watches a file_sd file's
        # directory for changes only if it exists when it reads the configuration (else it
        # sees new targets only at each refresh_interval)
        folder = local or out / "prometheus" / LOCAL_TARGETS
        folder.mkdir(parents=True, exist_ok=True)
        for model in models:
            if not (folder / targets_file(model.name)).exists():
                write_durable(folder / targets_file(model.name), "[]\n", mode=0o644)
    for model in models:
        put(out / "prometheus" / "rules" / f"{model.name}.yml",
            to_yaml(rule_groups(model, monitoring)))
        put(out / "grafana" / f"{model.name}.json",
            json.dumps(model_dashboard(model, monitoring), indent=2) + "\n")
    put(out / "grafana" / "fleet.json",
        json.dumps(fleet_dashboard(models, monitoring), indent=2) + "\n")
    return written


# -- the targets -----------------------------------------------------------------------------

def running_processes(target: Target) -> tuple[list[ServingProcess], list[str]]:
    """The model's running server containers on every host of the model, and the hosts that
    could not be read."""
    from tfsdeploy.run import survey

    def look(_t: Any, _h: Any, _c: Any, facts: Any) -> dict[str, Any]:
        return {"processes": [ServingProcess(facts.host, c.instance, c.slot, c.release,
                                             c.version)
                              for c in facts.servers if c.running]}

    rows = survey.each_host(target, look, hosts=target.model_hosts)
    found = [p for r in rows if r["reachable"] for p in r["processes"]]
    return found, [r["host"] for r in rows if not r["reachable"]]


def merged_groups(target: Target, processes: list[ServingProcess], unread: list[str],
                  previous: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The target groups of what runs now; a host that could not be read keeps its groups
    of the previous file (its processes may well still run)."""
    fresh = target_groups(target.model, target.model_hosts, processes)
    kept = [g for g in previous if g.get("labels", {}).get("host") in set(unread)]
    return sorted(fresh + kept, key=lambda g: (g["labels"]["host"], g["labels"]["instance"],
                                               g["labels"]["slot"]))


def _previous(path: Path | None) -> list[dict[str, Any]]:
    if path is None or not path.is_file():
        return []
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return []
    return data if isinstance(data, list) else []


def publish_targets(target: Target, *, local_only: Path | None = None) -> list[str]:
    """Rewrite the model's file_sd file in every place the inventory names (or only in
    ``local_only``); returns where it was written. A monitoring host that cannot be written
    is reported on stderr and the others are still written."""
    inventory = target.inventory
    places = [local_only] if local_only else [local_targets_dir(inventory)]
    local = places[0]
    name = targets_file(target.model.name)
    processes, unread = running_processes(target)
    groups = merged_groups(target, processes, unread,
                           _previous(local / name if local else None))
    text = json.dumps(groups, indent=2) + "\n"
    written = []
    if local is not None:
        write_durable(local / name, text, mode=0o644)
        written.append(str(local / name))
    if local_only is None and inventory.monitoring.hosts is not None:
        written += _upload(inventory, inventory.monitoring, name, text)
    return written


def _upload(inventory: Inventory, monitoring: Monitoring, name: str, text: str) -> list[str]:
    from tfsdeploy.hosts.ssh import SshConnection

    assert monitoring.hosts is not None
    written = []
    final = f"{monitoring.targets_dir}/{name}"
    for host in inventory.match(monitoring.hosts, "monitoring.hosts"):
        try:
            conn = SshConnection(host)
            try:
                conn.run(["mkdir", "-p", monitoring.targets_dir], timeout=30)
                temp = f"{monitoring.targets_dir}/.{name}.tmp"
                conn.put_bytes(text.encode(), temp, mode=0o644)
                conn.run(["mv", "-f", temp, final], timeout=30)  # file_sd reads whole files
            finally:
                conn.close()
            written.append(f"{host.name}:{final}")
        except Exception as error:  # one unreachable Prometheus host never stops the others
            print(f"tfsdeploy: the targets could not be written to {host.name}:{final}: "
                  f"{type(error).__name__}: {error}", file=sys.stderr)
    return written


# the steps after which a host runs other serving processes than before: a new release's
# process loaded (its ports open once its version is AVAILABLE), an old one stopped or removed,
# a retained one started again
CHANGES_PROCESSES = frozenset({"gate_available", "retire_old", "stop_old", "remove_new",
                               "resume_release", "remove_containers"})


class Retargeter:
    """Rewrites the model's targets while a run rolls: after each step that changed which
    processes serve (``CHANGES_PROCESSES``), in a thread of its own so that the roll never
    waits for it; steps that come while it writes are taken together in its next pass.
    ``close`` waits for it and writes the run's final targets, if the run reached a host (a
    run refused before, on its input or its lock, changed nothing and connects to none)."""

    def __init__(self, target: Target) -> None:
        self.target = target
        self._wake = threading.Event()
        self._closed = False
        self._reached = False
        self._thread = threading.Thread(target=self._loop, name="retarget", daemon=True)
        self._thread.start()

    def step(self, host: str, phase: str, task: str, status: str, seconds: float,
             detail: str) -> None:
        """A run's step: a change of the serving processes wakes the writer."""
        self._reached = True
        if status == "ok" and task in CHANGES_PROCESSES:
            self._wake.set()

    def _loop(self) -> None:
        while True:
            self._wake.wait()
            if self._closed:
                return
            self._wake.clear()
            after_run(self.target)

    def close(self) -> None:
        """The last write, from what serves at the end of the run."""
        self._closed = True
        self._wake.set()
        self._thread.join(timeout=120)
        if self._reached:
            after_run(self.target)


class TeeReporter:
    """A run's reporter whose steps also reach the retargeter; everything else is the
    inner reporter's."""

    def __init__(self, inner: Any, retargeter: Retargeter) -> None:
        self._inner, self._retargeter = inner, retargeter

    def step(self, host: str, phase: str, task: str, status: str, seconds: float,
             detail: str) -> None:
        """As the inner reporter, then the retargeter."""
        self._inner.step(host, phase, task, status, seconds, detail)
        self._retargeter.step(host, phase, task, status, seconds, detail)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


def retargets(target: Target) -> bool:
    """Whether the inventory names a place for the targets."""
    monitoring = target.inventory.monitoring
    return monitoring.hosts is not None or monitoring.local_targets_dir is not None


def after_run(target: Target) -> None:
    """After a deploy, rollback, promote or abort: the model's targets rewritten where the
    inventory names a place; a failure is one line on stderr (it never changes the run's
    exit code)."""
    if not retargets(target):
        return
    try:
        publish_targets(target)
    except Exception as error:
        print(f"tfsdeploy: the Prometheus targets of {target.model.name} could not be "
              f"rewritten: {type(error).__name__}: {error}", file=sys.stderr)


def observe(inventory: Inventory, model: str | None, out: Path, *, targets: bool
            ) -> tuple[list[Path], list[str]]:
    """`fab observe`: the files written, and (``targets``) where each model's targets were
    written from what runs on its hosts now."""
    models = chosen_models(inventory, model)
    written = write_observability(inventory, models, out)
    published: list[str] = []
    if targets:
        beside = scraped_targets_dir(inventory) == LOCAL_TARGETS
        for entry in models:
            chosen = Target(inventory, entry, inventory.select(None, model=entry))
            published += publish_targets(
                chosen, local_only=out / "prometheus" / LOCAL_TARGETS if beside else None)
    return written, published
