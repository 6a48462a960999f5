"""The accept PNG shows the release window where it happened (tfsdeploy.accept.plot)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.accept.plotcheck import expected_columns, shaded_columns
from tfsdeploy.accept import plot


def series(seconds: int, *, spike_at: int = 30) -> list[dict[str, Any]]:
    return [{"second": s, "qps": 300.0 - (40 if s == spike_at else 0), "errors": s % 7 == 0,
             "p50": 4.0, "p95": 9.0, "p99": 20.0 + (60 if s == spike_at else 0),
             "p999": 30.0 + (90 if s == spike_at else 0)} for s in range(seconds)]


def arguments(release: plot.Mark | None) -> dict[str, Any]:
    return {"title": "t", "target_qps": 300.0, "slo_ms": 50.0, "duration_s": 60.0,
            "release": release}


@pytest.mark.parametrize(("start", "end"), [(15.0, 37.5), (40.2, 52.0)])
def test_the_release_window_is_shaded_where_it_happened(tmp_path: Path, start: float,
                                                        end: float) -> None:
    png = tmp_path / "accept.png"
    mark = plot.Mark("release v2", start, end)
    plot.draw(png, series(61), **arguments(mark))
    found = shaded_columns(png)
    assert found is not None
    want = expected_columns(series(61), **arguments(mark))
    assert found[0] == pytest.approx(want[0], abs=2)
    assert found[1] == pytest.approx(want[1], abs=2)


def test_no_release_no_shade_and_a_lost_generator_is_a_line(tmp_path: Path) -> None:
    png = tmp_path / "accept.png"
    plot.draw(png, series(61), lost=[plot.Mark("tb2 lost", 33.0)], **arguments(None))
    assert shaded_columns(png) is None
    fig = plot.build_figure(series(61), lost=[plot.Mark("tb2 lost", 33.0)], **arguments(None))
    labels = fig.axes[0].get_legend_handles_labels()[1]
    assert "tb2 lost" in labels


def test_a_stall_switches_the_latency_axis_to_log(tmp_path: Path) -> None:
    rows = series(10)
    rows[5]["p999"] = 4000.0
    fig = plot.build_figure(rows, **arguments(None))
    assert fig.axes[1].get_yscale() == "log"
    assert plot.build_figure(series(10), **arguments(None)).axes[1].get_yscale() == "linear"
