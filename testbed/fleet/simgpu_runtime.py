#!/usr/bin/python3 -S
"""OCI runtime wrapper of the testbed's simulated GPUs (each host dockerd's default runtime).

It does what nvidia-container-runtime does in its "legacy" mode (nvidia-container-toolkit,
internal/modifier/stable.go): on `create` (and `run`) it puts the NVIDIA prestart hook into the
bundle's config.json unless the spec has it already, then execs runc with the unchanged
arguments. The hook (here the testbed's nvidia-container-runtime-hook) gives the container its
GPUs. The real wrapper adds the hook to every container and the hook returns at once for
containers that ask for no GPU; this one adds it only to those that ask (NVIDIA_VISIBLE_DEVICES,
simgpu_devices.py), which ends the same and saves a process per container.

So `docker run -e NVIDIA_VISIBLE_DEVICES=1 ...` gets GPU 1 through this runtime, `--gpus ...`
through dockerd (which adds the hook itself), and a container asking for nothing gets no GPU.
Stdlib only: containerd's shim runs it.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

from simgpu_devices import HOOK_NAME, env_map, has_nvidia_hook, requested_devices

RUNC = os.environ.get("SIMGPU_RUNC", "/usr/sbin/runc")
HERE = Path(__file__).resolve().parent
HOOK = Path(os.environ.get("SIMGPU_HOOK", str(HERE / "nvidia-container-runtime-hook")))
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
    """The bundle directory of a create/run command (runc's default: the working directory)."""
    for i, arg in enumerate(args):
        if arg in ("--bundle", "-b") and i + 1 < len(args):
            return args[i + 1]
        if arg.startswith("--bundle="):
            return arg.split("=", 1)[1]
    return os.getcwd()


def with_gpu_hook(spec: dict[str, Any], hook: Path) -> dict[str, Any] | None:
    """The spec with the NVIDIA prestart hook added, or None when it needs no change."""
    env = env_map((spec.get("process") or {}).get("env") or [])
    if requested_devices(env) is None or has_nvidia_hook(spec):
        return None
    hooks = spec.setdefault("hooks", {})
    hooks.setdefault("prestart", []).append({"path": str(hook), "args": [HOOK_NAME, "prestart"]})
    return spec


def add_gpu_hook(config_path: Path) -> None:
    """Rewrite the bundle's config.json (atomically) if the container asks for GPUs."""
    spec = with_gpu_hook(json.loads(config_path.read_text()), HOOK)
    if spec is None:
        return
    tmp = config_path.with_name(config_path.name + ".simgpu.tmp")
    tmp.write_text(json.dumps(spec))
    os.replace(tmp, config_path)


def main() -> None:
    args = sys.argv[1:]
    command, pos = find_command(args)
    if command in ("create", "run"):
        add_gpu_hook(Path(find_bundle(args[pos + 1 :])) / "config.json")
    os.execv(RUNC, [RUNC, *args])


if __name__ == "__main__":
    main()
