"""Which login a host's Docker engine pulls with, per registry.

An engine keeps no login: a pull is anonymous unless its caller sends an ``X-Registry-Auth``
header (moby api/server/router/image/image_routes.go, postImagesCreate: an empty or missing
header is an anonymous pull). docker-py, asked to pull without ``auth_config``, sends the
credentials of the docker configuration of the machine it runs on, credential helpers
included (docker/auth.py, ``get_config_header``): the deploy machine's push login would reach
every host's engine, and root on any one host could read it. So every pull of the toolkit
states its login (``SdkDocker.pull``), chosen here for the host and the image's registry:

1. the host's ``pull_logins`` names one for the registry: a pull-only credential the
   inventory names by reference, read on the deploy machine: ``env:NAME`` (an environment
   variable holding ``user:password``) or ``file:/path`` (its first line, ``user:password``;
   the file readable by its owner only, as ssh keys);
2. else the host's own docker login, read on the host: its docker CLI configuration's
   credential helper (``credHelpers``, ``credsStore``) or ``auths`` entry, as the docker CLI
   resolves them (cli/config/configfile/file.go);
3. else none: an anonymous pull.

A login goes only to the engine of the host it is for. None is ever shown: errors name the
reference or the registry, never a value, and ``repr`` shows neither.
"""

from __future__ import annotations

import base64
import binascii
import json
import os
import re
import stat
import threading
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, Protocol

from tfsdeploy.core.errors import ConfigError, Problem
from tfsdeploy.hosts.commands import logins as login_commands

AuthConfig = dict[str, str]
"""What the engine's X-Registry-Auth carries (moby api/types/registry AuthConfig: username,
password, identitytoken, serveraddress); empty: an anonymous pull."""

DOCKER_HUB = ("docker.io", "index.docker.io", "registry-1.docker.io")
HUB_SERVER = "https://index.docker.io/v1/"  # the key docker login writes for Docker Hub
_HELPER = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")


class CommandOutput(Protocol):
    """What a command on the host answered (``ssh.Result``)."""

    @property
    def ok(self) -> bool:
        """Whether it exited 0."""

    @property
    def stdout(self) -> str:
        """Its output."""


RunOnHost = Callable[[list[str], bytes | None], CommandOutput]
"""Run an argv on the host with optional stdin (the host's connection)."""


def _refused(registry: str, reference: str, why: str, fix: str) -> ConfigError:
    return ConfigError(Problem(f"the pull login {reference} for {registry} {why}", fix=fix,
                               field=f"pull_logins.{registry}"))


def read_reference(registry: str, reference: str) -> AuthConfig:
    """The pull-only credential ``reference`` names (``env:NAME`` or ``file:/path``), read on
    the deploy machine; a ConfigError (exit 1) naming the reference, never the value."""
    kind, _, where = reference.partition(":")
    if kind == "env":
        value = os.environ.get(where)
        if value is None:
            raise _refused(registry, reference, "is not set in this environment",
                           f"export {where}=USER:PASSWORD (a pull-only account) for the run")
    else:
        value = _read_private_file(registry, reference, Path(where))
    user, sep, password = value.strip("\n").partition(":")
    if not sep or not user or not password or "\n" in password:
        raise _refused(registry, reference, "does not hold one line USER:PASSWORD",
                       "write the pull-only account as USER:PASSWORD")
    return {"username": user, "password": password, "serveraddress": registry}


def _read_private_file(registry: str, reference: str, path: Path) -> str:
    try:
        info = path.stat()
        if not stat.S_ISREG(info.st_mode):
            raise _refused(registry, reference, "is not a regular file",
                           "point it at a file holding USER:PASSWORD")
        if info.st_mode & 0o077:
            raise _refused(registry, reference, f"is readable by others (mode "
                           f"{stat.S_IMODE(info.st_mode):04o})", f"chmod 600 {path}")
        return path.read_text().split("\n", 1)[0]
    except (OSError, UnicodeDecodeError) as error:
        raise _refused(registry, reference, f"cannot be read ({type(error).__name__})",
                       "point it at a readable file holding USER:PASSWORD") from None


