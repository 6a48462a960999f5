"""Python inventory files: hosts, groups, vars and the model catalog.

An inventory is a Python file that defines these module-level names::

    defaults = {...}                      # vars for every host (optional)
    hosts = [Host("gpu-a1", "10.0.0.1", gpus=[Gpu(0, 24576)], vars={...}), ...]
    groups = {"gpu_a": Group(["gpu-a1", "gpu-a2"], vars={...}), ...}   # optional
    models = [Model(...), ...]

Vars precedence, lowest first: built-in defaults < ``defaults`` < groups (in the order the
file declares them) < host vars. Every var is checked against ``HostVars``; an unknown key is an
error that names where it was set.
"""

from __future__ import annotations

import difflib
import fnmatch
import os
import re
import runpy
import traceback
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from types import MappingProxyType
from typing import Any

from tfsdeploy.catalog import Model
from tfsdeploy.errors import ConfigError, Problem

DEFAULT_INVENTORY = "inventory/testbed.py"
INVENTORY_ENV = "TFSDEPLOY_INVENTORY"


@dataclass(frozen=True)
class Gpu:
    """One GPU of a host: its index (CUDA_VISIBLE_DEVICES) and total memory."""

    index: int
    memory_mib: int
    name: str = "GPU"


@dataclass(frozen=True)
class HostVars:
    """Every var a host can have, with its built-in default."""

    ssh_user: str = "root"
    ssh_port: int = 22
    ssh_key: str | None = None
    ssh_known_hosts: str | None = None
    data_root: str = "/srv/tfsdeploy"
    image: str = "tensorflow/serving:2.21.0-gpu"
    tfserving_version: str = "2.21.0"
    proxy_image: str = "haproxy:2.6"
    grpc_port: int = 8500
    rest_port: int = 8501
    slot_ports: Mapping[str, tuple[int, int]] = field(
        default_factory=lambda: {"blue": (8510, 8511), "green": (8520, 8521)})
    proxy_admin_port: int = 8599
    gpu_safety_margin: float = 1.2
    gpu_headroom: float = 0.1
    monitoring_path: str = "/monitoring/prometheus/metrics"
    file_system_poll_wait_seconds: int = 1
    grpc_max_connection_age_ms: int = 0
    enable_model_warmup: bool = True
    # TFServing retries a failed load 5 times a minute apart by default: a bad release would
    # hold its gate for 5 minutes. One quick retry covers transient file-system errors.
    max_num_load_retries: int = 1
    load_retry_interval_micros: int = 5_000_000
    docker_gpus: str | None = None

    def __post_init__(self) -> None:
        ports = {k: tuple(v) for k, v in dict(self.slot_ports).items()}
        object.__setattr__(self, "slot_ports", MappingProxyType(ports))


VAR_NAMES = frozenset(f.name for f in fields(HostVars))


@dataclass(frozen=True)
class Host:
    """A machine reachable over SSH with a Docker engine."""

    name: str
    address: str
    gpus: Sequence[Gpu] = ()
    vars: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        object.__setattr__(self, "gpus", tuple(self.gpus))
        object.__setattr__(self, "vars", MappingProxyType(dict(self.vars)))


@dataclass(frozen=True)
class Group:
    """Named set of hosts with vars that apply to all of them."""

    hosts: Sequence[str]
    vars: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        object.__setattr__(self, "hosts", tuple(self.hosts))
        object.__setattr__(self, "vars", MappingProxyType(dict(self.vars)))


@dataclass(frozen=True)
class ResolvedHost:
    """A host with its groups and its merged, typed vars."""

    name: str
    address: str
    gpus: tuple[Gpu, ...]
    groups: tuple[str, ...]
    vars: HostVars


