"""GPU memory on the testbed's simulated GPU (docs/testbed-contract.md "Simulated GPU").

At start-up the server reserves memory on one simulated GPU the way TensorFlow's BFC
allocator does on a real one (allow_growth is off by default):
- fraction f > 0: reserve f x total; if that much is not free, start-up fails with an
  out-of-memory error;
- f = 0: TF's default takes all memory that is free at that moment, so a second server on
  the same GPU finds none and fails.
The reservation is a procs/<token>.json file kept under an exclusive flock for the process
lifetime; nvidia-smi reads these files. Every model version is then charged its footprint
(assets.extra/simgpu.json memory_mib, else variables x 2 + 64 MiB) against the reservation;
a version that does not fit fails to load with RESOURCE_EXHAUSTED.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import pathlib
import socket
import threading
import uuid
from collections.abc import Iterator
from typing import IO, Any

from . import log
from .model import variables_size
from .status import Code, ServingError

DEFAULT_DIR = "/run/simgpu"
# Below this much free memory TF cannot even create the CUDA context and device.
MIN_CONTEXT_MIB = 256
_WHERE = "external/local_xla/xla/stream_executor/cuda/cuda_driver.cc:1234"


def simgpu_dir() -> pathlib.Path:
    """The simulated-GPU directory (env SIMGPU_DIR overrides /run/simgpu)."""
    return pathlib.Path(os.environ.get("SIMGPU_DIR", DEFAULT_DIR))


def _visible_device(gpus: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The GPU this process would use: first of CUDA_/NVIDIA_VISIBLE_DEVICES, default 0."""
    spec = os.environ.get("CUDA_VISIBLE_DEVICES")
    if spec is None:
        spec = os.environ.get("NVIDIA_VISIBLE_DEVICES")
    if spec is None or spec.strip() in ("", "all"):
        first = "0" if spec is None or spec.strip() == "all" else ""
    else:
        first = spec.split(",")[0].strip()
    if first in ("", "none", "void", "-1"):
        return None
    for gpu in gpus:
        if str(gpu.get("index")) == first or gpu.get("uuid") == first:
            return gpu
    return None


def _footprint_mib(export_dir: str) -> int:
    declared = pathlib.Path(export_dir, "assets.extra", "simgpu.json")
    if declared.exists():
        try:
            return int(json.loads(declared.read_text())["memory_mib"])
        except (ValueError, KeyError, TypeError):
            log.warning("simgpu.py", f"Ignoring malformed {declared}")
    return (variables_size(export_dir) * 2) // (1 << 20) + 64


class GpuReservation:
    """This process's reservation on one simulated GPU, and the charges against it.

    Without allow_growth the whole limit is taken at start-up. With allow_growth (session
    config ``gpu_options { allow_growth: true }`` or TF_FORCE_GPU_ALLOW_GROWTH=true) the pool
    starts at the CUDA context size and grows on demand up to the limit, as long as the GPU has
    free memory; like TF's BFC allocator it never shrinks.
    """

    def __init__(self, directory: pathlib.Path, gpu: dict[str, Any], limit_mib: int,
                 pool_mib: int, handle: IO[str], *, growth: bool) -> None:
        self.directory = directory
        self.gpu = gpu
        self.reserved_mib = limit_mib
        self.pool_mib = pool_mib
        self.growth = growth
        self._handle = handle  # keeps the flock for the process lifetime
        self._charges: dict[str, int] = {}
        self._lock = threading.Lock()

    @property
    def device(self) -> str:
        """TF's device name for the GPU."""
        return "/job:localhost/replica:0/task:0/device:GPU:0"

    def charge(self, key: str, export_dir: str) -> None:
        """Charge a version's footprint, or raise RESOURCE_EXHAUSTED if it does not fit."""
        need = _footprint_mib(export_dir)
        with self._lock:
            used = sum(self._charges.values())
            base = MIN_CONTEXT_MIB if self.growth else 0
            if base + used + need > self.reserved_mib:
                raise self._oom(need, self.reserved_mib - base - used)
            if self.growth and base + used + need > self.pool_mib:
                self._grow(base + used + need, need)
            self._charges[key] = need

    def _grow(self, new_pool: int, need: int) -> None:
        with _locked(self.directory / "lock"):
            others = _live_usage(self.directory / "procs", int(self.gpu["index"]),
                                 exclude=self._handle.name)
            free = int(self.gpu["memory_total_mib"]) - others - self.pool_mib
            if new_pool - self.pool_mib > free:
                raise self._oom(need, free)
            self.pool_mib = new_pool
            _rewrite(self._handle, int(self.gpu["index"]), new_pool)

    def _oom(self, need: int, free: int) -> ServingError:
        return ServingError(
            Code.RESOURCE_EXHAUSTED,
            f"OOM when allocating tensor of {need} MiB on {self.device} by allocator "
            f"GPU_0_bfc: {max(free, 0)} MiB free (limit {self.reserved_mib} MiB for this "
            "process)")

    def release(self, key: str) -> None:
        """Give back a version's charge (on unload or failed load)."""
        with self._lock:
            self._charges.pop(key, None)


