"""Printing for people: progress lines, tables (a run's summary, status, history, a check's
plan, the hosts), errors, JSON. Rich is imported only when a table prints (`fab deploy
--json` prints none)."""

from __future__ import annotations

import json
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO

from tfsdeploy.cli.gpu_status import gpu_cell
from tfsdeploy.core.errors import ConfigError, TfsDeployError
from tfsdeploy.core.inventory.fleet import ResolvedHost
from tfsdeploy.core.inventory.gpu import instance_gpus
from tfsdeploy.core.inventory.load import Inventory
from tfsdeploy.core.render.files import placements
from tfsdeploy.core.visible import visible

if TYPE_CHECKING:
    from tfsdeploy.run.engine import RunResult
    from tfsdeploy.run.jobs import PullProgress


def print_table(title: str, headers: Sequence[str], rows: Sequence[Sequence[str]],
                stream: TextIO | None = None) -> None:
    """A table on stdout (or ``stream``). Cells are text, never markup: a host's error
    holding ``[/srv/...]`` or a lock holder named ``[bold]x`` is shown as it is (rich would
    take it as a closing tag and raise MarkupError), with every control character made
    visible (rich itself would drop CR, BEL and BS, and pass ESC through). No colours or
    styles: nothing rich writes is an escape sequence."""
    from rich.console import Console
    from rich.table import Table

    table = Table(title=visible(title), title_justify="left")
    for header in headers:
        table.add_column(header)
    for row in rows:
        table.add_row(*(visible(cell) for cell in row))
    Console(file=stream or sys.stdout, width=140, markup=False, emoji=False, highlight=False,
            color_system=None).print(table)


def print_error(error: BaseException, stream: TextIO | None = None) -> None:
    """The error, with every problem and its fix, on stderr."""
    out = stream or sys.stderr
    label = "invalid input" if isinstance(error, ConfigError) else "error"
    if not isinstance(error, TfsDeployError):
        label = f"unexpected {type(error).__name__} (a defect of tfsdeploy; --debug shows " \
                "the traceback)"
    print(f"tfsdeploy: {label}: {error}", file=out)


def print_json(data: Any) -> None:
    """Machine-readable output on stdout."""
    json.dump(data, sys.stdout, indent=2, default=str)
    print()


class LineReporter:
    """Progress lines as steps finish: elapsed, host, phase, step, status, duration, detail.

    A stream that can no longer be written (the operator's terminal closed: SIGHUP) is
    dropped, never allowed to fail the run; the log file keeps every line.
    """

    def __init__(self, stream: TextIO, log_file: str | None = None) -> None:
        self._streams: list[TextIO] = [stream]
        if log_file:
            Path(log_file).parent.mkdir(parents=True, exist_ok=True)
            self._streams.append(open(log_file, "a", buffering=1))  # noqa: SIM115
        self._start = time.monotonic()
        self._lock = threading.Lock()
        self._pulls: dict[tuple[str, str], float] = {}
        self._pulled: set[tuple[str, str]] = set()  # said finished: said once
        self.events: list[dict[str, Any]] = []  # for --json: pull progress, as printed

    def _print(self, text: str) -> None:
        stamp = time.strftime("%Y-%m-%dT%H:%M:%S")
        text = visible(text)  # the log file is read on a terminal too
        for index, stream in enumerate(list(self._streams)):
            try:
                print(f"{stamp} {text}" if index else text, file=stream, flush=True)
            except (OSError, ValueError):
                self._streams.remove(stream)

    def step(self, host: str, phase: str, task: str, status: str, seconds: float,
             detail: str) -> None:
        """Print one finished step."""
        # split on newlines only: a CR from a host is shown (\x0d), never a line break
        first, *rest = (detail or "").rstrip("\n").split("\n")
        with self._lock:
            self._print(f"[{time.monotonic() - self._start:7.1f}s] {host:<10} {phase:<9} "
                        f"{task:<15} {status:<7} {seconds:6.2f}s  {first}")
            for line in rest:
                self._print(f"{'':>60}{line}")

    def note(self, text: str) -> None:
        """Print a fleet-level message."""
        with self._lock:
            self._print(f"[{time.monotonic() - self._start:7.1f}s] == {text}")

    def warn(self, text: str) -> None:
        """Something that went wrong after the run: on stderr (and in the log file)."""
        print(f"tfsdeploy: {visible(text)}", file=sys.stderr, flush=True)
        with self._lock:
            for stream in self._streams[1:]:
                print(f"{time.strftime('%Y-%m-%dT%H:%M:%S')} {visible(text)}", file=stream,
                      flush=True)

    def progress(self, host: str, update: PullProgress) -> None:
        """An image pull's progress, at most once a second per host and image, and its end
        once."""
        key = (host, update.image)
        now = time.monotonic()
        done = bool(update.layers_total) and update.layers_done == update.layers_total
        if key in self._pulled or (now - self._pulls.get(key, 0.0) < 1.0 and not done):
            return  # the engine's last events (digest, status) repeat a finished pull
        self._pulls[key] = now
        if done:
            self._pulled.add(key)
        self.events.append({**update.as_event(), "host": host,
                            "at_s": round(now - self._start, 3)})
        mib = update.bytes_done / (1 << 20)
        total = f"/{update.bytes_total / (1 << 20):.0f}" if update.bytes_total else ""
        self.note(f"{host}: pull {update.image}: {update.layers_done}/{update.layers_total} "
                  f"layers, {mib:.0f}{total} MiB")


