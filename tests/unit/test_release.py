"""What a deploy ships and what it reads back: per-host images, model versions staged from
linked sources, versions never reused with other weights, and records or labels from a host
that must never reach a path."""

from __future__ import annotations

import io
import json
import os
import tarfile
from functools import partial
from pathlib import Path
from typing import Any

import pytest

from tfsdeploy.core.errors import ConfigError, ExitCode
from tfsdeploy.hosts.facts import gather
from tfsdeploy.run.operations.stage import VersionArchive
from tfsdeploy.run.views import history

from . import runs
from .fakes import FakeFleet, FakeHost, LocalConnection, read_json
from .runs import MODEL, manifest, paths

BOOT = Path("/proc/sys/kernel/random/boot_id").read_text().strip()

# two hosts are enough for what these tests show
run_deploy = partial(runs.run_deploy, count=2)
run_rollback = partial(runs.run_rollback, count=2)
target = partial(runs.target, count=2)

CPU = "reg/tfs-cpu:2.21.0"


def _staged(host: FakeHost, version: int) -> Path:
    return Path(paths(host).version_dir(version))


def _serving_changes(host: FakeHost, since: int) -> list[tuple[str, Any]]:
    return [(m, a) for m, a in host.docker.calls[since:] if m in ("run", "start", "stop", "remove")]


# -- per-host image ---------------------------------------------------------------------------

def test_a_host_with_its_own_image_runs_it_and_records_it(world: dict[str, Any]) -> None:
    own = {"h2": {"image": CPU}}
    first = run_deploy(world, 1, host_vars=own)
    assert first.exit_code == ExitCode.OK, first.message
    fleet: FakeFleet = world["fleet"]
    for name, host in fleet.hosts.items():
        image = CPU if name == "h2" else "reg/tfs:2.21.0"
        assert host.docker.called("run")[0].image == image, name
        assert host.docker.called("pull") == [image, "reg/proxy:2.6"], name
        assert read_json(manifest(host, first.release_id))["image"] == image, name
    run_deploy(world, 2, host_vars=own)
    run_deploy(world, 3, host_vars=own)
    # a rollback re-creates each host's container from its own record
    back = run_rollback(world, to=first.release_id, host_vars=own)
    assert back.exit_code == ExitCode.OK, back.message
    assert fleet["h2"].docker.called("run")[-1].image == CPU
    assert fleet["h1"].docker.called("run")[-1].image == "reg/tfs:2.21.0"


# -- model versions on the hosts --------------------------------------------------------------

def _linked_source(world: dict[str, Any]) -> Path:
    """Version 3 as DVC or git-annex leave it: links to files and directories elsewhere."""
    store = world["tmp"] / "store"
    (store / "vars").mkdir(parents=True)
    (store / "blob").write_bytes(b"pb")
    (store / "blob").chmod(0o600)
    (store / "vars" / "variables.index").write_bytes(b"index")
    (store / "vars" / "variables.data-00000-of-00001").write_bytes(b"data" * 1000)
    version = world["source"] / "3"
    (version / "saved_model.pb").unlink()
    (version / "saved_model.pb").symlink_to(store / "blob")
    (version / "variables").symlink_to(store / "vars", target_is_directory=True)
    return version


def test_a_linked_source_stages_the_linked_content(world: dict[str, Any]) -> None:
    version = _linked_source(world)
    result = run_deploy(world, 3)
    assert result.exit_code == ExitCode.OK, result.message
    for host in world["fleet"].hosts.values():
        staged = _staged(host, 3)
        files = sorted(p.relative_to(staged).as_posix() for p in staged.rglob("*"))
        assert files == ["saved_model.pb", "variables", "variables/variables.data-00000-of-00001",
                         "variables/variables.index"]
        assert not any(p.is_symlink() for p in staged.rglob("*"))
        assert (staged / "saved_model.pb").read_bytes() == b"pb"
        assert (staged / "variables" / "variables.data-00000-of-00001").read_bytes() == \
            b"data" * 1000
        assert {oct(p.stat().st_mode & 0o777) for p in staged.rglob("*") if p.is_file()} == \
            {"0o644"}  # whatever the source's modes
        assert {oct(p.stat().st_mode & 0o777) for p in (staged, staged / "variables")} == \
            {"0o755"}
        assert (Path(paths(host).digest_file(3)).read_text().split()[0]
                == VersionArchive(version).digest())
    archive = VersionArchive(version)
    with tarfile.open(archive.path()) as tar:
        members = tar.getmembers()
        assert all(m.isreg() for m in members)
        assert sorted(m.name for m in members) == [
            "SHA256SUMS", "version/saved_model.pb",
            "version/variables/variables.data-00000-of-00001", "version/variables/variables.index"]
    archive.discard()


