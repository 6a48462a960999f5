"""`fab prune` removes what killed stages left (fake hosts, the real shell scripts): a pull's
``.pull-<v>`` copy and its extract container (labelled with the model, or made before the label
from the model's repository), a push's ``.staging-*`` directory and archive, a check's
``.sums-*``; never a version, another model's extract container, or anything under --check."""

from __future__ import annotations

from functools import partial
from pathlib import Path
from typing import Any

from tfsdeploy.core.errors import ExitCode
from tfsdeploy.hosts.commands import pull as pull_commands
from tfsdeploy.run.prune import prune, prune_check, pruned

from . import runs
from .fakes import FakeFleet, FakeHost
from .runs import Recorder, paths

target = partial(runs.target, count=2)
PULL = {"model_transfer": "pull", "model_registry": "reg:5000/tfsdeploy-models"}
LEFT = (".pull-2", ".staging-3-r20261201-000000000-v3", ".staging-3-r20261201-000000000-v3.tar",
        ".sums-2-r20261201-000000000-v2")


def _leave(host: FakeHost) -> Path:
    """What a killed pull, a killed push and a killed check leave on ``host``."""
    models = Path(paths(host).model_dir)
    (models / ".pull-2" / "version" / "variables").mkdir(parents=True)
    (models / ".pull-2" / "version" / "saved_model.pb").write_bytes(b"half")
    (models / LEFT[1] / "version").mkdir(parents=True)
    (models / LEFT[2]).write_bytes(b"tar")
    (models / LEFT[3]).write_text("sums")
    # the engine's extract containers: ours (labelled), ours before the label (our
    # repository), another model's, and one another toolkit made
    (host.dir / "docker-ps.txt").write_text(
        "c1|hp2|reg:5000/tfsdeploy-models/hp2@sha256:aa\n"
        "c2||reg:5000/tfsdeploy-models/hp2@sha256:bb\n"
        "c3|other|reg:5000/tfsdeploy-models/other@sha256:cc\n"
        "c4||reg:5000/elsewhere/hp2@sha256:dd\n")
    return models


def test_prune_removes_what_killed_stages_left_and_nothing_else(world: dict[str, Any]) -> None:
    fleet: FakeFleet = world["fleet"]
    assert runs.run_deploy(world, 1, count=2).exit_code == ExitCode.OK
    models = _leave(fleet["h1"])
    recorder = Recorder()
    result = prune(target(world, host_vars={"h1": PULL}), reporter=recorder,
                   connect=fleet.connect)
    assert result.exit_code == ExitCode.OK, result.message
    assert sorted(p.name for p in models.iterdir()) == ["1"], "the version stays, the rest goes"
    assert (fleet["h1"].dir / "docker-rm.log").read_text().split("\n")[:2] == \
        ["-f -- c1", "-f -- c2"]
    steps = {s["step"]: s for s in result.hosts["h1"].steps}
    detail = steps["prune_leftovers"]["detail"]
    assert detail.startswith("found 6 left by killed stages; removed 6 left by killed stages: "
                             "file .pull-2, "), detail
    assert detail.endswith("container c1, container c2") and "c3" not in detail
    assert pruned(result.hosts["h1"].steps).leftovers == 6
    assert result.hosts["h1"].status == "pruned"
    assert result.hosts["h2"].status == "clean"


def test_prune_check_lists_the_removal_and_removes_nothing(world: dict[str, Any]) -> None:
    fleet: FakeFleet = world["fleet"]
    assert runs.run_deploy(world, 1, count=2).exit_code == ExitCode.OK
    models = _leave(fleet["h1"])
    planned = prune_check(target(world), connect=fleet.connect)
    changes = [c for step in planned[0]["steps"] for c in step["changes"]]
    assert any("remove what killed stages left" in str(c) for c in changes), planned[0]
    assert sorted(p.name for p in models.iterdir()) == sorted(["1", *LEFT])
    assert not (fleet["h1"].dir / "docker-rm.log").exists()


def test_the_listing_reads_only(tmp_path: Path) -> None:
    import subprocess

    (tmp_path / "m" / ".pull-4").mkdir(parents=True)
    (tmp_path / "m" / "4").mkdir()
    (tmp_path / "bin").mkdir()
    (tmp_path / "bin" / "docker").write_text("#!/bin/sh\nexit 0\n")  # no engine here
    (tmp_path / "bin" / "docker").chmod(0o755)
    listed = subprocess.run(pull_commands.leftovers(str(tmp_path / "m"), model="m",
                                                    repository=""),
                            capture_output=True, text=True, check=True,
                            env={"PATH": f"{tmp_path / 'bin'}:/usr/bin:/bin"})
    assert listed.stdout.splitlines()[0] == "file .pull-4"
    assert (tmp_path / "m" / ".pull-4").is_dir()