class NoteSink:
    """Where the lines after a run go (the post-hooks, the notifications' delivery)."""

    def __init__(self, stream: TextIO) -> None:
        self._stream = stream

    def note(self, text: str) -> None:
        """One line, marked as a note."""
        print(f"== {text}", file=self._stream)

    def warn(self, text: str) -> None:
        """Something that went wrong after the run: on stderr."""
        print(f"tfsdeploy: {text}", file=sys.stderr)


def note_sink(json: bool) -> NoteSink:
    """The lines after a run: on stderr with --json, else on stdout."""
    return NoteSink(sys.stderr if json else sys.stdout)


def reporter(json: bool, log_file: str | None) -> LineReporter:
    """Progress lines on stdout (stderr with --json), and in the log file."""
    return LineReporter(sys.stderr if json else sys.stdout, log_file)


# -- a run's summary ---------------------------------------------------------------------------

def error_cell(error: str, diagnosis: dict[str, str] | None) -> str:
    """The summary's error: its first line, then the known failure's cause and fix."""
    first = error.split("\n")[0][:80]
    if not diagnosis:
        return first
    return f"{first}\ncause: {diagnosis['cause']}\nfix: {diagnosis['fix']}"


def summary_rows(result: RunResult) -> list[tuple[str, ...]]:
    """Per host: result, time in each phase and gate, and the error (with its cause and fix
    when it is a known failure)."""
    rows: list[tuple[str, ...]] = []
    for name, outcome in result.hosts.items():
        by_phase: dict[str, float] = {}
        for step in outcome.steps:
            by_phase[step["phase"]] = by_phase.get(step["phase"], 0.0) + step["seconds"]
        gates = {s["step"]: s["seconds"] for s in outcome.steps if s.get("gate")}
        rows.append((name, outcome.status,
                     " ".join(f"{p} {s:.1f}s" for p, s in by_phase.items()),
                     " ".join(f"{g.removeprefix('gate_')} {s:.1f}s" for g, s in gates.items()),
                     error_cell(outcome.error, outcome.diagnosis)))
    return rows


def print_run(command: str, result: RunResult, rows: list[tuple[str, ...]] | None) -> None:
    """A run's summary table and its message; ``rows`` replace the per-host rows (a prune's:
    what was removed and the space freed). A canary's judgement follows in its own table."""
    # a run without a release (prune) names none
    what = f" v{result.version} ({result.release_id})" if result.release_id else ""
    print_table(f"{command} {result.model}{what}: {result.exit_code.name.lower()} in "
                f"{result.seconds:.1f} s",
                ("host", "result", "removed", "freed", "error") if rows is not None else
                ("host", "result", "time per phase", "gates", "error"),
                rows if rows is not None else summary_rows(result))
    judged = canary_rows(result)
    if judged:
        print_table("canary: each step's metrics, new slots against old (98% intervals)",
                    ("host", "step", "metric", "effect", "interval", "p", "allowed",
                     "verdict"), judged)
    print(result.message)


def canary_rows(result: RunResult) -> list[tuple[str, ...]]:
    """Per host, per canary step, per metric: effect, interval, p-value, the increase
    allowed and the classification (the step's verdict and score on its first row)."""
    from tfsdeploy.core.canary.judge import Classification, MetricResult

    rows: list[tuple[str, ...]] = []
    for host, outcome in result.hosts.items():
        named = False
        for step in (outcome.canary or {}).get("steps") or []:
            head = f"{step['weight']}% {step['verdict']}" + (
                f" {step['score']:g}" if step.get("score") is not None else "")
            for number, data in enumerate(step.get("metrics") or []):
                metric = MetricResult(data["metric"], Classification(data["classification"]),
                                      data["critical"], data["unit"], data["effect"],
                                      data["low"], data["high"], data["p_value"],
                                      data["allowed"])
                shown = metric.classification is not Classification.NODATA
                rows.append(("" if named else host, head if number == 0 else "",
                             metric.name + (" (critical)" if metric.critical else ""),
                             metric.format(metric.effect, 0) if shown else "-",
                             f"{metric.format(metric.low, -1)}..{metric.format(metric.high, 1)}"
                             if shown else "-",
                             f"{metric.p_value:.2g}" if metric.p_value is not None else "-",
                             metric.format(metric.allowed, 0) if metric.allowed is not None
                             else "-", str(metric.classification)))
                named = True
    return rows


