"""Every rename that publishes state on a host is durable: the argv builders fsync the new
file (or tree) and its directory before the rename and the directory after it. Each builder
runs for real here, with ``sync`` and ``mv`` on the PATH replaced by wrappers that log what
they were given (and then do it), so the order of the calls is what is asserted."""

from __future__ import annotations

import hashlib
import os
import re
import shlex
import subprocess
from pathlib import Path
from typing import Any

from tfsdeploy.core.errors import ExitCode
from tfsdeploy.core.inventory.layout import HostPaths
from tfsdeploy.hosts.commands import lock, stage
from tfsdeploy.hosts.commands.files import append_lines, point_symlink, write_file

from .runs import paths, run_deploy

BOOT = Path("/proc/sys/kernel/random/boot_id").read_text().strip()


def _tools(tmp: Path) -> Path:
    """sync and mv that log their arguments (``tmp`` cut off) to tmp/calls, then run."""
    bin_dir = tmp / "bin"
    bin_dir.mkdir(exist_ok=True)
    log = tmp / "calls"
    log.unlink(missing_ok=True)
    for name in ("sync", "mv"):
        tool = bin_dir / name
        tool.write_text(f'#!/bin/sh\necho "{name} $*" | sed "s#{tmp}/##g" >> "{log}"\n'
                        f'exec /usr/bin/env PATH=/usr/bin:/bin {name} "$@"\n')
        tool.chmod(0o755)
    return bin_dir


def _run(tmp: Path, argv: list[str], stdin: bytes = b"") -> tuple[int, list[str]]:
    """Run ``argv`` as SSH would (quoted once) with the logging tools; its exit code and
    the calls in order."""
    env = {"PATH": f"{_tools(tmp)}:/usr/bin:/bin", "LC_ALL": "C"}
    done = subprocess.run(["sh", "-c", shlex.join(argv)], input=stdin, env=env,
                          capture_output=True, check=False)
    log = tmp / "calls"
    calls = log.read_text().splitlines() if log.exists() else []
    return done.returncode, [re.sub(r"\.tmp-[0-9]+", ".tmp-PID", c) for c in calls]


def test_write_file_fsyncs_the_file_and_directory_before_the_rename_and_after(
        tmp_path: Path) -> None:
    (tmp_path / "rel").mkdir()
    target = tmp_path / "rel" / "manifest.json"
    target.write_text("old")
    code, calls = _run(tmp_path, write_file(str(target), mode=0o640), b'{"id": "x"}\n')
    assert code == 0
    assert calls == ["sync -- rel/manifest.json.tmp-PID", "sync -- rel",
                     "mv -f -T -- rel/manifest.json.tmp-PID rel/manifest.json", "sync -- rel"]
    assert target.read_bytes() == b'{"id": "x"}\n'
    assert target.stat().st_mode & 0o777 == 0o640
    assert sorted(p.name for p in target.parent.iterdir()) == ["manifest.json"]


def test_write_file_into_a_missing_directory_fails_and_leaves_nothing(tmp_path: Path) -> None:
    code, calls = _run(tmp_path, write_file(str(tmp_path / "none" / "f")), b"x")
    assert code != 0 and calls == []


def test_the_current_link_flips_with_its_directory_fsynced_before_and_after(
        tmp_path: Path) -> None:
    (tmp_path / "m").mkdir()
    link = tmp_path / "m" / "current"
    os.symlink("releases/a", link)
    code, calls = _run(tmp_path, point_symlink("releases/b", str(link)))
    assert code == 0 and os.readlink(link) == "releases/b"
    # the new link lives in its directory: nothing of its own to fsync
    assert calls == ["sync -- m", "mv -f -T -- m/current.new m/current", "sync -- m"]


