"""Reading the release window back out of an accept.png (test support).

The release window is drawn as a shaded span of one colour across the three panels. A column
of the PNG lies inside the span when many of its pixels have that colour blended on white; the
expected columns come from the same figure built again from the report's JSON.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from tfsdeploy.accept import plot

MIN_SHADED_PIXELS = 100  # per column: the three panels' height is several hundred pixels


def shade_rgb() -> np.ndarray[Any, Any]:
    """The release colour at its alpha over a white background (0-1 floats)."""
    from matplotlib.colors import to_rgb

    colour = np.array(to_rgb(plot.RELEASE_COLOR))
    return 1.0 - plot.RELEASE_ALPHA * (1.0 - colour)


def shade_under_grid_rgb() -> np.ndarray[Any, Any]:
    """The release colour where a grid line is drawn over it (0-1 floats)."""
    from matplotlib import rcParams
    from matplotlib.colors import to_rgb

    grid = np.array(to_rgb(rcParams["grid.color"]))
    return (1.0 - plot.GRID_ALPHA) * shade_rgb() + plot.GRID_ALPHA * grid


def shaded_columns(png: Path) -> tuple[int, int] | None:
    """First and last pixel column that is shaded top to bottom (None when none is).

    A pixel is shaded when its colour is the shade's, or the shade's under a grid line
    (anti-aliased: anywhere between the two): a vertical grid line over the window's last
    columns (a release that ended 0.05 s after a 5 s tick) is still the window, and counting
    only the shade's own colour ended the window 2.4 columns early."""
    from matplotlib.image import imread

    image = imread(str(png))[:, :, :3]
    shade, under = shade_rgb(), shade_under_grid_rgb()
    along = np.clip(((image - shade) @ (under - shade)) / float((under - shade) @ (under - shade)),
                    0.0, 1.0)
    nearest = shade + along[:, :, None] * (under - shade)
    close = np.all(np.abs(image - nearest) < 0.02, axis=2)
    columns = np.flatnonzero(close.sum(axis=0) >= MIN_SHADED_PIXELS)
    if columns.size == 0:
        return None
    return int(columns[0]), int(columns[-1])


def expected_columns(series: list[dict[str, Any]], **kwargs: Any) -> tuple[float, float]:
    """Where the release's start and end fall, in pixel columns of the same figure."""
    import matplotlib.pyplot as plt

    fig = plot.build_figure(series, **kwargs)
    fig.canvas.draw()
    ax = fig.axes[0]
    release = kwargs["release"]
    x0 = ax.transData.transform((release.start_s, 0))[0]
    x1 = ax.transData.transform((release.end_s, 0))[0]
    plt.close(fig)
    return float(x0), float(x1)


def plot_arguments(report: dict[str, Any]) -> dict[str, Any]:
    """build_figure's arguments for the run an accept.json describes."""
    accept = report["tfsdeploy"]["accept"]
    release = accept["release"]
    return {"title": "check", "target_qps": accept["targetQps"], "slo_ms": accept["sloP99Ms"],
            "duration_s": accept["durationS"],
            "release": plot.Mark("release", release["startS"], release["endS"])
            if release and release["startS"] is not None else None}
