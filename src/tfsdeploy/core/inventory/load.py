"""Python inventory files: hosts, groups, vars and the model catalog.

An inventory is a Python file that defines these module-level names::

    defaults = {...}                      # vars for every host (optional)
    hosts = [Host("gpu-a1", "10.0.0.1", gpus=[Gpu(0, 24576)], vars={...}), ...]
    groups = {"gpu_a": Group(["gpu-a1", "gpu-a2"], vars={...}), ...}   # optional
    models = [Model(...), ...]

Vars precedence, lowest first: built-in defaults < ``defaults`` < groups (in the order the
file declares them) < host vars. Every value is checked with pydantic against the annotations
of ``Host``, ``Gpu``, ``Group``, ``HostVars`` and the catalog types, where it was set (an
unknown var names where it was set and the closest known name); then the rules between
values (names and addresses declared once, ports, placements). ``build_inventory`` reports
every problem in one ConfigError.
"""

from __future__ import annotations

import difflib
import fnmatch
import ipaddress
import os
import runpy
import traceback
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from tfsdeploy.core.errors import ConfigError, Problem
from tfsdeploy.core.inventory.catalog import Model, validate_catalog
from tfsdeploy.core.inventory.fleet import (
    SLOT_NAMES,
    VAR_NAMES,
    Group,
    Host,
    HostVars,
    ResolvedHost,
)
from tfsdeploy.core.inventory.gateway import Gateway, gateway_problems
from tfsdeploy.core.inventory.gpu import instance_gpus
from tfsdeploy.core.inventory.layout import model_ports
from tfsdeploy.core.inventory.monitoring import Monitoring, check_monitoring
from tfsdeploy.core.inventory.schema import (
    GroupName,
    check,
)

DEFAULT_INVENTORY = "inventory/testbed.py"
INVENTORY_ENV = "TFSDEPLOY_INVENTORY"


@dataclass(frozen=True)
class Inventory:
    """A loaded, checked inventory."""

    path: str
    hosts: tuple[ResolvedHost, ...]
    groups: Mapping[str, tuple[str, ...]]
    models: Mapping[str, Model]
    notify: tuple[str, ...] = ()  # event receivers of every deploy/rollback (docs/hooks.md)
    # the fleet's Prometheus (core/inventory/monitoring.py)
    monitoring: Monitoring = field(default_factory=Monitoring)
    gateway: Gateway | None = None  # the gateway layer (core/inventory/gateway.py), if declared

    @property
    def gateway_hosts(self) -> tuple[ResolvedHost, ...]:
        """The hosts of the gateway's group (none without a gateway)."""
        if self.gateway is None:
            return ()
        names = set(self.groups.get(self.gateway.group, ()))
        return tuple(h for h in self.hosts if h.name in names)

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
        option = "--hosts" if patterns or not model else f"models.{model.name}.hosts"
        chosen = self.match(patterns or (model.hosts if model else "all"), option)
        if limit:
            keep = {h.name for h in self.match(limit, "--limit")}
            chosen = tuple(h for h in chosen if h.name in keep)
        if not chosen:
            raise ConfigError(Problem(
                f"no host matches --hosts {patterns or 'all'!r} and --limit {limit!r}",
                fix="list hosts, groups or globs that exist (see `fab hosts`)",
                file=self.path, field="--limit" if limit else option))
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
                    file=self.path, field=option))
            wanted |= names
        return tuple(h for h in self.hosts if h.name in wanted)

    def _names_for(self, token: str) -> set[str]:
        if token == "all":  # the serving hosts: gateway hosts route, they do not serve
            return {h.name for h in self.hosts} - {h.name for h in self.gateway_hosts}
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
        base_dir=os.path.dirname(os.path.abspath(resolved)),
        hosts=namespace.get("hosts", []),
        groups=namespace.get("groups", {}),
        defaults=namespace.get("defaults", {}),
        models=namespace.get("models", []),
        notify=namespace.get("notify", []),
        gateway=namespace.get("gateway"),
        monitoring=namespace.get("monitoring"),
    )