def test_a_model_file_named_sha256sums_is_staged_like_any_other(world: dict[str, Any]) -> None:
    (world["source"] / "2" / "SHA256SUMS").write_text("these are weights, not sums\n")
    result = run_deploy(world, 2)
    assert result.exit_code == ExitCode.OK, result.message
    for host in world["fleet"].hosts.values():
        assert (_staged(host, 2) / "SHA256SUMS").read_text() == "these are weights, not sums\n"


def test_a_control_character_in_a_file_name_is_refused_before_any_change(
        world: dict[str, Any]) -> None:
    first = run_deploy(world, 1)
    (world["source"] / "2" / "bad\nname").write_bytes(b"x")
    fleet: FakeFleet = world["fleet"]
    calls = {n: len(h.docker.calls) for n, h in fleet.hosts.items()}
    result = run_deploy(world, 2)
    assert result.exit_code == ExitCode.INVALID, result.message
    for name, host in fleet.hosts.items():
        assert "file name 'bad\\nname' holds a control character" in result.hosts[name].error
        assert not _serving_changes(host, calls[name])
        assert not _staged(host, 2).exists()
        assert host.running(MODEL) == [first.release_id]


def _corrupt(upload: Path) -> None:
    """Change one byte of a model file in the archive (its sums left as they were)."""
    with tarfile.open(upload) as tar:
        members = [(m, tar.extractfile(m).read()) for m in tar.getmembers()]  # type: ignore[union-attr]
    with tarfile.open(upload, "w") as tar:
        for member, data in members:
            if member.name == "version/saved_model.pb":
                data = b"pX"
            tar.addfile(member, io.BytesIO(data))


def test_a_failed_verify_leaves_nothing_staged(world: dict[str, Any]) -> None:
    first = run_deploy(world, 1)
    fleet: FakeFleet = world["fleet"]
    fleet["h2"].on_upload = _corrupt
    result = run_deploy(world, 2)
    assert result.exit_code == ExitCode.INVALID, result.message
    assert "verify sha256 of every file" in result.hosts["h2"].error
    models = Path(paths(fleet["h2"]).model_dir)
    assert sorted(os.listdir(models)) == ["1"]  # no .staging-*, no version 2
    assert fleet["h2"].running(MODEL) == [first.release_id]


def test_a_failed_unpack_leaves_nothing_staged(world: dict[str, Any]) -> None:
    run_deploy(world, 1)
    fleet: FakeFleet = world["fleet"]
    fleet["h2"].on_upload = lambda upload: upload.write_bytes(b"not a tar archive" * 100)
    result = run_deploy(world, 2)
    assert result.exit_code == ExitCode.INVALID, result.message
    assert sorted(os.listdir(paths(fleet["h2"]).model_dir)) == ["1"]


def _prestage(host: FakeHost, version: int, content: bytes, digest: str | None) -> None:
    staged = _staged(host, version)
    staged.mkdir(parents=True)
    (staged / "saved_model.pb").write_bytes(content)
    if digest is not None:
        Path(paths(host).digests).mkdir(parents=True, exist_ok=True)
        Path(paths(host).digest_file(version)).write_text(digest + "\n")


@pytest.mark.parametrize("recorded", [True, False], ids=["digest recorded", "no digest"])
def test_a_version_on_the_host_with_other_weights_is_refused(world: dict[str, Any],
                                                             recorded: bool) -> None:
    first = run_deploy(world, 1)
    fleet: FakeFleet = world["fleet"]
    other = VersionArchive(world["source"] / "1").digest().replace("a", "b").replace("0", "1")
    _prestage(fleet["h2"], 2, b"retrained weights", other if recorded else None)
    calls = {n: len(h.docker.calls) for n, h in fleet.hosts.items()}
    admin = {n: len(h.proxy.admin) for n, h in fleet.hosts.items()}
    result = run_deploy(world, 2)
    assert result.exit_code == ExitCode.INVALID, result.message
    assert result.hosts["h2"].status == "failed"
    error = result.hosts["h2"].error
    assert "stage_model" in error
    assert ("a version number is never reused" in error if recorded
            else "verify the files already in" in error)
    for name, host in fleet.hosts.items():  # nothing serving changed anywhere
        assert not _serving_changes(host, calls[name]), name
        assert len(host.proxy.admin) == admin[name]
        assert host.running(MODEL) == [first.release_id]
    assert (_staged(fleet["h2"], 2) / "saved_model.pb").read_bytes() == b"retrained weights"


