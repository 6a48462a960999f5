"""The Prometheus textfile for cron and systemd runs: readable by node_exporter, label values
escaped, and never a label made of an unchecked --model."""

from __future__ import annotations

import stat
from pathlib import Path

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
