"""tests/bounds.py: a timing bound fails above (or below) its limit with a message naming the
quantity, the measurement and the bound, passes within it, and is recorded on the running
test whether it passed or not; the JUnit XML carries it, also from an xdist worker."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from tests.bounds import PROPERTY, recorded_on, within

REPO = Path(__file__).resolve().parents[2]


class Item:
    """Stands for the running test: these bounds stay out of this run's own table."""

    def __init__(self) -> None:
        self.user_properties: list[tuple[str, object]] = []

    def recorded(self) -> list[object]:
        return [json.loads(str(value)) for name, value in self.user_properties
                if name == PROPERTY]


def test_a_measurement_within_its_bounds_passes_and_is_recorded() -> None:
    item = Item()
    with recorded_on(item):
        within("step, s", 0.4, below=1)
        within("pending, s", 5.0, at_least=4.5, at_most=7.5)
    assert item.recorded() == [{"what": "step, s", "measured": 0.4, "below": 1.0},
                                 {"what": "pending, s", "measured": 5.0, "at_least": 4.5,
                                  "at_most": 7.5}]


@pytest.mark.parametrize(("measured", "bounds", "shown"), [
    (1.0, {"below": 1}, "< 1"),
    (1.25, {"at_most": 1}, "<= 1"),
    (2.0, {"above": 2}, "> 2"),
    (1.5, {"at_least": 2, "at_most": 9}, ">= 2"),
])
def test_a_measurement_past_a_bound_fails_naming_it(
        measured: float, bounds: dict[str, float], shown: str) -> None:
    item = Item()
    with recorded_on(item), pytest.raises(AssertionError) as failure:
        within("the roll, s", measured, **bounds)
    assert str(failure.value) == f"the roll, s: measured {measured:g}, bound {shown}"
    assert item.recorded() == [{"what": "the roll, s", "measured": measured,
                                  **{k: float(v) for k, v in bounds.items()}}]


def test_a_failure_shows_its_detail() -> None:
    with recorded_on(Item()), pytest.raises(AssertionError) as failure:
        within("the roll, s", 12.0, below=10, detail="$ fab deploy\n-> exit 2")
    assert str(failure.value) == "the roll, s: measured 12, bound < 10\n$ fab deploy\n-> exit 2"


def test_a_bound_is_required() -> None:
    with recorded_on(Item()), pytest.raises(TypeError):
        within("nothing", 1.0)


def test_outside_a_test_a_bound_is_only_checked() -> None:
    with recorded_on(None):
        within("step, s", 0.4, below=1)
        with pytest.raises(AssertionError):
            within("step, s", 1.4, below=1)


PROBE = '''
from tests.bounds import within

def test_fast():
    within("probe, s", 0.25, below=1)

def test_slow():
    within("probe, s", 3.0, below=1)
'''


@pytest.mark.parametrize("workers", [[], ["-n", "2"]], ids=["serial", "xdist"])
def test_the_junit_xml_carries_each_bound(tmp_path: Path, workers: list[str]) -> None:
    # the probe lies outside the suite; the suite's conftest comes in as a plugin
    (tmp_path / "test_probe.py").write_text(PROBE)
    junit = tmp_path / "run.xml"
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "tests.conftest",
         *workers, f"--junitxml={junit}", f"--rootdir={tmp_path}", str(tmp_path)],
        cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)}, capture_output=True, text=True,
        timeout=120)
    assert proc.returncode == 1, proc.stdout + proc.stderr  # test_slow fails
    found = {case.get("name"): [json.loads(p.get("value", "")) for p in case.iter("property")
                                if p.get("name") == PROPERTY]
             for case in ET.parse(junit).iter("testcase")}
    assert found == {"test_fast": [{"what": "probe, s", "measured": 0.25, "below": 1.0}],
                     "test_slow": [{"what": "probe, s", "measured": 3.0, "below": 1.0}]}