def _run_inventory(path: str) -> dict[str, Any]:
    if not os.path.isfile(path):
        raise ConfigError(Problem(
            f"inventory file {path!r} does not exist",
            fix="pass --inventory PATH or set TFSDEPLOY_INVENTORY to a Python inventory file",
            file=path))
    try:
        return runpy.run_path(path, run_name="tfsdeploy_inventory")
    except SystemExit as exc:
        # sys.exit() in an inventory would end the command silently with its code
        line = _line_in(path, exc)
        raise ConfigError(Problem(
            f"the inventory called sys.exit({exc.code!r})",
            fix="remove the exit: an inventory only defines hosts, groups, defaults and models",
            file=f"{path}:{line}" if line else path)) from None
    except Exception as exc:  # any error in user code becomes a located config error
        line = _line_in(path, exc)
        raise ConfigError(Problem(
            f"the inventory raised {type(exc).__name__}: {exc}",
            fix="fix the Python at that line",
            file=f"{path}:{line}" if line else path)) from exc


def _line_in(path: str, exc: BaseException) -> int | None:
    target = os.path.abspath(path)
    if isinstance(exc, SyntaxError) and exc.filename \
            and os.path.abspath(exc.filename) == target:
        return exc.lineno  # raised while compiling: no frame of the file yet
    frames = [f for f in traceback.extract_tb(exc.__traceback__)
              if os.path.abspath(f.filename) == target]
    return frames[-1].lineno if frames else None


def build_inventory(path: str, *, hosts: Iterable[Host], groups: Mapping[str, Group],
                    defaults: Mapping[str, Any], models: Iterable[Model],
                    notify: object = (), monitoring: object = None,
                    base_dir: str | None = None, gateway: object = None) -> Inventory:
    """Check and resolve inventory data (pure); raises ConfigError with every problem.
    Relative ``ssh_key`` and ``ssh_known_hosts`` are taken from ``base_dir`` (default: the
    directory of ``path``), wherever the command runs from."""
    host_list, host_vars, problems = _checked_hosts(path, hosts)
    receivers, found = check(list[str], list(notify) if isinstance(notify, (list, tuple))
                             else notify, file=path, prefix="notify")
    problems += found
    group_map, found = _checked_groups(path, groups)
    problems += found
    base, found = _checked_vars(path, defaults, "defaults")
    problems += found
    group_vars: dict[str, dict[str, Any]] = {}
    for name, group in group_map.items():
        group_vars[name], found = _checked_vars(path, group.vars, f"groups.{name}.vars")
        problems += found
    problems += _check_names(path, host_list, group_map)
    model_map, found = _checked_models(path, models)
    problems += found
    observed, found = check_monitoring(monitoring, path)
    problems += found
    checked_gateway, found = (None, []) if gateway is None else \
        check(Gateway, gateway, file=path, prefix="gateway")
    problems += found
    if problems:
        raise ConfigError(problems)
    beside = os.path.dirname(path) if base_dir is None else base_dir
    resolved = tuple(_resolve(h, group_map, base, group_vars, host_vars[h.name], beside)
                     for h in host_list)
    inventory = Inventory(
        path=path, hosts=resolved,
        groups=MappingProxyType({k: tuple(g.hosts) for k, g in group_map.items()}),
        models=MappingProxyType(model_map), notify=tuple(receivers or ()),
        monitoring=observed or Monitoring(), gateway=checked_gateway)
    problems = [p for h in resolved for p in host_port_problems(path, h)]
    problems += monitoring_host_problems(inventory)
    problems += placement_problems(inventory)
    if checked_gateway is not None:
        problems += gateway_problems(
            checked_gateway, path=path, groups=inventory.groups, models=inventory.models,
            placed=lambda m: _placed_quietly(inventory, m))
    if problems:
        raise ConfigError(merge_hosts(problems))
    return inventory


