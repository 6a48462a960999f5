"""One digest per version whatever carries its files: push and pull record the same digest for
a Keras-style export (``assets/``, ``assets.extra/`` and ``fingerprint.pb`` beside
``variables/``, where ``os.walk`` order and sorted paths differ), a version staged by push is
reused once the hosts switch to pull, and a version an earlier push recorded under its
``os.walk``-order digest is still accepted by both transfers, also after the host rebooted."""

from __future__ import annotations

import hashlib
import os
import shutil
from functools import partial
from pathlib import Path
from typing import Any

import pytest

from tfsdeploy.core.errors import ExitCode
from tfsdeploy.run.operations.stage import VersionArchive
from tfsdeploy.run.publish import pack

from . import runs
from .fakes import FakeFleet
from .runs import Recorder, paths

BOOT = Path("/proc/sys/kernel/random/boot_id").read_text().strip()
OTHER_BOOT = "00000000-0000-4000-8000-000000000000"
run_deploy = partial(runs.run_deploy, count=2)
PULL = {"model_transfer": "pull", "model_registry": "reg:5000/tfsdeploy-models"}


def _keras_export(version: Path) -> Path:
    """A version laid out as Keras and TensorFlow 2 export it (the testbed's models too)."""
    (version / "variables").mkdir(parents=True, exist_ok=True)
    (version / "assets").mkdir()
    (version / "assets.extra").mkdir()
    (version / "saved_model.pb").write_bytes(b"graph of " + version.name.encode())
    (version / "fingerprint.pb").write_bytes(b"fingerprint")
    (version / "assets" / "vocab.txt").write_text("a\nb\n")
    (version / "assets.extra" / "tf_serving_warmup_requests").write_bytes(b"warmup")
    (version / "variables" / "variables.index").write_bytes(b"index")
    (version / "variables" / "variables.data-00000-of-00001").write_bytes(os.urandom(300))
    return version


def _walk_order_sums(version: Path) -> str:
    """The sums as the push of earlier releases wrote them: os.walk order, each directory's
    files sorted before its subdirectories (computed here without the toolkit)."""
    lines = []
    for directory, dirs, files in os.walk(version):
        dirs.sort()
        for name in sorted(files):
            path = Path(directory, name)
            digest = hashlib.sha256(path.read_bytes()).hexdigest()
            lines.append(f"{digest}  {path.relative_to(version).as_posix()}\n")
    return "".join(lines)


def _digest(sums: str) -> str:
    return hashlib.sha256(sums.encode()).hexdigest()


def _exported_world(world: dict[str, Any]) -> dict[str, Any]:
    for version in (1, 2, 3):
        _keras_export(world["source"] / str(version))
    return world


def _stage_details(recorder: Recorder) -> dict[str, str]:
    return {host: detail for (host, _, task, _), detail in zip(recorder.steps, recorder.details,
                                                                strict=True)
            if task.startswith("stage")}


def test_push_and_pull_record_one_digest_for_a_keras_export(tmp_path: Path) -> None:
    version = _keras_export(tmp_path / "1")
    packed, archive = pack("m", 1, version), VersionArchive(version)
    assert archive.sums() == packed.files.sums()
    assert archive.digest() == packed.files.digest()
    # the fixture tells the two orders apart (the files sorted: assets/ before fingerprint.pb)
    assert _walk_order_sums(version) != packed.files.sums()
    assert archive.sums().splitlines()[0].endswith("  assets.extra/tf_serving_warmup_requests")


def test_a_version_staged_by_push_is_reused_when_the_hosts_switch_to_pull(
        world: dict[str, Any]) -> None:
    _exported_world(world)
    assert run_deploy(world, 1).exit_code == ExitCode.OK  # push
    assert run_deploy(world, 2).exit_code == ExitCode.OK
    recorder = Recorder()
    # back to version 1 (staged by push, beyond the window) with the hosts now pulling
    result = run_deploy(world, 1, recorder, host_vars={"h1": PULL, "h2": PULL})
    assert result.exit_code == ExitCode.OK, result.message
    details = _stage_details(recorder)
    assert sorted(details) == ["h1", "h2"], recorder.steps
    assert all(d.startswith("version 1 already staged") for d in details.values()), details
    fleet: FakeFleet = world["fleet"]
    for host in fleet.hosts.values():
        assert not [r for r in host.docker.called("pull") if "tfsdeploy-models" in r]


@pytest.mark.parametrize("transfer", ["push", "pull"])
@pytest.mark.parametrize("record", ["this boot", "another boot", "digest only"])
def test_a_version_an_earlier_push_recorded_in_walk_order_is_accepted(
        world: dict[str, Any], transfer: str, record: str) -> None:
    _exported_world(world)
    assert run_deploy(world, 1).exit_code == ExitCode.OK
    fleet: FakeFleet = world["fleet"]
    host_paths = paths(fleet["h2"])
    source = world["source"] / "2"
    shutil.copytree(source, host_paths.version_dir(2))
    sums = _walk_order_sums(source)
    digest = _digest(sums)
    # what an earlier push left: the digest of its sums, the boot, the sums (older releases
    # recorded the digest alone)
    Path(host_paths.digest_file(2)).write_text(
        {"this boot": f"{digest} {BOOT}\n", "another boot": f"{digest} {OTHER_BOOT}\n",
         "digest only": f"{digest}\n"}[record])
    if record != "digest only":
        Path(host_paths.sums_file(2)).write_text(sums)
    recorder = Recorder()
    # h2 alone switches (h1 has no version 2 yet: a pull would need a registry)
    result = run_deploy(world, 2, recorder, host_vars={"h2": PULL} if transfer == "pull"
                        else None)
    assert result.exit_code == ExitCode.OK, result.message
    detail = _stage_details(recorder)["h2"]
    assert not [w for w in fleet["h2"].writes if "/.staging-2-" in w], "nothing uploaded"
    assert not [r for r in fleet["h2"].docker.called("pull") if "tfsdeploy-models" in r]
    assert ("version 2 already staged" if record == "this boot" else
            "every file matches; version 2 staged before the host's last boot: every file "
            "re-verified") in detail, detail
    assert Path(host_paths.digest_file(2)).read_text().split()[0] == digest
