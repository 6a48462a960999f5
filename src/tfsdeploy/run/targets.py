"""The targets every run keeps current: ``publish_targets`` reads which serving processes run on
a model's hosts and rewrites the model's file_sd file where the inventory's ``monitoring`` says
(beside this machine's inventory and/or on its Prometheus hosts), so that the scraped series
follow the process and carry its release and version.
"""

from __future__ import annotations

import json
import os
import sys
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from tfsdeploy.core.inventory.fleet import ResolvedHost
from tfsdeploy.core.inventory.load import Inventory
from tfsdeploy.core.inventory.monitoring import Monitoring
from tfsdeploy.core.localfiles import write_durable
from tfsdeploy.core.observe.prometheus import ServingProcess, target_groups, targets_file
from tfsdeploy.core.target import Target
from tfsdeploy.hosts.commands.files import ABSENT, read_if_present
from tfsdeploy.hosts.ssh import ConnectionFactory, SshConnection
from tfsdeploy.run import engine, survey
from tfsdeploy.run.after import AFTER_DEADLINE_S, AfterPass, StepEvent
from tfsdeploy.run.jobs import Session

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


# -- the targets -----------------------------------------------------------------------------

def running_processes(target: Target, session: Session
                      ) -> tuple[list[ServingProcess], list[str]]:
    """The model's running server containers on every host of the model, and the hosts that
    could not be read (over the engine's ``session``: a run's, or a look's)."""
    def look(_t: Any, _h: Any, _c: Any, facts: Any) -> dict[str, Any]:
        return {"processes": [ServingProcess(facts.host, c.instance, c.slot, c.release,
                                             c.version)
                              for c in facts.servers if c.running]}

    rows = survey.each_host(target, look, hosts=target.model_hosts, session=session)
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


def parse_groups(text: str) -> list[dict[str, Any]]:
    """A file_sd file's groups ([] when it is not one)."""
    found = groups_in(text)
    return found if found is not None else []


def groups_in(text: str) -> list[dict[str, Any]] | None:
    """A file_sd file's groups (None when it is not one)."""
    try:
        data = json.loads(text)
    except ValueError:
        return None
    return data if isinstance(data, list) else None


def _previous_local(path: Path) -> list[dict[str, Any]]:
    try:
        return parse_groups(path.read_text()) if path.is_file() else []
    except OSError:
        return []


def publish_targets(target: Target, *, session: Session, local_only: Path | None = None
                    ) -> list[str]:
    """Rewrite the model's file_sd file in every place the inventory names (or only in
    ``local_only``), over the engine's ``session``; returns where it was written. A
    host that could not be read keeps the groups the file had for it (the local file, else
    the first monitoring host's that holds one); when no monitoring host can say what that
    was, their files are left as they are (stderr says so): a host is never dropped from the
    targets because it could not be read. A monitoring host that cannot be written is
    reported on stderr and the others are still written."""
    inventory = target.inventory
    local = local_only or local_targets_dir(inventory)
    name = targets_file(target.model.name)
    monitors = (inventory.match(inventory.monitoring.hosts, "monitoring.hosts")
                if local_only is None and inventory.monitoring.hosts is not None else ())
    processes, unread = running_processes(target, session)
    previous: list[dict[str, Any]] | None = []
    if unread:
        previous = (_previous_local(local / name) if local is not None
                    else _previous_remote(monitors, inventory.monitoring, name, session))
    if previous is None:
        print(f"tfsdeploy: the targets of {target.model.name} were left as they are: "
              f"{', '.join(unread)} could not be read, and no monitoring host gave its "
              "previous targets", file=sys.stderr)
        return []
    groups = merged_groups(target, processes, unread, previous)
    text = json.dumps(groups, indent=2) + "\n"
    written = []
    if local is not None:
        write_durable(local / name, text, mode=0o644)
        written.append(str(local / name))
    for host in monitors:
        written += _upload(host, inventory.monitoring, name, text, session)
    return written


def publish_now(target: Target, *, local_only: Path | None = None,
                connect: ConnectionFactory = SshConnection) -> list[str]:
    """publish_targets outside a run (`fab observe --targets`, the guard's targets after it
    acted), on the engine's look: its connections, closed at the end, its deadline, and
    Ctrl-C, SIGTERM and SIGHUP, which end it (LookStopped)."""
    return engine.look(
        target, lambda session: publish_targets(target, local_only=local_only,
                                                session=session),
        connect=connect, left="each place holds its previous targets file or the new one "
                              "(files are replaced whole)")


