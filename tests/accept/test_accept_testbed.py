"""``fab accept`` on the local fleet (real sshd, dockerd, HAProxy, the TFServing-compatible
server): load from two testbed hosts (group ``loadgens``), a release in the window.

Model ``acceptit``, port offset 2000 (stable gRPC 10500). Versions: 1 and 2 are half_plus_two
1 and 2; 3 answers like half_plus_two 3 (y = 0.5 x + 4) but sleeps about 400 ms inside every
batch (tests/accept/slowmodel.py): slow at serving time. The inventory's warmup gate is loose
(P99 5 s) so that the deploy lets it through: the acceptance table must catch it.

Tests run in file order: v1 is deployed by the fixture, the passing run releases v2 (alone,
after the parallel tiers: marker quiet, with its own fixture), the lost and the stalled
generator runs change nothing, the slow run releases v3. Each asserts the one
verdict its scenario must give: pass (0), inconclusive (5: a generator lost, a generator
that stalled), fail (2: the slow release).
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.bounds import within

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "integration"))

from deploy_support import GOOD, assemble_source, assert_ports_free
from testbed_support import (
    HOSTS,
    MODELS,
    VENV_BIN,
    ModelFleet,
    Run,
    copy_version,
    expected_y,
    fleet_lifetime,
    grpc_predict,
    inventory_text,
    ssh,
)

from .plotcheck import expected_columns, plot_arguments, shaded_columns

pytestmark = pytest.mark.testbed

MODEL, OFFSET = "acceptit", 2000
# an SLO the good versions meet with room on a 2-core machine shared with the fleet; the slow
# version's batches wait about 2 x SLOW_SLEEP_MS, so its P99 is over the SLO by more than the
# generators' own lag has ever been (207 ms at most, docs/acceptance.md): the run must blame
# the fleet (exit 2), never call it inconclusive
SLO_MS = 250
SLOW_VERSION, SLOW_B, SLOW_SLEEP_MS = 3, 4.0, 500
LOADGENS = ("tb1", "tb2")
GROUPS = ('{"canary": Group(["tb1"]), "main": Group(["tb2", "tb3"]), '
          '"loadgens": Group(["tb1", "tb2"])}')


def make_slow_version(source: Path, golden: Path, tmp: Path) -> None:
    """Version 3: the slow model, with half_plus_two 3's warmup records and golden outputs."""
    built = tmp / "slow-build"
    subprocess.run([str(VENV_BIN / "python"), str(Path(__file__).with_name("slowmodel.py")),
                    str(built), str(SLOW_B), str(SLOW_SLEEP_MS),
                    str(MODELS / "half_plus_two" / "3")], check=True, timeout=300,
                   capture_output=True)
    copy_version(built, source, SLOW_VERSION)
    data = json.loads(golden.read_text())
    catalog = json.loads((MODELS / "half_plus_two" / "catalog.json").read_text())
    data["version_details"][str(SLOW_VERSION)] = {
        "golden": catalog["version_details"]["3"]["golden"], "from": "slowmodel b=4"}
    golden.write_text(json.dumps(data, indent=1))


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ModelFleet]:
    def make() -> ModelFleet:
        assert_ports_free(OFFSET)
        tmp = tmp_path_factory.mktemp(MODEL)
        source, golden = assemble_source(tmp, {1: GOOD[1], 2: GOOD[2]})
        make_slow_version(source, golden, tmp)
        inventory = tmp / "inventory.py"
        inventory.write_text(inventory_text(
            title="the acceptance-run tests", model=MODEL, source=source, golden=golden,
            offset=OFFSET, groups=GROUPS, slo_ms=SLO_MS,
            warmup="Warmup(samples=10, p99_ms=5000.0, timeout_s=60)",
            rollout="Rollout(serial=(1, '100%'), min_healthy_s=1.0, load_timeout_s=120.0, "
                    "drain_timeout_s=30)"))
        fleet = ModelFleet(model=MODEL, offset=OFFSET, tmp=tmp, source=source,
                           inventory=inventory)
        fleet.deploy(1)
        return fleet

    yield from fleet_lifetime(MODEL, make, keep_env="TFSDEPLOY_ACCEPT_TESTS_KEEP")


def accept_json(out: Path) -> dict[str, Any]:
    return json.loads((out / "accept.json").read_text())  # type: ignore[no-any-return]


def figures(name: str, accept: dict[str, Any]) -> str:
    """The run's verdict, rows and each generator's own lag, on one line (printed: the
    measurements the bounds here rest on)."""
    rows = ", ".join(f"{r['row']} {r['figure']} {'pass' if r['passed'] else 'FAIL'}"
                     for r in accept["rows"])
    gens = ", ".join(f"{g['name']} {g['status']} own late {g.get('ownLateSends')} max lag "
                     f"{g.get('maxSendLagMs', 0):.0f} ms" for g in accept["generators"])
    return f"{name}: exit {accept['exitCode']} ({accept['verdict']}); {rows}; {gens}"


