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


@task(help={
    "model": "model name from the inventory's catalog (required)",
    "inventory": "inventory file (default: $TFSDEPLOY_INVENTORY or inventory/testbed.py)",
    "hosts": "hosts, groups or globs, comma-separated (default: the model's hosts)",
    "limit": "further narrow the hosts",
    "version": "model version to deploy (default: the newest in the model's source)",
    "playbook": "playbook file (default: playbooks/deploy.yml)",
    "lock_wait": "seconds to wait for another deploy's lock before exiting 4 (default 0)",
    "check": "show the per-host plan; touch nothing",
    "diff": "with --check: also diff every file against what is live",
    "json": "print the result as JSON on stdout (progress goes to stderr)",
})
def deploy(c: Any, model: str, inventory: str | None = None, hosts: str | None = None,
           limit: str | None = None, version: str | None = None, playbook: str | None = None,
           lock_wait: float = 0.0, check: bool = False, diff: bool = False,
           json: bool = False) -> None:
    """Roll a model release host by host in a dual-version window, gated on health."""
    def body() -> int:
        import sys

        from tfsdeploy.cli import deploy as cmd
        from tfsdeploy.cli.output import print_table

        request = cmd.DeployRequest(model=model, inventory=inventory, hosts=hosts, limit=limit,
                                    version=version, playbook=playbook,
                                    lock_wait=float(lock_wait))
        if check or diff:
            rows = cmd.plan(request, diff=diff)
            if json:
                cmd.print_json(rows)
                return 0
            print_table(f"deploy --check {model}: nothing was changed",
                        ("host", "would do", "live"),
                        [(r["host"], r["action"], r["detail"]) for r in rows])
            for row in rows:
                if row["diff"]:
                    print(row["diff"])
            return 0
        result = cmd.deploy(request, reporter=cmd.LineReporter(sys.stderr if json else
                                                                sys.stdout))
        if json:
            cmd.print_json(result.as_dict())
        else:
            print_table(f"deploy {model} v{result.version} ({result.release_id}): "
                        f"{result.exit_code.name.lower()} in {result.seconds:.1f} s",
                        ("host", "result", "time per phase", "gates", "error"),
                        cmd.summary_rows(result))
            print(result.message)
        return int(result.exit_code)

    _run(body)


@task(help={"model": "model whose fleet lock to show (required)",
            "inventory": "inventory file",
            "break_": "remove the lock whoever holds it (only when no deploy runs)"})
def lock(c: Any, model: str, inventory: str | None = None, break_: bool = False) -> None:
    """Show the deploy lock of a model's fleet, or break a stale one with --break."""
    def body() -> int:
        from tfsdeploy import lock as locks
        from tfsdeploy.inventory import load_inventory
        from tfsdeploy.layout import host_paths
        from tfsdeploy.remote import SshRunner

        inv = load_inventory(inventory)
        catalog = inv.model(model)
        lock_host = inv.select(None, model=catalog)[0]
        runner = SshRunner(lock_host)
        try:
            lock_dir = host_paths(lock_host, catalog).lock_dir
            if break_:
                holder = locks.break_lock(runner, lock_dir)
                print(f"lock on {lock_host.name} broken" + (
                    f" (was: {holder.describe()})" if holder else " (it was free)"))
                return 0
            holder = locks.read_lock(runner, lock_dir)
            if holder is None:
                print(f"{model}: no deploy holds the lock (on {lock_host.name})")
                return 0
            stale = " STALE: that process is gone" if locks.is_stale(holder) else ""
            print(f"{model}: locked on {lock_host.name} by {holder.describe()}{stale}")
            return 0
        finally:
            runner.close()

    _run(body)


ns = Collection(render, hosts, deploy, lock)
