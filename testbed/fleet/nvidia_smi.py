#!/usr/bin/python3 -S
"""nvidia-smi for the testbed's simulated GPUs: answers from /run/simgpu (private to each host).

Supports what the toolkit asks a real nvidia-smi:
  --query-gpu=index,name,uuid,memory.total,memory.reserved,memory.used,memory.free
      --format=csv[,noheader][,nounits]
  --query-compute-apps=pid,process_name,used_gpu_memory,gpu_uuid --format=csv[,noheader][,nounits]
  -i/--id, -L, and a plain summary without arguments.  Output follows nvidia-smi's CSV format.

Memory as a real card reports it (an H200 on driver 580: `memory.total` 143771 MiB,
`memory.reserved` 616, `memory.used` 0 and `memory.free` 143156 at idle; docs/gpu-memory.md):
the driver's reserve (gpus.json `memory_reserved_mib`, default 0) is in the total but neither
used nor free, so free = total - reserved - used.

Processes by pid as the caller's pid namespace numbers them, as the driver does: run on a host,
the pid of a containerised server is its HOST pid. A record's owner holds a flock on its file,
and the kernel's /proc/locks names each flock's holder by its pid in the reader's pid namespace
(fs/locks.c, locks_translate_pid); a holder that namespace cannot see (0 there) keeps the pid
its record gives.

On a host, gpus.json lists every GPU; in a container it lists the GPUs the container was given
(nvidia_container_hook.py), each with the host's index. Like the real nvidia-smi in a container,
`index` numbers the GPUs it sees from 0, while `minor_number` and `pci.bus_id` stay the host's
(the device node /dev/nvidia<minor> and the bus address do not change inside a container).
memory.used is the whole GPU's, every process's on the host, as the driver reports it.

A reservation record (procs/*.json) names its GPU by the host's index (`gpu`) or, when it has
one, by UUID (`gpu_uuid`, which wins). Records whose owner died (their flock can be taken) are
deleted while holding /run/simgpu/lock, as docs/testbed-contract.md specifies.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
import sys
from pathlib import Path
from typing import Any

SIMGPU = Path(os.environ.get("SIMGPU_DIR", "/run/simgpu"))
DRIVER_VERSION = "550.54.15"
NO_DRIVER = (
    "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver. "
    "Make sure that the latest NVIDIA driver is installed and running.\n"
)

# field -> (header, unit); aliases map to the canonical name nvidia-smi prints in the header
GPU_FIELDS = {
    "index": ("index", ""),
    "minor_number": ("minor_number", ""),
    "name": ("name", ""),
    "gpu_name": ("name", ""),
    "uuid": ("uuid", ""),
    "gpu_uuid": ("uuid", ""),
    "count": ("count", ""),
    "driver_version": ("driver_version", ""),
    "pci.bus_id": ("pci.bus_id", ""),
    "gpu_bus_id": ("pci.bus_id", ""),
    "memory.total": ("memory.total [MiB]", "MiB"),
    "memory.reserved": ("memory.reserved [MiB]", "MiB"),
    "memory.used": ("memory.used [MiB]", "MiB"),
    "memory.free": ("memory.free [MiB]", "MiB"),
    "utilization.gpu": ("utilization.gpu [%]", "%"),
    "utilization.memory": ("utilization.memory [%]", "%"),
    "temperature.gpu": ("temperature.gpu", ""),
}
APP_FIELDS = {
    "pid": ("pid", ""),
    "process_name": ("process_name", ""),
    "name": ("process_name", ""),
    "used_gpu_memory": ("used_gpu_memory [MiB]", "MiB"),
    "used_memory": ("used_gpu_memory [MiB]", "MiB"),
    "gpu_uuid": ("gpu_uuid", ""),
    "gpu_name": ("gpu_name", ""),
    "gpu_bus_id": ("gpu_bus_id", ""),
}


class Usage(Exception):
    pass


def load_gpus() -> list[dict[str, Any]] | None:
    """The GPUs this host (or container) sees, in enumeration order; None without a driver."""
    try:
        return list(json.loads((SIMGPU / "gpus.json").read_text())["gpus"])
    except FileNotFoundError:
        return None


def live_reservations() -> list[dict[str, Any]]:
    """Reservation records of live owners, each with its owner's pid as this pid namespace
    sees it; files of dead owners are removed."""
    procs = SIMGPU / "procs"
    if not procs.is_dir():
        return []
    records = []
    with open(SIMGPU / "lock", "a+") as lock:
        with contextlib.suppress(OSError):
            fcntl.flock(lock, fcntl.LOCK_EX)
        holders = flock_holders()
        for path in sorted(procs.glob("*.json")):
            record = _live_record(path)
            if record is not None:
                records.append(with_holder_pid(record, path, holders))
    return records


def flock_holders(locks: Path = Path("/proc/locks")) -> dict[tuple[int, int], int]:
    """(device, inode) -> the pid holding a flock on that file, as /proc/locks gives it in
    this pid namespace (``1: FLOCK  ADVISORY  WRITE 18326 fe:00:2146378 0 EOF``; waiters,
    ``1: -> FLOCK ...``, are skipped)."""
    found: dict[tuple[int, int], int] = {}
    try:
        text = locks.read_text()
    except OSError:
        return found
    for line in text.splitlines():
        fields = line.split()
        if len(fields) < 6 or fields[1] != "FLOCK":
            continue
        try:
            major, minor, inode = fields[5].split(":")
            device = os.makedev(int(major, 16), int(minor, 16))
            found[(device, int(inode))] = int(fields[4])
        except ValueError:
            continue
    return found


def with_holder_pid(
    record: dict[str, Any], path: Path, holders: dict[tuple[int, int], int]
) -> dict[str, Any]:
    """The record with ``pid`` = the pid of its file's flock holder in this namespace."""
    try:
        st = path.stat()
    except OSError:
        return record
    pid = holders.get((st.st_dev, st.st_ino), 0)
    return {**record, "pid": pid} if pid > 0 else record


