"""`fab plan-capacity --tune-report DIR/tune.json`: the instance count from the recommended
trial's QPS at the SLO, with the arithmetic; a report without a usable trial is refused."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tfsdeploy.loadtest.capacity import CapacityError, plan_from_tune

from .test_cli import _fab


def _report(tmp_path: Path, **changes: Any) -> Path:
    trial = {"batching": {"max_batch_size": 32}, "threads": {}, "qps": 8000.0, "p99_ms": 41.5,
             "meets_slo": True, "label": "batch 32 timeout 2000us threads 2"}
    data = {"kind": "tfsdeploy.tune", "host": "tb1", "slo_p99_ms": 50.0,
            "trials": [dict(trial, qps=5000.0), trial], "recommended": 1, **changes}
    path = tmp_path / "tune.json"
    path.write_text(json.dumps(data))
    return path


def test_the_recommended_trial_gives_the_per_instance_figure(tmp_path: Path) -> None:
    result = plan_from_tune(100_000, _report(tmp_path))
    assert result.per_instance_qps == 8000.0
    assert (result.minimum, result.recommended) == (22, 26)
    assert "trial 1 of fab tune on tb1 (batch 32 timeout 2000us threads 2), p99 41.50 ms" \
        in result.explain()


@pytest.mark.parametrize(("changes", "reason"), [
    ({"recommended": None}, "no trial of the tune report met the SLO"),
    ({"recommended": 5}, "recommended trial 5 is not one of its 2 trials"),
    ({"kind": "tfsdeploy.sweep"}, "not a fab tune report"),
    ({"trials": []}, "holds no trial"),
])
def test_a_report_without_a_usable_trial_is_refused(tmp_path: Path, changes: dict[str, Any],
                                                    reason: str) -> None:
    with pytest.raises(CapacityError, match=reason):
        plan_from_tune(1000, _report(tmp_path, **changes))


def test_fab_plan_capacity_reads_a_tune_report(tmp_path: Path) -> None:
    path = _report(tmp_path)
    result = _fab("plan-capacity", "--target-qps", "100000", "--tune-report", str(path),
                  tmp_path=tmp_path)
    assert result.returncode == 0, result.stderr
    assert "100,000 / (8,000.0 x 0.65 x 0.9)" in result.stdout
    assert "minimum 22 instances, recommended 26" in result.stdout
    both = _fab("plan-capacity", "--target-qps", "10", "--tune-report", str(path),
                "--per-instance-qps", "5", tmp_path=tmp_path)
    assert both.returncode == 1
    assert "--tune-report and --per-instance-qps both give the per-instance figure" \
        in both.stdout + both.stderr