@pytest.mark.parametrize("recorded", [True, False], ids=["digest recorded", "no digest"])
def test_a_version_on_the_host_with_the_same_files_is_reused(world: dict[str, Any],
                                                             recorded: bool) -> None:
    run_deploy(world, 1)
    fleet: FakeFleet = world["fleet"]
    digest = VersionArchive(world["source"] / "2").digest()
    _prestage(fleet["h2"], 2, b"pb", digest if recorded else None)
    result = run_deploy(world, 2)
    assert result.exit_code == ExitCode.OK, result.message
    uploads = {n: [w for w in h.writes if "/.staging-2-" in w] for n, h in fleet.hosts.items()}
    assert not uploads["h2"] and uploads["h1"]  # nothing uploaded where it was
    assert Path(paths(fleet["h2"]).digest_file(2)).read_text().split() == [digest, BOOT]
    # the sums it was verified against are recorded too: a reuse after a reboot checks them
    assert Path(paths(fleet["h2"]).sums_file(2)).read_text() == \
        VersionArchive(world["source"] / "2").sums()


# -- what a host says is checked before it is used -----------------------------------------

HOSTILE = "../../../../etc"  # from a release directory: the test's tmp_path/etc


def test_hostile_release_ids_read_back_from_a_host_never_reach_a_path(world: dict[str, Any]
                                                                     ) -> None:
    first = run_deploy(world, 1, keep=2)
    fleet: FakeFleet = world["fleet"]
    h1 = fleet["h1"]
    sentinel = world["tmp"] / "etc" / "passwd"
    sentinel.parent.mkdir()
    sentinel.write_text("root:x:0:0")
    assert Path(paths(h1).releases, HOSTILE).resolve() == sentinel.parent.resolve()
    h1.docker.add("tfs-hp2-evil", {"tfsdeploy.model": MODEL, "tfsdeploy.role": "server",
                                   "tfsdeploy.release": HOSTILE, "tfsdeploy.slot": "green",
                                   "tfsdeploy.version": "1"}, running=False)
    record = read_json(manifest(h1, first.release_id))
    planted = Path(paths(h1).releases, "r20200101-000000000-v1")
    planted.mkdir()
    (planted / "manifest.json").write_text(
        json.dumps({**record, "id": HOSTILE, "status": "serving"}))
    facts = gather(LocalConnection(_resolved(world, "h1"), fleet), MODEL, paths(h1))
    assert HOSTILE not in {c.release for c in facts.containers}
    assert HOSTILE not in {r.id for r in facts.releases}
    assert [b.path for b in facts.broken] == [str(planted / "manifest.json")]
    for version in (2, 3):  # the second prunes what is beyond keep_releases: 2
        assert run_deploy(world, version, keep=2).exit_code == ExitCode.OK
    assert not manifest(h1, first.release_id).exists()  # pruning ran
    assert sentinel.read_text() == "root:x:0:0"
    assert not [a for a in h1.log if a[:1] == ["rm"] and HOSTILE in " ".join(a)]
    assert "tfs-hp2-evil" not in h1.docker.called("remove")
    with pytest.raises(ConfigError, match="is not retained"):
        run_rollback(world, to=HOSTILE, keep=2)
    assert sentinel.read_text() == "root:x:0:0"


def _resolved(world: dict[str, Any], name: str) -> Any:
    return target(world).inventory.host(name)


def test_one_truncated_record_hides_no_later_release(world: dict[str, Any]) -> None:
    first = run_deploy(world, 1)
    second = run_deploy(world, 2)
    run_deploy(world, 3)
    fleet: FakeFleet = world["fleet"]
    cut = manifest(fleet["h1"], first.release_id)
    cut.write_text(cut.read_text()[:100])  # a run killed while writing it (older tools)
    facts = gather(LocalConnection(_resolved(world, "h1"), fleet), MODEL, paths(fleet["h1"]))
    assert [b.path for b in facts.broken] == [str(cut)]
    assert len(facts.releases) == 2 and second.release_id in {r.id for r in facts.releases}
    (row,) = [r for r in history(target(world), connect=fleet.connect) if r["host"] == "h1"]
    assert [b["path"] for b in row["broken_records"]] == [str(cut)]
    assert len(row["releases"]) == 2
    back = run_rollback(world)
    assert back.exit_code == ExitCode.OK, back.message
    assert back.release_id == second.release_id
    assert all(h.running(MODEL) == [second.release_id] for h in fleet.hosts.values())
