"""GPU memory on the testbed's simulated GPUs (docs/testbed-contract.md "Simulated GPU").

Which GPUs: the host's GPUs (``/run/simgpu/gpus.json``) that NVIDIA_VISIBLE_DEVICES exposes to
the container (indices or UUIDs; ``all``; unset counts as ``all`` because the tensorflow/serving
-gpu images set it so; empty, ``none`` or ``void``: none), then CUDA_VISIBLE_DEVICES among those,
renumbered from 0 as nvidia-container-runtime and CUDA do (an invalid entry ends the list; -1 or
empty: none). TensorFlow makes a device of every one it sees.

The memory CUDA can use is the card's total less what its driver reserves (gpus.json
``memory_reserved_mib``, default 0; an H200 on driver 580 reserves 616 of its 143,771 MiB and
cuMemGetInfo's total is 143,156 MiB): TensorFlow's limit is ``fraction x`` that total
(gpu_device.cc SingleVirtualDeviceMemoryLimit: ``total_memory * per_process_gpu_memory_fraction``
with ``total_memory`` from DeviceMemoryUsage, i.e. cuMemGetInfo), and free memory is that total
less what every process holds.

What a process holds on each visible GPU, as TensorFlow does (tensorflow/core/common_runtime/gpu/
gpu_device.cc, xla/tsl/framework/bfc_allocator.cc):
- a CUDA context (``context_mib`` of gpus.json, default 256 MiB): if it does not fit, creating
  the device fails, so every session (model load) fails;
- a BFC allocator limited to ``fraction x total`` (fraction 0: the memory free after the context
  minus MinSystemMemory). Without allow_growth its first allocation asks for the whole limit and,
  when that is not free, backs off by 10% steps until something fits: the server starts anyway
  and a model that needs more than it got fails later with RESOURCE_EXHAUSTED (OOM), after one
  more attempt to grow to the full limit. With allow_growth it grows by what each version needs.
Models run on GPU 0 of the visible set: each version is charged ``assets.extra/simgpu.json``
``memory_mib`` (default variables x 2 + 64 MiB) there. Memory is taken when the first version
loads (that is when TensorFlow creates its devices) and is never given back, like the BFC
allocator.

Records: one ``procs/<token>.json`` per visible GPU (``{"gpu": <host index>, "used_mib": ...}``,
the format nvidia_smi.py reads), each under an exclusive flock held for the process lifetime,
written while holding ``lock``; files of dead owners are deleted by the next reader.
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import json
import os
import pathlib
import socket
import threading
import uuid
from collections.abc import Iterator, Sequence
from typing import IO, Any

from . import log
from .model import variables_size
from .status import Code, ServingError

DEFAULT_DIR = "/run/simgpu"
DEFAULT_CONTEXT_MIB = 256
DEFAULT_COMPUTE_CAPABILITY = "7.5"  # the Tesla T4 the testbed simulates
BACKPEDAL = 0.9  # BFCAllocator::Extend's kBackpedalFactor
_DRIVER = "external/local_xla/xla/stream_executor/cuda/cuda_driver.cc"
_DEVICE = "tensorflow/core/common_runtime/gpu/gpu_device.cc"


def simgpu_dir() -> pathlib.Path:
    """The simulated-GPU directory (env SIMGPU_DIR overrides /run/simgpu)."""
    return pathlib.Path(os.environ.get("SIMGPU_DIR", DEFAULT_DIR))


def _select(gpus: Sequence[dict[str, Any]], spec: str, *, by_position: bool
            ) -> list[dict[str, Any]]:
    """Entries named by a comma list of indices or UUIDs; stops at the first unknown one."""
    chosen = []
    for item in (part.strip() for part in spec.split(",")):
        match = None
        for position, gpu in enumerate(gpus):
            index = str(position) if by_position else str(gpu.get("index"))
            if item == index or (item.startswith("GPU-") and gpu.get("uuid") == item):
                match = gpu
        if match is None:
            break
        chosen.append(match)
    return chosen


def visible_gpus(gpus: Sequence[dict[str, Any]], environ: dict[str, str] | os._Environ[str]
                 ) -> list[dict[str, Any]]:
    """The host GPUs this process sees, in CUDA order (its device 0 first)."""
    nvidia = environ.get("NVIDIA_VISIBLE_DEVICES")
    if nvidia is None or nvidia.strip() == "all":
        exposed = list(gpus)
    elif nvidia.strip() in ("", "none", "void"):
        exposed = []
    else:
        exposed = _select(gpus, nvidia, by_position=False)
    cuda = environ.get("CUDA_VISIBLE_DEVICES")
    if cuda is None:
        return exposed
    if cuda.strip() in ("", "-1"):
        return []
    return _select(exposed, cuda, by_position=True)


def min_system_memory(available_mib: int, cc_major: int) -> int:
    """gpu_device.cc MinSystemMemory (optimized build), in MiB."""
    if available_mib < 2048:
        return 225
    if cc_major <= 6:
        return 500
    if cc_major <= 7:
        return 1050
    if cc_major <= 8:
        return 1536
    return 1800


def footprint_mib(export_dir: str) -> int:
    """What a version needs on the GPU: simgpu.json memory_mib, else variables x 2 + 64."""
    declared = pathlib.Path(export_dir, "assets.extra", "simgpu.json")
    if declared.exists():
        try:
            return int(json.loads(declared.read_text())["memory_mib"])
        except (ValueError, KeyError, TypeError):
            log.warning("simgpu.py", f"Ignoring malformed {declared}")
    return (variables_size(export_dir) * 2) // (1 << 20) + 64


@contextlib.contextmanager
def _locked(path: pathlib.Path) -> Iterator[None]:
    with open(path, "a+") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def live_usage(procs: pathlib.Path, gpu_index: int, exclude: Sequence[str] = ()) -> int:
    """MiB held on host GPU ``gpu_index`` by live owners; files of dead owners are deleted."""
    used = 0
    for path in sorted(procs.glob("*.json")):
        if str(path) in exclude:
            continue
        try:
            with open(path) as handle:
                try:
                    fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except BlockingIOError:
                    record = json.loads(handle.read() or "{}")
                    if int(record.get("gpu", -1)) == gpu_index:
                        used += int(record.get("used_mib", 0))
                    continue
                path.unlink(missing_ok=True)  # we got the lock: the owner is dead
        except (OSError, ValueError):
            continue
    return used


def _record(gpu_index: int, used_mib: int) -> str:
    return json.dumps({"gpu": gpu_index, "used_mib": used_mib, "pid": os.getpid(),
                       "process_name": "tensorflow_model_server",
                       "container": socket.gethostname()})


def _write(handle: IO[str], gpu_index: int, used_mib: int) -> None:
    handle.seek(0)
    handle.truncate()
    handle.write(_record(gpu_index, used_mib))
    handle.flush()


def _oom_log(mib: int) -> None:
    size = mib << 20
    log.warning(_DRIVER, f"failed to allocate {size / (1 << 30):.2f}GiB ({size} bytes) from "
                "device: CUDA_ERROR_OUT_OF_MEMORY: out of memory")


@dataclasses.dataclass
class Device:
    """One visible GPU as TensorFlow holds it: context, BFC limit and region, the record."""

    ordinal: int
    gpu: dict[str, Any]
    context_mib: int
    limit_mib: int = 0
    region_mib: int = 0
    handle: IO[str] | None = None

    @property
    def host_index(self) -> int:
        """The GPU's index on the host (what nvidia-smi shows)."""
        return int(self.gpu["index"])

    @property
    def total_mib(self) -> int:
        """The GPU's memory CUDA can use (cuMemGetInfo's total): nvidia-smi's total less the
        driver's reserve."""
        return int(self.gpu["memory_total_mib"]) - int(self.gpu.get("memory_reserved_mib", 0))

    @property
    def name(self) -> str:
        """TF's device name."""
        return f"/job:localhost/replica:0/task:0/device:GPU:{self.ordinal}"


