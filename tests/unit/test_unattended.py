"""The Prometheus textfile for cron and systemd runs: readable by node_exporter, label values
escaped, and never a label made of an unchecked --model."""

from __future__ import annotations

import json
import stat
from pathlib import Path
from typing import Any

import pytest

from tfsdeploy.cli.unattended import (
    INVALID_MODEL,
    label_values,
    read_samples,
    textfile_samples,
    update_textfile,
    write_json_file,
)


def _write(path: Path, **changes: object) -> None:
    run: dict[str, object] = {"model": "m", "command": "deploy", "exit_code": 0,
                              "seconds": 1.0, "release": "r1", "version": 1}
    run.update(changes)
    update_textfile(str(path), **run)  # type: ignore[arg-type]


def test_textfile_is_readable_by_other_users(tmp_path: Path) -> None:
    path = tmp_path / "tfsdeploy.prom"
    _write(path)
    assert stat.S_IMODE(path.stat().st_mode) == 0o644
    _write(path, exit_code=2)  # rewritten: still 0644
    assert stat.S_IMODE(path.stat().st_mode) == 0o644


def test_json_result_keeps_owner_only_mode(tmp_path: Path) -> None:
    path = tmp_path / "result.json"
    write_json_file(str(path), {"exit_code": 0})
    assert stat.S_IMODE(path.stat().st_mode) == 0o600


@pytest.mark.parametrize("release", [
    'r1"} 1\ntfsdeploy_last_run_exit_code{command="deploy",model="other"} 0\n#',
    "back\\slash", 'quote"', "new\nline", "brace}",
])
def test_label_values_are_escaped(tmp_path: Path, release: str) -> None:
    path = tmp_path / "tfsdeploy.prom"
    _write(path, release=release)
    lines = path.read_text().splitlines()
    info = [line for line in lines if line.startswith("tfsdeploy_release_info")]
    assert len(info) == 1  # nothing injected: one sample, on one line
    assert not any('model="other"' in line and not line.startswith("tfsdeploy_release_info")
                   for line in lines)
    samples = read_samples(str(path))
    (key,) = [k for k in samples if k.startswith("tfsdeploy_release_info")]
    assert label_values(key[len("tfsdeploy_release_info"):])["release"] == release
    # a second run of the same command replaces the first, escapes and all
    _write(path, release="r2")
    text = path.read_text()
    assert 'release="r2"' in text and text.count("tfsdeploy_release_info{") == 1


@pytest.mark.parametrize("model", [
    'm",command="guard"} 0\ntfsdeploy_last_run_exit_code{model="x', "../../etc", "", "-rf",
    "a b", "models",
])
def test_an_invalid_model_is_never_a_label(tmp_path: Path, model: str) -> None:
    path = tmp_path / "tfsdeploy.prom"
    _write(path, model=model, exit_code=1, release="")
    text = path.read_text()
    assert model not in text.replace(INVALID_MODEL, "") or model == ""
    samples = read_samples(str(path))
    assert samples[f'tfsdeploy_last_run_exit_code{{command="deploy",model="{INVALID_MODEL}"}}'] \
        == 1


def test_samples_of_a_valid_model() -> None:
    samples = textfile_samples(model="resnet50", command="guard", exit_code=0, seconds=1.0,
                               release="r20260101-000000000-v1", version=1, now=10.0,
                               previous_success=None)
    assert samples['tfsdeploy_last_run_exit_code{command="guard",model="resnet50"}'] == 0.0
    assert samples['tfsdeploy_release_info{command="guard",model="resnet50",'
                   'release="r20260101-000000000-v1",version="1"}'] == 1.0


@pytest.mark.parametrize("model", ["no such model", "../x", ""])
def test_a_run_with_an_invalid_model_is_recorded_under_a_label_no_model_can_have(
        tmp_path: Path, model: str) -> None:
    from tfsdeploy.cli.main import main
    from tfsdeploy.core.inventory.schema import model_name_problem

    assert model_name_problem(INVALID_MODEL) is not None  # no model can be called that
    path = tmp_path / "tfsdeploy.prom"
    code = main("rollback", {"c": None, "model": model, "inventory": None, "hosts": None,
                             "limit": None, "to": None, "playbook": None, "lock_wait": 0.0,
                             "json": False, "log_file": None, "json_file": None,
                             "metrics_file": str(path), "hooks": None, "notify": None})
    assert code == 1
    samples = read_samples(str(path))
    assert samples == {
        f'tfsdeploy_last_run_timestamp_seconds{{command="rollback",model="{INVALID_MODEL}"}}':
            samples[f'tfsdeploy_last_run_timestamp_seconds{{command="rollback",'
                    f'model="{INVALID_MODEL}"}}'],
        f'tfsdeploy_last_run_exit_code{{command="rollback",model="{INVALID_MODEL}"}}': 1.0,
        f'tfsdeploy_last_run_duration_seconds{{command="rollback",model="{INVALID_MODEL}"}}':
            samples[f'tfsdeploy_last_run_duration_seconds{{command="rollback",'
                    f'model="{INVALID_MODEL}"}}']}


