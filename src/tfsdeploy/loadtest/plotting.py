"""matplotlib for the toolkit's PNG plots, installed on first use where it is missing.

matplotlib and the numpy it needs take about 170 MB, more than the rest of a deploy machine's
environment, for three plots: fab accept's run over time, fab tune's trials and the load
generator's concurrency sweep. So the plain install leaves them out and the ``plots`` extra
names them (``pip install 'tfsdeploy[plots]'`` installs them ahead of time). A command that
draws without them installs ``PLOTS_REQUIREMENT`` into the environment it runs in, once, with
that environment's own pip, and says so on stderr. Where that cannot be done (no network to
the package index, no pip, an environment it may not write), the command still does all its
other work and says which plot is missing, why, and the command that adds it.
"""

from __future__ import annotations

import importlib
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

# the `plots` extra of pyproject.toml (tests/unit/test_plotting.py holds them equal)
PLOTS_REQUIREMENT = "matplotlib>=3.8"
INSTALL_TIMEOUT_S = 600.0
FIX = "pip install 'tfsdeploy[plots]' (matplotlib) in the toolkit's environment"

Runner = Callable[[list[str]], "subprocess.CompletedProcess[str]"]


class PlotUnavailable(RuntimeError):
    """matplotlib is not installed and could not be installed."""


def install_command() -> list[str]:
    """The command that installs matplotlib into this interpreter's environment."""
    return [sys.executable, "-m", "pip", "install", "--quiet", "--disable-pip-version-check",
            PLOTS_REQUIREMENT]


def _run(argv: list[str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, capture_output=True, text=True, timeout=INSTALL_TIMEOUT_S,
                          check=False)


def _import_matplotlib() -> Any:
    return importlib.import_module("matplotlib")


def _install(run: Runner) -> None:
    """Install matplotlib with this environment's pip, saying so; PlotUnavailable on failure."""
    print(f"matplotlib is not installed (the plain install leaves it out): installing "
          f"{PLOTS_REQUIREMENT} into {sys.prefix} for the plot, once", file=sys.stderr,
          flush=True)
    try:
        done = run(install_command())
    except (OSError, subprocess.SubprocessError) as err:
        raise PlotUnavailable(f"installing matplotlib failed: {err}; {FIX}") from None
    if done.returncode != 0:
        tail = (done.stderr or done.stdout or "").strip().splitlines()[-3:]
        raise PlotUnavailable(f"installing matplotlib failed (pip exit {done.returncode}: "
                              f"{' '.join(tail) or 'no output'}); {FIX}")
    importlib.invalidate_caches()


def pyplot(*, run: Runner | None = None) -> Any:
    """``matplotlib.pyplot`` on the Agg backend (no display), matplotlib installed first if
    this environment lacks it; PlotUnavailable says why it cannot be."""
    try:
        matplotlib = _import_matplotlib()
    except ImportError:
        matplotlib = None
    if matplotlib is None:
        _install(run or _run)
        try:
            matplotlib = _import_matplotlib()
        except ImportError as err:
            raise PlotUnavailable(f"matplotlib installed but not importable ({err}); "
                                  f"{FIX}") from None
    matplotlib.use("Agg")
    return importlib.import_module("matplotlib.pyplot")


def pyplot_or_say(path: Path, *, run: Runner | None = None) -> Any | None:
    """``pyplot()``, or None after saying on stderr that ``path`` is not drawn and why."""
    try:
        return pyplot(run=run)
    except PlotUnavailable as err:
        print(f"plot not drawn ({path}): {err}", file=sys.stderr, flush=True)
        return None
