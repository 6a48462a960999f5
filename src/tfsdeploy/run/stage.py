"""`fab publish` (a model version packed once and pushed to the fleet's registry as an image)
and `fab stage` (the version put in place on every host ahead of a release)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tfsdeploy.core.errors import ConfigError, Problem, TfsDeployError
from tfsdeploy.core.inventory.versions import choose_version
from tfsdeploy.core.target import Target
from tfsdeploy.hosts.registry import Registry, RegistryError
from tfsdeploy.hosts.ssh import ConnectionFactory, SshConnection
from tfsdeploy.run import engine, plans
from tfsdeploy.run.after import NO_EPILOGUE, Epilogue
from tfsdeploy.run.engine import Reporter, RunResult
from tfsdeploy.run.publish import Published, pack, publish
from tfsdeploy.run.sources import SourceError


class PublishFailed(TfsDeployError):
    """The registry could not be reached or refused the image, or the source changed while
    it was read; no host was touched."""


def registries(target: Target) -> list[tuple[str, bool]]:
    """The distinct (model_registry, insecure) of the selected hosts; none is a config
    error."""
    found = sorted({(str(h.vars.model_registry), h.vars.model_registry_insecure)
                    for h in target.hosts if h.vars.model_registry})
    if not found:
        raise ConfigError(Problem(
            f"no selected host of {target.model.name} names a model_registry",
            fix="set model_registry (e.g. 'registry:5000/tfsdeploy-models') in the "
                "inventory's defaults, a group or the hosts", file=target.inventory.path,
            field="model_registry"))
    return found


def publish_version(target: Target, version: int | str | None) -> list[Published]:
    """Pack the version once and publish it to every registry the selected hosts name;
    only what a registry lacks is pushed."""
    model = target.model
    chosen = choose_version(model, version, target.inventory.path)
    wanted = registries(target)
    source = plans.deployable_source(target, chosen)
    try:
        packed = pack(model.name, chosen, Path(source))
    except (SourceError, OSError) as error:
        raise PublishFailed(f"version {chosen} of {model.name} cannot be packed: {error}") \
            from None
    done: list[Published] = []
    for prefix, insecure in wanted:
        registry = Registry(prefix.split("/", 1)[0], insecure=insecure)
        try:
            done.append(publish(packed, registry, prefix))
        except (RegistryError, SourceError) as error:
            raise PublishFailed(str(error)) from None
        finally:
            registry.close()
    return done


def publish_data(target: Target, published: list[Published]) -> dict[str, Any]:
    """The JSON result of `fab publish`."""
    return {"model": target.model.name, "images": [
        {"reference": p.reference, "digest": p.digest, "tag": p.tag,
         "repository": f"{p.repo.registry}/{p.repo.repository}",
         "uploaded": list(p.uploaded), "uploaded_bytes": p.uploaded_bytes}
        for p in published]}


def stage(target: Target, *, version: int | str | None = None, playbook: str | None = None,
          lock_wait: float = 0.0, max_pulls: int | None = None, reporter: Reporter,
          connect: ConnectionFactory = SshConnection,
        epilogue: Epilogue = NO_EPILOGUE) -> RunResult:
    """Stage the version on every selected host; nothing serving changes."""
    plan = plans.stage_plan(target, version=version, playbook=playbook, lock_wait=lock_wait,
                            max_pulls=max_pulls)
    return engine.run(plan, reporter=reporter, connect=connect, epilogue=epilogue)
