"""Whether a file the toolkit executes (a hook, the load generator's packed environment) can
be trusted on the deploy machine: as sshd's StrictModes trusts a user's files (OpenSSH auth.c,
``auth_secure_path``: the file and every directory above it owned by the user or root, none
writable by group or others), with symbolic links resolved and their target checked.

One exception: a directory with the sticky bit (``/tmp``). There no other user can remove or
rename an entry someone else owns (unlink(2) and rename(2) fail with EPERM in a sticky
directory), so the entry below it, whose owner is checked, cannot be replaced through it.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path


def untrusted(path: Path, *, uid: int | None = None) -> str | None:
    """Why ``path`` cannot be trusted, or None: its target (links resolved) and every
    directory above it owned by ``uid`` (default: this process's effective user) or root, and
    none writable by group or others unless it is a sticky directory."""
    me = os.geteuid() if uid is None else uid
    try:
        real = path.resolve(strict=True)
    except (OSError, RuntimeError) as error:
        return f"{path} cannot be resolved ({error})"
    linked = f" (the target of the link {path})" if real != path.absolute() else ""
    for place in (real, *real.parents):
        try:
            info = place.stat()
        except OSError as error:
            return f"{place} cannot be read ({error.strerror or error})"
        named = f"{place}{linked if place == real else ''}"
        if info.st_uid not in (me, 0):
            return f"{named} is owned by uid {info.st_uid}, neither you (uid {me}) nor root"
        sticky = place != real and stat.S_ISDIR(info.st_mode) and info.st_mode & stat.S_ISVTX
        if info.st_mode & 0o022 and not sticky:
            who = ("group- and world-" if info.st_mode & 0o022 == 0o022
                   else "group-" if info.st_mode & 0o020 else "world-")
            return f"{named} is {who}writable (mode {stat.S_IMODE(info.st_mode):04o})"
    return None


def trust_fix(problem: str) -> str:
    """How to make a path trusted again, for ``untrusted``'s reason."""
    place = problem.split(" ", 1)[0]
    if " is owned by " in problem:
        return (f"chown it to yourself or root (chown \"$(id -un)\" {place}), or keep it in "
                "directories only you and root own")
    if "writable" in problem:
        return f"chmod go-w {place}"
    return "use a directory you own"
