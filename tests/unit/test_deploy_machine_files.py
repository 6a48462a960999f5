"""Every file the toolkit writes on the deploy machine survives a power loss whole or not at
all: the JSON result, the textfile, the targets a run rewrites, `fab observe`'s files and
`fab render`'s are each fsynced under a temporary name beside them, renamed over, and their
directory fsynced after the rename (the calls observed as they happen). Two runs ending at
once keep each other's samples in the textfile."""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from tfsdeploy.cli import observe, unattended
from tfsdeploy.cli.render import write_renders
from tfsdeploy.core import localfiles
from tfsdeploy.core.inventory.monitoring import Monitoring
from tfsdeploy.core.observe.prometheus import ServingProcess
from tfsdeploy.core.target import Target, load_target, render_release
from tfsdeploy.run import targets

from .test_observe import fleet

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture()
def calls(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, str]]:
    """('fsync', path) and ('replace', destination), in order."""
    seen: list[tuple[str, str]] = []
    real_fsync, real_replace = os.fsync, os.replace

    def fsync(fd: int) -> None:
        seen.append(("fsync", os.readlink(f"/proc/self/fd/{fd}")))
        real_fsync(fd)

    def replace(src: Any, dst: Any) -> None:
        seen.append(("replace", str(dst)))
        real_replace(src, dst)

    monkeypatch.setattr(os, "fsync", fsync)
    monkeypatch.setattr(os, "replace", replace)
    return seen


def assert_durable(calls: list[tuple[str, str]], files: list[Path]) -> None:
    """Each file: a temporary beside it fsynced, renamed over it, its directory fsynced."""
    assert files
    for path in files:
        index = calls.index(("replace", str(path)))
        before = [p for kind, p in calls[:index] if kind == "fsync"]
        assert any(Path(p).parent == path.parent and Path(p).name.startswith(f".{path.name}.")
                   for p in before), (path, calls)
        assert ("fsync", str(path.parent)) in calls[index + 1:], (path, calls)


def test_the_json_result_and_the_textfile(tmp_path: Path, calls: list[tuple[str, str]]) -> None:
    unattended.write_json_file(str(tmp_path / "result.json"), {"exit_code": 0})
    unattended.update_textfile(str(tmp_path / "tfsdeploy.prom"), model="m", command="deploy",
                               exit_code=0, seconds=1.0, release="", version=None)
    assert_durable(calls, [tmp_path / "result.json", tmp_path / "tfsdeploy.prom"])


def test_fab_observe_s_files_and_the_targets_a_run_rewrites(
        tmp_path: Path, calls: list[tuple[str, str]], monkeypatch: pytest.MonkeyPatch) -> None:
    inventory = fleet(Monitoring(local_targets_dir=str(tmp_path / "targets")))
    out = tmp_path / "observe"
    written = observe.write_observability(inventory, list(inventory.models.values()), out)
    assert_durable(calls, [*written, tmp_path / "targets" / "m.json"])
    calls.clear()
    monkeypatch.setattr(targets, "running_processes", lambda _target, _session=None: (
        [ServingProcess("h1", 0, "blue", "r1", 1)], []))
    target = Target(inventory, inventory.model("m"), inventory.hosts)
    assert targets.publish_now(target) == [str(tmp_path / "targets" / "m.json")]
    assert_durable(calls, [tmp_path / "targets" / "m.json"])


def test_fab_render_s_files(tmp_path: Path, calls: list[tuple[str, str]],
                            monkeypatch: pytest.MonkeyPatch) -> None:
    """Many files, two commits of the file system: every file whole under its temporary
    name at the first, every rename between the two, nothing renamed after the second."""
    whole_at_first: list[bool] = []
    real_sync = localfiles.sync_filesystem

    def sync_filesystem(path: str | Path) -> None:
        if not any(kind == "syncfs" for kind, _ in calls):  # the first: every temp written
            temps = list((tmp_path / "out").rglob(".*.*"))
            named = {t.parent / t.name[1:].rsplit(".", 1)[0]: t for t in temps}
            whole_at_first.append(len(temps) == expected and all(
                named[path].read_text() == text for path, text in texts.items()))
        calls.append(("syncfs", str(path)))
        real_sync(path)

    monkeypatch.setattr(localfiles, "sync_filesystem", sync_filesystem)
    # the testbed inventory as shipped (tb1..tb3, one 16 GiB GPU each), not the live fleet's
    # hosts.json: the alone phase of scripts/test reshapes that fleet beside this tier
    monkeypatch.setenv("TFSDEPLOY_TESTBED_DIR", str(tmp_path / "no-testbed"))
    target = load_target("half_plus_two", inventory=str(REPO / "inventory" / "testbed.py"))
    renders = render_release(target, 1)
    texts = {tmp_path / "out" / r.host.name / r.model.name / f.name: f.text
             for r in renders for f in r.files}
    expected = len(texts) + len(renders)  # each host's files and its proxy config
    written = write_renders(renders, tmp_path / "out")
    assert len(written) == expected > 3
    out = str(tmp_path / "out")
    assert calls == [("syncfs", out), *(("replace", str(p)) for p in written),
                     ("syncfs", out)], calls
    assert whole_at_first == [True]
    assert not list((tmp_path / "out").rglob(".*.*"))  # no temporary left


def test_runs_ending_together_keep_each_other_s_samples(tmp_path: Path,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """The textfile is read, changed and renamed: a second run reading it before the first
    renamed would write it back without the first run's samples."""
    path = str(tmp_path / "tfsdeploy.prom")
    real_read = unattended.read_samples
    reading = threading.Event()

    def slow_read(where: str) -> dict[str, float]:
        found = real_read(where)
        reading.set()
        time.sleep(0.3)  # the first run is between its read and its rename
        return found

    monkeypatch.setattr(unattended, "read_samples", slow_read)

    def run(command: str) -> None:
        unattended.update_textfile(path, model="m", command=command, exit_code=0,
                                   seconds=1.0, release="", version=None)

    first = threading.Thread(target=run, args=("deploy",))
    first.start()
    reading.wait(5)
    run("rollback")  # ends while the deploy is still writing
    first.join()
    commands = {unattended.label_values("{" + key.partition("{")[2]).get("command")
                for key in real_read(path)}
    assert commands == {"deploy", "rollback"}
