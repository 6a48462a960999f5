"""The run over time as a PNG: QPS, latency percentiles and errors per second, with the
release window and lost generators marked (matplotlib, no display needed; installed on first
use where missing: loadtest/plotting.py)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tfsdeploy.loadtest import plotting

RELEASE_COLOR = "#f5a623"  # the shaded release window (a colour no line uses)
RELEASE_ALPHA = 0.3
GRID_ALPHA = 0.3  # the grid lines, drawn over the release window
LOST_COLOR = "#d0021b"
PERCENTILE_LINES = (("p50", "P50", "tab:green"), ("p95", "P95", "tab:olive"),
                    ("p99", "P99", "tab:red"), ("p999", "P99.9", "tab:purple"))


@dataclass(frozen=True)
class Mark:
    """A span (release) or an instant (a generator lost), in seconds after the start."""

    label: str
    start_s: float
    end_s: float | None = None


def build_figure(series: Sequence[dict[str, Any]], *, title: str, target_qps: float,
                 slo_ms: float, duration_s: float, release: Mark | None,
                 lost: Sequence[Mark] = ()) -> Any:
    """The figure (three panels sharing the time axis); the caller saves or inspects it.
    PlotUnavailable when matplotlib is missing and cannot be installed."""
    plt = plotting.pyplot()

    xs = [row["second"] + 0.5 for row in series]  # a second's figures sit at its middle
    fig, (ax_qps, ax_lat, ax_err) = plt.subplots(3, 1, sharex=True, figsize=(10, 8), dpi=100,
                                                 gridspec_kw={"height_ratios": [2, 3, 1.2]})
    ax_qps.plot(xs, [row["qps"] for row in series], color="tab:blue", label="completed/s")
    ax_qps.axhline(target_qps, color="tab:blue", linestyle=":", label="target QPS")
    ax_qps.set_ylabel("QPS")
    for key, label, color in PERCENTILE_LINES:
        ax_lat.plot(xs, [row[key] for row in series], color=color, label=label)
    ax_lat.axhline(slo_ms, color="black", linestyle="--", label=f"SLO {slo_ms:g} ms")
    ax_lat.set_ylabel("latency (ms)")
    if any((row["p999"] or 0) > 20 * slo_ms for row in series):
        ax_lat.set_yscale("log")  # a stall's seconds-long tail would flatten everything else
    ax_err.bar(xs, [row["errors"] for row in series], width=0.9, color=LOST_COLOR,
               label="errors/s")
    ax_err.set_ylabel("errors/s")
    ax_err.set_xlabel("seconds since the common start")
    for ax in (ax_qps, ax_lat, ax_err):
        _marks(ax, release, lost, label=ax is ax_qps)
        ax.axvline(duration_s, color="grey", linewidth=0.8)
        ax.grid(True, alpha=GRID_ALPHA)
    ax_qps.legend(loc="lower left", fontsize=8, ncol=3)
    ax_lat.legend(loc="upper left", fontsize=8, ncol=5)
    ax_qps.set_title(title)
    fig.tight_layout()
    return fig


def _marks(ax: Any, release: Mark | None, lost: Sequence[Mark], *, label: bool) -> None:
    if release is not None:
        end = release.end_s if release.end_s is not None else release.start_s
        ax.axvspan(release.start_s, end, color=RELEASE_COLOR, alpha=RELEASE_ALPHA, linewidth=0,
                   label=release.label if label else None)
    for mark in lost:
        ax.axvline(mark.start_s, color=LOST_COLOR, linestyle="--",
                   label=mark.label if label else None)


def draw(path: Path, series: Sequence[dict[str, Any]], **kwargs: Any) -> None:
    """Save the figure as a PNG at ``path`` (not drawn, said on stderr, when matplotlib is
    missing and cannot be installed)."""
    plt = plotting.pyplot_or_say(path)
    if plt is None:
        return
    fig = build_figure(series, **kwargs)
    fig.savefig(path)
    plt.close(fig)