def monitoring_host_problems(inventory: Inventory) -> list[Problem]:
    """``monitoring.hosts`` must name hosts of the inventory."""
    pattern = inventory.monitoring.hosts
    if pattern is None:
        return []
    try:
        inventory.match(pattern, "monitoring.hosts")
    except ConfigError as error:
        return list(error.problems)
    return []


def merge_hosts(problems: list[Problem]) -> list[Problem]:
    """One problem for the hosts that share it (a value set in ``defaults`` or a group
    repeats on each of its hosts), naming the first hosts and how many more."""
    hosts: dict[tuple[str, str, str | None, str | None], list[str]] = {}
    for problem in problems:
        key = (problem.message, problem.fix, problem.file, problem.field)
        hosts.setdefault(key, []).append(problem.host or "")
    merged = []
    for (message, fix, file, field_), names in hosts.items():
        shown = ", ".join(names[:3]) + (f" and {len(names) - 3} more" if len(names) > 3 else "")
        merged.append(Problem(message, fix=fix, host=shown or None, file=file, field=field_))
    return merged


def _checked_hosts(path: str, hosts: object
                   ) -> tuple[list[Host], dict[str, dict[str, Any]], list[Problem]]:
    """The valid hosts, the vars each host sets (checked), and every problem."""
    items, problems = check(list[Any], hosts, file=path, prefix="hosts")
    valid: list[Host] = []
    own_vars: dict[str, dict[str, Any]] = {}
    for index, raw in enumerate(items or ()):
        name = getattr(raw, "name", None)
        named = isinstance(name, str) and name.isprintable() and 0 < len(name) <= 128
        where = f"hosts.{name}" if named else f"hosts[{index}]"
        host, found = check(Host, raw, file=path, host=name if named else None, prefix=where)
        problems += found
        if isinstance(getattr(raw, "vars", None), Mapping):
            own_vars[str(name)], found = _checked_vars(path, raw.vars, f"{where}.vars",
                                                       host=name if named else None)
            problems += found
        if host is not None:
            valid.append(host)
    return valid, own_vars, problems


def _checked_groups(path: str, groups: object) -> tuple[dict[str, Group], list[Problem]]:
    items, problems = check(dict[str, Any], groups, file=path, prefix="groups")
    valid: dict[str, Group] = {}
    for name, raw in (items or {}).items():
        _, found = check(dict[GroupName, Any], {name: raw}, file=path, prefix="groups")
        group, more = check(Group, raw, file=path, prefix=f"groups.{name}")
        problems += found + more
        if group is not None and not found:
            valid[name] = group
    return valid, problems


def _checked_vars(path: str, values: object, where: str, host: str | None = None
                  ) -> tuple[dict[str, Any], list[Problem]]:
    """The vars set in one place, each checked against HostVars (unset ones stay unset)."""
    given, problems = check(dict[str, Any], values, file=path, host=host, prefix=where)
    if not given:
        return {}, problems
    checked, problems = check(HostVars, given, file=path, host=host, prefix=where,
                              known=VAR_NAMES, unknown="var")
    return ({key: getattr(checked, key) for key in given} if checked else {}), problems


def _checked_models(path: str, models: object) -> tuple[dict[str, Model], list[Problem]]:
    items, problems = check(list[Any], models, file=path, prefix="models")
    valid, found = validate_catalog(items or [], path)
    problems += found
    result: dict[str, Model] = {}
    for model in valid:
        if model.name in result:
            problems.append(Problem(f"model {model.name!r} is declared twice",
                                    fix="declare each model once", file=path,
                                    field=f"models.{model.name}"))
        result[model.name] = model
    return result, problems


