"""`fab render`: write exactly the files each host would receive, after validating them."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from tfsdeploy.errors import ConfigError
from tfsdeploy.inventory import Inventory, load_inventory
from tfsdeploy.layout import SLOTS, model_ports
from tfsdeploy.proxy import render_proxy_config
from tfsdeploy.render import HostRender, render_fleet
from tfsdeploy.validate import check_port_clashes, validate_model, validate_render
from tfsdeploy.versions import choose_version


@dataclass(frozen=True)
class RenderRequest:
    """What `fab render` was asked for."""

    model: str
    inventory: str | None = None
    hosts: str | None = None
    limit: str | None = None
    version: int | str | None = None


def render_and_validate(request: RenderRequest) -> list[HostRender]:
    """Load, render and validate; raises ConfigError with every problem found."""
    return render_inventory(load_inventory(request.inventory), request)


def render_inventory(inventory: Inventory, request: RenderRequest) -> list[HostRender]:
    """Render and validate ``request`` against a loaded inventory."""
    model = inventory.model(request.model)
    problems = validate_model(model, inventory.path) + check_port_clashes(inventory)
    if problems:
        raise ConfigError(problems)
    version = choose_version(model, request.version, inventory.path)
    hosts = inventory.select(request.hosts, limit=request.limit, model=model)
    renders = render_fleet(inventory, model, version, hosts)
    problems = [p for r in renders for p in validate_render(r, inventory.path)]
    if problems:
        raise ConfigError(problems)
    return renders


PROXY_CONFIG = "proxy/haproxy.cfg"


def write_renders(renders: list[HostRender], out: Path) -> list[Path]:
    """Write ``out/<host>/<model>/<file>`` for every render, and the host's proxy config as
    ``proxy/haproxy.cfg`` (as a first deploy writes it: slot blue active; each switch rewrites
    which slot is enabled); returns the paths written."""
    written = []
    for render in renders:
        folder = out / render.host.name / render.model.name
        (folder / "proxy").mkdir(parents=True, exist_ok=True)
        texts = {f.name: f.text for f in render.files}
        texts[PROXY_CONFIG] = render_proxy_config(render.host, render.model,
                                                  model_ports(render.host, render.model),
                                                  SLOTS[0])
        for name, text in texts.items():
            path = folder / name
            path.write_text(text)
            written.append(path)
    return written


def summary_rows(renders: list[HostRender]) -> list[tuple[str, ...]]:
    """One row per host: name, address, version, GPU fraction and window, files."""
    rows: list[tuple[str, ...]] = []
    for r in renders:
        gpu = (f"{r.gpu.fraction:.3f} (window {r.gpu.window_total:.3f}/{r.gpu.limit:.3f})"
               if r.gpu else "no GPU")
        rows.append((r.host.name, r.host.address, str(r.version), gpu,
                     str(len(r.files) + 1)))  # + the proxy config
    return rows
