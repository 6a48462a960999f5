"""Reading a host's own registry login (pure argv builders): its docker CLI configuration and,
where that names one, its credential helper. The answers hold secrets: ``hosts.logins`` reads
them and never shows them. No secret is ever an argument: a helper gets the registry on stdin,
as the docker CLI gives it (docker-credential-helpers' protocol: ``get`` reads the server URL
on stdin, prints ``{"ServerURL", "Username", "Secret"}``)."""

from __future__ import annotations

from tfsdeploy.hosts.commands import Argv

# the docker CLI's configuration of the SSH user ($DOCKER_CONFIG, else ~/.docker: docker's
# cli/config/config.go); nothing printed when there is none
_CONFIG = 'cat -- "${DOCKER_CONFIG:-$HOME/.docker}/config.json" 2>/dev/null || true'


def docker_config() -> Argv:
    """Print the host's docker CLI configuration (``config.json``), if any."""
    return ["sh", "-c", _CONFIG]


def credential_helper(helper: str) -> Argv:
    """Ask ``docker-credential-<helper>`` for the login of the registry given on stdin."""
    return [f"docker-credential-{helper}", "get"]
