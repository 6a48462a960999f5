"""Files and directories on a host: create, link, append, remove (pure argv builders)."""

from __future__ import annotations

from tfsdeploy.hosts.commands import Argv


class UnsafePath(ValueError):
    """A path to remove or write is not inside the directory it must stay in."""


def inside(path: str, root: str) -> str:
    """``path`` when it lies strictly inside ``root`` (absolute, no ``..``), else UnsafePath.

    Every destructive builder checks this: a name read back from a host can never make the
    toolkit remove or overwrite anything outside the data root.
    """
    parts = path.split("/")
    if (not path.startswith("/") or not root.startswith("/") or ".." in parts
            or "." in parts[1:] or "" in parts[1:] or not path.startswith(root.rstrip("/") + "/")):
        raise UnsafePath(f"{path!r} is not inside {root!r}")
    return path


def mkdir(path: str, *, mode: str | None = None) -> Argv:
    """Create a directory and its parents (``mode`` for the last one, e.g. ``0700``)."""
    return ["mkdir", "-p", *(["-m", mode] if mode else []), "--", path]


def remove_tree(path: str, *, root: str) -> Argv:
    """Remove a directory tree that lies inside ``root``."""
    return ["rm", "-rf", "--", inside(path, root)]


def _swap_link_sh(target: int, link: int) -> str:
    """Shell: replace the symlink named by positional argument ``link`` atomically with one to
    positional argument ``target`` (rename over the old link)."""
    return f'ln -sfn "${target}" "${link}.new" && mv -T "${link}.new" "${link}"'


def point_symlink(target: str, link: str) -> Argv:
    """Replace ``link`` atomically with a symlink to ``target`` (rename over the old link)."""
    return ["sh", "-c", _swap_link_sh(1, 2), "sh", target, link]


def append_lines(path: str, lines: list[str]) -> Argv:
    """Append lines to a file (the audit log), creating its directory if needed."""
    return ["sh", "-c", 'f="$1"; shift; mkdir -p "$(dirname "$f")" && printf "%s\\n" "$@" >> "$f"',
            "sh", path, *lines]


def read_files(directory: str, names: tuple[str, ...]) -> Argv:
    """Print each named file of ``directory`` after a ``@@file <name>`` line (exit 1 when one
    is missing)."""
    return ["sh", "-c", 'd="$1"; shift; for n in "$@"; do echo "@@file $n"; '
            'cat "$d/$n" || exit 1; echo; done; echo "@@end"', "sh", directory, *names]


def tail(path: str, lines: int) -> Argv:
    """The last ``lines`` lines of a file (the audit log)."""
    return ["tail", "-n", str(lines), path]


def disk_usage(paths: list[str]) -> Argv:
    """Bytes under each path (``du -sb``; missing paths are skipped)."""
    return ["sh", "-c", 'for p in "$@"; do [ -e "$p" ] && du -sb -- "$p"; done; true', "sh",
            *paths]