@contextlib.contextmanager
def _locked(path: pathlib.Path) -> Iterator[None]:
    with open(path, "a+") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _live_usage(procs: pathlib.Path, gpu_index: int, exclude: str = "") -> int:
    """MiB held on ``gpu_index`` by live owners; files of dead owners are deleted."""
    used = 0
    for path in sorted(procs.glob("*.json")):
        if exclude and os.path.samefile(path, exclude):
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


def _oom(need_mib: int) -> ServingError:
    need = need_mib << 20
    log.error(_WHERE, f"failed to allocate {need / (1 << 30):.2f}G ({need} bytes) from "
              "device: CUDA_ERROR_OUT_OF_MEMORY: out of memory")
    return ServingError(
        Code.INTERNAL,
        f"Failed to create GPU device /job:localhost/replica:0/task:0/device:GPU:0: "
        f"failed to allocate {need / (1 << 30):.2f}G ({need} bytes) from device: "
        "CUDA_ERROR_OUT_OF_MEMORY: out of memory")


def reserve(fraction: float, *, allow_growth: bool = False) -> GpuReservation | None:
    """Reserve GPU memory at start-up; None when this host/container has no simulated GPU."""
    directory = simgpu_dir()
    config = directory / "gpus.json"
    if not config.exists():
        return None
    gpus = json.loads(config.read_text()).get("gpus", [])
    gpu = _visible_device(gpus)
    if gpu is None:
        log.info("gpu_device.cc", "No visible simulated GPU; running on CPU only")
        return None
    procs = directory / "procs"
    procs.mkdir(parents=True, exist_ok=True)
    total = int(gpu["memory_total_mib"])
    with _locked(directory / "lock"):
        free = total - _live_usage(procs, int(gpu["index"]))
        limit = int(total * fraction) if fraction > 0 else free
        pool = MIN_CONTEXT_MIB if allow_growth else limit
        if pool > free or free < MIN_CONTEXT_MIB:
            raise _oom(pool if fraction > 0 else total)
        handle = _write_proc_file(procs, int(gpu["index"]), pool)
    log.info("gpu_device.cc", f"Created device /job:localhost/replica:0/task:0/device:GPU:0 "
             f"with {limit} MB memory:  -> device: 0, name: {gpu.get('name', 'GPU')}")
    return GpuReservation(directory, gpu, limit, pool, handle, growth=allow_growth)


def _record(gpu_index: int, used_mib: int) -> str:
    return json.dumps({"gpu": gpu_index, "used_mib": used_mib, "pid": os.getpid(),
                       "process_name": "tensorflow_model_server",
                       "container": socket.gethostname()})


def _rewrite(handle: IO[str], gpu_index: int, used_mib: int) -> None:
    handle.seek(0)
    handle.truncate()
    handle.write(_record(gpu_index, used_mib))
    handle.flush()


def _write_proc_file(procs: pathlib.Path, gpu_index: int, used_mib: int) -> IO[str]:
    token = f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    path = procs / f"{token}.json"
    handle = open(path, "w+")  # noqa: SIM115 - held open (and locked) for the process lifetime
    fcntl.flock(handle, fcntl.LOCK_EX)
    _rewrite(handle, gpu_index, used_mib)
    return handle
