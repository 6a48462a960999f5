"""The accept PNG shows the release window where it happened (tfsdeploy.accept.plot)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tests.accept.plotcheck import (
    expected_columns,
    shade_rgb,
    shade_under_grid_rgb,
    shaded_columns,
)
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


def test_a_window_whose_last_columns_lie_under_a_grid_line_is_found_to_its_end(
        tmp_path: Path) -> None:
    """A full run's 40 s window whose release ended at 15.05 s, 0.05 s after a tick: the
    tick's grid line lay over the window's last columns, and a check that knew only the
    shade's own colour found the window 2.4 columns short (432 for 434.4). Here an image
    shaded in columns 10..30 whose columns 29 and 30 are under a grid line (30 only half)."""
    from matplotlib import rcParams
    from matplotlib.colors import to_rgb
    from matplotlib.image import imsave

    image = np.ones((300, 60, 3))
    image[:, 10:31] = shade_rgb()
    image[:, 29] = shade_under_grid_rgb()
    image[:, 30] = (shade_rgb() + shade_under_grid_rgb()) / 2  # anti-aliased edge of the line
    # the line's other half falls outside the window: the grid's colour over white
    grid = np.array(to_rgb(rcParams["grid.color"]))
    image[:, 31] = (1.0 - plot.GRID_ALPHA) + plot.GRID_ALPHA * grid
    png = tmp_path / "accept.png"
    imsave(png, image)
    assert shaded_columns(png) == (10, 30)


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
