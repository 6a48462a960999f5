"""Shared test set-up: run from the repository root, with its src/ importable."""

from __future__ import annotations

import json
import math
import os
import signal
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
os.chdir(ROOT)
for path in (ROOT, ROOT / "src"):
    if str(path) not in sys.path:
        sys.path.insert(0, str(path))
# and so do the Python processes the tests start (``python -c``): the venv's install is
# editable from whichever checkout ran scripts/setup last, which need not be this one
os.environ["PYTHONPATH"] = os.pathsep.join(
    [str(ROOT / "src"), *filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep))])

# Ctrl-C as a terminal delivers it. A suite started in the background (``bash scripts/test &``,
# nohup, some CI runners) inherits SIGINT ignored, Python then leaves it ignored, and so does
# every process the tests start, as POSIX asks: the tests that press Ctrl-C on `fab` would
# test nothing. A handler here (not SIG_IGN) makes the processes the tests start begin with
# SIGINT at its default, as from a terminal.
if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)


# -- parallel runs (pytest-xdist, ``--dist loadgroup``; scripts/test) ------------------------
#
# Every test module is one xdist group unless it names a group itself: a module's tests share
# module-scoped fixtures (one model on the fleet, one emulator), so they run in one worker, in
# file order. Modules that must not overlap share a group (``gpu-host``: the users of the
# suite fleet's two-GPU host; ``ssh-cut``: the modules that refuse new connections to a host's
# second sshd port, 2222, which all of them reach the hosts on). Groups are handed to the
# workers longest first, by the times the last run recorded (scripts/test-report writes them),
# so that the longest module does not start last.

DURATIONS = Path(os.environ.get("TFSDEPLOY_CACHE", "/var/cache/tfsdeploy")) / "test-durations.json"
# a guess for a group no run has timed yet: fleet tiers first, then the rest
FIRST_GUESS_S = {"mainjob": 200.0, "integration": 150.0, "accept": 60.0, "conformance": 60.0,
                 "testbed": 30.0, "emulator": 20.0}


def xdist_group(item: pytest.Item) -> str:
    """The group ``item`` runs in: its module's own or the one its marker names."""
    marker = item.get_closest_marker("xdist_group")
    if marker is not None:
        return str(marker.args[0] if marker.args else marker.kwargs.get("name", "default"))
    return item.nodeid.split("::", 1)[0]


def _recorded_durations() -> dict[str, float]:
    try:
        data = json.loads(DURATIONS.read_text())
    except (OSError, ValueError):
        return {}
    return {str(k): float(v) for k, v in data.items()} if isinstance(data, dict) else {}


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    recorded = _recorded_durations()
    first_seen: dict[str, int] = {}
    modules: dict[str, set[str]] = {}
    for index, item in enumerate(items):
        group = xdist_group(item)
        first_seen.setdefault(group, index)
        modules.setdefault(group, set()).add(item.nodeid.split("::", 1)[0])
        if item.get_closest_marker("xdist_group") is None:
            item.add_marker(pytest.mark.xdist_group(group))

    def module_s(module: str) -> float:
        tier = module.split("/")[1] if module.count("/") >= 2 else ""
        return recorded.get(module, FIRST_GUESS_S.get(tier, 5.0))

    # math.fsum: exact whatever the order of the set, which differs per process (string hash
    # seeds): a plain sum differed in its last bit between workers, two groups tied
    # differently, and xdist refused the run ("Different tests were collected")
    expected = {group: math.fsum(map(module_s, mods)) for group, mods in modules.items()}
    items.sort(key=lambda item: (-expected[xdist_group(item)], first_seen[xdist_group(item)]))


# -- reports that a worker can send ------------------------------------------------------------
#
# pytest-xdist sends each report to the controller as UTF-8; a lone surrogate in it (the
# hostile-input batteries print host text that holds them on purpose) ends the worker with an
# internal error, and the rest of its tests never run. Each text of a report is made UTF-8
# safe first, its surrogates shown as \udcff escapes.


def _utf8_safe(text: str) -> str:
    return text.encode("utf-8", "backslashreplace").decode("utf-8")


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    report.sections = [(_utf8_safe(title), _utf8_safe(body)) for title, body in report.sections]
    if report.longrepr is not None:
        rendered = str(report.longrepr)
        safe = _utf8_safe(rendered)
        if safe != rendered:
            report.longrepr = safe


# -- timing bounds (tests/bounds.py) -----------------------------------------------------------
#
# A test's timing bounds are recorded on it as properties, which the JUnit XML carries to
# scripts/test-report's table: ``within`` learns here which test is running, from its set-up
# (module fixtures started for it included) to its teardown.


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> object:
    from tests.bounds import recorded_on  # after ROOT is on sys.path, above

    with recorded_on(item):
        return (yield)