def test_the_exit_code_help_names_every_exit_code(tmp_path: Path) -> None:
    from tfsdeploy.core.errors import ExitCode

    path = tmp_path / "tfsdeploy.prom"
    _write(path, exit_code=6)
    (help_line,) = [line for line in path.read_text().splitlines()
                    if line.startswith("# HELP tfsdeploy_last_run_exit_code ")]
    for code in ExitCode:
        assert f"{int(code)} {code.name.lower()}" in help_line, (code, help_line)


# -- `fab prune`'s summary --------------------------------------------------------------------

def test_pruned_reads_what_each_step_removed() -> None:
    from tfsdeploy.run.prune import Pruned, human_size, pruned

    steps = [
        {"phase": "preflight", "step": "discover", "ok": True, "detail": "pruned 9 old release(s)"},
        {"phase": "prune", "step": "prune_releases", "ok": True,
         "detail": "pruned 2 old release(s)"},
        {"phase": "prune", "step": "prune_versions", "ok": True,
         "detail": "0.0 MiB (9876 bytes) in version(s) 1, 2; removed version(s) 1, 2"},
        {"phase": "prune", "step": "prune_images", "ok": True,
         "detail": "reg:5000/tfs:2.20.0: 300.0 MiB (314572800 bytes) freed; reg:5000/tfs:2.19.0 "
                   "kept (in use or absent); reg/tfs:old: 0.5 MiB (524288 bytes) freed"}]
    assert pruned(steps) == Pruned(releases=2, versions=(1, 2),
                                   images=("reg:5000/tfs:2.20.0", "reg/tfs:old"),
                                   freed_bytes=9876 + 314572800 + 524288)
    assert pruned(steps).describe() == "2 release(s), version(s) 1, 2, 2 image(s)"
    failed = [{**steps[2], "ok": False, "detail": "prune_versions: expected ...; saw exit 1"}]
    assert pruned(failed) == Pruned() and Pruned().describe() == "nothing"
    assert [human_size(n) for n in (0, 1023, 9876, 2 << 20, 3 << 30)] == \
        ["0 bytes", "1023 bytes", "9.6 KiB", "2.0 MiB", "3.0 GiB"]


def test_prune_says_what_it_removed_and_freed_per_host(
        world: dict[str, Any], monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    from functools import partial

    from tfsdeploy.cli.main import main
    from tfsdeploy.run import deploy as cli_deploy
    from tfsdeploy.run import prune as cli_prune

    from .fakes import FakeSlot, FrozenClock
    from .runs import MODEL, inventory_file

    fleet = world["fleet"]
    monkeypatch.setattr(cli_deploy, "deploy", partial(
        cli_deploy.deploy, connect=fleet.connect, clock=FrozenClock(), client_factory=FakeSlot))
    monkeypatch.setattr(cli_prune, "prune", partial(cli_prune.prune, connect=fleet.connect))
    inventory = inventory_file(world, keep=2, count=2)
    base = {"c": None, "model": MODEL, "inventory": inventory, "hosts": None, "limit": None,
            "playbook": None, "lock_wait": 0.0, "json": False, "log_file": None,
            "json_file": None, "metrics_file": None}
    for version in ("1", "2", "3"):
        assert main("deploy", base | {"version": version, "check": False, "diff": False,
                                      "hooks": None, "notify": None, "canary_weights": None,
                                      "step_s": None, "pause": False}) == 0
    for host in fleet.hosts.values():  # version 1's directory: 2 MiB that prune frees
        (host.dir / "r" / "models" / MODEL / "1" / "variables.data").write_bytes(
            b"\0" * (2 << 20))
    capsys.readouterr()
    json_file = world["tmp"] / "prune.json"
    assert main("prune", base | {"check": False, "json_file": str(json_file)}) == 0
    out = capsys.readouterr().out
    assert f"prune {MODEL}: ok in " in out and " v0 " not in out and "()" not in out, out
    assert "every host serves" not in out and "4.0 MiB freed on 2 host(s)" in out, out
    written = json.loads(json_file.read_text())
    assert {h: o["status"] for h, o in written["hosts"].items()} == {"h1": "pruned",
                                                                     "h2": "pruned"}
    assert written["pruned"]["h1"]["versions"] == [1]
    version_1 = (2 << 20) + len(b"pb")  # the file written above, and saved_model.pb
    assert written["pruned"]["h1"]["freed_bytes"] >= version_1
    assert written["freed_bytes"] == sum(p["freed_bytes"] for p in written["pruned"].values())
    rows = [line for line in out.splitlines() if "h1" in line and "pruned" in line]
    assert rows and "version(s) 1" in rows[0] and "2.0 MiB" in rows[0], out
