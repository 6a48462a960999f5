"""scripts/test-report on JUnit files as pytest writes them: every skip printed with its
reason; a skip the allowlist does not name, and a tier that collected tests and ran none,
fail the run (exit 1); an allowlist that is not valid is exit 2; every timing bound a test
recorded is listed, tightest margin first."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from xml.sax.saxutils import quoteattr

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "scripts" / "test-report"

PASSED = '<testcase classname="tests.unit.test_a" name="test_ok" time="0.1"/>'
SKIPPED = ('<testcase classname="tests.conformance.test_b" name="test_gpu[x]" time="0.0">'
           '<skipped type="pytest.skip" message="needs a GPU machine here">'
           'tests/conformance/test_b.py:9: needs a GPU machine here</skipped></testcase>')
OTHER_RAN = '<testcase classname="tests.conformance.test_b" name="test_cpu" time="0.2"/>'
ENTRY = ('[[skip]]\ntest = "tests/conformance/test_b.py::test_gpu*"\n'
         'because = "needs a GPU machine"\nreason = "CI machines have no GPU"\n')


def report(tmp_path: Path, cases: list[str], allowed: str = ""
           ) -> subprocess.CompletedProcess[str]:
    junit = tmp_path / "run.xml"
    junit.write_text('<?xml version="1.0" encoding="utf-8"?><testsuites><testsuite name="pytest">'
                     + "".join(cases) + "</testsuite></testsuites>")
    allowlist = tmp_path / "skips-allowed.toml"
    allowlist.write_text(allowed)
    return subprocess.run([sys.executable, str(SCRIPT), "--allowed-skips", str(allowlist),
                           str(junit)], capture_output=True, text=True, timeout=60)


def test_a_run_without_skips_passes(tmp_path: Path) -> None:
    proc = report(tmp_path, [PASSED, OTHER_RAN])
    assert proc.returncode == 0, proc.stdout
    assert "== skips: 0" in proc.stdout


def test_a_skip_not_on_the_allowlist_fails_the_run_and_is_printed(tmp_path: Path) -> None:
    proc = report(tmp_path, [PASSED, SKIPPED, OTHER_RAN])
    assert proc.returncode == 1, proc.stdout
    assert "tests/conformance/test_b.py::test_gpu[x]" in proc.stdout
    assert "needs a GPU machine here" in proc.stdout
    assert "NOT ALLOWED" in proc.stdout and "1 skip(s) not on the allowlist" in proc.stdout


def test_an_allowed_skip_passes_with_its_reason(tmp_path: Path) -> None:
    proc = report(tmp_path, [PASSED, SKIPPED, OTHER_RAN], ENTRY)
    assert proc.returncode == 0, proc.stdout
    assert "allowed: CI machines have no GPU" in proc.stdout


def test_an_allowed_test_skipped_for_another_reason_fails(tmp_path: Path) -> None:
    other = SKIPPED.replace("needs a GPU machine here", "the fleet is not set up")
    proc = report(tmp_path, [PASSED, other, OTHER_RAN], ENTRY)
    assert proc.returncode == 1, proc.stdout


def test_a_tier_whose_every_test_skipped_fails_even_when_allowed(tmp_path: Path) -> None:
    proc = report(tmp_path, [PASSED, SKIPPED], ENTRY)
    assert proc.returncode == 1, proc.stdout
    assert "the tier conformance collected tests and ran none" in proc.stdout


def test_an_xfail_counts_as_a_skip(tmp_path: Path) -> None:
    xfail = SKIPPED.replace("pytest.skip", "pytest.xfail")
    proc = report(tmp_path, [PASSED, xfail, OTHER_RAN])
    assert proc.returncode == 1 and "xfail: needs a GPU machine" in proc.stdout, proc.stdout


def test_an_allowlist_entry_without_its_reason_is_refused(tmp_path: Path) -> None:
    proc = report(tmp_path, [PASSED], ENTRY.replace('reason = "CI machines have no GPU"\n', ""))
    assert proc.returncode == 2, proc.stdout
    assert "entry 1 must have exactly the keys" in proc.stderr


def test_the_repository_s_allowlist_is_valid(tmp_path: Path) -> None:
    junit = tmp_path / "run.xml"
    junit.write_text(f'<testsuites><testsuite name="pytest">{PASSED}</testsuite></testsuites>')
    proc = subprocess.run([sys.executable, str(SCRIPT), str(junit)], capture_output=True,
                          text=True, timeout=60)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def bound(what: str, measured: float, **limits: float) -> str:
    value = json.dumps({"what": what, "measured": measured, **limits})
    return f'<property name="timing bound" value={quoteattr(value)}/>'


def test_the_timing_bounds_are_listed_tightest_margin_first(tmp_path: Path) -> None:
    timed = ('<testcase classname="tests.unit.test_a" name="test_timed" time="1.0"><properties>'
             + bound("the roll, s", 2.0, below=10) + bound("stop, s", 0.8, below=1)
             + bound("pending, s", 6.0, at_least=4.5, at_most=7.5)
             + '<property name="other" value="x"/></properties></testcase>')
    proc = report(tmp_path, [timed, OTHER_RAN])
    assert proc.returncode == 0, proc.stdout
    section = proc.stdout.split("== timing bounds: 3", 1)[1].split("== skips", 1)[0]
    lines = [line.strip() for line in section.splitlines()[1:]]
    assert lines == ["1.25x  stop, s: measured 0.8, bound < 1",
                     "tests/unit/test_a.py::test_timed",
                     "1.25x  pending, s: measured 6, bound >= 4.5, <= 7.5",
                     "tests/unit/test_a.py::test_timed",
                     "5.00x  the roll, s: measured 2, bound < 10",
                     "tests/unit/test_a.py::test_timed"]


def test_a_bound_past_its_limit_shows_a_margin_below_one(tmp_path: Path) -> None:
    failed = ('<testcase classname="tests.unit.test_a" name="test_slow" time="3.0">'
              '<properties>' + bound("the roll, s", 3.0, below=1) + '</properties>'
              '<failure message="the roll, s: measured 3, bound &lt; 1">x</failure></testcase>')
    proc = report(tmp_path, [failed, OTHER_RAN])
    assert proc.returncode == 0, proc.stdout  # the failure fails the run in pytest, not here
    assert "0.33x  the roll, s: measured 3, bound < 1" in proc.stdout


def test_a_margin_over_zero_is_infinite(tmp_path: Path) -> None:
    timed = ('<testcase classname="tests.unit.test_a" name="test_timed" time="1.0"><properties>'
             + bound("wait, s", 0.0, below=1) + bound("gap, s", 0.5, at_least=0)
             + '</properties></testcase>')
    proc = report(tmp_path, [timed, OTHER_RAN])
    assert proc.returncode == 0, proc.stdout
    assert "infx  wait, s: measured 0, bound < 1" in proc.stdout
    assert "infx  gap, s: measured 0.5, bound >= 0" in proc.stdout
