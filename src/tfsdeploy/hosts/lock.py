"""One deploy per model fleet at a time: a lock directory on a majority of the model's hosts.

``mkdir`` is atomic on each host, and a run holds the lock only when it created the lock
directory on a strict majority of the model's hosts: two runs from different machines (or a
person and a cron job), even with different views of which hosts answer, can never both hold
it, and one unreachable host does not block a rollback. Each host changes its part only under
``flock``, and removes it only for the token it was asked to remove (``commands.lock``): a
stale lock broken by two runs at once is broken once, and a fresh lock is never taken for the
stale one it replaced. A lock is stale only when its holder provably cannot return: its boot
is one that this deploy machine recorded in its own journal of boots and this machine runs
another boot now (a process does not outlive its kernel), or, on this boot and in this pid
namespace, its pid no longer runs (or runs a process started later). A shared
``/etc/machine-id`` proves nothing: CI runner containers built from one image and cloned VMs
share it, and their runs are live on other kernels; the journal is written by the machine that
takes the lock, before it takes it, and read only on that machine.

A run that took a strict majority holds the lock whatever a minority of hosts still keep:
another holder then has a minority, and a minority holds nothing (a run taking the lock
gives its parts back when it cannot reach a majority). A lock directory with no record is a
killed acquisition (each host writes the record under ``flock`` in the command that creates
the directory) and is taken over on that host. A paused canary's part is the exception: it
holds the lock for the canary, wherever it is left; the engine judges a minority of such
parts against the hosts' records (``run.engine``): parts of a finished canary are cleared.
"""

from __future__ import annotations

import os
import random
import socket
import uuid
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from tfsdeploy.core.errors import ExitCode, HostUnreachable, TfsDeployError
from tfsdeploy.core.inventory.layout import HostPaths
from tfsdeploy.core.localfiles import append_durable
from tfsdeploy.core.rollout.gates import Clock
from tfsdeploy.core.rollout.records import LockRecord, now_iso, parse_lock
from tfsdeploy.core.who import user_name
from tfsdeploy.hosts.commands import lock as lock_commands
from tfsdeploy.hosts.ssh import Connection


class LockHeld(TfsDeployError):
    """Another run holds the lock."""

    exit_code = ExitCode.LOCKED


class LockQuorumLost(TfsDeployError):
    """Too few of the model's hosts answer to hold a majority lock."""

    exit_code = ExitCode.INVALID


def _boot_id() -> str:
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        return ""


def _machine_id() -> str:
    # machine-id(5): /etc/machine-id, or /var/lib/dbus/machine-id on older systems
    for path in ("/etc/machine-id", "/var/lib/dbus/machine-id"):
        try:
            found = Path(path).read_text().strip()
        except OSError:
            continue
        if found:
            return found
    return ""


def boot_journal() -> Path:
    """This machine's journal of its boots, for this user: ``$XDG_STATE_HOME/tfsdeploy/boots``
    (default ``~/.local/state/tfsdeploy/boots``), one line per boot a lock was taken in:
    ``<boot id> <machine id or -> <host name>``."""
    state = os.environ.get("XDG_STATE_HOME") or os.path.join(
        os.path.expanduser("~"), ".local", "state")
    return Path(state, "tfsdeploy", "boots")


def _identity() -> str:
    return f"{_machine_id() or '-'} {socket.gethostname()}"


def _journal_lines() -> list[str]:
    try:
        return boot_journal().read_text().splitlines()
    except (OSError, UnicodeDecodeError):
        return []


def record_this_boot() -> bool:
    """Put this boot in the journal, durably, unless it is there (a lock taken in this boot can
    then be judged stale once this machine has booted again); False when the journal cannot be
    written (such a lock is then never judged stale by a reboot: `fab lock --break`)."""
    boot = _boot_id()
    if not boot:
        return False
    line = f"{boot} {_identity()}"
    if line in _journal_lines():
        return True
    try:
        append_durable(boot_journal(), line)
    except OSError:
        return False
    return True


def booted_here(boot_id: str) -> bool:
    """Whether ``boot_id`` is a boot of this machine: its journal has it, written under this
    machine's id and host name (a journal on a home directory that machines share names the
    machine that wrote each line)."""
    return bool(boot_id) and f"{boot_id} {_identity()}" in _journal_lines()


def _pid_namespace() -> str:
    try:
        return os.readlink("/proc/self/ns/pid")
    except OSError:
        return ""