def run_dirs_left(run_id: str) -> dict[str, str]:
    """What each generator host still has of the run (nothing, after a run)."""
    left = {}
    for host in LOADGENS:
        found = ssh(host, f"ls -d /srv/tfsdeploy/loadgen/runs/{run_id} 2>/dev/null; true"
                    ).stdout.strip()
        if found:
            left[host] = found
    return left


def run_id_of(run: Run) -> str:
    found = re.search(r"accept: run (\S+);", run.out)
    assert found, run.describe()
    return found.group(1)


@pytest.mark.quiet
def test_the_acceptance_run_passes_with_a_release_under_load(fleet: ModelFleet) -> None:
    out = fleet.tmp / "pass"
    # A pass is a verdict on latency: it runs alone (marker quiet), as the other latency
    # judges do. Beside the parallel tiers, a machine 99.6 % busy gave one second a P99 over
    # 1 s though the fleet and the toolkit were sound (the generators' own lag, 213 ms, taken
    # off). An SLO of 1 s for this run still: the three servers, the two generators and the
    # release's model loads share the 2 cores. A 40 s window, the release from 15 % of it: a
    # release that outlasts the window fails the run (rows.release_row); 6 s of load before
    # it give the plot its columns
    run = fleet.fab("accept", "--target-qps", "200", "--duration", "40s", "--release", "2",
                    "--release-at", "15%", "--loadgens", "loadgens", "--slo-p99-ms", "1000",
                    "--out", str(out), timeout=600)
    data = accept_json(out)
    accept = data["tfsdeploy"]["accept"]
    print(figures("passing run", accept))
    assert accept["sloP99Ms"] == 1000, accept["sloP99Ms"]
    # every request of every generator counted once in the merge
    gens = {g["name"]: g for g in accept["generators"]}
    assert set(gens) == set(LOADGENS) and all(g["status"] == "ok" for g in gens.values())
    assert all(g["count"] == 4000 for g in gens.values()), gens  # 100 QPS x 40 s each
    assert data["count"] == accept["merge"]["count"] == sum(g["count"] for g in gens.values())
    assert sum(r["count"] for r in accept["series"]) == data["count"]
    # the release ran inside the window, and the plot shows it there
    release = accept["release"]
    assert release["exitCode"] == 0 and release["startS"] < release["endS"], release
    # --release-at 15 % of the 40 s window: 6 s in (its lower limit); it must end inside it
    # measured in a full run (2 cores, 4 workers beside it): 6.00 s, margin 1.00x;
    # scripts/test prints it every run
    within("release start in the window, s", release["startS"], at_least=6)
    within("release end in the window, s", release["endS"], at_most=40)
    png = out / "accept.png"
    found = shaded_columns(png)
    want = expected_columns(accept["series"], **plot_arguments(data))
    assert found is not None and found == pytest.approx(want, abs=2), (found, want)
    # the release happened (v2 answers), and the generators left nothing behind
    for address in HOSTS.values():
        assert grpc_predict(address, fleet.grpc_port, MODEL, [2.0]) == [expected_y(2)]
    assert run_dirs_left(run_id_of(run)) == {}
    assert all("environment" in line for line in run.out.splitlines()
               if re.match(r"accept: tb\d: ready", line))
    # the verdict: a pass (a generator that lagged leaves a warning, and the pass stands when
    # every row passed; a run that a lag made inconclusive fails here: that is
    # test_a_generator_that_stalls_makes_the_run_inconclusive's outcome, not this one's)
    assert run.code == 0, run.describe()
    assert [(r["row"], r["passed"]) for r in accept["rows"]] == [
        ("throughput", True), ("p99 every 1 s", True), ("error rate", True),
        ("p99 during release v2", True)]


def test_a_generator_lost_mid_run_fails_the_run_and_keeps_the_rest(fleet: ModelFleet) -> None:
    out = fleet.tmp / "lost"
    watched = fleet.background("accept", "--target-qps", "100", "--duration", "20s",
                               "--loadgens", "loadgens", "--start-margin", "8s",
                               "--out", str(out))
    run_id = re.search(r"run (\S+);", watched.wait_for(r"accept: run \S+;")).group(1)  # type: ignore[union-attr]
    watched.wait_for(r"accept: load from", timeout=300)
    time.sleep(8 + 8)  # the margin, then 8 s into the window
    ssh("tb2", f"kill -9 $(cat /srv/tfsdeploy/loadgen/runs/{run_id}/pid)")
    run = watched.finish(timeout=300)
    data = accept_json(out)
    accept = data["tfsdeploy"]["accept"]
    assert run.code == 5, run.describe()
    gens = {g["name"]: g for g in accept["generators"]}
    assert gens["tb2"]["status"] == "lost" and "process gone" in gens["tb2"]["error"]
    # killed 8 s into the window (after the 8 s margin), reported lost at 8.6 s (measured,
    # docs/acceptance.md): within 3 s before and 6 s after the kill
    # measured in a full run (2 cores, 4 workers beside it): 8.39 s, margin 1.67x;
    # scripts/test prints it every run
    within("killed generator reported lost, s into the window", gens["tb2"]["endedS"],
           at_least=5, at_most=14)
    assert gens["tb1"]["status"] == "ok" and gens["tb1"]["count"] == 1000  # kept
    assert data["count"] == 1000 and accept["merge"]["equal"]
    assert any("tb2 was lost mid-run" in w for w in accept["warnings"])
    assert accept["verdict"] == "inconclusive: load generation failed", run.describe()
    assert run_dirs_left(run_id) == {}


