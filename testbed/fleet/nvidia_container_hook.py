#!/usr/bin/python3 -S
"""The testbed's stand-in for nvidia-container-runtime-hook: gives a container its simulated GPUs.

Installed as `$STATE/bin/nvidia-container-runtime-hook`, on the PATH of every testbed dockerd.
How a real host works (moby v20.10 daemon/nvidia_linux.go, nvidia-container-toolkit
cmd/nvidia-container-runtime-hook/main.go):
- dockerd registers its "nvidia" device driver at start-up only if this executable is on its
  PATH; without it `docker run --gpus ...` fails ("could not select device driver");
- for a GPU request (`--gpus all|N|device=...`, the SDK's DeviceRequest(capabilities=[["gpu"]]))
  dockerd appends NVIDIA_VISIBLE_DEVICES=all|0,..,N-1|<ids> (and NVIDIA_DRIVER_CAPABILITIES when
  the request names driver capabilities) to the container's environment and adds this program
  as a prestart hook with the arguments `nvidia-container-runtime-hook prestart`;
- runc runs prestart hooks after the container's mounts are made and before it pivots into its
  root, with the container state (pid, bundle) on stdin; the real hook then runs
  `nvidia-container-cli configure --pid=<pid> --device=... <rootfs>`, which enters the
  container's mount namespace and mounts the device nodes of the chosen GPUs, the driver
  libraries and (capability `utility`) nvidia-smi into the root file system.

This one does the same with the simulated GPUs: in the container's mount namespace it mounts a
small tmpfs at <rootfs>/run/simgpu holding a gpus.json with only the chosen GPUs
(simgpu_devices.view_document), binds the host's procs/ and lock into it (reservations are
host-wide: every process on a GPU sees the others'), and binds the testbed's nvidia-smi at
/usr/bin/nvidia-smi. Errors are nvidia-container-cli's, and fail the container's start.
`poststart` and `poststop` do nothing, as in the real hook. Stdlib only.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any, TextIO

from simgpu_devices import (
    DeviceError,
    capabilities,
    env_map,
    requested_devices,
    select_gpus,
    view_document,
)

SIMGPU = Path("/run/simgpu")
NVIDIA_SMI = Path("/usr/local/bin/nvidia-smi")
CONTAINER_NVIDIA_SMI = "usr/bin/nvidia-smi"
USAGE = (
    "Usage of nvidia-container-runtime-hook:\n"
    "Commands:\n  prestart\n        run the prestart hook\n"
    "  poststart\n        no-op\n  poststop\n        no-op\n"
)


class HookError(Exception):
    """The container cannot have the GPUs it asks for; the message follows nvidia-container-cli."""


def container_spec(state: dict[str, Any]) -> tuple[Path, dict[str, Any]]:
    """The bundle directory and the OCI spec of the container being created."""
    bundle = Path(state.get("bundle") or state.get("bundlePath") or "")
    return bundle, json.loads((bundle / "config.json").read_text())


def rootfs_path(bundle: Path, spec: dict[str, Any]) -> Path:
    """The container's root file system as seen before runc pivots into it."""
    root = Path(spec["root"]["path"])
    return root if root.is_absolute() else bundle / root


def host_gpus() -> dict[str, Any]:
    """The host's gpus.json; a host without it has no GPU driver."""
    try:
        return dict(json.loads((SIMGPU / "gpus.json").read_text()))
    except FileNotFoundError:
        raise HookError("initialization error: nvml error: driver not loaded") from None


def prestart(state: dict[str, Any]) -> None:
    """Give the container of ``state`` the GPUs its environment asks for (nothing if none)."""
    bundle, spec = container_spec(state)
    env = env_map(spec.get("process", {}).get("env") or [])
    requested = requested_devices(env)
    if requested is None:
        return  # not a GPU container
    doc = host_gpus()
    try:
        selected = select_gpus(doc.get("gpus", []), requested)
    except DeviceError as exc:
        raise HookError(str(exc)) from None
    utility = "utility" in capabilities(env)
    argv = [
        "nsenter", f"--target={int(state['pid'])}", "--mount", "--",
        sys.executable, str(Path(__file__).resolve()), "configure",
        str(rootfs_path(bundle, spec)), "utility" if utility else "-",
    ]
    done = subprocess.run(argv, input=json.dumps(view_document(doc, selected)), text=True,
                          capture_output=True, check=False)
    if done.returncode != 0:
        raise HookError(f"mount error: {(done.stderr or done.stdout).strip()}")


def inside(rootfs: Path, relative: str) -> Path:
    """``rootfs``/``relative``, refusing a path that a symlink leads out of the container."""
    path = rootfs / relative
    real, root = os.path.realpath(path), os.path.realpath(rootfs)
    if not real.startswith(root + os.sep):
        raise HookError(f"{relative} leads out of the container's root file system ({real})")
    return path


def mount(*args: str | Path) -> None:
    """Run mount(8); its error becomes the hook's."""
    done = subprocess.run(["mount", *map(str, args)], capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise HookError(f"mount {' '.join(map(str, args))}: {done.stderr.strip()}")


def configure(rootfs: Path, utility: bool, view: str) -> None:
    """In the container's mount namespace: its /run/simgpu and, for `utility`, nvidia-smi."""
    target = inside(rootfs, "run/simgpu")
    target.mkdir(parents=True, exist_ok=True)
    inside(rootfs, "run/simgpu")  # again: the directories now exist, symlinks would show
    mount("-t", "tmpfs", "-o", "nosuid,nodev,noexec,mode=0755,size=1m", "simgpu", target)
    (target / "gpus.json").write_text(view + "\n")
    (target / "procs").mkdir()
    (target / "lock").touch()
    mount("--bind", SIMGPU / "procs", target / "procs")
    mount("--bind", SIMGPU / "lock", target / "lock")
    # the GPU list is the runtime's, not the container's to change (procs/ and lock stay rw)
    mount("-o", "remount,ro,nosuid,nodev,noexec", target)
    if utility and NVIDIA_SMI.exists():
        tool = inside(rootfs, CONTAINER_NVIDIA_SMI)
        tool.parent.mkdir(parents=True, exist_ok=True)
        tool.touch()
        mount("--bind", NVIDIA_SMI, tool)
        mount("-o", "remount,bind,ro,nosuid,nodev", tool)


def main(argv: list[str], stdin: TextIO) -> int:
    """`prestart` (state on stdin), `poststart`/`poststop` (nothing), `configure` (internal)."""
    words = [arg for arg in argv if not arg.startswith("-") or arg == "-"]
    try:
        if words[:1] == ["prestart"]:
            prestart(json.load(stdin))
        elif words[:1] == ["configure"] and len(words) == 3:
            configure(Path(words[1]), words[2] == "utility", stdin.read())
        elif words[:1] not in (["poststart"], ["poststop"]):
            sys.stderr.write(USAGE)
            return 2
    except HookError as exc:
        # `configure` reports to prestart, which names the tool once for both
        prefix = "" if words[:1] == ["configure"] else "nvidia-container-cli: "
        sys.stderr.write(f"{prefix}{exc}\n")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:], sys.stdin))