def print_check(command: str, model: str, json: bool, rows: list[dict[str, Any]]) -> int:
    """A check's plan: per host what it would do, then each step's changes and the diffs."""
    if json:
        print_json(rows)
        return 0
    print_table(f"{command} --check {model}: nothing was changed",
                ("host", "would do", "live"), [(r["host"], r["action"], r["detail"])
                                               for r in rows])
    for row in rows:
        print(f"{row['host']}:")
        for line in row.get("shape") or []:
            print(f"  shape     {line}")
        for step in row["steps"]:
            if step["error"]:
                print(f"  {step['phase']:<9} {step['step']:<15} WOULD FAIL: {step['error']}")
            for change in step["changes"]:
                print(f"  {step['phase']:<9} {step['step']:<15} {change['what']}")
        if row["diff"]:
            print(row["diff"])
    return 0


# -- the fleet ---------------------------------------------------------------------------------

def host_rows(inventory: Inventory, hosts: Sequence[ResolvedHost]) -> list[tuple[str, ...]]:
    """`fab hosts`: per host its address, groups, GPUs, and each model on it (with its
    instances' GPUs when it runs one per GPU)."""
    placed = placements(inventory)

    def models(host: ResolvedHost) -> str:
        cells = []
        for name in (m for m, on in placed.items() if host.name in on):
            gpus = instance_gpus(host, inventory.models[name])
            cells.append(name if len(gpus) < 2 else
                         f"{name} x{len(gpus)} (GPU {','.join(str(g[0]) for g in gpus)})")
        return ", ".join(cells) or "-"

    return [(h.name, h.address, ",".join(h.groups) or "-",
             " ".join(f"{g.index}:{g.memory_mib}MiB" for g in h.gpus) or "-", models(h))
            for h in hosts]


def traffic_cell(instances: list[dict[str, Any]], canary: dict[str, str] | None) -> str:
    """`fab status`'s traffic column: per instance the slot that takes the requests, or the
    shares of both while a canary splits them (``blue 75 / green 25``), then the canary
    under way (``paused canary <release>``)."""
    several = len(instances) > 1

    def one(instance: dict[str, Any]) -> str:
        shares = instance.get("traffic") or {}
        shown = (" / ".join(f"{slot} {share}" for slot, share in shares.items())
                 if len(shares) > 1 else instance.get("traffic_slot") or "-")
        return (f"i{instance['instance']} " if several else "") + shown

    text = ", ".join(one(i) for i in instances)
    if canary and canary["state"] == "interrupted":  # a killed run left the split
        return text + (f"; interrupted canary {canary['release']} (its run is gone: fab abort "
                       "or fab promote)")
    return text + (f"; {canary['state']} canary {canary['release']}" if canary else "")


def status_row(row: dict[str, Any]) -> tuple[str, ...]:
    """`fab status`'s row of one host."""
    if not row["reachable"]:
        return (row["host"], "UNREACHABLE", "", "", row.get("error", "")[:60], "", "", "")
    instances = row.get("instances") or [{"instance": 0, "traffic_slot": row["traffic_slot"],
                                          "slots": row["slots"]}]
    several = len(instances) > 1

    def label(instance: dict[str, Any]) -> str:
        return f"i{instance['instance']} " if several else ""

    slots = "; ".join(
        f"{label(instance)}{slot}: " + ", ".join(
            f"{c['release']} {'running' if c['running'] else 'stopped'}"
            + "".join(f" [{v.get('version', '?')} {v.get('state', v.get('error'))}]"
                      for v in c["versions"])
            for c in containers)
        for instance in instances
        for slot, containers in instance["slots"].items() if containers)
    drift = row.get("note") or "; ".join([*row["drift"], *row.get("instance_drift", [])]) \
        or "none"
    return (row["host"], str(row["current"] or "-"), str(row["version"] or "-"),
            traffic_cell(instances, row.get("canary")), slots or "-", drift,
            row["lock"] or "free", gpu_cell(row))


def print_history(model: str, rows: list[dict[str, Any]]) -> None:
    """`fab history`: per host its retained releases, unreadable records and audit tail."""
    for row in rows:
        if not row["reachable"]:
            print(f"{row['host']}: UNREACHABLE ({row['error']})")
            continue
        print_table(f"{row['host']}: releases of {model}",
                    ("release", "version", "status", "slot", "by", "at", "seconds", "gates"),
                    [(r["id"], str(r["version"]), str(r["status"]), str(r["slot"]),
                      str(r["by"]), str(r["at"]), str(r["seconds"]),
                      " ".join(f"{g} {s:.1f}s" for g, s in r["gates"].items()))
                     for r in row["releases"]])
        for broken in row["broken_records"]:
            print(f"  unreadable record {broken['path']}: {broken['error']}")
        for entry in row["audit"][-15:]:
            print(f"  {entry['time']} {entry['who']} {entry['event']} {entry['release']} "
                  f"{entry['details'] or ''}")
