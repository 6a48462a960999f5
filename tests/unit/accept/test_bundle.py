"""The generator environment packed from the toolkit's own (tfsdeploy.accept.bundle)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tfsdeploy.accept import bundle


@pytest.fixture(scope="module")
def packed(tmp_path_factory: pytest.TempPathFactory) -> bundle.Bundle:
    return bundle.ensure_bundle(tmp_path_factory.mktemp("bundle"))


def test_the_bundle_holds_what_the_generator_imports_and_no_tensorflow_or_numpy(
        packed: bundle.Bundle) -> None:
    names = {name for name, _ in packed.distributions}
    assert {"grpcio", "protobuf", "hdrhistogram"} <= names
    assert not names & {"tensorflow", "tensorflow-serving-api", "tfsdeploy", "fabric", "numpy"}
    members = set(bundle.iter_arcnames(packed.path))
    assert "tfsdeploy/loadtest/cli.py" in members and "grpc/__init__.py" in members
    assert "hdrh/histogram.py" in members
    assert any(m.endswith(".dist-info/RECORD") for m in members)  # metadata goes too
    assert not any("__pycache__" in m or m.startswith("tensorflow") for m in members)


def test_the_key_is_stable_and_the_bundle_is_reused(packed: bundle.Bundle) -> None:
    again = bundle.ensure_bundle(packed.path.parent)
    assert again.key == packed.key and again.path == packed.path
    assert packed.path.name == f"generator-{packed.key}.tar.gz"


def test_a_file_that_differs_from_its_record_is_refused(tmp_path: Path) -> None:
    changed = tmp_path / "module.py"
    changed.write_text("x = 1\n")
    member = bundle.Member(changed, "module.py", "not-the-recorded-hash")
    with pytest.raises(bundle.BundleError, match="differs from its distribution's RECORD"):
        bundle.write_bundle(tmp_path / "b.tar.gz", [member])
    assert not list(tmp_path.glob("b.tar.gz*"))


def test_a_host_python_must_match_abi_machine_and_libc() -> None:
    here = {"python": "3.11", "soabi": "cpython-311-x86_64-linux-gnu", "machine": "x86_64",
            "libc": ["glibc", "2.36"]}
    assert bundle.compatibility_problem(here, dict(here)) is None
    assert bundle.compatibility_problem(here, {**here, "libc": ["glibc", "2.41"]}) is None
    older = bundle.compatibility_problem(here, {**here, "libc": ["glibc", "2.31"]})
    assert older == "C library glibc 2.31 is older than the toolkit's glibc 2.36"
    other = bundle.compatibility_problem(
        here, {**here, "python": "3.12", "soabi": "cpython-312-x86_64-linux-gnu"})
    assert other is not None and "Python ABI cpython-312" in other and "(python3 3.12)" in other
    assert "architecture aarch64" in str(bundle.compatibility_problem(
        here, {**here, "machine": "aarch64"}))


def test_only_the_newest_bundles_are_kept(tmp_path: Path) -> None:
    for age, name in enumerate(("a", "b", "c", "d")):
        old = tmp_path / f"generator-{name}.tar.gz"
        old.write_bytes(b"x")
        os.utime(old, (1_000_000 + age, 1_000_000 + age))
    made = bundle.ensure_bundle(tmp_path)
    left = sorted(p.name for p in tmp_path.glob("generator-*.tar.gz"))
    assert left == sorted([made.path.name, "generator-d.tar.gz", "generator-c.tar.gz"])


# -- a private, verified cache ---------------------------------------------------------------

def test_the_cache_is_a_private_directory_of_the_user(tmp_path: Path) -> None:
    made = bundle.private_dir(tmp_path / "cache" / "loadgen")
    assert made.stat().st_mode & 0o777 == 0o700 and made.stat().st_uid == os.geteuid()
    loose = tmp_path / "loose"
    loose.mkdir(mode=0o755)
    loose.chmod(0o755)
    assert bundle.private_dir(loose).stat().st_mode & 0o777 == 0o700  # ours: tightened
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)  # anyone could put a directory of their own there
    with pytest.raises(bundle.BundleError, match=r"is not private: .* world-writable"):
        bundle.private_dir(shared / "loadgen")
    link = tmp_path / "link"
    link.symlink_to(made)
    with pytest.raises(bundle.BundleError, match="not a directory of this user's"):
        bundle.private_dir(link)


@pytest.mark.skipif(os.geteuid() != 0, reason="changes a directory's owner")
def test_a_cache_directory_of_another_user_is_refused_and_never_tmp(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    planted = tmp_path / "project" / "loadgen"
    planted.mkdir(parents=True, mode=0o700)
    os.chown(planted, 4321, 4321)
    with pytest.raises(bundle.BundleError, match="not a directory of this user's"):
        bundle.private_dir(planted)
    # the project's cache refused: the user's own cache, never a shared /tmp name
    monkeypatch.setenv("TFSDEPLOY_CACHE", str(tmp_path / "project"))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "home-cache"))
    assert bundle.cache_dir() == tmp_path / "home-cache" / "tfsdeploy" / "loadgen"


def test_a_changed_bundle_is_packed_anew_and_never_shipped(packed: bundle.Bundle) -> None:
    assert packed.sha256 == bundle.file_sha256(packed.path)
    bundle.verify_bundle(packed)
    original = packed.path.read_bytes()
    packed.path.write_bytes(original[:-100] + b"\0" * 100)  # someone changed it
    with pytest.raises(bundle.BundleError, match="changed since it was packed"):
        bundle.verify_bundle(packed)
    again = bundle.ensure_bundle(packed.path.parent)
    assert again.sha256 == bundle.file_sha256(again.path) == packed.sha256
    assert again.path.read_bytes() == original


def test_the_host_refuses_a_bundle_whose_sha256_differs(tmp_path: Path) -> None:
    import subprocess

    from tfsdeploy.accept.commands import HostDirs, install_env

    dirs = HostDirs(str(tmp_path), "k1", "run1")
    Path(dirs.env_root).mkdir(parents=True)
    Path(dirs.upload).write_bytes(b"not the bundle")
    done = subprocess.run(install_env(dirs, "import sys", "0" * 64), capture_output=True,
                          check=False)
    assert done.returncode == 5
    assert not Path(dirs.upload).exists() and not Path(dirs.env).exists()
