"""scripts/test-report on JUnit files as pytest writes them: every skip printed with its
reason; a skip the allowlist does not name, and a tier that collected tests and ran none,
fail the run (exit 1); an allowlist that is not valid is exit 2."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

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
