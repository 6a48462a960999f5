"""``fab prune``: free a host's disk of what no retained release needs: the releases beyond
``keep_releases`` (as a deploy's finalize prunes them), the model version directories no
retained or running release uses, and the images of pruned releases that no container uses.
Never the live release, what the proxy serves, a release in the rollback window, or a
retained one, nor their files, whatever their containers' state
(``finalize.protected_releases``): a rollback to any release ``fab history`` lists keeps
working."""

from __future__ import annotations

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
