#!/usr/bin/python3
"""OCI runtime wrapper of the testbed's simulated GPU (registered with each host's dockerd).

Like nvidia-container-runtime does for real GPUs, it edits the bundle's config.json on
`create` (and `run`) so that every container gets the host's /run/simgpu bind-mounted at the
same path, then execs runc with the unchanged arguments.  Stdlib only: containerd's shim runs it.
"""

from __future__ import annotations

import json
import os
import sys

RUNC = os.environ.get("SIMGPU_RUNC", "/usr/sbin/runc")
SIMGPU = "/run/simgpu"
# runc's global options that take a value (they come before the command)
GLOBAL_VALUE_FLAGS = {"--root", "--log", "--log-format", "--criu", "--rootless"}


def find_command(args: list[str]) -> tuple[str | None, int]:
    """The runc command (create, start, ...) and its position, skipping global options."""
    i = 0
    while i < len(args):
        arg = args[i]
        if arg in GLOBAL_VALUE_FLAGS:
            i += 2
            continue
        if arg.startswith("-"):
            i += 1
            continue
        return arg, i
    return None, -1


def find_bundle(args: list[str]) -> str:
    for i, arg in enumerate(args):
        if arg in ("--bundle", "-b") and i + 1 < len(args):
            return args[i + 1]
        if arg.startswith("--bundle="):
            return arg.split("=", 1)[1]
    return os.getcwd()


def add_simgpu_mount(config_path: str) -> None:
    with open(config_path) as f:
        config = json.load(f)
    mounts = config.setdefault("mounts", [])
    if any(m.get("destination") == SIMGPU for m in mounts):
        return
    mounts.append(
        {
            "destination": SIMGPU,
            "type": "bind",
            "source": SIMGPU,
            "options": ["rbind", "rw", "nosuid", "nodev"],
        }
    )
    tmp = config_path + ".simgpu.tmp"
    with open(tmp, "w") as f:
        json.dump(config, f)
    os.replace(tmp, config_path)


def main() -> None:
    args = sys.argv[1:]
    command, pos = find_command(args)
    if command in ("create", "run") and os.path.isdir(SIMGPU):
        add_simgpu_mount(os.path.join(find_bundle(args[pos + 1 :]), "config.json"))
    os.execv(RUNC, [RUNC, *args])


if __name__ == "__main__":
    main()