def check_references(logins: Mapping[str, str]) -> None:
    """Every reference ``logins`` names can be read now (before any connection)."""
    for registry, reference in sorted(logins.items()):
        read_reference(registry, reference)


def _server_keys(registry: str) -> list[str]:
    """The keys a docker configuration may file ``registry``'s login under."""
    if registry in DOCKER_HUB:
        return [HUB_SERVER, "index.docker.io", "docker.io"]
    return [registry, f"https://{registry}", f"http://{registry}", f"https://{registry}/v1/",
            f"https://{registry}/v2/"]


def _from_entry(entry: Any, registry: str) -> AuthConfig | None:
    """A docker configuration's ``auths`` entry -> its login (None: it holds none)."""
    if not isinstance(entry, dict):
        return None
    if entry.get("identitytoken"):
        return {"identitytoken": str(entry["identitytoken"]), "serveraddress": registry}
    try:
        user, sep, password = base64.b64decode(str(entry.get("auth") or "")).decode() \
            .partition(":")
    except (binascii.Error, UnicodeDecodeError):
        return None
    return {"username": user, "password": password, "serveraddress": registry} \
        if sep and user else None


def host_login(run: RunOnHost, registry: str) -> AuthConfig | None:
    """The host's own docker login to ``registry`` (None: it has none, or it cannot be
    read: the pull is then anonymous, and a registry that wants a login refuses it)."""
    answer = run(login_commands.docker_config(), None)
    try:
        config = json.loads(answer.stdout) if answer.ok and answer.stdout.strip() else {}
    except ValueError:
        return None
    if not isinstance(config, dict):
        return None
    keys = _server_keys(registry)
    helpers = _section(config, "credHelpers")
    helper = next((helpers[k] for k in keys if k in helpers), None) or config.get("credsStore")
    if isinstance(helper, str) and _HELPER.fullmatch(helper):
        found = _from_helper(run, helper, keys[0], registry)
        if found is not None:
            return found
    auths = _section(config, "auths")
    return next((login for k in keys if (login := _from_entry(auths.get(k), registry))), None)


def _section(config: dict[str, Any], name: str) -> dict[str, Any]:
    found = config.get(name)
    return found if isinstance(found, dict) else {}


def _from_helper(run: RunOnHost, helper: str, server: str, registry: str) -> AuthConfig | None:
    answer = run(login_commands.credential_helper(helper), server.encode())
    try:
        found = json.loads(answer.stdout) if answer.ok else None
    except ValueError:
        return None
    if not isinstance(found, dict) or not found.get("Secret"):
        return None
    if found.get("Username") == "<token>":  # an identity token (docker login's OAuth)
        return {"identitytoken": str(found["Secret"]), "serveraddress": registry}
    return {"username": str(found.get("Username", "")), "password": str(found["Secret"]),
            "serveraddress": registry}


class PullLogins:
    """The logins one host's engine pulls with, per registry, each read once (a connection
    lives one run)."""

    def __init__(self, host: str, references: Mapping[str, str], run: RunOnHost) -> None:
        self._host = host
        self._references = dict(references)
        self._run = run
        self._found: dict[str, AuthConfig] = {}
        self._lock = threading.Lock()

    def __repr__(self) -> str:
        return f"PullLogins({self._host!r}, registries={sorted(self._found)!r})"

    def auth_config(self, registry: str) -> AuthConfig:
        """The login for ``registry`` (``{}``: anonymous), never the deploy machine's."""
        with self._lock:
            if registry not in self._found:
                reference = self._references.get(registry)
                self._found[registry] = (read_reference(registry, reference) if reference
                                         else host_login(self._run, registry) or {})
            return dict(self._found[registry])

    def source(self, registry: str) -> str:
        """Whose login a pull from ``registry`` uses, for messages (no value)."""
        reference = self._references.get(registry)
        if reference:
            return f"the pull login {reference}"
        return "the host's own docker login" if self._found.get(registry) else \
            "no login (the host has none for it)"