def _check_names(path: str, hosts: list[Host], groups: dict[str, Group]) -> list[Problem]:
    """Each host, address and group once; groups name known hosts only."""
    problems: list[Problem] = []
    seen: dict[str, str] = {}
    by_address: dict[str, str] = {}
    for host in hosts:
        if host.name in seen:
            problems.append(Problem(f"host {host.name!r} is declared twice",
                                    fix="declare each host once; put shared vars in a group",
                                    file=path, field=f"hosts.{host.name}"))
        seen[host.name] = host.address
        address = _canonical_address(host.address)
        if address in by_address and by_address[address] != host.name:
            problems.append(Problem(
                f"hosts {by_address[address]!r} and {host.name!r} have the same address "
                f"{host.address!r}: two deploys would run on one machine at once",
                fix="give each machine one host entry (or correct the address)",
                host=host.name, file=path, field=f"hosts.{host.name}.address"))
        by_address.setdefault(address, host.name)
        indexes = [g.index for g in host.gpus]
        for gpu in host.gpus:
            if gpu.reserved_mib >= gpu.memory_mib:
                problems.append(Problem(
                    f"GPU {gpu.index}: reserved_mib {gpu.reserved_mib} is not below memory_mib "
                    f"{gpu.memory_mib}", fix="write nvidia-smi's memory.reserved, a small part "
                    "of memory.total (616 of 143,771 MiB on an H200)", host=host.name,
                    file=path, field=f"hosts.{host.name}.gpus"))
        if len(set(indexes)) != len(indexes):
            problems.append(Problem(f"GPU indexes repeat: {indexes}",
                                    fix="give each GPU its own index", host=host.name,
                                    file=path, field=f"hosts.{host.name}.gpus"))
    for name, group in groups.items():
        if name == "all" or name in seen:
            problems.append(Problem(f"group name {name!r} clashes with "
                                    f"{'the implicit group all' if name == 'all' else 'a host'}",
                                    fix="rename the group", file=path, field=f"groups.{name}"))
        for member in group.hosts:
            if member not in seen:
                problems.append(Problem(f"group {name!r} lists unknown host {member!r}",
                                        fix=_suggest(member, seen, "declare it in `hosts`"),
                                        file=path, field=f"groups.{name}.hosts"))
    return problems


def _canonical_address(address: str) -> str:
    try:
        return str(ipaddress.ip_address(address))
    except ValueError:
        return address.lower().rstrip(".")


def _suggest(word: str, choices: Iterable[str], otherwise: str) -> str:
    close = difflib.get_close_matches(word, sorted(choices), n=1)
    return f"did you mean {close[0]!r}?" if close else otherwise


def _resolve(host: Host, groups: Mapping[str, Group], base: Mapping[str, Any],
             group_vars: Mapping[str, Mapping[str, Any]], own: Mapping[str, Any],
             beside: str) -> ResolvedHost:
    member_of = tuple(name for name, g in groups.items() if host.name in g.hosts)
    merged: dict[str, Any] = dict(base)
    for name in member_of:
        merged.update(group_vars[name])
    merged.update(own)
    for name in INVENTORY_RELATIVE:
        merged[name] = beside_inventory(merged.get(name), beside)
    return ResolvedHost(name=host.name, address=host.address, gpus=tuple(host.gpus),
                        groups=member_of, vars=HostVars(**merged))


# vars naming files on the deploy machine: a relative one is beside the inventory (as
# ssh_config(5) takes IdentityFile and UserKnownHostsFile from ~/.ssh, not the working
# directory): `fab` run from another directory, or by cron from /, finds the same files
INVENTORY_RELATIVE = ("ssh_key", "ssh_known_hosts")


def beside_inventory(value: str | None, directory: str) -> str | None:
    """``value`` as a path: absolute and ``~`` paths as they are, a relative one joined to
    the inventory's ``directory`` (pure)."""
    if not value or value.startswith(("/", "~")):
        return value
    return os.path.join(directory, value)


