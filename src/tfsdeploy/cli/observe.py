"""`fab observe`: ``write_observability`` writes what ``core.observe`` renders (prometheus.yml,
a rules file per model) and the Grafana dashboards (``core.observe.dashboards``, imported here
only); with ``--targets``, each model's targets from what runs now (``run.targets``).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

from tfsdeploy.core.inventory.catalog import Model
from tfsdeploy.core.inventory.load import Inventory
from tfsdeploy.core.localfiles import write_durable
from tfsdeploy.core.observe.prometheus import (
    prometheus_config,
    rule_groups,
    targets_file,
    to_yaml,
)
from tfsdeploy.core.target import Target
from tfsdeploy.run.targets import (
    LOCAL_TARGETS,
    local_targets_dir,
    publish_now,
    scraped_targets_dir,
)


def chosen_models(inventory: Inventory, name: str | None) -> list[Model]:
    """The catalog's models, or the one ``--model`` names."""
    if name is None:
        return list(inventory.models.values())
    return [inventory.model(name)]


def write_observability(inventory: Inventory, models: Sequence[Model], out: Path
                        ) -> list[Path]:
    """DIR/prometheus/prometheus.yml, DIR/prometheus/rules/<model>.yml and
    DIR/grafana/{fleet,<model>}.json; returns the paths written."""
    from tfsdeploy.core.observe.dashboards import fleet_dashboard, model_dashboard

    monitoring = inventory.monitoring
    written: list[Path] = []

    def put(path: Path, text: str) -> None:
        write_durable(path, text, mode=0o644)  # Prometheus and Grafana read them
        written.append(path)

    config = prometheus_config(models, monitoring, targets_dir=scraped_targets_dir(inventory))
    put(out / "prometheus" / "prometheus.yml", to_yaml(config))
    local = local_targets_dir(inventory) if monitoring.hosts is None else None
    if monitoring.hosts is None:
        # the targets files exist from the start: Prometheus watches a file_sd file's
        # directory for changes only if it exists when it reads the configuration (else it
        # sees new targets only at each refresh_interval)
        folder = local or out / "prometheus" / LOCAL_TARGETS
        folder.mkdir(parents=True, exist_ok=True)
        for model in models:
            if not (folder / targets_file(model.name)).exists():
                write_durable(folder / targets_file(model.name), "[]\n", mode=0o644)
    for model in models:
        put(out / "prometheus" / "rules" / f"{model.name}.yml",
            to_yaml(rule_groups(model, monitoring)))
        put(out / "grafana" / f"{model.name}.json",
            json.dumps(model_dashboard(model, monitoring), indent=2) + "\n")
    put(out / "grafana" / "fleet.json",
        json.dumps(fleet_dashboard(models, monitoring), indent=2) + "\n")
    return written


def observe(inventory: Inventory, model: str | None, out: Path, *, targets: bool
            ) -> tuple[list[Path], list[str]]:
    """`fab observe`: the files written, and (``targets``) where each model's targets were
    written from what runs on its hosts now."""
    models = chosen_models(inventory, model)
    written = write_observability(inventory, models, out)
    published: list[str] = []
    if targets:
        beside = scraped_targets_dir(inventory) == LOCAL_TARGETS
        for entry in models:
            chosen = Target(inventory, entry, inventory.select(None, model=entry))
            published += publish_now(
                chosen, local_only=out / "prometheus" / LOCAL_TARGETS if beside else None)
    return written, published