@dataclass(frozen=True)
class Inventory:
    """A loaded, checked inventory."""

    path: str
    hosts: tuple[ResolvedHost, ...]
    groups: Mapping[str, tuple[str, ...]]
    models: Mapping[str, Model]

    def host(self, name: str) -> ResolvedHost:
        """The host called ``name``."""
        for host in self.hosts:
            if host.name == name:
                return host
        raise KeyError(name)

    def model(self, name: str) -> Model:
        """The catalog entry for ``name``, or a ConfigError listing the known models."""
        if name not in self.models:
            known = ", ".join(sorted(self.models)) or "none"
            raise ConfigError(Problem(
                f"model {name!r} is not in the catalog (known: {known})",
                fix=f"add a Model(name={name!r}, ...) to `models` in {self.path}, or pick a "
                    "known model", file=self.path, field="models"))
        return self.models[name]

    def select(self, patterns: str | None = None, *, limit: str | None = None,
               model: Model | None = None) -> tuple[ResolvedHost, ...]:
        """Hosts matching ``patterns`` (default: the model's hosts), narrowed by ``limit``."""
        chosen = self.match(patterns or (model.hosts if model else "all"), "--hosts")
        if limit:
            keep = {h.name for h in self.match(limit, "--limit")}
            chosen = tuple(h for h in chosen if h.name in keep)
        if not chosen:
            raise ConfigError(Problem(
                f"no host matches --hosts {patterns or 'all'!r} and --limit {limit!r}",
                fix="list hosts, groups or globs that exist (see `fab hosts`)",
                file=self.path))
        return chosen

    def match(self, patterns: str, option: str) -> tuple[ResolvedHost, ...]:
        """Hosts named by comma-separated host names, group names or globs."""
        wanted: set[str] = set()
        for token in (t.strip() for t in patterns.split(",")):
            if not token:
                continue
            names = self._names_for(token)
            if not names:
                raise ConfigError(Problem(
                    f"{option} {token!r} matches no host, group or glob",
                    fix=f"use one of the groups ({', '.join(sorted(self.groups)) or 'none'}) or "
                        "host names; globs like 'gpu-a*' match host names",
                    file=self.path))
            wanted |= names
        return tuple(h for h in self.hosts if h.name in wanted)

    def _names_for(self, token: str) -> set[str]:
        if token == "all":
            return {h.name for h in self.hosts}
        if token in self.groups:
            return set(self.groups[token])
        return {h.name for h in self.hosts if fnmatch.fnmatchcase(h.name, token)}


def inventory_path(explicit: str | None = None) -> str:
    """``--inventory`` if given, else $TFSDEPLOY_INVENTORY, else inventory/testbed.py."""
    return explicit or os.environ.get(INVENTORY_ENV) or DEFAULT_INVENTORY


def load_inventory(path: str | None = None) -> Inventory:
    """Run the inventory file and check it; raises ConfigError naming every problem."""
    resolved = inventory_path(path)
    namespace = _run_inventory(resolved)
    return build_inventory(
        resolved,
        hosts=namespace.get("hosts", []),
        groups=namespace.get("groups", {}),
        defaults=namespace.get("defaults", {}),
        models=namespace.get("models", []),
    )


def _run_inventory(path: str) -> dict[str, Any]:
    if not Path(path).is_file():
        raise ConfigError(Problem(
            f"inventory file {path!r} does not exist",
            fix="pass --inventory PATH or set TFSDEPLOY_INVENTORY to a Python inventory file",
            file=path))
    try:
        return runpy.run_path(path, run_name="tfsdeploy_inventory")
    except Exception as exc:  # any error in user code becomes a located config error
        line = _line_in(path, exc)
        raise ConfigError(Problem(
            f"the inventory raised {type(exc).__name__}: {exc}",
            fix="fix the Python at that line", file=f"{path}:{line}" if line else path)) from exc


def _line_in(path: str, exc: BaseException) -> int | None:
    target = os.path.abspath(path)
    frames = [f for f in traceback.extract_tb(exc.__traceback__)
              if os.path.abspath(f.filename) == target]
    return frames[-1].lineno if frames else None


def build_inventory(path: str, *, hosts: Iterable[Host], groups: Mapping[str, Group],
                    defaults: Mapping[str, Any], models: Iterable[Model]) -> Inventory:
    """Check and resolve inventory data (pure); raises ConfigError with every problem."""
    problems: list[Problem] = []
    host_list = list(hosts)
    group_map = dict(groups)
    problems += _check_hosts(path, host_list)
    problems += _check_groups(path, host_list, group_map)
    problems += _check_var_keys(path, "defaults", defaults)
    for name, group in group_map.items():
        problems += _check_var_keys(path, f"groups.{name}.vars", group.vars)
    for host in host_list:
        problems += _check_var_keys(path, f"hosts.{host.name}.vars", host.vars)
    model_map, model_problems = _index_models(path, models)
    problems += model_problems
    if problems:
        raise ConfigError(problems)
    resolved = tuple(_resolve(h, group_map, defaults) for h in host_list)
    problems = [p for h in resolved for p in _check_types(path, h)]
    if problems:
        raise ConfigError(problems)
    return Inventory(path=path, hosts=resolved,
                     groups=MappingProxyType({k: tuple(g.hosts) for k, g in group_map.items()}),
                     models=MappingProxyType(model_map))


HOST_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")


