"""The deploy machine's own files: every write replaces the file in one rename with the file
fsynced before it and the directory after it (asserted on the order of the real calls, with
os.fsync, os.replace and os.open observed), appends are fsynced, and the lock around a
read-modify-write keeps a second writer out until the first has renamed its file."""

from __future__ import annotations

import os
import stat
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from tfsdeploy.core import localfiles


@pytest.fixture()
def calls(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """'fsync <path>' and 'replace <from> <to>' (names relative to the test's directory)."""
    seen: list[str] = []
    names: dict[int, str] = {}
    real_open, real_fsync, real_replace = os.open, os.fsync, os.replace

    def opened(path: Any, flags: int, mode: int = 0o777, **kwargs: Any) -> int:
        fd = real_open(path, flags, mode, **kwargs)
        names[fd] = str(path)
        return fd

    def fsync(fd: int) -> None:
        seen.append(f"fsync {names.get(fd) or os.readlink(f'/proc/self/fd/{fd}')}")
        real_fsync(fd)

    def replace(src: Any, dst: Any) -> None:
        seen.append(f"replace {src} {dst}")
        real_replace(src, dst)

    monkeypatch.setattr(os, "open", opened)
    monkeypatch.setattr(os, "fsync", fsync)
    monkeypatch.setattr(os, "replace", replace)
    return seen


def test_a_write_fsyncs_the_file_then_renames_then_fsyncs_the_directory(
        tmp_path: Path, calls: list[str]) -> None:
    (tmp_path / "out").mkdir()
    target = tmp_path / "out" / "result.json"
    target.write_text("old")
    localfiles.write_durable(target, '{"exit_code": 0}\n')
    assert target.read_text() == '{"exit_code": 0}\n'
    assert stat.S_IMODE(target.stat().st_mode) == 0o600
    assert len(calls) == 3, calls
    temp = calls[0].split(" ", 1)[1]
    assert Path(temp).parent == target.parent and Path(temp).name.startswith(".result.json.")
    assert calls[1:] == [f"replace {temp} {target}", f"fsync {target.parent}"]
    assert sorted(p.name for p in target.parent.iterdir()) == ["result.json"]


def test_a_write_into_new_directories_fsyncs_each_new_entry(tmp_path: Path,
                                                            calls: list[str]) -> None:
    target = tmp_path / "a" / "b" / "targets.json"
    localfiles.write_durable(target, b"[]\n", mode=0o644)
    assert stat.S_IMODE(target.stat().st_mode) == 0o644
    assert calls[:2] == [f"fsync {tmp_path}", f"fsync {tmp_path / 'a'}"]
    assert calls[-1] == f"fsync {tmp_path / 'a' / 'b'}"


def test_a_failed_write_leaves_the_old_file_and_no_temporary(tmp_path: Path,
                                                             monkeypatch: pytest.MonkeyPatch
                                                             ) -> None:
    target = tmp_path / "t.prom"
    target.write_text("old\n")

    def refuse(src: Any, dst: Any) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "replace", refuse)
    with pytest.raises(OSError):
        localfiles.write_durable(target, "new\n")
    assert target.read_text() == "old\n"
    assert [p.name for p in tmp_path.iterdir()] == ["t.prom"]


def test_an_append_is_fsynced_and_a_new_file_s_directory_too(tmp_path: Path,
                                                            calls: list[str]) -> None:
    journal = tmp_path / "state" / "boots"
    localfiles.append_durable(journal, "first")
    localfiles.append_durable(journal, "second\n")
    assert journal.read_text() == "first\nsecond\n"
    assert calls == [f"fsync {tmp_path}", f"fsync {journal}", f"fsync {journal.parent}",
                     f"fsync {journal}"]


def test_the_lock_keeps_a_second_read_modify_write_out(tmp_path: Path) -> None:
    target = tmp_path / "tfsdeploy.prom"
    order: list[str] = []
    inside = threading.Event()

    def first() -> None:
        with localfiles.locked(target):
            order.append("first in")
            inside.set()
            time.sleep(0.3)
            order.append("first out")

    thread = threading.Thread(target=first)
    thread.start()
    inside.wait(5)
    with localfiles.locked(target):  # flock locks are per open file: threads exclude too
        order.append("second in")
    thread.join()
    assert order == ["first in", "first out", "second in"]
    assert (tmp_path / ".tfsdeploy.prom.lock").exists()
    assert not target.exists()