def _live_record(path: Path) -> dict[str, Any] | None:
    """The record at ``path`` if its owner holds its lock; a dead owner's file is deleted."""
    try:
        fd = os.open(path, os.O_RDONLY)  # flock needs no write access: any user can look
    except OSError:
        return None
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            if exc.errno not in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                raise
            return dict(json.loads(path.read_text() or "{}"))
        # we got the lock: its owner is dead (another user's file in the sticky procs/ stays)
        with contextlib.suppress(OSError):
            path.unlink(missing_ok=True)
        return None
    except ValueError:
        return None  # a live owner still writing its record
    finally:
        os.close(fd)


def record_position(record: dict[str, Any], gpus: list[dict[str, Any]]) -> int | None:
    """Which of ``gpus`` (by position) a record is on: by UUID if it names one, else by the
    host's index; None for a GPU not in the list (another container's)."""
    for position, gpu in enumerate(gpus):
        if "gpu_uuid" in record:
            if record["gpu_uuid"] == gpu.get("uuid"):
                return position
        elif int(record.get("gpu", 0)) == int(gpu["index"]):
            return position
    return None


def used_by_gpu(gpus: list[dict[str, Any]], records: list[dict[str, Any]]) -> dict[int, int]:
    """MiB used on each GPU, by position in ``gpus``."""
    used: dict[int, int] = {}
    for rec in records:
        position = record_position(rec, gpus)
        if position is not None:
            used[position] = used.get(position, 0) + int(rec.get("used_mib", 0))
    return used


def bus_id(gpu: dict[str, Any]) -> str:
    """The GPU's PCI address, from the host's index (the same on the host and in containers)."""
    return f"00000000:{int(gpu['index']) + 1:02X}:00.0"


def parse_format(value: str) -> tuple[bool, bool]:
    parts = [p.strip() for p in value.split(",")]
    if (
        not parts
        or parts[0] != "csv"
        or any(p not in ("csv", "noheader", "nounits") for p in parts)
    ):
        raise Usage(f'"{value}" is not a valid format.')
    return "noheader" in parts, "nounits" in parts


def render(
    fields: list[str],
    table: dict[str, tuple[str, str]],
    rows: list[dict[str, Any]],
    noheader: bool,
    nounits: bool,
) -> str:
    for field in fields:
        if field not in table:
            raise Usage(f'Field "{field}" is not a valid field to query.')
    lines = [] if noheader else [", ".join(table[f][0] for f in fields)]
    for row in rows:
        cells = []
        for field in fields:
            value, unit = row[table[field][0]], table[field][1]
            cells.append(str(value) if nounits or not unit else f"{value} {unit}")
        lines.append(", ".join(cells))
    return "".join(line + "\n" for line in lines)


def gpu_rows(
    gpus: list[dict[str, Any]], used: dict[int, int], *, positions: list[int] | None = None
) -> list[dict[str, Any]]:
    """One row per GPU; ``positions`` (default: all) picks which, ``used`` is by position."""
    rows = []
    for position in range(len(gpus)) if positions is None else positions:
        gpu = gpus[position]
        total = int(gpu["memory_total_mib"])
        reserved = int(gpu.get("memory_reserved_mib", 0))
        in_use = used.get(position, 0)
        rows.append(
            {
                "index": position,
                "minor_number": int(gpu["index"]),
                "name": gpu["name"],
                "uuid": gpu["uuid"],
                "count": len(gpus),
                "driver_version": DRIVER_VERSION,
                "pci.bus_id": bus_id(gpu),
                "memory.total [MiB]": total,
                "memory.reserved [MiB]": reserved,
                "memory.used [MiB]": in_use,
                "memory.free [MiB]": max(total - reserved - in_use, 0),
                "utilization.gpu [%]": 0,
                "utilization.memory [%]": round(100 * in_use / total) if total else 0,
                "temperature.gpu": 35,
            }
        )
    return rows


