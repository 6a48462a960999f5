"""The gateway layer as an inventory declares it: which hosts are gateways (a group, ``gateway``
by default), which models they route and how (a listen port pair per model, or routing by the
request's authority ``<model>.<domain>`` on shared ports), each model's request-rate limit and
the timeouts (pure: the values, their rules, and the rules between them and the inventory).

An inventory file declares it beside its hosts::

    gateway = Gateway(domain="models.example.com", routes=[
        Route("resnet50", rate_limit_rps=2000),
        Route("ranker", grpc_port=9500, rest_port=9501)])

The gateway's hosts are not serving hosts: the implicit group ``all`` leaves them out, and a
model whose ``hosts`` names one is refused. ``gateway_config`` renders HAProxy's file from it.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Annotated, ClassVar

from pydantic import ConfigDict, Field, Strict

from tfsdeploy.core.errors import Problem
from tfsdeploy.core.inventory.catalog import CHECKED, Model
from tfsdeploy.core.inventory.fleet import ResolvedHost
from tfsdeploy.core.inventory.schema import (
    ONE_WEEK_S,
    GroupName,
    ImageReference,
    ModelName,
    Port,
    rule,
)

_LABEL = r"(?!-)[a-z0-9-]{1,63}(?<!-)"
_DOMAIN = re.compile(rf"{_LABEL}(\.{_LABEL})+")

Domain = Annotated[str, Strict(), rule(
    lambda v: None if _DOMAIN.fullmatch(v) else "is not a DNS domain of lowercase labels",
    "write a domain like 'models.example.com' (lowercase letters, digits and '-' per label)")]
Milliseconds = Annotated[int, Strict(), Field(ge=10, le=3_600_000)]
RatePerSecond = Annotated[int, Strict(), Field(ge=1, le=10_000_000)]


@dataclass(frozen=True)
class Route:
    """One model behind the gateway: its own listen ports (gRPC over HTTP/2 cleartext and
    REST), or none (it is then reached through the shared ports by its authority
    ``<model>.<domain>``), and its request-rate limit per gateway host (None: no limit)."""

    __pydantic_config__: ClassVar[ConfigDict] = CHECKED
    model: ModelName
    grpc_port: Port | None = None
    rest_port: Port | None = None
    rate_limit_rps: RatePerSecond | None = None


@dataclass(frozen=True)
class Gateway:
    """The gateway hosts' setting. Timeouts in milliseconds.

    ``check_interval_ms``: how often each backend's model status is read (REST
    ``GET /v1/models/<model>``, AVAILABLE expected); a host leaves the rotation after ``fall``
    failed checks in a row (a refused connection fails at once; a host that hangs fails after
    ``check_timeout_ms``), and at once at the first failed connection of live traffic; it
    comes back after ``rise`` good ones. ``fall`` is 2: one status answer later than
    ``check_timeout_ms`` from a busy host is no outage (with fall 1 and the model's one other
    host drained, a single late answer turned into 503s for every client).
    ``request_timeout_ms``: the longest a request may wait for its backend's answer;
    ``client_idle_timeout_ms``: how long an idle client connection is kept (gRPC clients hold
    theirs for hours: keep it long); ``backend_idle_ms``: how long the gateway keeps its
    connections to the serving hosts when they carry no request."""

    __pydantic_config__: ClassVar[ConfigDict] = CHECKED
    routes: Annotated[Sequence[Route], Field(min_length=1, max_length=1000)]
    group: GroupName = "gateway"
    domain: Domain | None = None
    grpc_port: Port = 8500
    rest_port: Port = 8501
    connect_timeout_ms: Milliseconds = 2000
    request_timeout_ms: Milliseconds = 60_000
    client_idle_timeout_ms: Milliseconds = 3_600_000
    # HAProxy closes half of a server's idle connections every pool-purge-delay, and a
    # connection between two requests counts as idle: the gateway's connection to a host is
    # replaced once per this period at most (measured on HAProxy 2.6.12: with 10 s, the one
    # connection under a steady load was replaced at 10 s and 20 s)
    backend_idle_ms: Milliseconds = 3_600_000
    check_interval_ms: Milliseconds = 1000
    check_timeout_ms: Milliseconds = 500
    rise: Annotated[int, Strict(), Field(ge=1, le=100)] = 2
    fall: Annotated[int, Strict(), Field(ge=1, le=100)] = 2
    image: ImageReference | None = None  # None: each gateway host's proxy_image
    # the most a `fab gateway` run may take, lock included (None: no limit): past it the run
    # stops as at SIGTERM, at its next wait or between two hosts (the host rolling gets its
    # previous files back; none after it rolls); a command under way finishes first
    deadline_s: Annotated[float | None, Strict(),
                          Field(gt=0, le=ONE_WEEK_S, allow_inf_nan=False)] = None

    def __post_init__(self) -> None:
        if isinstance(self.routes, list):
            object.__setattr__(self, "routes", tuple(self.routes))

    def route(self, model: str) -> Route | None:
        """The route of ``model`` (None: the gateway does not route it)."""
        return next((r for r in self.routes if r.model == model), None)


Placement = Callable[[Model], tuple[ResolvedHost, ...]]


def gateway_problems(gateway: Gateway, *, path: str, groups: Mapping[str, tuple[str, ...]],
                     models: Mapping[str, Model], placed: Placement) -> list[Problem]:
    """The rules between the gateway's values and the inventory: its group exists and has
    hosts, every route names a model of the catalog once (names compared without case), is
    reachable (own ports or the domain), ports are never shared, a domain-routed model's name
    is a DNS label, the check fits its interval, a request may last its model's latency SLO,
    and no model serves from a gateway host."""
    def problem(message: str, fix: str, field: str) -> Problem:
        return Problem(message, fix=fix, file=path, field=f"gateway.{field}")

    problems: list[Problem] = []
    members = groups.get(gateway.group)
    if not members:
        problems.append(problem(
            f"the gateway's group {gateway.group!r} " + ("has no host" if members == () else
                                                         "is not declared"),
            f"declare groups = {{{gateway.group!r}: Group([...gateway hosts...])}}", "group"))
    if gateway.check_timeout_ms >= gateway.check_interval_ms:
        problems.append(problem(
            f"check_timeout_ms {gateway.check_timeout_ms} is not below check_interval_ms "
            f"{gateway.check_interval_ms}: a hung host would be judged later than one interval",
            "lower check_timeout_ms below check_interval_ms (e.g. half of it)",
            "check_timeout_ms"))
    problems += _port_problems(gateway, problem)
    # HAProxy's ACLs match the authority lowercased (an authority is case-insensitive, RFC
    # 3986 3.2.2): two names differing only in case would render one ACL twice, and the
    # second model's route (its rate limit too) would never apply
    seen: dict[str, str] = {}
    for index, route in enumerate(gateway.routes):
        where = f"routes[{index}]"
        first = seen.get(route.model.lower())
        if first == route.model:
            problems.append(problem(f"model {route.model!r} is routed twice",
                                    "give each model one Route", f"{where}.model"))
        elif first is not None:
            problems.append(problem(
                f"model {route.model!r} is routed beside {first!r}: route names must differ "
                "in more than case (the gateway matches names and authorities lowercased)",
                "rename one of the models, or route one of them only", f"{where}.model"))
        seen.setdefault(route.model.lower(), route.model)
        problems += _route_problems(gateway, route, where, models, placed, members or (),
                                    problem)
    return problems


def _route_problems(gateway: Gateway, route: Route, where: str, models: Mapping[str, Model],
                    placed: Placement, members: Sequence[str],
                    problem: Callable[[str, str, str], Problem]) -> list[Problem]:
    problems: list[Problem] = []
    if (route.grpc_port is None) != (route.rest_port is None):
        problems.append(problem(
            f"model {route.model!r} has only a "
            f"{'gRPC' if route.grpc_port is not None else 'REST'} port",
            "give both grpc_port and rest_port, or neither (routing by authority)", where))
    if route.grpc_port is None and gateway.domain is None:
        problems.append(problem(
            f"model {route.model!r} has no ports and the gateway no domain: no request could "
            "reach it", "give the Route grpc_port and rest_port, or the Gateway a domain "
            "(requests then name '<model>.<domain>')", where))
    if gateway.domain is not None and route.grpc_port is None \
            and not re.fullmatch(_LABEL, route.model.lower()):
        problems.append(problem(
            f"model {route.model!r} cannot be the first label of an authority "
            f"'{route.model}.{gateway.domain}' ('_' and '.' are not allowed in a DNS label)",
            "give this Route its own grpc_port and rest_port", f"{where}.model"))
    model = models.get(route.model)
    if model is None:
        known = ", ".join(sorted(models)) or "none"
        problems.append(problem(f"model {route.model!r} is not in the catalog (known: {known})",
                                "route a model declared in `models`", f"{where}.model"))
        return problems
    if gateway.request_timeout_ms < model.latency_slo_ms:
        problems.append(problem(
            f"request_timeout_ms {gateway.request_timeout_ms} is below the latency SLO of "
            f"model {model.name!r} ({model.latency_slo_ms:g} ms): requests the SLO allows "
            "would be cut", f"raise request_timeout_ms to at least "
            f"{math.ceil(model.latency_slo_ms)}", "request_timeout_ms"))
    serving = {h.name for h in placed(model)}
    overlap = sorted(serving & set(members))
    if overlap:
        problems.append(problem(
            f"model {model.name!r} is placed on gateway host(s) {', '.join(overlap)}: a gateway "
            "host routes, it does not serve", f"take {', '.join(overlap)} out of "
            f"models.{model.name}.hosts (the implicit group 'all' leaves gateway hosts out)",
            f"{where}.model"))
    if not serving:
        problems.append(problem(f"model {model.name!r} has no serving host to route to",
                                f"place it on hosts (models.{model.name}.hosts)",
                                f"{where}.model"))
    return problems


def _port_problems(gateway: Gateway,
                   problem: Callable[[str, str, str], Problem]) -> list[Problem]:
    owners: dict[int, str] = {}
    named: list[tuple[str, int]] = []
    if gateway.domain is not None:
        named += [("grpc_port", gateway.grpc_port), ("rest_port", gateway.rest_port)]
    for index, route in enumerate(gateway.routes):
        named += [(f"routes[{index}].{kind}", port)
                  for kind, port in (("grpc_port", route.grpc_port),
                                     ("rest_port", route.rest_port)) if port is not None]
    problems = []
    for field, port in named:
        if port in owners:
            problems.append(problem(f"{owners[port]} and {field} are both {port}",
                                    "give every listen port of the gateway its own number",
                                    field))
        owners.setdefault(port, field)
    return problems
