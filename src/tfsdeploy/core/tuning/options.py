"""What `fab tune` may spend (pure, light: `fab --list` reads its defaults through
``cli.verbs``)."""

from __future__ import annotations

from dataclasses import dataclass

DEFAULT_MIN_GAIN = 0.05  # the QPS gain a change must bring to be kept


@dataclass(frozen=True)
class TuneOptions:
    """How long things may take: the search's budget, each rate step's window, the closed-loop
    probe that sets the first rate, and the QPS gain a change must bring. Its defaults are
    `fab tune`'s (``cli.verbs.TuneArgs`` takes ``--budget`` and ``--step`` from here)."""

    budget_s: float = 600.0
    max_trials: int | None = None  # None: as many as the budget holds
    step_s: float = 5.0
    probe_s: float = 2.0
    min_gain: float = DEFAULT_MIN_GAIN
    procs: int = 1
