#!/usr/bin/python3
"""nvidia-smi for the testbed's simulated GPU: answers from /run/simgpu (private to each host).

Supports what the toolkit asks a real nvidia-smi:
  --query-gpu=index,name,uuid,memory.total,memory.used,memory.free --format=csv[,noheader][,nounits]
  --query-compute-apps=pid,process_name,used_gpu_memory,gpu_uuid --format=csv[,noheader][,nounits]
  -L, and a plain summary without arguments.  Output follows nvidia-smi's CSV format exactly.
Reservation files whose owner died (their flock can be taken) are deleted while holding
/run/simgpu/lock, as docs/testbed-contract.md specifies.
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
    "name": ("name", ""),
    "gpu_name": ("name", ""),
    "uuid": ("uuid", ""),
    "gpu_uuid": ("uuid", ""),
    "count": ("count", ""),
    "driver_version": ("driver_version", ""),
    "pci.bus_id": ("pci.bus_id", ""),
    "gpu_bus_id": ("pci.bus_id", ""),
    "memory.total": ("memory.total [MiB]", "MiB"),
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
    try:
        return list(json.loads((SIMGPU / "gpus.json").read_text())["gpus"])
    except FileNotFoundError:
        return None


def live_reservations() -> list[dict[str, Any]]:
    """Reservation records of live owners; files of dead owners are removed."""
    procs = SIMGPU / "procs"
    if not procs.is_dir():
        return []
    records = []
    with open(SIMGPU / "lock", "a+") as lock:
        with contextlib.suppress(OSError):
            fcntl.flock(lock, fcntl.LOCK_EX)
        for path in sorted(procs.glob("*.json")):
            try:
                fd = os.open(path, os.O_RDWR)
            except FileNotFoundError:
                continue
            try:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except OSError as exc:
                    if exc.errno not in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                        raise
                    records.append(json.loads(Path(path).read_text() or "{}"))
                    continue
                path.unlink(missing_ok=True)  # we got the lock: its owner is dead
            except ValueError:
                continue  # a live owner still writing its record
            finally:
                os.close(fd)
    return records


def used_by_gpu(records: list[dict[str, Any]]) -> dict[int, int]:
    used: dict[int, int] = {}
    for rec in records:
        gpu = int(rec.get("gpu", 0))
        used[gpu] = used.get(gpu, 0) + int(rec.get("used_mib", 0))
    return used


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


def gpu_rows(gpus: list[dict[str, Any]], used: dict[int, int]) -> list[dict[str, Any]]:
    rows = []
    for gpu in gpus:
        index = int(gpu["index"])
        total = int(gpu["memory_total_mib"])
        in_use = used.get(index, 0)
        rows.append(
            {
                "index": index,
                "name": gpu["name"],
                "uuid": gpu["uuid"],
                "count": len(gpus),
                "driver_version": DRIVER_VERSION,
                "pci.bus_id": f"00000000:{index + 1:02X}:00.0",
                "memory.total [MiB]": total,
                "memory.used [MiB]": in_use,
                "memory.free [MiB]": max(total - in_use, 0),
                "utilization.gpu [%]": 0,
                "utilization.memory [%]": round(100 * in_use / total) if total else 0,
                "temperature.gpu": 35,
            }
        )
    return rows


def app_rows(gpus: list[dict[str, Any]], records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    by_index = {int(g["index"]): g for g in gpus}
    rows = []
    for rec in records:
        gpu = by_index.get(int(rec.get("gpu", 0)))
        if gpu is None:
            continue
        rows.append(
            {
                "pid": rec.get("pid", 0),
                "process_name": rec.get("process_name", ""),
                "used_gpu_memory [MiB]": rec.get("used_mib", 0),
                "gpu_uuid": gpu["uuid"],
                "gpu_name": gpu["name"],
                "gpu_bus_id": f"00000000:{int(gpu['index']) + 1:02X}:00.0",
            }
        )
    return rows


def summary(gpus: list[dict[str, Any]], records: list[dict[str, Any]]) -> str:
    rows = gpu_rows(gpus, used_by_gpu(records))
    out = [
        f"NVIDIA-SMI {DRIVER_VERSION}   Driver Version: {DRIVER_VERSION}   (testbed simulated GPU)"
    ]
    for r in rows:
        out.append(
            f"GPU {r['index']}: {r['name']}  {r['memory.used [MiB]']}MiB / "
            f"{r['memory.total [MiB]']}MiB"
        )
    out.append("Processes:")
    for a in app_rows(gpus, records):
        out.append(f"  pid {a['pid']}  {a['process_name']}  {a['used_gpu_memory [MiB]']}MiB")
    if not records:
        out.append("  No running processes found")
    return "\n".join(out) + "\n"


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
        if "id" in opts:
            wanted = {int(x) for x in opts["id"].split(",")}
            gpus = [g for g in gpus if int(g["index"]) in wanted]
            if not gpus:
                sys.stdout.write("No devices were found\n")
                return 6
        records = live_reservations()
        if "list" in opts:
            sys.stdout.write(
                "".join(f"GPU {g['index']}: {g['name']} (UUID: {g['uuid']})\n" for g in gpus)
            )
            return 0
        query = opts.get("query-gpu") or opts.get("query-apps")
        if query is None:
            sys.stdout.write(summary(gpus, records))
            return 0
        if "format" not in opts:
            raise Usage("--format=csv is required with a query (only csv is supported)")
        noheader, nounits = parse_format(opts["format"])
        fields = [f.strip() for f in query.split(",") if f.strip()]
        if "query-gpu" in opts:
            rows = gpu_rows(gpus, used_by_gpu(records))
            sys.stdout.write(render(fields, GPU_FIELDS, rows, noheader, nounits))
        else:
            sys.stdout.write(render(fields, APP_FIELDS, app_rows(gpus, records), noheader, nounits))
        return 0
    except Usage as exc:
        sys.stdout.write(f"{exc}\nPlease run 'nvidia-smi -h' for help.\n")
        return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