def process_start(pid: int) -> int:
    """A process's start time in clock ticks since boot (0 when it does not exist)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return int(fields[19])
    except (OSError, IndexError, ValueError):
        return 0


def new_lock_record(command: str) -> LockRecord:
    """The record of a lock this process is about to take (this boot is put in the machine's
    journal first: the record may outlive the boot)."""
    record_this_boot()
    pid = os.getpid()
    return LockRecord(token=uuid.uuid4().hex, who=user_name(), machine=socket.gethostname(),
                      pid=pid, started=now_iso(), command=command, boot_id=_boot_id(),
                      pid_namespace=_pid_namespace(), pid_start=process_start(pid),
                      machine_id=_machine_id())


def hand_to_paused(sites: list[LockSite], record: LockRecord, release: str) -> list[str]:
    """Keep the lock for a paused canary: each host's record names the paused release (never
    stale, whatever becomes of this process); returns the hosts where that failed."""
    paused = record.model_copy(update={"paused": release})
    return [site.host for site in sites if not replace(site, record.token, paused)]


def take_over_paused(sites: list[LockSite], record: LockRecord,
                     on_stale: Callable[[str], None] | None = None) -> list[LockSite]:
    """A promote or abort takes the lock a paused canary holds, where it still holds it, and
    takes free hosts as any run does (a host that was down when an earlier promote or abort
    ended may keep the paused part alone); returns the sites taken when they are a strict
    majority (else gives them back: none). None is taken when no host keeps a paused part."""
    held = {site.host: found for site, found in paused_parts(sites)}
    if not held:
        return []
    taken = [site for site in sites if site.host in held
             and replace(site, held[site.host].token, record)]
    fresh = [site for site in sites if site.host not in held
             and _attempt(site, record, on_stale).taken]
    if (len(taken) + len(fresh)) * 2 > len(sites):
        return taken + fresh
    for site in taken:  # not a majority: give the paused canary its lock back
        replace(site, record.token, held[site.host])
    release_sites(fresh, record)
    return []


def paused_parts(sites: list[LockSite]) -> list[tuple[LockSite, LockRecord]]:
    """The paused canary's parts that ``sites`` keep (the hosts a run did not take)."""
    found = []
    for site in sites:
        try:
            holder, _ = read(site)
        except HostUnreachable:
            continue
        if holder is not None and holder.paused:
            found.append((site, holder))
    return found


def replace(site: LockSite, token: str, record: LockRecord) -> bool:
    """Replace the host's lock record while it still holds ``token``."""
    try:
        return site.conn.run(lock_commands.replace_if_token(
            site.paths, token, record.model_dump_json())).ok
    except HostUnreachable:
        return False


def stale_reason(record: LockRecord) -> str | None:
    """Why the holder of a lock provably cannot return (None: it may): it was taken in a boot
    this machine recorded in its own journal (``booted_here``), and this machine runs another
    boot now; or, on this boot and in this pid namespace (so its pid means the same process
    here), that pid no longer runs, or runs a process that started after the lock was taken.
    The same machine id with another boot id is no proof: machines cloned from one image share
    the id. A paused canary's part is held by its release, not a process: never stale."""
    if record.paused or not record.boot_id:
        return None
    boot = _boot_id()
    if record.boot_id != boot:
        if boot and booted_here(record.boot_id):
            return "its deploy machine has rebooted since"
        return None
    if not record.pid_namespace or record.pid_namespace != _pid_namespace():
        return None
    started = process_start(record.pid)
    if started == 0 or (record.pid_start > 0 and started != record.pid_start):
        return "that process is gone"
    return None


def is_stale(record: LockRecord) -> bool:
    """Whether the holder of the lock provably cannot return (``stale_reason``)."""
    return stale_reason(record) is not None


@dataclass(frozen=True)
class LockSite:
    """Where one host keeps its part of the fleet lock."""

    host: str
    conn: Connection
    paths: HostPaths


@dataclass(frozen=True)
class Attempt:
    """What one host said to an attempt."""

    taken: bool = False
    holder: LockRecord | None = None
    unreadable: bool = False  # a lock directory without a readable record
    reachable: bool = True
    why: str = ""  # why the host did not answer (its connection's error)


def read(site: LockSite) -> tuple[LockRecord | None, bool]:
    """(the holder, whether a lock directory exists) on one host."""
    result = site.conn.run(lock_commands.read(site.paths))
    if result.ok:
        record = parse_lock(result.stdout)
        return record, True
    exists = site.conn.run(lock_commands.exists(site.paths)).ok
    return None, exists


def remove(site: LockSite, token: str, digest: str = "none") -> tuple[bool, LockRecord | None]:
    """Remove the lock if it still records ``token`` (or, with no token, still has the bytes
    of ``digest``); (whether this call removed it, what it holds otherwise)."""
    result = site.conn.run(lock_commands.remove_if_token(site.paths, token, digest))
    if result.ok:
        return result.stdout.strip() == "removed", None
    if result.code == 3:
        return False, parse_lock(result.stdout)
    raise HostUnreachable(f"{site.host}: the lock could not be changed: {result.tail()}")