def test_audit_appends_are_fsynced_with_their_directory(tmp_path: Path) -> None:
    log = tmp_path / "m" / "audit.log"
    code, calls = _run(tmp_path, append_lines(str(log), ['{"event": "x"}']))
    assert code == 0 and log.read_text() == '{"event": "x"}\n'
    assert calls == ["sync -- m/audit.log m"]


def test_lock_records_are_published_durably(tmp_path: Path) -> None:
    paths = HostPaths(root=str(tmp_path), model="m")
    code, calls = _run(tmp_path, lock.acquire(paths, '{"token": "aa"}'))
    assert code == 0
    assert calls == ["sync -- m/lock/info.json.tmp", "sync -- m/lock",
                     "mv -f -T -- m/lock/info.json.tmp m/lock/info.json", "sync -- m/lock",
                     "sync -- m"]
    code, calls = _run(tmp_path, lock.replace_if_token(paths, "aa", '{"token": "bb"}'))
    assert code == 0 and calls[-2:] == ["mv -f -T -- m/lock/info.json.tmp m/lock/info.json",
                                        "sync -- m/lock"]
    assert calls[:2] == ["sync -- m/lock/info.json.tmp", "sync -- m/lock"]
    code, calls = _run(tmp_path, lock.remove_if_token(paths, "bb"))
    assert code == 0 and calls == ["sync -- m"] and not Path(paths.lock_dir).exists()


def _staging(tmp: Path) -> tuple[str, str]:
    """An unpacked upload: staging/version/{saved_model.pb, variables/v.data} + SHA256SUMS."""
    staging = tmp / "models" / "m" / ".staging-3-r"
    (staging / "version" / "variables").mkdir(parents=True)
    (staging / "version" / "saved_model.pb").write_bytes(b"pb")
    (staging / "version" / "variables" / "v.data").write_bytes(b"weights")
    sums = "".join(f"{hashlib.sha256(p.read_bytes()).hexdigest()}  {name}\n"
                   for name, p in (("saved_model.pb", staging / "version" / "saved_model.pb"),
                                   ("variables/v.data",
                                    staging / "version" / "variables" / "v.data")))
    (staging / "SHA256SUMS").write_text(sums)
    return str(staging), sums


def test_a_staged_version_is_fsynced_whole_before_its_one_rename(tmp_path: Path) -> None:
    staging, sums = _staging(tmp_path)
    paths = HostPaths(root=str(tmp_path), model="m")
    digest = hashlib.sha256(sums.encode()).hexdigest()
    code, calls = _run(tmp_path, stage.verify_and_publish(
        staging, paths.version_dir(3), digest_file=paths.digest_file(3), digest=digest))
    assert code == 0
    rename = calls.index("mv -T -- models/m/.staging-3-r/version models/m/3")
    tree = [c for c in calls[:rename] if ".staging-3-r/version" in c]
    synced = {p for c in tree for p in c.split()[2:]}
    assert synced == {f"models/m/.staging-3-r/version{p}" for p in (
        "", "/saved_model.pb", "/variables", "/variables/v.data")}
    assert calls[rename - 1] == "sync -- models/m" and calls[rename + 1:] == ["sync -- models/m"]
    # the digest, this boot's id and the sums are recorded (durably) before the version appears
    assert Path(paths.digest_file(3)).read_text() == f"{digest} {BOOT}\n"
    assert Path(paths.sums_file(3)).read_text() == sums
    assert "mv -f -T -- m/versions/3.sha256.tmp m/versions/3.sha256" in calls[:rename]
    assert sorted(os.listdir(tmp_path / "models" / "m")) == ["3"]