def app_rows(
    gpus: list[dict[str, Any]], records: list[dict[str, Any]], *, positions: list[int] | None = None
) -> list[dict[str, Any]]:
    """One row per process on one of the GPUs at ``positions`` (default: all), GPU by GPU."""
    wanted = range(len(gpus)) if positions is None else positions
    placed = [(record_position(rec, gpus), rec) for rec in records]
    rows = []
    for position in wanted:
        gpu = gpus[position]
        for rec in (r for p, r in placed if p == position):
            rows.append(
                {
                    "gpu_index": position,
                    "pid": rec.get("pid", 0),
                    "process_name": rec.get("process_name", ""),
                    "used_gpu_memory [MiB]": rec.get("used_mib", 0),
                    "gpu_uuid": gpu["uuid"],
                    "gpu_name": gpu["name"],
                    "gpu_bus_id": bus_id(gpu),
                }
            )
    return rows


def summary(gpus: list[dict[str, Any]], records: list[dict[str, Any]], positions: list[int]) -> str:
    """The plain `nvidia-smi` view: each GPU's memory, then the processes and their GPU."""
    rows = gpu_rows(gpus, used_by_gpu(gpus, records), positions=positions)
    out = [
        f"NVIDIA-SMI {DRIVER_VERSION}   Driver Version: {DRIVER_VERSION}   (testbed simulated GPU)"
    ]
    for r in rows:
        out.append(
            f"GPU {r['index']}: {r['name']}  {r['pci.bus_id']}  {r['memory.used [MiB]']}MiB / "
            f"{r['memory.total [MiB]']}MiB"
        )
    out.append("Processes:")
    apps = app_rows(gpus, records, positions=positions)
    for a in apps:
        out.append(
            f"  GPU {a['gpu_index']}  pid {a['pid']}  {a['process_name']}  "
            f"{a['used_gpu_memory [MiB]']}MiB"
        )
    if not apps:
        out.append("  No running processes found")
    return "\n".join(out) + "\n"


def select_positions(gpus: list[dict[str, Any]], spec: str) -> list[int]:
    """`-i`: GPUs by index (as this nvidia-smi numbers them), UUID or PCI bus id."""
    wanted = {part.strip() for part in spec.split(",") if part.strip()}
    return [
        position
        for position, gpu in enumerate(gpus)
        if {str(position), gpu.get("uuid"), bus_id(gpu)} & wanted
    ]


def parse_args(argv: list[str]) -> dict[str, str]:
    opts: dict[str, str] = {}
    i = 0
    while i < len(argv):
        arg = argv[i]
        if arg in ("-L", "--list-gpus"):
            opts["list"] = "1"
        elif arg.startswith("--query-gpu="):
            opts["query-gpu"] = arg.split("=", 1)[1]
        elif arg.startswith("--query-compute-apps="):
            opts["query-apps"] = arg.split("=", 1)[1]
        elif arg.startswith("--format="):
            opts["format"] = arg.split("=", 1)[1]
        elif arg.startswith(("--id=", "-i=")):
            opts["id"] = arg.split("=", 1)[1]
        elif arg in (
            "-i",
            "--id",
            "--format",
            "--query-gpu",
            "--query-compute-apps",
        ) and i + 1 < len(argv):
            key = {
                "-i": "id",
                "--id": "id",
                "--format": "format",
                "--query-gpu": "query-gpu",
                "--query-compute-apps": "query-apps",
            }[arg]
            opts[key] = argv[i + 1]
            i += 1
        else:
            raise Usage(f"Invalid combination of input arguments: {arg}")
        i += 1
    return opts


def main(argv: list[str]) -> int:
    try:
        opts = parse_args(argv)
        gpus = load_gpus()
        if gpus is None:
            sys.stdout.write(NO_DRIVER)
            return 9
        positions = select_positions(gpus, opts["id"]) if "id" in opts else list(range(len(gpus)))
        if not positions:
            sys.stdout.write("No devices were found\n")
            return 6
        records = live_reservations()
        if "list" in opts:
            sys.stdout.write(
                "".join(
                    f"GPU {p}: {gpus[p]['name']} (UUID: {gpus[p]['uuid']})\n" for p in positions
                )
            )
            return 0
        query = opts.get("query-gpu") or opts.get("query-apps")
        if query is None:
            sys.stdout.write(summary(gpus, records, positions))
            return 0
        if "format" not in opts:
            raise Usage("--format=csv is required with a query (only csv is supported)")
        noheader, nounits = parse_format(opts["format"])
        fields = [f.strip() for f in query.split(",") if f.strip()]
        if "query-gpu" in opts:
            rows = gpu_rows(gpus, used_by_gpu(gpus, records), positions=positions)
            sys.stdout.write(render(fields, GPU_FIELDS, rows, noheader, nounits))
        else:
            rows = app_rows(gpus, records, positions=positions)
            sys.stdout.write(render(fields, APP_FIELDS, rows, noheader, nounits))
        return 0
    except Usage as exc:
        sys.stdout.write(f"{exc}\nPlease run 'nvidia-smi -h' for help.\n")
        return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
