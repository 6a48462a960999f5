"""tfsdeploy's Fabric tasks: thin wrappers over the `tfsdeploy` package.

Run from the repository root: `fab --list`, `fab render --model resnet50`.
Every task exits with the codes documented in the README (0 ok, 1 invalid input, ...).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from fabric import task
from invoke.collection import Collection
from invoke.exceptions import Exit


def _run(body: Callable[[], int]) -> None:
    """Run a command body; turn toolkit errors into their exit code with a clear message."""
    from tfsdeploy.cli.output import print_error
    from tfsdeploy.errors import TfsDeployError

    try:
        code = body()
    except TfsDeployError as error:
        print_error(error)
        raise Exit(code=int(error.exit_code)) from None
    if code:
        raise Exit(code=code)


@task(help={
    "model": "model name from the inventory's catalog (required)",
    "inventory": "inventory file (default: $TFSDEPLOY_INVENTORY or inventory/testbed.py)",
    "hosts": "hosts, groups or globs, comma-separated (default: the model's hosts)",
    "limit": "further narrow the hosts to these hosts, groups or globs",
    "version": "model version to render (default: the newest in the model's source)",
    "out": "output directory; one folder per host (default: render/)",
})
def render(c: Any, model: str, inventory: str | None = None, hosts: str | None = None,
           limit: str | None = None, version: str | None = None, out: str = "render") -> None:
    """Render and validate the files each host would receive; touches no host."""
    def body() -> int:
        from pathlib import Path

        from tfsdeploy.cli.output import print_table
        from tfsdeploy.cli.render import (
            RenderRequest,
            render_and_validate,
            summary_rows,
            write_renders,
        )

        renders = render_and_validate(RenderRequest(model=model, inventory=inventory,
                                                    hosts=hosts, limit=limit, version=version))
        written = write_renders(renders, Path(out))
        print_table(f"{model}: {len(renders)} host(s) rendered and validated into {out}/",
                    ("host", "address", "version", "GPU fraction", "files"),
                    summary_rows(renders))
        print(f"{len(written)} files written; every file parsed with TFServing's definitions.")
        return 0

    _run(body)


@task(help={"inventory": "inventory file (default: $TFSDEPLOY_INVENTORY or inventory/testbed.py)",
            "hosts": "hosts, groups or globs, comma-separated",
            "limit": "further narrow the hosts"})
def hosts(c: Any, inventory: str | None = None, hosts: str | None = None,
          limit: str | None = None) -> None:
    """List the inventory's hosts with their groups, GPUs and models."""
    def body() -> int:
        from tfsdeploy.cli.output import print_table
        from tfsdeploy.inventory import load_inventory
        from tfsdeploy.render import placements

        inv = load_inventory(inventory)
        placed = placements(inv)
        rows = [(h.name, h.address, ",".join(h.groups) or "-",
                 " ".join(f"{g.index}:{g.memory_mib}MiB" for g in h.gpus) or "-",
                 ",".join(m for m, on in placed.items() if h.name in on) or "-")
                for h in inv.select(hosts, limit=limit)]
        print_table(f"{inv.path}: {len(rows)} host(s)",
                    ("host", "address", "groups", "GPUs", "models"), rows)
        return 0

    _run(body)


ns = Collection(render, hosts)
