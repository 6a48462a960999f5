"""Outputs for cron and systemd: a JSON result file and a Prometheus textfile.

Files are written durably (``core.localfiles.write_durable``: temp file fsynced, renamed,
the directory fsynced) so a collector never reads half a file, nor an empty one after a power
loss; the textfile's read-modify-write runs under a lock (``localfiles.locked``) so that runs
ending together (a cron rollback beside a person's deploy) keep each other's samples.
The textfile follows node_exporter's textfile-collector format (Prometheus' text exposition
format: label values escape backslash, double quote and newline) and is readable by every
user, since node_exporter runs as its own; runs of other commands or models in the same file
are kept. A model name that is not a valid catalog name is never written as a label: such a
run is recorded under ``model="<invalid>"``.
"""

from __future__ import annotations

import json
import re
import sys
import time
from pathlib import Path
from typing import Any

from tfsdeploy.core.errors import ExitCode
from tfsdeploy.core.inventory.schema import model_name_problem
from tfsdeploy.core.localfiles import locked, write_durable

METRICS = {
    "tfsdeploy_last_run_timestamp_seconds": "Unix time the last run of the command ended.",
    "tfsdeploy_last_run_exit_code": "Exit code of the last run ("
                                    + ", ".join(f"{int(c)} {c.name.lower()}" for c in ExitCode)
                                    + ").",
    "tfsdeploy_last_run_duration_seconds": "Duration of the last run.",
    "tfsdeploy_last_success_timestamp_seconds": "Unix time of the last run that exited 0.",
    "tfsdeploy_release_info": "The release and version the last run ended on (value 1).",
}
# a label value is a double-quoted string in which \\, \" and \n are escapes
_VALUE = r'"(?:[^"\\]|\\.)*"'
SAMPLE = re.compile(rf"^(?P<name>[a-zA-Z_:][a-zA-Z0-9_:]*)(?P<labels>\{{(?:[^\"}}]|{_VALUE})*\}})?"
                    r"\s+(?P<value>\S+)(?:\s+-?[0-9]+)?$")
LABEL = re.compile(rf'\s*(?P<key>[a-zA-Z_][a-zA-Z0-9_]*)\s*=\s*(?P<value>{_VALUE})\s*,?')
INVALID_MODEL = "<invalid>"  # not a model name: a model name starts with a letter or digit
TEXTFILE_MODE = 0o644  # node_exporter reads it as another user


def write_json_file(path: str, data: Any) -> None:
    """The run's result as JSON (0600, durably)."""
    write_durable(path, json.dumps(data, indent=2, default=str) + "\n")


def escape_label(value: str) -> str:
    """A label value for the text format: backslash, double quote and newline escaped."""
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def unescape_label(quoted: str) -> str:
    """The value of a double-quoted, escaped label value."""
    return re.sub(r"\\(.)", lambda m: "\n" if m[1] == "n" else m[1], quoted[1:-1])


def label_values(labels: str) -> dict[str, str]:
    """``{a="x",b="y"}`` -> {"a": "x", "b": "y"}."""
    inner = labels[1:-1] if labels.startswith("{") else labels
    return {m["key"]: unescape_label(m["value"]) for m in LABEL.finditer(inner)}


def _labels(**values: str) -> str:
    return "{" + ",".join(f'{k}="{escape_label(v)}"' for k, v in sorted(values.items())) + "}"


def model_label(model: str) -> str:
    """``model`` if it is a valid model name, else INVALID_MODEL (a run with a bad --model
    is still recorded, but the text given is never written)."""
    return model if isinstance(model, str) and model_name_problem(model) is None \
        else INVALID_MODEL


def textfile_samples(*, model: str, command: str, exit_code: int, seconds: float,
                     release: str, version: int | None, now: float,
                     previous_success: float | None) -> dict[str, float]:
    """``name{labels}`` -> value for one run (pure)."""
    model = model_label(model)
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
    """Samples of an existing textfile (empty when there is none). A file that cannot be read
    back (unreadable, not UTF-8, a sample that is not a number) never stops this run's samples
    from being written: unreadable bytes and lines that are not samples are dropped, and a
    file that cannot be opened counts as empty (``TextfileUnreadable`` says why)."""
    try:
        raw = Path(path).read_bytes()
    except FileNotFoundError:
        return {}
    except OSError as error:
        raise TextfileUnreadable(f"{error.strerror or error}") from None
    found = {}
    for line in raw.decode("utf-8", errors="replace").splitlines():
        match = SAMPLE.match(line.strip())
        if match and not line.startswith("#"):
            try:
                found[match["name"] + (match["labels"] or "")] = float(match["value"])
            except ValueError:  # not a number: not a sample this module wrote
                continue
    return found


class TextfileUnreadable(Exception):
    """The existing textfile cannot be opened: the other runs' samples are lost."""


def _is_run_of(key: str, model: str, command: str) -> bool:
    """Whether the sample ``key`` belongs to the runs of ``command`` on ``model``."""
    name, _, labels = key.partition("{")
    values = label_values("{" + labels)
    return name.startswith("tfsdeploy_") and values.get("model") == model \
        and values.get("command") == command


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
    """Rewrite the textfile with this run's samples, keeping every other run's (when the old
    file cannot be read, this run's alone are written, and stderr says so); under the
    textfile's lock, so that a run ending meanwhile is not lost between our read and our
    rename."""
    with locked(path):
        _update_textfile(path, model=model, command=command, exit_code=exit_code,
                         seconds=seconds, release=release, version=version)


def _update_textfile(path: str, *, model: str, command: str, exit_code: int, seconds: float,
                     release: str, version: int | None) -> None:
    try:
        old = read_samples(path)
    except TextfileUnreadable as error:
        print(f"tfsdeploy: the textfile {path} could not be read back ({error}): it is "
              "rewritten with this run's samples only", file=sys.stderr)
        old = {}
    model = model_label(model)
    success_key = f"tfsdeploy_last_success_timestamp_seconds{_labels(model=model, command=command)}"
    kept = {k: v for k, v in old.items() if not _is_run_of(k, model, command)}
    kept.update(textfile_samples(model=model, command=command, exit_code=exit_code,
                                 seconds=seconds, release=release, version=version,
                                 now=time.time(), previous_success=old.get(success_key)))
    write_durable(path, format_textfile(kept), mode=TEXTFILE_MODE)