def _attempt(site: LockSite, record: LockRecord, on_stale: Callable[[str], None] | None
             ) -> Attempt:
    try:
        for _ in range(3):
            result = site.conn.run(lock_commands.acquire(site.paths, record.model_dump_json()))
            if result.ok:
                return Attempt(taken=True)
            if result.code != 3:
                raise HostUnreachable(f"{site.host}: taking the lock failed: {result.tail()}")
            holder = parse_lock(result.stdout)
            if holder is None:
                return Attempt(unreadable=True)
            why = stale_reason(holder)
            if why is None:
                return Attempt(holder=holder)
            removed, _ = remove(site, holder.token)
            if removed and on_stale:
                on_stale(f"broke a stale lock on {site.host}: {holder.describe()} ({why})")
        return Attempt()
    except HostUnreachable as error:
        return Attempt(reachable=False, why=str(error))


def acquire_majority(sites: list[LockSite], record: LockRecord, *, wait_s: float,
                     clock: Clock, model: str, on_stale: Callable[[str], None] | None = None,
                     fix: str | None = None) -> list[LockSite]:
    """Take the lock on a strict majority of ``sites`` (all that answer, then a majority of
    them is enough: what a minority keeps holds nothing), waiting up to ``wait_s`` for another
    holder; returns the sites taken. A paused canary's parts left on a minority are the
    caller's to judge (``paused_parts``). Raises LockHeld naming a holder (and ``fix``, else
    the model's way out), or LockQuorumLost when too few hosts answer."""
    end = clock.now() + wait_s
    while True:
        with ThreadPoolExecutor(max_workers=max(1, min(16, len(sites)))) as pool:
            outcomes = list(pool.map(lambda s: _attempt(s, record, on_stale), sites))
        taken = [s for s, a in zip(sites, outcomes, strict=True) if a.taken]
        holders = [(s.host, a) for s, a in zip(sites, outcomes, strict=True)
                   if a.holder or a.unreadable]
        answering = sum(1 for a in outcomes if a.reachable)
        if len(taken) * 2 > len(sites):
            return taken
        release_sites(taken, record)
        if not holders and answering * 2 <= len(sites):
            # each host's own reason first: a refused host key says what to do about it
            reasons = "".join(f"\n    {a.why}" for a in outcomes if a.why)
            raise LockQuorumLost(
                f"only {answering} of the {len(sites)} hosts of {model} answer: the deploy "
                f"lock needs a majority{reasons}\n    fix: bring hosts back, or narrow the "
                "model's hosts in the inventory")
        if clock.now() >= end:
            raise LockHeld(_held_message(model, holders, sites, fix))
        clock.sleep(min(2.0, max(0.1, end - clock.now())) * random.uniform(0.5, 1.0))


def _held_message(model: str, holders: list[tuple[str, Attempt]], sites: list[LockSite],
                  fix: str | None = None) -> str:
    paused = [(h, a.holder) for h, a in holders if a.holder is not None and a.holder.paused]
    if paused:  # no process holds it: breaking it would leave the canary's hosts half-rolled
        return paused_message(model, *paused[0])
    host, attempt = holders[0] if holders else (sites[0].host, Attempt())
    described = (attempt.holder.describe() if attempt.holder else
                 "a lock whose record is unreadable" if attempt.unreadable else
                 "a concurrent run")
    return (f"another deploy of {model} holds the lock on {host}: {described}.\n"
            + (f"    fix: {fix}" if fix else
               f"    fix: wait (--lock-wait SECONDS), or if no deploy is running, "
               f"`fab lock --model {model} --break`"))


def paused_message(model: str, host: str, holder: LockRecord) -> str:
    """Why a run is refused by a paused canary's part of the lock, and the way out."""
    return (f"a canary of {model} is paused: release {holder.paused} holds the lock on "
            f"{host} ({holder.command} by {holder.who}@{holder.machine} since "
            f"{holder.started}), serving part of the requests.\n"
            f"    fix: finish it with `fab promote --model {model}`, or return its hosts "
            f"to the old release with `fab abort --model {model}`; then run again")


def release_sites(sites: list[LockSite], record: LockRecord) -> list[str]:
    """Give the lock back where it is ours; returns the hosts where that failed."""
    failed = []
    for site in sites:
        try:
            remove(site, record.token)
        except HostUnreachable:
            failed.append(site.host)
    return failed

