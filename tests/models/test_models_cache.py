"""Caching, atomic publishing and the command line of the generator."""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

import pytest

from testbed.models import generate, half_plus_two, savedmodel
from tests.bounds import within

ROOT = Path(__file__).resolve().parents[2]
ONLY = ["half_plus_two"]


def snapshot(out: Path) -> dict[str, tuple[int, int]]:
    """Every file under ``out`` (except the lock) with its inode and mtime."""
    return {
        str(p.relative_to(out)): (p.stat().st_ino, p.stat().st_mtime_ns)
        for p in out.rglob("*")
        if p.is_file() and p.name != ".lock"
    }


def quiet(out: Path, force: bool = False) -> list[generate.Result]:
    """Generate half_plus_two into ``out`` without printing."""
    return generate.generate(out, ONLY, force=force, log=lambda _line: None)


@pytest.fixture()
def fresh(tmp_path: Path) -> Path:
    """A model root with half_plus_two freshly made."""
    assert {r.action for r in quiet(tmp_path)} == {"made"}
    return tmp_path


def test_second_run_is_fast_and_rewrites_nothing(fresh: Path) -> None:
    before = snapshot(fresh)
    start = time.perf_counter()
    results = quiet(fresh)
    # a cached model is only hashed and compared; making one again takes TensorFlow seconds
    # measured in a full run (2 cores, 4 workers beside it): 0.00556 s, margin 360x;
    # scripts/test prints it every run
    within("second make of cached models, s", time.perf_counter() - start, below=2.0)
    assert [(r.key, r.action) for r in results] == [
        (f"half_plus_two/{v}", "cached") for v in (1, 2, 3)
    ]
    assert snapshot(fresh) == before


def test_incomplete_version_is_made_again(fresh: Path) -> None:
    (fresh / "half_plus_two" / "2" / "variables" / "variables.index").unlink()
    actions = {r.key: r.action for r in quiet(fresh)}
    assert actions == {
        "half_plus_two/1": "cached",
        "half_plus_two/2": "made",
        "half_plus_two/3": "cached",
    }
    assert (fresh / "half_plus_two" / "2" / "variables" / "variables.index").is_file()


def test_changed_recipe_is_made_again(fresh: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(half_plus_two, "WARMUP_RECORDS", 3)
    assert {r.action for r in quiet(fresh)} == {"made"}
    assert len(savedmodel.read_warmup(fresh / "half_plus_two" / "1")) == 3


def test_force_makes_everything_again(fresh: Path) -> None:
    assert {r.action for r in quiet(fresh, force=True)} == {"made"}


def test_no_work_dirs_left_anywhere(fresh: Path) -> None:
    quiet(fresh, force=True)
    assert list((fresh / ".tmp").iterdir()) == []
    assert sorted(p.name for p in fresh.iterdir()) == [".lock", ".stamps", ".tmp", "half_plus_two"]
    assert sorted(p.name for p in (fresh / ".stamps").iterdir()) == [
        f"half_plus_two-{v}.json" for v in (1, 2, 3)
    ]


def test_publish_replaces_an_existing_version(tmp_path: Path) -> None:
    (tmp_path / "work").mkdir()
    old = tmp_path / "m" / "1"
    old.mkdir(parents=True)
    (old / "old").write_text("old")
    new = tmp_path / "new"
    new.mkdir()
    (new / "new").write_text("new")
    generate.publish(new, old, tmp_path / "work")
    assert sorted(p.name for p in old.iterdir()) == ["new"]
    assert not new.exists()
    assert list((tmp_path / "work").iterdir()) == []


def test_unknown_model_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="nope"):
        generate.generate(tmp_path, ["nope"])


def make_models(*args: str) -> subprocess.CompletedProcess[str]:
    """Run scripts/make-models."""
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"}
    return subprocess.run(
        [str(ROOT / "scripts" / "make-models"), *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
        check=False,
    )


def test_command_line_makes_then_caches(tmp_path: Path) -> None:
    first = make_models("--out", str(tmp_path), "--only", "half_plus_two_tf1")
    assert first.returncode == 0, first.stderr
    assert "made   half_plus_two_tf1/1 in " in first.stdout
    assert "1 made, 0 cached" in first.stdout
    second = make_models("--out", str(tmp_path), "--only", "half_plus_two_tf1")
    assert second.returncode == 0, second.stderr
    assert "0 made, 1 cached" in second.stdout
    bad = make_models("--out", str(tmp_path), "--only", "nope")
    assert bad.returncode == 1
    assert "unknown model(s): nope" in bad.stderr


def test_a_version_tfserving_cannot_restore_is_refused_not_cached(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A spec meant to serve (expect AVAILABLE) whose export TFServing's Session-style loader
    cannot restore: a Keras 3 model inside a tf.Module, with a warmup record."""
    from testbed.models import serving_failures
    from testbed.models.spec import VersionSpec

    def build(path: Path) -> dict[str, object]:
        serving_failures.save_keras_in_module(path, 2.0)
        savedmodel.write_warmup(path, half_plus_two._warmup_records("unservable",
                                                                     "serving_default", 1))
        return {}

    spec = VersionSpec(model="unservable", version=1, summary="Keras 3 model in a tf.Module",
                       recipe={"kind": "keras-in-module"}, build=build,
                       source_files=(Path(serving_failures.__file__),))
    monkeypatch.setattr(generate, "all_specs", lambda: [spec])
    with pytest.raises(generate.UnservableModel, match=r"unservable/1 is not servable .*"
                       r"warmup record 1 \(serving_default\) failed: .*Could not find variable"):
        generate.generate(tmp_path, ["unservable"], log=lambda _line: None)
    assert not (tmp_path / "unservable" / "1").exists()
    assert not generate.stamp_path(tmp_path, spec).exists()
    assert not list((tmp_path / ".tmp").iterdir())


def test_the_cache_key_covers_the_tensorflow_and_keras_releases(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from testbed.models import spec as spec_module

    (version,) = [s for s in half_plus_two.specs() if s.key == "half_plus_two/1"]
    before = version.recipe_hash()
    for package in ("tensorflow", "keras"):
        real = spec_module.toolchain()
        monkeypatch.setattr(spec_module, "toolchain", lambda p=package, r=real: {**r, p: "0.0"})
        assert version.recipe_hash() != before, package
        monkeypatch.undo()
    assert version.recipe_hash() == before