def host_port_problems(path: str, host: ResolvedHost) -> list[Problem]:
    """The host's stable and slot ports must all differ."""
    v = host.vars
    owners: dict[int, str] = {}
    problems = []
    named = [("grpc_port", v.grpc_port), ("rest_port", v.rest_port)]
    named += [(f"slot_ports.{slot}[{i}]", port)
              for slot in SLOT_NAMES for i, port in enumerate(v.slot_ports[slot])]
    for name, port in named:
        if port in owners:
            problems.append(Problem(
                f"{owners[port]} and {name} are both {port}: a port has one listener (a slot "
                "with one port for gRPC and REST serves no REST and no metrics)",
                fix="give every stable, admin and slot port its own number",
                host=host.name, file=path, field=name.split("[", 1)[0]))
        owners.setdefault(port, name)
    return problems


def _placed_quietly(inventory: Inventory, model: Model) -> tuple[ResolvedHost, ...]:
    """The hosts of ``model`` (none when its pattern is wrong: placement reports that)."""
    try:
        return inventory.match(model.hosts, f"models.{model.name}.hosts")
    except ConfigError:
        return ()


def placement_problems(inventory: Inventory) -> list[Problem]:
    """Each model's ``hosts`` names hosts; on each of them its ports (shifted by its
    ``port_offset``, and by ``layout.INSTANCE_PORT_STRIDE`` per instance) exist and no two
    models, nor two instances, share one; ``gpus`` names GPUs the host has."""
    problems: list[Problem] = []
    owners: dict[tuple[str, int], str] = {}
    if not inventory.hosts:
        return []  # nothing to place (an inventory of models only, e.g. while being written)
    for name, model in sorted(inventory.models.items()):
        try:
            placed = inventory.match(model.hosts, f"models.{name}.hosts")
        except ConfigError as error:
            problems += error.problems
            continue
        if not placed:
            problems.append(Problem(f"models.{name}.hosts {model.hosts!r} names no host",
                                    fix="name hosts, groups or globs, comma-separated (default "
                                        "'all')", file=inventory.path,
                                    field=f"models.{name}.hosts"))
        for host in placed:
            ports = model_ports(host, model)
            missing = sorted(set(model.gpus or ()) - {g.index for g in host.gpus})
            if missing and host.gpus:
                problems.append(Problem(
                    f"model {name!r} asks for GPU(s) {missing}; the host has "
                    f"{[g.index for g in host.gpus]}", fix="name GPUs the host has in the "
                    "model's gpus, or leave gpus unset (every GPU)", host=host.name,
                    file=inventory.path, field=f"models.{name}.gpus"))
            count = len(instance_gpus(host, model))
            used = sorted({ports.grpc, ports.rest,
                           *(port for k in range(count) for slot in ports.slots
                             for port in (ports.slot_grpc(slot, k), ports.slot_rest(slot, k)))})
            if used[-1] > 65535:
                problems.append(Problem(
                    f"port_offset {model.port_offset} moves the ports of model {name!r} up to "
                    f"{used[-1]}, beyond 65535", fix="lower port_offset (or the host's ports)",
                    host=host.name, file=inventory.path, field=f"models.{name}.port_offset"))
                continue
            clash = next((p for p in used if (host.name, p) in owners), None)
            if clash is not None:
                problems.append(Problem(
                    f"models {owners[(host.name, clash)]!r} and {name!r} both use port {clash}"
                    + (f" ({name!r} runs {count} instances here, each instance's slots "
                       f"{ports.instance_stride} ports above the previous one's)"
                       if count > 1 else ""),
                    fix=f"give one of them a port_offset (e.g. port_offset="
                        f"{100 * (1 + (count * ports.instance_stride) // 100)} on {name!r})",
                    host=host.name, file=inventory.path, field=f"models.{name}.port_offset"))
            owners.update({(host.name, p): name for p in used})
    return problems