def test_a_generator_that_stalls_makes_the_run_inconclusive(fleet: ModelFleet) -> None:
    """tb2's generator gets no CPU for 3 s mid-window (SIGSTOP of its processes, then
    SIGCONT: what a machine with no core to give does to it): its sends fall behind by its own
    doing, the seconds it stalled fail the P99 row by no more than its lag, and the run is
    inconclusive (exit 5), never a verdict on the fleet."""
    out = fleet.tmp / "stall"
    watched = fleet.background("accept", "--target-qps", "100", "--duration", "30s",
                               "--loadgens", "loadgens", "--start-margin", "8s",
                               "--slo-p99-ms", "1000", "--out", str(out))
    run_id = re.search(r"run (\S+);", watched.wait_for(r"accept: run \S+;")).group(1)  # type: ignore[union-attr]
    watched.wait_for(r"accept: load from", timeout=300)
    time.sleep(8 + 10)  # the margin, then 10 s into the window
    ssh("tb2", f"pid=$(cat /srv/tfsdeploy/loadgen/runs/{run_id}/pid) && "
               "group=$(ps -o pgid= -p $pid | tr -d ' ') && kill -STOP -- -$group && "
               "sleep 3 && kill -CONT -- -$group")
    run = watched.finish(timeout=300)
    accept = accept_json(out)["tfsdeploy"]["accept"]
    print(figures("stalled generator", accept))
    assert run.code == 5, run.describe()
    assert accept["verdict"] == "inconclusive: load generation failed", run.describe()
    gens = {g["name"]: g for g in accept["generators"]}
    assert {n: g["status"] for n, g in gens.items()} == {"tb1": "ok", "tb2": "ok"}
    assert all(g["count"] == 1500 for g in gens.values()), gens  # 50 QPS x 30 s each
    assert any(w.startswith("tb2 could not hold its share") for w in accept["warnings"]), \
        accept["warnings"]
    # the stalled seconds: P99 over the SLO by less than tb2's own lag (about 3 s)
    rows = {r["row"]: r for r in accept["rows"]}
    assert rows["throughput"]["passed"] and rows["error rate"]["passed"], rows
    assert not rows["p99 every 1 s"]["passed"], rows
    # the 3 s stop is the lag's upper limit; 2500 ms: the stop, less a send due in it
    # measured in a full run (2 cores, 4 workers beside it): 3006 ms, margin 1.20x;
    # scripts/test prints it every run
    within("stalled generator's send lag, ms", gens["tb2"]["maxSendLagMs"], at_least=2500,
           detail=gens["tb2"])
    # the SLO, 1000 ms: a P99 over it by more than the lag is the fleet's, not the stall's
    # measured in a full run (2 cores, 4 workers beside it): -1.88 ms,
    # margin inf (measured below 0); scripts/test prints it every run
    within("P99 of the stalled seconds less the send lag, ms",
           rows["p99 every 1 s"]["figure"] - gens["tb2"]["maxSendLagMs"], at_most=1000,
           detail=rows)
    assert run_dirs_left(run_id) == {}


def test_a_release_that_breaks_the_slo_fails_the_release_row(fleet: ModelFleet) -> None:
    out = fleet.tmp / "slow"
    # 60 QPS: 20 per host, which the slow version's two batch threads (a batch of up to 32
    # every 2 x SLOW_SLEEP_MS) serve without filling its queue, so that its gates pass. 60 s:
    # the release (two serial steps, each a load and five gates) must end inside the window;
    # on a busy 2-core machine it took 62 s with ten warmup records per load, about
    # 20 s of them replaying the records through the slow signature (now one record)
    run = fleet.fab("accept", "--target-qps", "60", "--duration", "60s", "--release",
                    str(SLOW_VERSION), "--release-at", "5s", "--loadgens", "loadgens",
                    "--start-margin", "8s", "--out", str(out), timeout=600)
    accept = accept_json(out)["tfsdeploy"]["accept"]
    print(figures("slow release", accept))
    release_row = accept["rows"][3]
    assert release_row["row"] == f"p99 during release v{SLOW_VERSION}"
    assert accept["release"]["exitCode"] == 0, run.describe()  # the deploy let it through
    assert not release_row["passed"], run.describe()
    # the slow version's own latency (the model's designed floor) puts it over the SLO
    # measured in a full run (2 cores, 4 workers beside it): 2048 ms, margin 8.19x;
    # scripts/test prints it every run
    within("P99 during the slow release, ms", release_row["figure"], above=SLO_MS,
           detail=run.describe())
    # the fleet failed, whatever the generators' own lag: exit 2
    assert run.code == 2, run.describe()
    assert accept["verdict"] == "fail", run.describe()

