"""`fab tune`: the search on one host of the model (run/tune.py), then its table, its PNG
(QPS at the SLO against P99, the SLO line, the recommendation marked), DIR/tune.json and,
with --write, the recommended configuration as Python for the catalog. The inventory is
never edited."""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

from tfsdeploy.cli.output import print_table
from tfsdeploy.cli.verbs import TuneArgs
from tfsdeploy.core.errors import ConfigError, Problem
from tfsdeploy.core.inventory.fleet import ResolvedHost
from tfsdeploy.core.localfiles import write_durable
from tfsdeploy.core.target import Target
from tfsdeploy.core.timetext import duration_seconds
from tfsdeploy.core.tuning.options import TuneOptions
from tfsdeploy.loadtest import plotting
from tfsdeploy.run.tune import TuneResult, tune

HEADERS = ("#", "configuration", "QPS at SLO", "P50 ms", "P95 ms", "P99 ms", "batch",
           "queue %", "CPU cores", "")


def chosen_host(target: Target, name: str | None) -> ResolvedHost:
    """``--host``, which must be one of the model's hosts; else its first host."""
    hosts = target.model_hosts
    if not hosts:
        raise ConfigError(Problem(f"the inventory places {target.model.name} on no host",
                                  fix="set the model's hosts", file=target.inventory.path))
    if name is None:
        return hosts[0]
    found = [h for h in hosts if h.name == name]
    if not found:
        raise ConfigError(Problem(f"--host {name!r} is not a host of {target.model.name}",
                                  fix=f"give one of {', '.join(h.name for h in hosts)}",
                                  field="--host"))
    return found[0]


def run_tune(target: Target, args: TuneArgs) -> int:
    """`fab tune` with its typed options; returns the exit code."""
    host = chosen_host(target, args.host)
    out = Path(args.out or f"tune-{target.model.name}")
    options = TuneOptions(budget_s=duration_seconds(args.budget),
                          step_s=duration_seconds(args.step), max_trials=args.trials)
    cap = f", at most {args.trials} trial(s)" if args.trials else ""
    print(f"tuning {target.model.name} on {host.name}: budget {options.budget_s:g} s{cap}, "
          f"{options.step_s:g} s per rate step; the inventory is not changed", flush=True)
    result = tune(target, host, options, note=lambda line: print(line, flush=True))
    out.mkdir(parents=True, exist_ok=True)
    data = result.as_json()
    plot = out / "tune.png"
    data["plot"] = str(plot)
    draw(result, plot)
    write_durable(out / "tune.json", json.dumps(data, indent=2) + "\n", mode=0o644)
    print_table(f"{target.model.name} on {host.name} (SLO P99 {target.model.latency_slo_ms:g} "
                "ms)", HEADERS, rows(result))
    print(f"report: {out / 'tune.json'}  plot: {plot}")
    return _conclude(result, args.write)


def _conclude(result: TuneResult, write: str | None) -> int:
    index = result.recommended
    if index is None:
        print("no configuration met the SLO at any rate: nothing to recommend")
        return 2
    trial = result.course.trials[index]
    current = result.course.trials[0]
    what = "the catalog's configuration" if index == 0 else f"trial {index}"
    print(f"recommended: {what}, {trial.qps:.1f} QPS at the SLO (the catalog's: "
          f"{current.score:.1f} QPS)")
    text = trial.config.python()
    if write:
        write_durable(write, f"# fab tune --model {result.model.name} on {result.host}: "
                      f"{trial.qps:.1f} QPS at P99 <= {result.model.latency_slo_ms:g} ms\n"
                      + text, mode=0o644)
        print(f"wrote {write}: paste it into the model's catalog entry")
    else:
        print(text, end="")
    return 0


def rows(result: TuneResult) -> list[tuple[str, ...]]:
    """One table row per trial."""
    def cell(value: float | None, form: str = ".1f") -> str:
        return "-" if value is None else format(value, form)

    made: list[tuple[str, ...]] = []
    for index, t in enumerate(result.course.trials):
        mark = "recommended" if index == result.recommended else (
            "catalog" if index == 0 else t.error or ("" if t.meets_slo else "SLO never met"))
        if index == 0 and index == result.recommended:
            mark = "catalog, recommended"
        made.append((str(index), t.config.label(), cell(t.qps if t.meets_slo else None),
                     cell(t.p50_ms), cell(t.p95_ms), cell(t.p99_ms), cell(t.mean_batch),
                     cell(None if t.queue_share is None else t.queue_share * 100, ".0f"),
                     cell(t.cpu_cores, ".2f"), mark))
    return made


def draw(result: TuneResult, path: Path) -> None:
    """PNG: each trial's QPS at the SLO against its P99 there, the SLO, the pick starred."""
    plt = plotting.pyplot_or_say(path)
    if plt is None:
        return

    slo = result.model.latency_slo_ms
    fig, ax = plt.subplots(figsize=(8, 5), dpi=100)
    for index, t in enumerate(result.course.trials):
        if t.p99_ms is None:
            continue
        ax.plot([t.p99_ms], [t.qps], "s" if index == 0 else "o",
                color="tab:blue" if t.meets_slo else "tab:grey",
                label="catalog's configuration (trial 0)" if index == 0 else None)
        ax.annotate(str(index), (t.p99_ms, t.qps), textcoords="offset points", xytext=(4, 4),
                    fontsize=8)
    ax.axvline(slo, color="tab:red", linestyle="--", label=f"SLO P99 {slo:g} ms")
    best = result.course.trials[result.recommended] if result.recommended is not None else None
    if best is not None and best.p99_ms is not None:
        ax.plot([best.p99_ms], [best.qps], "*", color="gold", markersize=18,
                markeredgecolor="black", label=f"recommended (trial {result.recommended})")
    ax.set_xlabel("P99 latency at the rate kept (ms)")
    ax.set_ylabel("QPS at the SLO")
    ax.set_title(f"fab tune: {result.model.name} on {result.host}")
    ax.grid(True, alpha=0.3)
    ax.legend(loc="best", fontsize=8)
    fig.tight_layout()
    image = io.BytesIO()
    fig.savefig(image, format="png")
    plt.close(fig)
    write_durable(path, image.getvalue(), mode=0o644)


def print_diagnosis(rows: list[dict[str, Any]]) -> None:
    """`fab diagnose`'s findings, host by host."""
    for row in rows:
        head = f"{row['host']}:"
        if not row.get("reachable"):
            print(f"{head} unreachable: {row.get('error')}")
            continue
        found = row.get("diagnosis")
        if found is None:
            print(f"{head} {row.get('note')}")
            continue
        print(f"{head} {row['container']} ({row['release']})")
        print(f"  limit: {found['summary']}")
        for line in found["figures"]:
            print(f"    {line}")
        print(f"  fix: {found['fix']}")
        for line in found["notes"]:
            print(f"  note: {line}")
