"""The fleet lock's part on one host: a directory created by ``mkdir`` (atomic), with its
record, changed only under ``flock`` on a file beside it so that reading the record and removing
the directory are one step: a lock is only ever removed by the token that was read. Every
change is durable (``files.publish_sh``): the record fsynced before its rename, the lock
directory and the model's directory after."""

from __future__ import annotations

from tfsdeploy.core.inventory.layout import HostPaths
from tfsdeploy.hosts.commands import Argv
from tfsdeploy.hosts.commands.files import SYNC, publish_sh

# exit 0: taken; 3: held (the record printed); other: failure. A lock directory without its
# record is an acquisition killed between its mkdir and its rename: the record is written
# under this flock by the command that made the directory, so holding the flock proves that
# command ended; the directory is then taken over (a killed acquisition must not block).
_ACQUIRE = ('mkdir -p "$1" && exec 9>>"$2" && flock -w 10 9 && '
            'if [ -d "$3" ]; then if [ -e "$3/info.json" ]; then '
            'cat "$3/info.json" 2>/dev/null; exit 3; fi; rm -rf -- "$3" || exit 4; fi && '
            'mkdir "$3" && printf "%s" "$4" > "$3/info.json.tmp" && '
            + publish_sh('"$3/info.json.tmp"', '"$3/info.json"') + f' && {SYNC} "$1"')
# exit 0 and "removed" (or nothing when there was no lock); 3: the lock holds another record
# now (printed). A record is named by its token, or, when it has none that can be read, by the
# sha256 of its bytes ("none" when the file is missing).
_REMOVE = ('[ -d "$2" ] || exit 0; exec 9>>"$1" || exit 4; flock -w 10 9 || exit 4; '
           '[ -d "$2" ] || exit 0; '
           'if [ -n "$3" ]; then '
           'held=$(sed -n \'s/.*"token": *"\\([0-9a-f]*\\)".*/\\1/p\' "$2/info.json" '
           '2>/dev/null); want=$3; '
           'else held=none; [ -f "$2/info.json" ] && '
           'held=$(sha256sum < "$2/info.json" | cut -c1-64); want=$4; fi; '
           'if [ "$held" = "$want" ]; then rm -rf -- "$2" && '
           f'{SYNC} "$(dirname -- "$2")" && echo removed; '
           'else cat "$2/info.json" 2>/dev/null; exit 3; fi')


def acquire(paths: HostPaths, record: str) -> Argv:
    """Create the lock directory with ``record``, unless it exists (then print its record)."""
    return ["sh", "-c", _ACQUIRE, "sh", paths.home, paths.lock_guard, paths.lock_dir, record]


def remove_if_token(paths: HostPaths, token: str, digest: str = "none") -> Argv:
    """Remove the lock only while it still records ``token`` (release, or break a stale one);
    otherwise print what it holds now and exit 3. With no token, remove a lock whose record
    has no readable token only while its bytes have the sha256 ``digest`` ("none": no
    record file)."""
    return ["sh", "-c", _REMOVE, "sh", paths.lock_guard, paths.lock_dir, token, digest]


def read(paths: HostPaths) -> Argv:
    """The lock record (exit 1 when there is none)."""
    return ["cat", f"{paths.lock_dir}/info.json"]


def exists(paths: HostPaths) -> Argv:
    """Exit 0 when a lock directory exists (its record may be missing or unreadable)."""
    return ["test", "-d", paths.lock_dir]


# exit 0: the record was replaced; 3: the lock holds another token now (printed)
_REPLACE = ('[ -d "$2" ] || exit 3; exec 9>>"$1" || exit 4; flock -w 10 9 || exit 4; '
            'held=$(sed -n \'s/.*"token": *"\\([0-9a-f]*\\)".*/\\1/p\' "$2/info.json" '
            '2>/dev/null); '
            'if [ "$held" = "$3" ]; then printf "%s" "$4" > "$2/info.json.tmp" && '
            + publish_sh('"$2/info.json.tmp"', '"$2/info.json"') + '; '
            'else cat "$2/info.json" 2>/dev/null; exit 3; fi')


def replace_if_token(paths: HostPaths, token: str, record: str) -> Argv:
    """Replace the lock's record while it still records ``token`` (a paused canary hands its
    lock on, a promote or abort takes it over); otherwise print what it holds and exit 3."""
    return ["sh", "-c", _REPLACE, "sh", paths.lock_guard, paths.lock_dir, token, record]


# `fab tune`'s lock on one host: the same directory-and-flock scheme, beside the fleet lock's
# (one tune of a model per host at a time; a deploy, prune or retire takes it for the moment it
# removes what a killed tune left)

def acquire_tune(paths: HostPaths, record: str) -> Argv:
    """``acquire`` for the model's tune lock on the host."""
    return ["sh", "-c", _ACQUIRE, "sh", paths.home, paths.tune_lock_guard, paths.tune_lock_dir,
            record]


def remove_tune_if_token(paths: HostPaths, token: str) -> Argv:
    """``remove_if_token`` for the model's tune lock on the host."""
    return ["sh", "-c", _REMOVE, "sh", paths.tune_lock_guard, paths.tune_lock_dir, token,
            "none"]
