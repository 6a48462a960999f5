"""Files and directories on a host: create, write, link, append, remove (pure argv builders).

Every rename that publishes state is durable. A rename is only as durable as the directory
entry it changes, and the renamed file only as complete as its last fsync: after a power loss
an unsynced rename may be gone, or (ext4's delayed allocation, xfs) point at an empty file. So
the new file (or tree) and its directory are fsynced before the rename, and the directory again
after it. The tool is ``sync FILE...``: GNU coreutils since 8.24 (2015) opens each argument
(``O_RDONLY|O_NONBLOCK``, directories too) and calls fsync(2) on it (src/sync.c,
``sync_arg``); an older ``sync`` ignores its arguments and calls sync(2), which on Linux waits
for every file system: slower, as durable. fsync(2) is what ext4 and xfs document for this
(a directory's fsync commits the journal or log holding the rename); on overlayfs fsync of a
file or a directory goes to the upper layer's file or directory (fs/overlayfs ``ovl_fsync``,
``ovl_dir_fsync``), so the same commands hold there.
"""

from __future__ import annotations

from tfsdeploy.hosts.commands import Argv

# fsync each argument (files and directories); see the module's docstring
SYNC = "sync --"


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


def publish_sh(new: str, final: str) -> str:
    """Shell: rename ``new`` (a file, a tree or a symlink) over ``final`` durably: every file
    and directory of ``new`` and the parent directory fsynced before the rename (a symlink
    lives in its directory), the parent again after it. Both are shell words (``"$1"``)."""
    return (f'd=$(dirname -- {final}) && find {new} ! -type l -exec {SYNC} {{}} + && '
            f'{SYNC} "$d" && mv -f -T -- {new} {final} && {SYNC} "$d"')


# stdin -> a temporary name beside the file -> mode -> durable rename over it
_WRITE = ('t="$1.tmp-$$"; { cat > "$t" && chmod "$2" "$t" && ' + publish_sh('"$t"', '"$1"')
          + '; } || { rm -f -- "$t"; exit 1; }')


def write_file(path: str, *, mode: int = 0o644) -> Argv:
    """Write stdin to ``path`` atomically and durably: a temporary name beside it, fsynced,
    renamed over it, the directory fsynced (its directory must exist)."""
    return ["sh", "-c", _WRITE, "sh", path, f"{mode:o}"]


def write_tree(directory: str, *, root: str) -> Argv:
    """Unpack the tar archive on stdin as the directory ``directory`` (inside ``root``), in
    one command for a release's files: into a temporary directory beside it, every file
    fsynced, then renamed into place, the parent fsynced. When the directory is there already
    (a paused canary's release, written by the run that paused; its container has it mounted)
    each file is renamed over its namesake instead: the directory itself stays."""
    one = publish_sh('"$f"', '"$1/${f##*/}"')
    script = ('t="$1.tmp-$$"; rm -rf -- "$t"; { mkdir -p -- "$t" && tar -x -C "$t" -f - && '
              'if [ -d "$1" ]; then for f in "$t"/*; do ' + one + ' || exit 1; done; '
              'rm -rf -- "$t"; else ' + publish_sh('"$t"', '"$1"') + '; fi; } || '
              '{ rm -rf -- "$t"; exit 1; }')
    return ["sh", "-c", script, "sh", inside(directory, root)]


def point_symlink(target: str, link: str) -> Argv:
    """Replace ``link`` atomically and durably with a symlink to ``target`` (a new link
    renamed over the old one; the directory fsynced before and after)."""
    return ["sh", "-c", 'ln -sfn -- "$1" "$2.new" && ' + publish_sh('"$2.new"', '"$2"'),
            "sh", target, link]


def append_lines(path: str, lines: list[str]) -> Argv:
    """Append lines to a file (the audit log), creating its directory if needed; the file and
    its directory are fsynced after the append (a record that survives power loss)."""
    return ["sh", "-c", 'f="$1"; shift; d=$(dirname -- "$f"); mkdir -p -- "$d" && '
            f'printf "%s\\n" "$@" >> "$f" && {SYNC} "$f" "$d"', "sh", path, *lines]


def read_files(directory: str, names: tuple[str, ...]) -> Argv:
    """Print each named file of ``directory`` after a ``@@file <name>`` line (exit 1 when one
    is missing)."""
    return ["sh", "-c", 'd="$1"; shift; for n in "$@"; do echo "@@file $n"; '
            'cat "$d/$n" || exit 1; echo; done; echo "@@end"', "sh", directory, *names]


ABSENT = 3  # read_if_present's exit status when there is no such file


def read_if_present(path: str) -> Argv:
    """Print a file; exit ``ABSENT`` when it does not exist (any other failure: another
    status), so that "no file yet" and "could not read it" differ."""
    return ["sh", "-c", 'if [ -e "$1" ]; then exec cat -- "$1"; fi; exit 3', "sh", path]


def tail(path: str, lines: int) -> Argv:
    """The last ``lines`` lines of a file (the audit log)."""
    return ["tail", "-n", str(lines), path]


def disk_usage(paths: list[str]) -> Argv:
    """Bytes under each path (``du -sb``; missing paths are skipped)."""
    return ["sh", "-c", 'for p in "$@"; do [ -e "$p" ] && du -sb -- "$p"; done; true', "sh",
            *paths]