class GpuProcess:
    """This process's view of its visible simulated GPUs and what it holds on them."""

    def __init__(self, directory: pathlib.Path, gpus: list[dict[str, Any]], fraction: float,
                 *, growth: bool) -> None:
        self.directory = directory
        self.procs = directory / "procs"
        self.fraction = fraction
        self.growth = growth
        self.devices = [Device(i, gpu, int(gpu.get("context_mib", DEFAULT_CONTEXT_MIB)))
                        for i, gpu in enumerate(gpus)]
        self._created = False
        self._charges: dict[str, int] = {}
        self._lock = threading.Lock()

    def _others(self, device: Device) -> int:
        mine = [d.handle.name for d in self.devices if d.handle is not None]
        return live_usage(self.procs, device.host_index, exclude=mine)

    def _publish(self, device: Device) -> None:
        used = device.context_mib + device.region_mib
        if device.handle is None:
            token = f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:8]}"
            # held open and locked for the process lifetime: the lock says "owner alive"
            device.handle = open(self.procs / f"{token}.json", "w+")  # noqa: SIM115
            fcntl.flock(device.handle, fcntl.LOCK_EX)
        _write(device.handle, device.host_index, used)

    def _create_devices(self) -> None:
        """BaseGPUDeviceFactory::CreateDevices: a context and an allocator per visible GPU."""
        self.procs.mkdir(parents=True, exist_ok=True)
        with _locked(self.directory / "lock"):
            for device in self.devices:
                if device.handle is None:
                    self._create_context(device)
            for device in self.devices:
                self._create_allocator(device)
        self._created = True

    def _create_context(self, device: Device) -> None:
        free = device.total_mib - self._others(device)
        if free < device.context_mib:
            raise ServingError(
                Code.INTERNAL,
                f"failed initializing StreamExecutor for CUDA device ordinal {device.ordinal} "
                "stream group 0: INTERNAL: failed call to cuDevicePrimaryCtxRetain: "
                "CUDA_ERROR_OUT_OF_MEMORY: out of memory; total memory reported: "
                f"{device.total_mib << 20}")
        self._publish(device)

    def _create_allocator(self, device: Device) -> None:
        free = device.total_mib - self._others(device) - device.context_mib
        if self.fraction > 0:
            device.limit_mib = int(device.total_mib * self.fraction)
        else:
            reserve = min_system_memory(free, int(str(device.gpu.get(
                "compute_capability", DEFAULT_COMPUTE_CAPABILITY)).split(".")[0]))
            device.limit_mib = free - reserve if reserve < free else free
        log.info(_DEVICE, f"Created device {device.name} with {device.limit_mib} MB memory:  "
                 f"-> device: {device.ordinal}, name: {device.gpu.get('name', 'GPU')}, pci "
                 f"bus id: 0000:{device.host_index + 1:02x}:00.0")
        if not self.growth:
            device.region_mib = self._first_region(device, free)
            self._publish(device)

    def _first_region(self, device: Device, free: int) -> int:
        """The first Extend: the whole limit, else 10% less and less while it does not fit."""
        want = device.limit_mib
        if want <= free:
            return want
        _oom_log(want)
        while want > 1:
            want = int(want * BACKPEDAL)
            if want <= free:
                return want
            _oom_log(want)
        return 0

    def charge(self, key: str, export_dir: str) -> None:
        """Charge a version's footprint on GPU 0; RESOURCE_EXHAUSTED when it does not fit."""
        need = footprint_mib(export_dir)
        with self._lock:
            if not self._created:
                self._create_devices()
            if not self.devices:
                return
            device = self.devices[0]
            used = sum(self._charges.values())
            if used + need > device.region_mib:
                self._extend(device, used + need - device.region_mib, need)
            self._charges[key] = need

    def _extend(self, device: Device, shortfall: int, need: int) -> None:
        """A later Extend: what is left of the limit (growth: the shortfall), if free now."""
        available = device.limit_mib - device.region_mib
        if shortfall > available:
            raise self._oom(device, need, available)
        grow = shortfall if self.growth else available
        with _locked(self.directory / "lock"):
            free = device.total_mib - self._others(device) - device.context_mib \
                - device.region_mib
            if grow > free:
                _oom_log(grow)
                raise self._oom(device, need, max(0, free))
            device.region_mib += grow
            self._publish(device)

    def _oom(self, device: Device, need: int, free: int) -> ServingError:
        return ServingError(
            Code.RESOURCE_EXHAUSTED,
            f"OOM when allocating tensor of {need} MiB on {device.name} by allocator "
            f"GPU_{device.ordinal}_bfc: {free} MiB could be added to its {device.region_mib} "
            f"MiB (limit {device.limit_mib} MiB)")

    def release(self, key: str) -> None:
        """Give a version's charge back to the allocator (the process keeps the memory)."""
        with self._lock:
            self._charges.pop(key, None)


def reserve(fraction: float, *, allow_growth: bool = False,
            environ: dict[str, str] | os._Environ[str] | None = None) -> GpuProcess | None:
    """This process's simulated GPUs; None when the host (or container) has none."""
    directory = simgpu_dir()
    config = directory / "gpus.json"
    if not config.exists():
        return None
    gpus = json.loads(config.read_text()).get("gpus", [])
    visible = visible_gpus(gpus, os.environ if environ is None else environ)
    if not visible:
        log.info(_DEVICE, "No visible simulated GPU; running on CPU only")
        return None
    return GpuProcess(directory, visible, fraction, growth=allow_growth)


# the name core.py and server.py use for the reservation object
GpuReservation = GpuProcess
