"""``fab prune``: free a host's disk of what no retained release needs: the releases beyond
``keep_releases`` (as a deploy's finalize prunes them), the model version directories no
retained or running release uses, and the images of pruned releases that no container uses.
Never the live release, what the proxy serves, a release in the rollback window, or a
retained one, nor their files, whatever their containers' state
(``finalize.protected_releases``): a rollback to any release ``fab history`` lists keeps
working. And what killed stages left (``prune_leftovers``): a pull's ``.pull-<v>`` copy and
extract container, a push's ``.staging-*`` directory and archive, a check's ``.sums-*``. Prune
holds the model's lock, so no stage of the model runs meanwhile: every one is stale."""

from __future__ import annotations

from tfsdeploy.core.artifact import ArtifactError, model_repo
from tfsdeploy.hosts.commands import pull as pull_commands
from tfsdeploy.hosts.commands.files import disk_usage, remove_tree
from tfsdeploy.run.changes import Check, Command, RemoveImage
from tfsdeploy.run.jobs import HostJob
from tfsdeploy.run.operations.finalize import doomed_releases, prune_releases
from tfsdeploy.run.operations.step import Ops, operation


@operation("prune_releases")
def prune_old_releases(job: HostJob) -> Ops:
    """Releases beyond ``keep_releases``: their containers and directories."""
    return (yield from prune_releases(job, set())) or "nothing beyond keep_releases"


def unused_versions(job: HostJob) -> list[int]:
    """Staged versions that no kept release records and no container runs (pure)."""
    doomed = set(doomed_releases(job, set()))
    used = {r.version for r in job.facts.releases if r.id not in doomed}
    used |= {c.version for c in job.facts.servers}
    return sorted(v for v in job.facts.versions if v not in used)


@operation("prune_versions")
def prune_versions(job: HostJob) -> Ops:
    """Model version directories that no retained release uses (with their digests)."""
    versions = unused_versions(job)
    if not versions:
        return "every staged version is used by a retained release"
    paths = job.paths
    directories = [paths.version_dir(v) for v in versions]

    def measure() -> str:
        result = job.conn.run(disk_usage(directories))
        total = sum(int(line.split()[0]) for line in result.stdout.splitlines()
                    if line.split() and line.split()[0].isascii()
                    and line.split()[0].isdigit())
        return (f"{total / (1 << 20):.1f} MiB ({total} bytes) in version(s) "
                f"{', '.join(map(str, versions))}")

    yield Check(f"measure version(s) {', '.join(map(str, versions))}", measure)
    for version, directory in zip(versions, directories, strict=True):
        yield Command.of(remove_tree(directory, root=paths.model_dir),
                         f"remove version {version} ({directory})")
        yield Command.of(remove_tree(paths.digest_file(version), root=paths.home),
                         f"forget version {version}'s digest")
        yield Command.of(remove_tree(paths.sums_file(version), root=paths.home),
                         f"forget version {version}'s sums")
    return f"removed version(s) {', '.join(map(str, versions))}"


@operation("prune_images")
def prune_images(job: HostJob) -> Ops:
    """Images of pruned releases that no container on the host uses any more."""
    doomed = set(doomed_releases(job, set()))
    kept = {r.image for r in job.facts.releases if r.id not in doomed}
    kept |= {c.image for c in job.facts.containers}
    images = sorted({r.image for r in job.facts.releases if r.id in doomed} - kept)
    if not images:
        return "no image to remove"

    for image in images:
        yield RemoveImage(image)
    return ""


def _image_repository(job: HostJob) -> str:
    """``registry/repository@`` of the model's version images on this host ("": none)."""
    prefix = job.host.vars.model_registry
    try:
        repo = model_repo(str(prefix), job.run.model.name) if prefix else None
    except ArtifactError:
        return ""
    return f"{repo.registry}/{repo.repository}@" if repo else ""


@operation("prune_leftovers")
def prune_leftovers(job: HostJob) -> Ops:
    """What killed stages left beside the model's versions, and a killed pull's extract
    containers (none of them is ever loaded or run; all take room)."""
    models_dir, model = job.paths.model_dir, job.run.model.name
    repository = _image_repository(job)
    found: dict[str, list[str]] = {}

    def look() -> str:
        result = job.conn.run(pull_commands.leftovers(models_dir, model=model,
                                                      repository=repository))
        found["items"] = [line for line in result.stdout.splitlines() if line.strip()]
        return (f"found {len(found['items'])} left by killed stages" if found["items"]
                else "nothing left by a killed stage")

    yield Check(f"list what killed stages left in {models_dir} and the model's extract "
                "containers", look)
    if found.get("items", ["plan"]):  # a plan runs no check: it shows the removal
        yield Command.of(pull_commands.remove_leftovers(models_dir, model=model,
                                                        repository=repository),
                         f"remove what killed stages left in {models_dir} and the model's "
                         "extract containers", timeout=600)
    items = found.get("items", [])
    return f"removed {len(items)} left by killed stages: {', '.join(items)}" if items else ""
