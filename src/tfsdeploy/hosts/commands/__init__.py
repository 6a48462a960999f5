"""Every command the toolkit runs on a host, built as an argument list (never a shell string
handed in from outside): pure builders, grouped by subject. Quoting happens once, at the SSH
boundary (``remote``). Docker Engine calls are not commands: they go through the docker SDK
(``containers`` builds their specs)."""

from __future__ import annotations

Argv = list[str]
