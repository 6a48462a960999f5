"""matplotlib for the plots: taken when installed, installed on first use when not (with this
environment's pip), and a plot skipped, with the reason and the fix, when that fails."""

from __future__ import annotations

import subprocess
import sys
import tomllib
from pathlib import Path
from typing import Any

import pytest

from tfsdeploy.loadtest import plotting, sweep

ROOT = Path(__file__).resolve().parents[2]


def test_the_requirement_is_the_plots_extra() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert project["optional-dependencies"]["plots"] == [plotting.PLOTS_REQUIREMENT]
    assert not any(d.startswith(("matplotlib", "numpy")) for d in project["dependencies"])


def _missing_once(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """matplotlib unimportable until the (fake) installer ran."""
    real = plotting._import_matplotlib
    calls: list[int] = []

    def attempt() -> Any:
        calls.append(1)
        if len(calls) == 1:
            raise ImportError("No module named 'matplotlib'")
        return real()
    monkeypatch.setattr(plotting, "_import_matplotlib", attempt)
    return calls


def test_installed_matplotlib_is_used_without_pip() -> None:
    def refuse(argv: list[str]) -> subprocess.CompletedProcess[str]:
        raise AssertionError(f"ran {argv}")
    assert plotting.pyplot(run=refuse).__name__ == "matplotlib.pyplot"


def test_missing_matplotlib_is_installed_with_this_environment_s_pip(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    _missing_once(monkeypatch)
    ran: list[list[str]] = []

    def pip(argv: list[str]) -> subprocess.CompletedProcess[str]:
        ran.append(argv)
        return subprocess.CompletedProcess(argv, 0, "", "")
    assert plotting.pyplot(run=pip).__name__ == "matplotlib.pyplot"
    assert ran == [[sys.executable, "-m", "pip", "install", "--quiet",
                    "--disable-pip-version-check", plotting.PLOTS_REQUIREMENT]]
    assert f"installing {plotting.PLOTS_REQUIREMENT} into {sys.prefix}" in \
        capsys.readouterr().err


def test_a_plot_that_cannot_be_had_is_skipped_and_says_why(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
        tmp_path: Path) -> None:
    _missing_once(monkeypatch)

    def offline(argv: list[str]) -> subprocess.CompletedProcess[str]:
        return subprocess.CompletedProcess(argv, 1, "", "ERROR: No matching distribution "
                                                        "found for matplotlib>=3.8")
    monkeypatch.setattr(plotting, "_run", offline)
    png = tmp_path / "sweep.png"
    point = sweep.SweepPoint(concurrency=1, rps=10.0, p50_ms=1.0, p95_ms=1.5, p99_ms=2.0,
                             p999_ms=2.5, error_rate_pct=0.0, count=10)
    sweep.draw_plot([point], png, sweep.SweepLimits())
    assert not png.exists()
    err = capsys.readouterr().err
    assert f"plot not drawn ({png}): installing matplotlib failed (pip exit 1: ERROR: No " \
           "matching distribution found for matplotlib>=3.8)" in err
    assert "pip install 'tfsdeploy[plots]'" in err