def _check_hosts(path: str, hosts: list[Host]) -> list[Problem]:
    problems: list[Problem] = []
    seen: set[str] = set()
    for host in hosts:
        if not isinstance(host, Host):
            problems.append(Problem(f"`hosts` holds {host!r}, not a Host",
                                    fix="write Host(name, address, ...)", file=path,
                                    field="hosts"))
            continue
        if not HOST_NAME.match(host.name):
            problems.append(Problem(f"host name {host.name!r} is not valid",
                                    fix="use letters, digits, '.', '_' and '-'", file=path,
                                    field=f"hosts.{host.name}"))
        if host.name in seen:
            problems.append(Problem(f"host {host.name!r} is declared twice",
                                    fix="declare each host once; put shared vars in a group",
                                    file=path, field=f"hosts.{host.name}"))
        seen.add(host.name)
        indexes = [g.index for g in host.gpus]
        if len(set(indexes)) != len(indexes):
            problems.append(Problem(f"GPU indexes repeat: {indexes}", fix="give each GPU its own "
                                    "index", host=host.name, file=path, field="gpus"))
        for gpu in host.gpus:
            if gpu.memory_mib <= 0:
                problems.append(Problem(f"GPU {gpu.index} memory_mib is {gpu.memory_mib}",
                                        fix="set the GPU's total memory in MiB (e.g. 16384)",
                                        host=host.name, file=path, field="gpus.memory_mib"))
    return problems


def _check_groups(path: str, hosts: list[Host], groups: dict[str, Group]) -> list[Problem]:
    known = {h.name for h in hosts if isinstance(h, Host)}
    problems: list[Problem] = []
    for name, group in groups.items():
        if name == "all" or name in known:
            problems.append(Problem(f"group name {name!r} clashes with "
                                    f"{'the implicit group all' if name == 'all' else 'a host'}",
                                    fix="rename the group", file=path, field=f"groups.{name}"))
        for member in group.hosts:
            if member not in known:
                problems.append(Problem(f"group {name!r} lists unknown host {member!r}",
                                        fix=_suggest(member, known, "declare it in `hosts`"),
                                        file=path, field=f"groups.{name}.hosts"))
    return problems


def _check_var_keys(path: str, where: str, values: Mapping[str, Any]) -> list[Problem]:
    return [Problem(f"unknown var {key!r}", fix=_suggest(key, VAR_NAMES, "remove it"),
                    file=path, field=f"{where}.{key}")
            for key in values if key not in VAR_NAMES]


def _suggest(word: str, choices: Iterable[str], otherwise: str) -> str:
    close = difflib.get_close_matches(word, sorted(choices), n=1)
    return f"did you mean {close[0]!r}?" if close else otherwise


def _index_models(path: str, models: Iterable[Model]) -> tuple[dict[str, Model], list[Problem]]:
    result: dict[str, Model] = {}
    problems: list[Problem] = []
    for model in models:
        if not isinstance(model, Model):
            problems.append(Problem(f"`models` holds {model!r}, not a Model",
                                    fix="write Model(name=..., ...)", file=path, field="models"))
        elif model.name in result:
            problems.append(Problem(f"model {model.name!r} is declared twice",
                                    fix="declare each model once", file=path,
                                    field=f"models.{model.name}"))
        else:
            result[model.name] = model
    return result, problems


def _resolve(host: Host, groups: Mapping[str, Group], defaults: Mapping[str, Any]
             ) -> ResolvedHost:
    member_of = tuple(name for name, g in groups.items() if host.name in g.hosts)
    merged: dict[str, Any] = dict(defaults)
    for name in member_of:
        merged.update(groups[name].vars)
    merged.update(host.vars)
    return ResolvedHost(name=host.name, address=host.address, gpus=tuple(host.gpus),
                        groups=member_of, vars=replace(HostVars(), **merged))


_EXPECTED_TYPES: dict[str, tuple[type, ...]] = {
    f.name: (int,) if f.type == "int" else (float, int) if f.type == "float"
    else (bool,) if f.type == "bool" else (str,) if f.type == "str"
    else (str, type(None)) if f.type == "str | None" else (object,)
    for f in fields(HostVars)
}


def _check_types(path: str, host: ResolvedHost) -> list[Problem]:
    problems = []
    for name, expected in _EXPECTED_TYPES.items():
        value = getattr(host.vars, name)
        wrong_bool = isinstance(value, bool) and bool not in expected
        if not isinstance(value, expected) or wrong_bool:
            problems.append(Problem(
                f"var {name!r} is {value!r} ({type(value).__name__}), expected "
                f"{' or '.join(t.__name__ for t in expected)}",
                fix=f"set {name} to a {expected[0].__name__}", host=host.name, file=path,
                field=name))
    return problems
