"""What an inventory says about its monitoring (``monitoring = Monitoring(...)``): where the
Prometheus servers are, where their file_sd targets live, where the toolkit's own textfile
metrics are scraped, and the thresholds the rendered alerts use.

Frozen, typed data checked like the catalog (``check_monitoring``); `fab observe` renders from
it (``observe``) and every deploy, rollback, promote and abort rewrites the targets it names.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Annotated, ClassVar, Literal

from pydantic import ConfigDict, Field, Strict

from tfsdeploy.core.errors import Problem
from tfsdeploy.core.inventory.catalog import CHECKED
from tfsdeploy.core.inventory.schema import AbsoluteDir, Text, check, pattern_rule

# the interval Prometheus' own parser takes for scrape_interval and `for` (whole seconds here)
Interval = Annotated[int, Strict(), Field(ge=1, le=7 * 86_400)]
Fraction = Annotated[float, Strict(), Field(gt=0, lt=1, allow_inf_nan=False)]
# host:port of a node_exporter whose textfile collector reads the toolkit's --metrics-file
Endpoint = Annotated[str, Strict(), pattern_rule(
    r"[A-Za-z0-9_.-]{1,253}:[0-9]{1,5}", "a host:port",
    "write the node_exporter's address and port, e.g. 'deploy-1:9100'")]
CronCommand = Literal["guard", "rollback", "deploy", "prune"]


@dataclass(frozen=True)
class Monitoring:
    """The fleet's Prometheus, as the inventory declares it.

    ``hosts``: inventory hosts or groups that run Prometheus; each run that changes what serves
    writes the model's file_sd file into ``targets_dir`` on each of them (over SSH), and/or into
    ``local_targets_dir`` on the deploying machine (relative: beside the inventory).
    ``node_exporters``: where the textfiles of ``--metrics-file`` are scraped.
    ``error_budget``: the share of requests that may fail or be slower than the model's
    ``latency_slo_ms`` (0.01: a 99% objective). ``cron_periods``: command -> how often cron
    runs it, in seconds; the alert fires when its last success is older than that plus its
    last run's duration. The durations (``scrape_interval_s``, ``rate_window_s``, the
    ``*_for_s``) are Prometheus' own; lower them for a test fleet."""

    __pydantic_config__: ClassVar[ConfigDict] = CHECKED
    hosts: Text | None = None
    targets_dir: AbsoluteDir = "/etc/prometheus/tfsdeploy"
    local_targets_dir: Text | None = None
    node_exporters: Annotated[Sequence[Endpoint], Field(max_length=256)] = ()
    scrape_interval_s: Interval = 15
    evaluation_interval_s: Interval = 15
    rate_window_s: Interval = 60
    p99_for_s: Interval = 300
    alert_for_s: Interval = 300
    error_budget: Fraction = 0.01
    warmup_max_s: Interval = 300
    queue_slo_share: Fraction = 0.5
    canary_pause_max_s: Interval = 3600
    cron_periods: Annotated[Mapping[CronCommand, Interval], Field(max_length=4)] = \
        field(default_factory=dict)

    def __post_init__(self) -> None:
        if isinstance(self.node_exporters, (list, tuple)):
            object.__setattr__(self, "node_exporters", tuple(self.node_exporters))
        if isinstance(self.cron_periods, Mapping):
            object.__setattr__(self, "cron_periods", MappingProxyType(dict(self.cron_periods)))


def check_monitoring(raw: object, file: str) -> tuple[Monitoring | None, list[Problem]]:
    """The inventory's ``monitoring`` checked (absent: the defaults), with its problems."""
    if raw is None:
        return Monitoring(), []
    checked, problems = check(Monitoring, raw, file=file, prefix="monitoring")
    rules: list[Problem] = []
    if checked is not None and checked.rate_window_s < 2 * checked.scrape_interval_s:
        rules.append(Problem(
            f"rate_window_s {checked.rate_window_s} is shorter than two scrape intervals "
            f"({2 * checked.scrape_interval_s} s): rate() needs two samples in its window",
            fix="make rate_window_s at least twice scrape_interval_s (four times is usual)",
            file=file, field="monitoring.rate_window_s"))
    return (checked if not problems and not rules else None), problems + rules
