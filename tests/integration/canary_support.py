"""What the canary modules share: a model on tb1..tb3 (serial [1, 100%]: tb1 is the canary)
whose rollout has a weighted canary (one step of 25 %, 8 s, 40 requests per slot unless the
module says, P99 within 1.5 x the old slot's + 5 ms, a comparison over 30 requests) and four
assembled versions:
1 and 2 good and answering alike (both half_plus_two/2: y = 0.5 x + 3, so the prediction
comparison passes; the responses' model_spec.version tells them apart),
3 = half_plus_two_bad/16 (answers as 2, 40 ms slower), 4 = half_plus_two_bad/17 (answers as 2,
but +1 for x > 100). Clients are independent of the toolkit: they talk to tb1's stable port.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
from deploy_support import GOOD, Fleet, Traffic, fleet_fixture
from testbed_support import HOSTS

SLOWER, DIFFERENT = ("half_plus_two_bad", 16), ("half_plus_two_bad", 17)
CANARY = ("CanaryPolicy(weights=(25,), step_s=8, min_requests={min_requests}, "
          "max_p99_ratio=1.5, latency_slack_ms=5, "
          "comparison=ComparisonPolicy(corpus={corpus!r}, samples=30))")


def canary_fleet(tmp_path_factory: pytest.TempPathFactory, model: str, offset: int, *,
                 min_requests: int = 40, hosts: dict[str, str] | None = None,
                 wide: str | None = None) -> Iterator[Fleet]:
    """Body of a module-scoped fixture: the model (above) on a healthy fleet, nothing
    deployed; ``min_requests``: per slot, for a step's verdict; ``hosts``: another fleet than
    tb1..tb3 (its first host is the canary); ``wide``: the host that runs one server on each
    of its two GPUs."""
    for made in fleet_fixture(tmp_path_factory, model, offset,
                              {1: GOOD[2], 2: GOOD[2], 3: SLOWER, 4: DIFFERENT},
                              serial=(1, "100%"), hosts=hosts or HOSTS):
        corpus = made.tmp / "corpus.jsonl"
        corpus.write_text("".join(json.dumps({"signature": "serving_default", "inputs": {
            "x": {"dtype": "DT_FLOAT", "shape": [1, 1], "values": [[float(x)]]}}}) + "\n"
            for x in (1, 50, 150, 250, 400, 900)))
        text = made.inventory.read_text().replace(
            "from tfsdeploy.core.inventory.catalog import",
            "from tfsdeploy.core.inventory.canary_policy import CanaryPolicy, ComparisonPolicy\n"
            "from tfsdeploy.core.inventory.catalog import").replace(
            "Rollout(", "Rollout(canary=" + CANARY.format(corpus=str(corpus),
                                                  min_requests=min_requests) + ", ", 1)
        if wide is not None:
            marker = "for i in range(1)])"
            assert marker in text
            text = text.replace(marker, f"for i in range(2 if name == {wide!r} else 1)])")
        made.inventory.write_text(text)
        yield made


def Client(fleet: Fleet, host: str = "tb1") -> Traffic:
    """An independent client of a host's stable gRPC port (tb1: the canary host), unpaced:
    the shares count answers (1,000 a share), and a step's judge needs ``min_requests`` of
    them in each slot within the step."""
    return Traffic(fleet, host, per_second=None)


def serving(fleet: Fleet, version: int) -> None:
    """Every host's stable ports answer as half_plus_two/2 and its live release is
    ``version``."""
    fleet.assert_serving(2)
    for host in HOSTS:
        record = fleet.current(host)
        assert record is not None and record["version"] == version, (host, record)


def deploy(fleet: Fleet, version: int, *args: str) -> Any:
    """``fab deploy --version V --json ARGS``."""
    return fleet.fab("deploy", "--version", str(version), "--json", *args, timeout=900)
