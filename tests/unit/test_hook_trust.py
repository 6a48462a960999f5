"""Hooks are trusted as sshd's StrictModes trusts files, and they run on every ending
docs/hooks.md promises: also for runs that end with the lock held (exit 4) or with no host
reachable (exit 3)."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from functools import partial
from pathlib import Path
from typing import Any

import pytest

from tfsdeploy.core.errors import ConfigError, ExitCode
from tfsdeploy.core.file_trust import untrusted
from tfsdeploy.runbook.hooks import Moment, find_hooks, hook_env, run_hook

from .test_hooks import END, FACTS, _dump_env, _hook
from .test_notify import Receiver

root_only = pytest.mark.skipif(os.geteuid() != 0, reason="changes a file's owner")


def test_a_pre_hook_in_a_group_writable_directory_is_refused_naming_the_fix(
        tmp_path: Path) -> None:
    hooks = tmp_path / "hooks"
    _hook(hooks, "pre-deploy", "exit 0\n")
    hooks.chmod(0o775)
    with pytest.raises(ConfigError) as refused:
        find_hooks(hooks)
    text = str(refused.value)
    assert f"hook pre-deploy is not trusted: {hooks} is group-writable (mode 0775)" in text
    assert f"chmod go-w {hooks}" in text


def test_a_world_writable_hook_or_a_parent_is_refused(tmp_path: Path) -> None:
    hook = _hook(tmp_path / "a" / "hooks", "pre-rollback", "exit 0\n", mode=0o757)
    assert untrusted(hook) == f"{hook} is world-writable (mode 0757)"
    hook.chmod(0o755)
    assert untrusted(hook) is None
    (tmp_path / "a").chmod(0o777)
    assert untrusted(hook) == f"{tmp_path / 'a'} is group- and world-writable (mode 0777)"


def test_a_link_is_judged_by_its_target_and_the_target_s_directories(tmp_path: Path) -> None:
    shared = tmp_path / "shared"
    target = _hook(shared, "deploy-check", "exit 0\n")
    shared.chmod(0o777)
    hooks = tmp_path / "hooks"
    hooks.mkdir()
    (hooks / "pre-deploy").symlink_to(target)
    with pytest.raises(ConfigError, match=f"{shared} is group- and world-writable"):
        find_hooks(hooks)
    shared.chmod(0o755)
    target.chmod(0o775)
    problem = untrusted(hooks / "pre-deploy")
    assert problem == (f"{target} (the target of the link {hooks / 'pre-deploy'}) is "
                       "group-writable (mode 0775)")


def test_a_sticky_world_writable_directory_above_does_not_distrust(tmp_path: Path) -> None:
    """/tmp: no other user can rename or remove what is ours in it."""
    sticky = tmp_path / "tmp"
    sticky.mkdir()
    sticky.chmod(0o1777)
    hook = _hook(sticky / "mine" / "hooks", "pre-deploy", "exit 0\n")
    assert untrusted(hook) is None


@root_only
def test_a_hook_owned_by_another_user_is_refused(tmp_path: Path) -> None:
    hook = _hook(tmp_path / "hooks", "pre-deploy", "exit 0\n")
    os.chown(hook, 4321, -1)
    assert untrusted(hook) == f"{hook} is owned by uid 4321, neither you (uid 0) nor root"
    with pytest.raises(ConfigError, match='chown "\\$\\(id -un\\)"'):
        find_hooks(tmp_path / "hooks")


def test_an_untrusted_post_hook_is_reported_not_run(tmp_path: Path) -> None:
    ran = tmp_path / "ran"
    _hook(tmp_path / "hooks", "post-deploy", f"touch {ran}\n", mode=0o775)
    found = find_hooks(tmp_path / "hooks")  # a post-hook never stops the run
    result = run_hook(found, Moment.POST_DEPLOY, hook_env(FACTS, END), timeout_s=10)
    assert not ran.exists()
    assert not result.ok and not result.stops_run
    assert "was not run: not trusted:" in result.describe()
    assert "group-writable (mode 0775)" in result.error and "chmod go-w" in result.error


def test_a_hook_made_untrusted_during_the_run_is_not_run(tmp_path: Path) -> None:
    ran = tmp_path / "ran"
    _hook(tmp_path / "hooks", "pre-rollback", f"touch {ran}\n")
    found = find_hooks(tmp_path / "hooks")
    (tmp_path / "hooks").chmod(0o777)  # checked again right before it runs
    result = run_hook(found, Moment.PRE_ROLLBACK, hook_env(FACTS), timeout_s=10)
    assert result.stops_run and not ran.exists()
    refusal = result.refusal()
    assert refusal is not None and refusal.exit_code == ExitCode.INVALID
    assert "not trusted" in str(refusal)


# -- every ending runs the post-hooks and sends `finished` --------------------------------

def events(receiver: Receiver) -> list[str]:
    """The name of each event the receiver took, in order."""
    return [str(body.get("event")) for body in receiver.accepted()]


@pytest.fixture()
def receiver(monkeypatch: pytest.MonkeyPatch) -> Iterator[Receiver]:
    from tfsdeploy.cli import around

    # a run gives its notifications 0.8 s at its end; this receiver runs in the test's own
    # process, at nice 19 beside the fleet tiers in CI, and these tests judge what it got
    monkeypatch.setattr(around, "NOTIFY_CLOSE_S", 10.0)
    found = Receiver()
    yield found
    found.stop()


def _args(world: dict[str, Any], hooks: Path, url: str, **more: Any) -> dict[str, Any]:
    from .runs import MODEL, inventory_file

    return {"c": None, "model": MODEL, "inventory": inventory_file(world), "hosts": None,
            "limit": None, "playbook": None, "lock_wait": 0.0, "json": False,
            "log_file": None, "json_file": None, "metrics_file": None, "hooks": str(hooks),
            "notify": [url], **more}


def _recorders(hooks: Path, *names: str) -> dict[str, Path]:
    seen = {}
    for name in names:
        seen[name] = hooks.parent / f"{name}.json"
        _hook(hooks, name, _dump_env(seen[name]))
    return seen


def _fake_commands(world: dict[str, Any], monkeypatch: pytest.MonkeyPatch) -> None:
    from tfsdeploy.run import deploy as cli_deploy
    from tfsdeploy.run import rollback as cli_rollback

    from .fakes import FakeSlot, FrozenClock

    fleet = world["fleet"]
    for module, name in ((cli_deploy, "deploy"), (cli_rollback, "rollback")):
        monkeypatch.setattr(module, name, partial(
            getattr(module, name), connect=fleet.connect, clock=FrozenClock(),
            client_factory=FakeSlot))


def test_a_deploy_that_finds_the_lock_held_runs_its_post_hooks_and_says_finished(
        world: dict[str, Any], monkeypatch: pytest.MonkeyPatch, receiver: Receiver) -> None:
    from tfsdeploy.cli.main import main

    from .runs import paths, run_deploy

    run_deploy(world, 1)
    _fake_commands(world, monkeypatch)
    hooks = world["tmp"] / "hooks"
    seen = _recorders(hooks, "pre-deploy", "post-deploy", "on-failure")
    assert world["fleet"].hosts
    for host in world["fleet"].hosts.values():
        lock = Path(paths(host).lock_dir)
        lock.mkdir(parents=True)
        (lock / "info.json").write_text(json.dumps({
            "token": "0123abcd", "who": "alice", "machine": "elsewhere", "pid": 7,
            "started": "2026-11-30T10:00:00+00:00", "command": "deploy hp2 v9"}))
    code = main("deploy", _args(world, hooks, receiver.url, version="2", check=False,
                                diff=False, canary_weights=None, step_s=None, pause=False))
    assert code == ExitCode.LOCKED
    for name in ("post-deploy", "on-failure"):
        assert seen[name].is_file(), f"{name} did not run after exit 4"
        env = json.loads(seen[name].read_text())
        assert env["TFSDEPLOY_EXIT_CODE"] == "4" and env["TFSDEPLOY_RESULT"] == "locked"
        assert "alice" in env["TFSDEPLOY_MESSAGE"]
    assert events(receiver)[-1] == "finished", events(receiver)


def test_a_rollback_that_reaches_no_host_runs_its_post_hooks_and_says_finished(
        world: dict[str, Any], monkeypatch: pytest.MonkeyPatch, receiver: Receiver) -> None:
    from tfsdeploy.cli.main import main

    from .runs import run_deploy

    run_deploy(world, 1)
    run_deploy(world, 2)
    _fake_commands(world, monkeypatch)
    for host in world["fleet"].hosts.values():
        host.unreachable = True
    hooks = world["tmp"] / "hooks"
    seen = _recorders(hooks, "pre-rollback", "post-rollback", "on-failure")
    code = main("rollback", _args(world, hooks, receiver.url, to=None))
    assert code == ExitCode.INCONSISTENT
    assert not seen["pre-rollback"].exists()  # no release was chosen: nothing to ask about
    for name in ("post-rollback", "on-failure"):
        assert seen[name].is_file(), f"{name} did not run after exit 3"
        env = json.loads(seen[name].read_text())
        assert env["TFSDEPLOY_EXIT_CODE"] == "3" and env["TFSDEPLOY_RESULT"] == "inconsistent"
    assert events(receiver)[-1] == "finished", events(receiver)


def test_a_refused_pre_hook_still_runs_no_other_hook(
        world: dict[str, Any], monkeypatch: pytest.MonkeyPatch, receiver: Receiver) -> None:
    from tfsdeploy.cli.main import main

    _fake_commands(world, monkeypatch)
    hooks = world["tmp"] / "hooks"
    seen = _recorders(hooks, "post-deploy", "on-failure")
    _hook(hooks, "pre-deploy", "echo no ticket\nexit 1\n")
    code = main("deploy", _args(world, hooks, receiver.url, version="1", check=False,
                                diff=False, canary_weights=None, step_s=None, pause=False))
    assert code == ExitCode.INVALID
    assert not seen["post-deploy"].exists() and not seen["on-failure"].exists()
