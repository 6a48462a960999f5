"""A failed gate says what is wrong and how to fix it, on the local fleet: each of the common
TFServing load and warmup failures, from a real failing SavedModel, exits 2 with every host on
its previous release, and names its cause and fix under the gate's progress line, in the
summary table, in the JSON result and in the failed release's record.

One model (``itdiagnose``, port offset 2800: stable ports 11300 gRPC / 11301 REST). Version 1
(half_plus_two/1) is deployed once for the module, then each bad version in turn; serial
(1, "100%") stops each at tb1, so only tb1 loads it. The server is told not to retry a failed
load (``max_num_load_retries`` 0) so that each failure ends at once.

Assembled versions (docs/models.md): 2 = half_plus_two_bad/18 (Keras 3 model in a tf.Module),
3 = 19 (tf.py_function), 4 = 20 (GraphDef from a newer TensorFlow), 5 = 15 (larger than its
GPU share), 6 = 14 (warmup file not a TFRecord), 7 = 12 (serving_default takes z, returns w).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from deploy_support import GOOD, Fleet, fleet_fixture
from testbed_support import HOSTS, Run

pytestmark = pytest.mark.testbed

MODEL, OFFSET = "itdiagnose", 2800
BAD = "half_plus_two_bad"


@dataclass(frozen=True)
class Case:
    """One bad version and what its failure must say."""

    version: int
    source: int  # its half_plus_two_bad number
    kind: str
    gate: str
    cause: str  # in the cause
    fix: str  # in the fix
    as_json: bool = False  # --json (the result on stdout, progress on stderr)


CASES = (
    Case(2, 18, "variables_not_restored", "gate_available", "variable 'dense/",
         "re-export the model with Keras's model.export(path)"),
    Case(3, 19, "op_not_in_server", "gate_available", "op 'EagerPyFunc' comes from "
         "tf.py_function", "rebuild the model without tf.py_function", as_json=True),
    Case(4, 20, "model_newer_than_server", "gate_available", "the server's TensorFlow 2.21.0 "
         "reads up to", "set the hosts' image and tfserving_version vars (now "),
    Case(5, 15, "gpu_memory_exhausted", "gate_available", "ran out of GPU memory while loading",
         "raise the catalog's memory_mib"),
    Case(6, 14, "warmup_file_unreadable", "gate_available", "is not a TFRecord file of "
         "PredictionLog records", "rewrite the warmup file", as_json=True),
    Case(7, 12, "signature_mismatch", "gate_signature", "'serving_default' takes z DT_FLOAT",
         "the model's signatures: serving_default (z -> w); times_two (x -> y)"),
)


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    versions = {1: GOOD[1], **{c.version: (BAD, c.source) for c in CASES}}
    for made in fleet_fixture(tmp_path_factory, MODEL, OFFSET, versions, serial=(1, "100%"),
                              min_healthy_s=0.5, load_timeout_s=60.0, warmup_samples=4):
        text = made.inventory.read_text()
        made.inventory.write_text(text.replace(
            '"docker_gpus": "all",', '"docker_gpus": "all",\n    "max_num_load_retries": 0,'))
        yield made


@pytest.fixture(scope="module")
def v1(fleet: Fleet) -> dict[str, str]:
    """Version 1 on every host: each host's release id."""
    fleet.deploy(1)
    releases = {h: (fleet.current(h) or {}).get("id", "") for h in HOSTS}
    assert all(releases.values()), releases
    return releases


def gate_lines(out: str, gate: str) -> list[str]:
    """The failed gate's progress line on tb1 and the lines printed under it."""
    lines = out.splitlines()
    at = next(i for i, line in enumerate(lines)
              if " tb1 " in line and f" {gate} " in line and " failed " in line)
    return [lines[at], *(line.strip() for line in lines[at + 1:at + 4])]


def result_of(run: Run, case: Case, json_file: str) -> dict[str, object]:
    written: dict[str, object] = json.loads(Path(json_file).read_text())
    if case.as_json:
        assert run.json() == written
    return written


@pytest.mark.parametrize("case", CASES, ids=[f"v{c.source}-{c.kind}" for c in CASES])
def test_a_failed_gate_names_the_cause_and_the_fix(fleet: Fleet, v1: dict[str, str],
                                                   case: Case) -> None:
    json_file = str(fleet.tmp / f"deploy-{case.version}.json")
    run = fleet.fab("deploy", "--version", str(case.version), "--json-file", json_file,
                    *(["--json"] if case.as_json else []))
    assert run.code == 2, run.describe()
    for host in HOSTS:
        current = fleet.current(host) or {}
        assert (current.get("id"), current.get("status")) == (v1[host], "serving"), host
    fleet.assert_serving(1)

    progress = run.stderr if case.as_json else run.stdout
    gate, cause, fix, evidence = gate_lines(progress, case.gate)
    assert f"{case.gate}: expected" in gate, gate
    assert cause.startswith("cause: ") and case.cause in cause, cause
    assert fix.startswith("fix: ") and case.fix in fix, fix
    assert evidence.startswith("evidence: "), evidence

    result = result_of(run, case, json_file)
    hosts = result["hosts"]
    assert isinstance(hosts, dict)
    assert hosts["tb1"]["status"] == "restored"
    assert {hosts[h]["status"] for h in ("tb2", "tb3")} == {"skipped"}
    found = hosts["tb1"]["diagnosis"]
    assert found["kind"] == case.kind
    assert (f"cause: {found['cause']}", f"fix: {found['fix']}") == (cause, fix)

    record = next(r for r in fleet.records("tb1") if r["id"] == result["release"])
    assert record["status"] == "failed" and record["diagnosis"] == found
    if not case.as_json:
        table = run.stdout[run.stdout.index(f"deploy {MODEL} v{case.version}"):]
        assert "cause:" in table and "fix:" in table, table
