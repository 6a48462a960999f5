"""Outputs for cron and systemd: a JSON result file and a Prometheus textfile.

Files are written atomically (temp file + rename) so a collector never reads half a file.
The textfile follows node_exporter's textfile-collector format; runs of other commands or
models in the same file are kept.
"""

from __future__ import annotations

import json
import os
import re
import tempfile
import time
from pathlib import Path
from typing import Any

METRICS = {
    "tfsdeploy_last_run_timestamp_seconds": "Unix time the last run of the command ended.",
    "tfsdeploy_last_run_exit_code": "Exit code of the last run (0 ok, 1 invalid, 2 rolled "
                                    "back, 3 inconsistent, 4 locked).",
    "tfsdeploy_last_run_duration_seconds": "Duration of the last run.",
    "tfsdeploy_last_success_timestamp_seconds": "Unix time of the last run that exited 0.",
    "tfsdeploy_release_info": "The release and version the last run ended on (value 1).",
}
SAMPLE = re.compile(r"^(?P<name>[a-zA-Z_:][a-zA-Z0-9_:]*)(?P<labels>\{[^}]*\})?\s+(?P<value>\S+)$")


def write_atomic(path: str, text: str) -> None:
    """Replace ``path`` with ``text`` in one rename."""
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, temp = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.")
    with os.fdopen(fd, "w") as handle:
        handle.write(text)
    os.replace(temp, target)


def write_json_file(path: str, data: Any) -> None:
    """The run's result as JSON."""
    write_atomic(path, json.dumps(data, indent=2, default=str) + "\n")


def _labels(**values: str) -> str:
    return "{" + ",".join(f'{k}="{v}"' for k, v in sorted(values.items())) + "}"


def textfile_samples(*, model: str, command: str, exit_code: int, seconds: float,
                     release: str, version: int | None, now: float,
                     previous_success: float | None) -> dict[str, float]:
    """``name{labels}`` -> value for one run (pure)."""
    base = _labels(model=model, command=command)
    samples = {f"tfsdeploy_last_run_timestamp_seconds{base}": now,
               f"tfsdeploy_last_run_exit_code{base}": float(exit_code),
               f"tfsdeploy_last_run_duration_seconds{base}": round(seconds, 3)}
    success = now if exit_code == 0 else previous_success
    if success is not None:
        samples[f"tfsdeploy_last_success_timestamp_seconds{base}"] = success
    if release:
        info = _labels(model=model, command=command, release=release,
                       version=str(version or ""))
        samples[f"tfsdeploy_release_info{info}"] = 1.0
    return samples


def read_samples(path: str) -> dict[str, float]:
    """Samples of an existing textfile (empty when there is none)."""
    try:
        lines = Path(path).read_text().splitlines()
    except FileNotFoundError:
        return {}
    found = {}
    for line in lines:
        match = SAMPLE.match(line.strip())
        if match and not line.startswith("#"):
            found[match["name"] + (match["labels"] or "")] = float(match["value"])
    return found


def format_textfile(samples: dict[str, float]) -> str:
    """HELP and TYPE once per metric, then its samples, sorted."""
    lines = []
    for name, help_text in METRICS.items():
        mine = sorted(k for k in samples if k.split("{", 1)[0] == name)
        if mine:
            lines += [f"# HELP {name} {help_text}", f"# TYPE {name} gauge"]
            lines += [f"{key} {float(samples[key])!r}" for key in mine]
    return "\n".join(lines) + "\n"


def update_textfile(path: str, *, model: str, command: str, exit_code: int, seconds: float,
                    release: str, version: int | None) -> None:
    """Rewrite the textfile with this run's samples, keeping every other run's."""
    old = read_samples(path)
    ours = _labels(model=model, command=command)[1:-1]
    success_key = f"tfsdeploy_last_success_timestamp_seconds{{{ours}}}"
    kept = {k: v for k, v in old.items()
            if not (k.startswith("tfsdeploy_") and ours in k)}
    kept.update(textfile_samples(model=model, command=command, exit_code=exit_code,
                                 seconds=seconds, release=release, version=version,
                                 now=time.time(), previous_success=old.get(success_key)))
    write_atomic(path, format_textfile(kept))