def _previous_remote(monitors: Sequence[ResolvedHost], monitoring: Monitoring, name: str,
                     session: Session) -> list[dict[str, Any]] | None:
    """The targets file as the first monitoring host that holds one has it; [] when a host
    answered that it has none yet and none other has it; None when none could be read (an
    unreadable file counts as not read)."""
    answered = False
    for host in monitors:
        try:
            result = session.connection(host).run(
                read_if_present(f"{monitoring.targets_dir}/{name}"), timeout=30)
        except Exception:
            continue
        found = groups_in(result.stdout) if result.ok else None
        if found is not None:
            return found
        answered = answered or result.code == ABSENT
    return [] if answered else None


def _upload(host: ResolvedHost, monitoring: Monitoring, name: str, text: str,
            session: Session) -> list[str]:
    final = f"{monitoring.targets_dir}/{name}"
    try:
        conn = session.connection(host)
        conn.run(["mkdir", "-p", monitoring.targets_dir], timeout=30)
        temp = f"{monitoring.targets_dir}/.{name}.tmp"
        conn.put_bytes(text.encode(), temp, mode=0o644)
        conn.run(["mv", "-f", temp, final], timeout=30)  # file_sd reads whole files
    except Exception as error:  # one unreachable Prometheus host never stops the others
        if session.ended.is_set():  # the look ended (a signal, its deadline): it says so
            return []
        print(f"tfsdeploy: the targets could not be written to {host.name}:{final}: "
              f"{type(error).__name__}: {error}", file=sys.stderr)
        return []
    return [f"{host.name}:{final}"]


class Retargeter:
    """Rewrites the model's targets while a run rolls, over the run's own connections: after
    each step whose typed event says a serving process started, stopped or became AVAILABLE,
    in a thread of its own so that the roll never waits for it; steps that come while it
    writes are taken together in its next pass. Its after-pass (``final``) waits for it and
    writes the run's final targets, once the result is recorded, if the run reached a host (a
    run refused before, on its input or its lock, changed nothing)."""

    def __init__(self, target: Target) -> None:
        self.target = target
        self._wake = threading.Event()
        self._closed = False
        self._reached = False
        self._session: Session | None = None
        self._thread = threading.Thread(target=self._loop, name="retarget", daemon=True)
        self._thread.start()

    def on_step(self, event: StepEvent, session: Session) -> None:
        """A run's step: a change of the serving processes wakes the writer."""
        self._reached = True
        self._session = session
        if event.status == "ok" and event.processes_changed:
            self._wake.set()

    def _loop(self) -> None:
        while True:
            self._wake.wait()
            if self._closed:
                return
            self._wake.clear()
            after_run(self.target, self._session)

    def final(self, _result: Any, session: Session | None) -> None:
        """The last write, from what serves at the end of the run (an after-pass)."""
        self.stop()
        if self._reached:
            after_run(self.target, session)

    def stop(self) -> None:
        """The writer ends (a run that ended without a result writes nothing more)."""
        self._closed = True
        self._wake.set()
        self._thread.join(timeout=AFTER_DEADLINE_S)

    def after_pass(self) -> AfterPass:
        """The targets as an after-pass of the run."""
        return AfterPass("the model's Prometheus targets", self.final)


def retargets(target: Target) -> bool:
    """Whether the inventory names a place for the targets."""
    monitoring = target.inventory.monitoring
    return monitoring.hosts is not None or monitoring.local_targets_dir is not None


def after_run(target: Target, session: Session | None = None) -> None:
    """After a deploy, rollback, promote or abort: the model's targets rewritten where the
    inventory names a place (over the run's ``session``; the guard's, whose runs are over,
    on a look of their own); a failure is one line on stderr (it never changes the run's
    exit code)."""
    if not retargets(target):
        return
    try:
        if session is None:
            publish_now(target)
        else:
            publish_targets(target, session=session)
    except Exception as error:
        print(f"tfsdeploy: the Prometheus targets of {target.model.name} could not be "
              f"rewritten: {type(error).__name__}: {error}", file=sys.stderr)
