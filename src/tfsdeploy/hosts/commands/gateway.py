"""Commands on a gateway host (pure builders)."""

from __future__ import annotations

from tfsdeploy.hosts.commands import Argv


def check_config(image: str, directory: str, files_dir: str, config: str) -> Argv:
    """``haproxy -c`` of the configuration in ``directory`` in a throw-away container of the
    gateway's own image (the HAProxy that will load it), the directory mounted where the
    gateway sees its files, no network, nothing written."""
    return ["docker", "run", "--rm", "--network", "none", "--read-only", "--cap-drop", "ALL",
            "--security-opt", "no-new-privileges", "-v", f"{directory}:{files_dir}:ro",
            "--entrypoint", "haproxy", image, "-c", "-f", f"{files_dir}/{config}"]


def list_files(directory: str) -> Argv:
    """The names of the files of ``directory`` (none when it does not exist)."""
    return ["sh", "-c", 'cd -- "$1" 2>/dev/null && for f in *; do [ -f "$f" ] && '
            'echo "$f"; done; true', "sh", directory]


def remove_files(directory: str, names: list[str]) -> Argv:
    """Remove the named files of ``directory``."""
    return ["sh", "-c", 'd="$1"; shift; for n in "$@"; do rm -f -- "$d/$n"; done', "sh",
            directory, *names]


def read_records(directory: str) -> Argv:
    """Every file two levels under ``directory`` (``<model>/<host>``), each after a
    ``@@file <model>/<host>`` line, then ``@@end`` (nothing when it does not exist)."""
    return ["sh", "-c", 'cd -- "$1" 2>/dev/null && for f in */*; do [ -f "$f" ] && '
            '{ echo "@@file $f"; cat -- "$f"; echo; }; done; echo "@@end"', "sh", directory]


def read_if_present(path: str) -> Argv:
    """The file at ``path``; nothing (and exit 0) when there is none."""
    return ["sh", "-c", 'cat -- "$1" 2>/dev/null; true', "sh", path]
