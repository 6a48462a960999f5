"""What a command acts on: an inventory, one model of its catalog, the hosts selected.

Every command that loads an inventory goes through ``load_target``: the catalog entry is
validated before anything reads a host or builds a path from its name.
"""

from __future__ import annotations

from dataclasses import dataclass

from tfsdeploy.core.errors import ConfigError
from tfsdeploy.core.inventory.catalog import Model
from tfsdeploy.core.inventory.fleet import ResolvedHost
from tfsdeploy.core.inventory.load import Inventory, load_inventory
from tfsdeploy.core.inventory.versions import choose_version
from tfsdeploy.core.render.files import HostRender, render_fleet
from tfsdeploy.core.render.validate import check_port_clashes, validate_model, validate_render


@dataclass(frozen=True)
class Target:
    """An inventory, a model and the selected hosts."""

    inventory: Inventory
    model: Model
    hosts: tuple[ResolvedHost, ...]

    @property
    def model_hosts(self) -> tuple[ResolvedHost, ...]:
        """Every host the catalog places the model on (the lock spans them all)."""
        return self.inventory.select(None, model=self.model)


def load_target(model: str, *, inventory: str | None = None, hosts: str | None = None,
                limit: str | None = None) -> Target:
    """Load and validate the inventory, the model's catalog entry and the host selection."""
    inv = load_inventory(inventory)
    catalog = inv.model(model)
    problems = validate_model(catalog, inv.path) + check_port_clashes(inv)
    if problems:
        raise ConfigError(problems)
    return Target(inv, catalog, inv.select(hosts, limit=limit, model=catalog))


def render_release(target: Target, version: int | str | None) -> list[HostRender]:
    """Render and validate the release's files for every selected host; touches no host."""
    model = target.model
    chosen = choose_version(model, version, target.inventory.path)
    renders = render_fleet(target.inventory, model, chosen, target.hosts)
    problems = [p for r in renders for p in validate_render(r, target.inventory.path)]
    if problems:
        raise ConfigError(problems)
    return renders