def test_recorded_sums_catch_a_truncated_file_and_replace_stages_over_it(
        tmp_path: Path) -> None:
    staging, sums = _staging(tmp_path)
    paths = HostPaths(root=str(tmp_path), model="m")
    digest = hashlib.sha256(sums.encode()).hexdigest()
    final = paths.version_dir(3)
    assert _run(tmp_path, stage.verify_and_publish(
        staging, final, digest_file=paths.digest_file(3), digest=digest))[0] == 0
    verify = stage.verify_recorded(final, sums_file=paths.sums_file(3), digest=digest)
    assert subprocess.run(verify, check=False).returncode == 0
    Path(final, "variables", "v.data").write_bytes(b"wei")  # a power loss cut it short
    assert subprocess.run(verify, check=False).returncode == 5
    assert subprocess.run(stage.verify_recorded(final, sums_file=paths.sums_file(3),
                                                digest="0" * 64), check=False).returncode == 5
    staging, _ = _staging(tmp_path)
    code, _ = _run(tmp_path, stage.verify_and_publish(
        staging, final, digest_file=paths.digest_file(3), digest=digest))
    assert code == 0 and Path(final, "variables", "v.data").read_bytes() == b"wei"  # kept
    staging, _ = _staging(tmp_path)
    code, _ = _run(tmp_path, stage.verify_and_publish(
        staging, final, digest_file=paths.digest_file(3), digest=digest, replace=True))
    assert code == 0 and Path(final, "variables", "v.data").read_bytes() == b"weights"
    assert sorted(os.listdir(tmp_path / "models" / "m")) == ["3"]
    assert subprocess.run(verify, check=False).returncode == 0


def test_record_boot_rewrites_the_digest_with_this_boot(tmp_path: Path) -> None:
    paths = HostPaths(root=str(tmp_path), model="m")
    Path(paths.digests).mkdir(parents=True)
    Path(paths.digest_file(3)).write_text(f"{'a' * 64} 00000000-0000-0000-0000-000000000000\n")
    code, calls = _run(tmp_path, stage.record_boot(paths.digest_file(3), "a" * 64))
    assert code == 0 and Path(paths.digest_file(3)).read_text() == f"{'a' * 64} {BOOT}\n"
    assert calls[-2:] == ["mv -f -T -- m/versions/3.sha256.tmp m/versions/3.sha256",
                          "sync -- m/versions"]


# -- a staged version reused after a reboot (fake hosts) -------------------------------------

def _fake_reboot(world: dict[str, Any], host: str, version: int) -> Path:
    """Record another boot id for a staged version on a fake host (its kernel 'rebooted')."""
    digest_file = Path(paths(world["fleet"][host]).digest_file(version))
    digest = digest_file.read_text().split()[0]
    digest_file.write_text(f"{digest} 00000000-0000-4000-8000-000000000000\n")
    return digest_file


def test_a_version_staged_before_a_reboot_is_reverified_then_trusted(
        world: dict[str, Any]) -> None:
    run_deploy(world, 1)
    run_deploy(world, 2)
    digest_file = _fake_reboot(world, "h1", 1)
    again = run_deploy(world, 1)
    assert again.exit_code == ExitCode.OK, again.message
    stage_h1 = next(s for s in again.hosts["h1"].steps if s["step"] == "stage_model")
    assert "re-verified against its recorded sums" in stage_h1["detail"], stage_h1
    assert digest_file.read_text().split()[1] == BOOT
    stage_h2 = next(s for s in again.hosts["h2"].steps if s["step"] == "stage_model")
    assert "already staged" in stage_h2["detail"], stage_h2  # same boot: not read again


def test_a_version_damaged_before_a_reboot_is_staged_again(world: dict[str, Any]) -> None:
    run_deploy(world, 1)
    run_deploy(world, 2)
    _fake_reboot(world, "h1", 1)
    model_file = Path(paths(world["fleet"]["h1"]).version_dir(1), "saved_model.pb")
    model_file.write_bytes(b"")  # the power loss left it empty
    again = run_deploy(world, 1)
    assert again.exit_code == ExitCode.OK, again.message
    stage_h1 = next(s for s in again.hosts["h1"].steps if s["step"] == "stage_model")
    assert "failed its re-verification and was replaced" in stage_h1["detail"], stage_h1
    assert model_file.read_bytes() == b"pb"
