"""`fab tune`'s scratch instances on a host: the tune lock (one tune of a model per host at a
time) and the removal of what a tune left.

A tune takes the lock before it removes or starts anything, and labels each scratch instance
with the lock's token: whoever holds the lock owns the model's scratch instances there. A
second tune is refused, naming the first (it would remove the first one's trials); a deploy,
prune or retire removes a killed tune's instances only while it holds the lock itself, for
that moment, so never the trial of a tune that runs. The lock is kept as the fleet lock's
part on a host is (``commands.lock``: a directory made by ``mkdir``, its record changed under
``flock``), and it is stale when the fleet lock would be (``lock.stale_reason``: its holder
provably cannot return); a stale one is broken, and what its tune left is removed.
"""

from __future__ import annotations

from collections.abc import Callable

from tfsdeploy.core.errors import ExitCode, HostUnreachable, TfsDeployError
from tfsdeploy.core.inventory.layout import TUNE_LABEL, HostPaths
from tfsdeploy.core.rollout.records import LockRecord, parse_lock
from tfsdeploy.hosts.commands import lock as lock_commands
from tfsdeploy.hosts.commands.files import remove_tree
from tfsdeploy.hosts.dockerapi import ScratchFact
from tfsdeploy.hosts.facts import HostFacts
from tfsdeploy.hosts.lock import stale_reason
from tfsdeploy.hosts.ssh import Connection


class TuneHeld(TfsDeployError):
    """Another `fab tune` of the model runs on the host."""

    exit_code = ExitCode.LOCKED


class ScratchLeft(TfsDeployError):
    """A scratch instance could not be removed: a person must look."""

    exit_code = ExitCode.INCONSISTENT


def attempt(conn: Connection, paths: HostPaths, record: LockRecord, *,
            on_stale: Callable[[str], None]) -> tuple[bool, LockRecord | None]:
    """Take the model's tune lock on the host for ``record``: (True, None) when taken, else
    (False, the holder; None when its record cannot be read). A stale holder's lock is
    broken on the way (``on_stale`` says so) and taken."""
    holder: LockRecord | None = None
    for _ in range(3):
        result = conn.run(lock_commands.acquire_tune(paths, record.model_dump_json()),
                          timeout=60)
        if result.ok:
            return True, None
        if result.code != 3:
            raise HostUnreachable(f"{conn.host.name}: taking the tune lock failed: "
                                  f"{result.tail()}")
        holder = parse_lock(result.stdout)
        why = stale_reason(holder) if holder is not None else None
        if holder is None or why is None:
            return False, holder
        if give_back(conn, paths, holder.token):
            on_stale(f"broke a stale tune lock on {conn.host.name}: {holder.describe()} "
                     f"({why})")
    return False, holder


def give_back(conn: Connection, paths: HostPaths, token: str) -> bool:
    """Remove the tune lock while it still records ``token``; whether this call removed it."""
    result = conn.run(lock_commands.remove_tune_if_token(paths, token), timeout=60)
    return result.ok and result.stdout.strip() == "removed"


def held_message(model: str, host: str, holder: LockRecord | None, paths: HostPaths) -> str:
    """Why a second tune is refused, and the way out."""
    described = holder.describe() if holder else "a tune lock whose record is unreadable"
    return (f"another fab tune of {model} runs on {host}: {described}; its scratch instances "
            f"there are its own.\n    fix: wait until it ends; if it was killed on another "
            f"machine, remove {paths.tune_lock_dir} on {host} (what it left goes with the next "
            f"fab tune, deploy, prune or retire of {model})")


def remove_all(conn: Connection, model: str, paths: HostPaths) -> list[str]:
    """Remove every scratch instance of ``model`` on the host and the trials' files (the
    caller holds the tune lock); the names removed. Raises ScratchLeft when one stays."""
    docker = conn.docker
    names = docker.labelled(TUNE_LABEL, model)
    for name in names:
        docker.remove(name)
    result = conn.run(remove_tree(paths.tune_dir, root=paths.root), timeout=60)
    left = docker.labelled(TUNE_LABEL, model)
    if left or not result.ok:
        raise ScratchLeft(f"scratch instances left on {conn.host.name}: "
                          f"{', '.join(left) or result.tail()}; remove them with "
                          "`docker rm -f` on the host")
    return names


def clear_left(conn: Connection, model: str, paths: HostPaths, record: LockRecord) -> str:
    """A deploy's, prune's or retire's part: under the tune lock (taken for ``record``, given
    back at once), remove the scratch instances of ``model`` that a tune no longer running
    left; a running tune's are left to it. Returns what was done, for people."""
    notes: list[str] = []
    taken, holder = attempt(conn, paths, record, on_stale=notes.append)
    if not taken:
        described = holder.describe() if holder else "a tune lock whose record is unreadable"
        return f"kept fab tune's scratch instances: they are {described}'s"
    try:
        names = remove_all(conn, model, paths)
    finally:
        give_back(conn, paths, record.token)
    done = (f"removed {', '.join(names)}: fab tune's scratch instance(s) that a tune no "
            "longer running left" if names else "no scratch instance left")
    return "; ".join([*notes, done])


def owner(facts: HostFacts, fact: ScratchFact) -> LockRecord | None:
    """The tune that runs and owns a scratch instance of the facts' model: the holder of its
    tune lock when that holder may still run and started it; None when a tune that no longer
    runs left it (or its lock is another's)."""
    holder = facts.tune_lock
    if holder is None or fact.run != holder.token or stale_reason(holder) is not None:
        return None
    return holder


def whose(facts: HostFacts, fact: ScratchFact, model: str) -> str:
    """A scratch instance on the host of ``model``'s facts, for people: its name, state and
    GPUs, and whose it is (a running tune's, or left by one that no longer runs)."""
    gpus = (f", GPU {fact.gpus}" if fact.gpus not in ("", "all") else
            ", every GPU" if fact.gpus == "all" else "")
    head = f"{fact.name} ({fact.state}{gpus})"
    if fact.model != model:
        return f"{head}: fab tune's scratch instance of {fact.model}"
    running = owner(facts, fact)
    if running is not None:
        return (f"{head}: the scratch instance of {running.describe()}, which holds the "
                "model's tune lock")
    return (f"{head}: fab tune's scratch instance left by a tune that no longer runs; "
            f"the next fab deploy, rollback, prune or retire of {model} removes it")
