"""What ``fab accept`` was asked for (pure, light: `fab --list` reads its defaults through
``cli.verbs``)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class AcceptOptions:
    """What ``fab accept`` was asked for (strings as typed; parsed by ``plan.build_plan``). Its
    defaults are `fab accept`'s (``cli.verbs.AcceptArgs`` takes ``--duration`` and
    ``--interval`` from here)."""

    model: str
    inventory: str | None = None
    target_qps: float | None = None
    duration: str = "5m"
    interval: str = "1s"
    release: str | int | None = None
    release_at: str | None = None
    loadgens: str | None = None
    slo_p99_ms: float | None = None
    max_error_rate_pct: float | None = None
    data_version: str | int | None = None
    start_margin: str | None = None
    timeout: str | None = None
    concurrency: int | None = None
    procs: int | None = None
