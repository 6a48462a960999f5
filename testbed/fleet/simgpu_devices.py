"""Which simulated GPUs a container gets: the NVIDIA Container Toolkit's rules, for the testbed.

Shared by the testbed's OCI runtime wrapper (simgpu_runtime.py) and its prestart hook
(nvidia_container_hook.py); stdlib only, because containerd's shim and runc run them.

Facts, from the NVIDIA Container Toolkit (internal/config/image/cuda_image.go, devices.go,
builder.go, capabilities.go; cmd/nvidia-container-runtime-hook/container_config.go):
- the OCI spec's process environment is read as a map, so a variable given twice counts with its
  LAST value (dockerd appends NVIDIA_VISIBLE_DEVICES after the image's own environment);
- NVIDIA_VISIBLE_DEVICES unset, empty, or with a `void` entry: not a GPU container, the hook does
  nothing; except that a "legacy" CUDA image (CUDA_VERSION set, NVIDIA_REQUIRE_CUDA unset) with
  the variable unset gets `all`;
- `all`: every GPU; `none`: a GPU container without devices (the driver's tools only); otherwise
  a comma list of GPU indices or UUIDs, each of which must exist
  (nvidia-container-cli: "device error: <id>: unknown device");
- NVIDIA_DRIVER_CAPABILITIES unset or empty: compute,utility (unset on a legacy image: all);
  `utility` is what mounts nvidia-smi into the container.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

VISIBLE = "NVIDIA_VISIBLE_DEVICES"
CAPABILITIES = "NVIDIA_DRIVER_CAPABILITIES"
DEFAULT_CAPABILITIES = frozenset({"compute", "utility"})
ALL_CAPABILITIES = frozenset(
    {"compute", "compat32", "graphics", "utility", "video", "display", "ngx"}
)
HOOK_NAME = "nvidia-container-runtime-hook"


class DeviceError(Exception):
    """A requested GPU does not exist on the host; the message is nvidia-container-cli's."""


def env_map(env: Iterable[str]) -> dict[str, str]:
    """An OCI process environment as a map; a later entry of the same name wins."""
    found: dict[str, str] = {}
    for entry in env:
        name, sep, value = entry.partition("=")
        if sep:
            found[name] = value
    return found


def is_legacy_image(env: Mapping[str, str]) -> bool:
    """CUDA_VERSION set and NVIDIA_REQUIRE_CUDA unset (images older than the toolkit's rules)."""
    return bool(env.get("CUDA_VERSION")) and not env.get("NVIDIA_REQUIRE_CUDA")


def requested_devices(env: Mapping[str, str]) -> list[str] | None:
    """The devices a container asks for: None when it is not a GPU container, [] for `none`,
    ["all"], or the listed indices/UUIDs in the order given."""
    value = env.get(VISIBLE)
    if value is None and is_legacy_image(env):
        value = "all"
    entries = [part.strip() for part in (value or "").split(",") if part.strip()]
    if not entries or "void" in entries:
        return None
    for entry in entries:  # the first keyword decides, as in the toolkit's NewVisibleDevices
        if entry == "all":
            return ["all"]
        if entry == "none":
            return []
    return entries


def capabilities(env: Mapping[str, str]) -> frozenset[str]:
    """The driver capabilities the container gets."""
    value = env.get(CAPABILITIES)
    if value is None and is_legacy_image(env):
        return ALL_CAPABILITIES
    wanted = {part.strip() for part in (value or "").split(",") if part.strip()}
    if not wanted:
        return DEFAULT_CAPABILITIES
    if "all" in wanted:
        return ALL_CAPABILITIES
    return frozenset(wanted & ALL_CAPABILITIES)


def select_gpus(gpus: Sequence[dict[str, Any]], requested: Sequence[str]) -> list[dict[str, Any]]:
    """The host's GPU entries a request names, in the host's order (the order the container
    enumerates them in), each once; DeviceError for an id the host does not have."""
    if list(requested) == ["all"]:
        return list(gpus)
    chosen: set[int] = set()
    for item in requested:
        matches = [
            position
            for position, gpu in enumerate(gpus)
            if item == str(gpu.get("index")) or item == gpu.get("uuid")
        ]
        if not matches:
            raise DeviceError(f"device error: {item}: unknown device")
        chosen.update(matches)
    return [gpu for position, gpu in enumerate(gpus) if position in chosen]


def view_document(
    host_doc: Mapping[str, Any], selected: Sequence[dict[str, Any]]
) -> dict[str, Any]:
    """The gpus.json a container sees: the host's document with only its GPUs.

    Each entry is the host's own, `index` included: like a device node (/dev/nvidia1 keeps its
    minor number inside the container), the file keeps the host's numbering, so a server that
    reads NVIDIA_VISIBLE_DEVICES finds its GPUs in it and records its usage under the host's
    index; enumeration (nvidia-smi, the server's device ordinals) numbers them from 0.
    """
    doc = {key: value for key, value in host_doc.items() if key != "gpus"}
    doc["gpus"] = [dict(gpu) for gpu in selected]
    return doc


def has_nvidia_hook(spec: Mapping[str, Any]) -> bool:
    """The spec already runs the NVIDIA prestart hook (dockerd adds it for `--gpus`)."""
    hooks = (spec.get("hooks") or {}).get("prestart") or []
    return any(str(hook.get("path", "")).rsplit("/", 1)[-1] == HOOK_NAME for hook in hooks)
