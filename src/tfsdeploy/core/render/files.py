"""Render every file a host receives for one release, from Jinja2 templates (pure).

Templates render with StrictUndefined: a missing variable is an error naming the template and
line, never an empty string in a config file.
"""

from __future__ import annotations

import json
import os
import traceback
from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import jinja2

from tfsdeploy.core.errors import ConfigError, Problem
from tfsdeploy.core.inventory.catalog import Model
from tfsdeploy.core.inventory.fleet import ResolvedHost
from tfsdeploy.core.inventory.gpu import GpuPlan, InstancePlan, plan_instances
from tfsdeploy.core.inventory.load import Inventory

TEMPLATES_ENV = "TFSDEPLOY_TEMPLATES"
CONTAINER_CONFIG_DIR = "/etc/tfsdeploy"
CONTAINER_MODEL_ROOT = "/models"

MODEL_CONFIG = "models.config"
BATCHING_CONFIG = "batching.config"
MONITORING_CONFIG = "monitoring.config"
FLAGS = "tfserving.flags"
FILE_NAMES = (MODEL_CONFIG, BATCHING_CONFIG, MONITORING_CONFIG, FLAGS)


@dataclass(frozen=True)
class RenderedFile:
    """One file as the host receives it."""

    name: str
    text: str


@dataclass(frozen=True)
class HostRender:
    """Everything one host receives for one release of one model."""

    host: ResolvedHost
    model: Model
    version: int
    gpu: GpuPlan | None  # the first instance's (the fraction tfserving.flags names)
    files: tuple[RenderedFile, ...]
    instances: tuple[InstancePlan, ...] = (InstancePlan(0, (), None),)

    def file(self, name: str) -> RenderedFile:
        """The rendered file called ``name``."""
        return next(f for f in self.files if f.name == name)


def templates_dir() -> Path:
    """$TFSDEPLOY_TEMPLATES, else the project's templates/ directory."""
    explicit = os.environ.get(TEMPLATES_ENV)
    return Path(explicit) if explicit else Path(__file__).resolve().parents[4] / "templates"


def pb_string(value: object) -> str:
    """A protobuf text-format string literal."""
    return json.dumps(str(value))


def pb_bool(value: object) -> str:
    """A protobuf text-format (and TFServing flag) boolean."""
    return "true" if value else "false"


@lru_cache(maxsize=4)
def _environment(directory: str) -> jinja2.Environment:
    env = jinja2.Environment(loader=jinja2.FileSystemLoader(directory),
                             undefined=jinja2.StrictUndefined, keep_trailing_newline=True,
                             autoescape=False)
    env.filters["pbstr"] = pb_string
    env.filters["pbbool"] = pb_bool
    return env


def container_paths(model: Model) -> dict[str, str]:
    """Where the server finds its files inside the container."""
    return {
        "model_base": f"{CONTAINER_MODEL_ROOT}/{model.name}",
        "model_config": f"{CONTAINER_CONFIG_DIR}/{MODEL_CONFIG}",
        "batching": f"{CONTAINER_CONFIG_DIR}/{BATCHING_CONFIG}",
        "monitoring": f"{CONTAINER_CONFIG_DIR}/{MONITORING_CONFIG}",
    }


def resolve_labels(model: Model, version: int) -> list[tuple[str, int]]:
    """Label -> version pairs; ``"release"`` means the version being deployed."""
    pairs = []
    for label, target in sorted(model.labels.items()):
        pairs.append((label, version if target == "release" else int(target)))
    return pairs


def placements(inventory: Inventory) -> dict[str, frozenset[str]]:
    """Model name -> the names of the hosts its ``hosts`` pattern places it on."""
    return {name: frozenset(h.name for h in inventory.match(model.hosts, f"models.{name}.hosts"))
            for name, model in inventory.models.items()}


def render_host(host: ResolvedHost, model: Model, version: int, *,
                co_located: Sequence[Model] = (), directory: Path | None = None) -> HostRender:
    """Render the files of one release of ``model`` at ``version`` for ``host``."""
    instances = plan_instances(host, model, co_located)
    gpu = instances[0].plan
    context = {"host": host, "vars": host.vars, "model": model, "version": version,
               "batching": model.batching, "labels": resolve_labels(model, version),
               "paths": container_paths(model), "gpu": gpu}
    env = _environment(str(directory or templates_dir()))
    files = tuple(RenderedFile(name, _render_one(env, name, context)) for name in FILE_NAMES)
    return HostRender(host=host, model=model, version=version, gpu=gpu, files=files,
                      instances=instances)


def _render_one(env: jinja2.Environment, name: str, context: dict[str, object]) -> str:
    template_name = f"{name}.j2"
    try:
        return env.get_template(template_name).render(context)
    except jinja2.TemplateNotFound as exc:
        raise ConfigError(Problem(f"template {template_name} is missing",
                                  fix=f"restore templates/{template_name} or set "
                                      f"{TEMPLATES_ENV}", file=template_name)) from exc
    except (jinja2.UndefinedError, jinja2.TemplateSyntaxError) as exc:
        line = getattr(exc, "lineno", None) or _template_line(exc, template_name)
        raise ConfigError(Problem(f"template error: {exc}",
                                  fix="define the variable or fix the template syntax",
                                  file=f"{template_name}:{line}" if line else template_name)
                          ) from exc


def _template_line(exc: BaseException, template_name: str) -> int | None:
    """The template line of a render error (Jinja rewrites tracebacks to template lines)."""
    frames = [f for f in traceback.extract_tb(exc.__traceback__)
              if f.filename.endswith(template_name)]
    return frames[-1].lineno if frames else None


def render_fleet(inventory: Inventory, model: Model, version: int,
                 hosts: Sequence[ResolvedHost]) -> list[HostRender]:
    """Render ``model`` at ``version`` for each of ``hosts``."""
    directory = templates_dir()
    placed = placements(inventory)
    return [render_host(h, model, version, directory=directory,
                        co_located=[inventory.models[name] for name, on in placed.items()
                                    if h.name in on])
            for h in hosts]
