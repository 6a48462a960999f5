"""`fab tune` on the local fleet: trials of ``ittune`` on tb1 beside its live release, which
serves its clients with no failed request meanwhile; tune.json's shape and the recommendation
rule, the PNG, the Python written by --write, the inventory untouched and no scratch instance
left, also after Ctrl-C. The figures themselves are the shared machine's and noisy: only the
behaviour is asserted (benchmarks/bench_tune.py prints the figures).

Model ``ittune`` (port offset 4700) on tb1; its scratch instances listen above 14000.
"""

from __future__ import annotations

import json
import signal
import time
from collections.abc import Iterator

import pytest
from deploy_support import GOOD, Fleet, Traffic, fleet_fixture
from testbed_support import ADDRESSES, Watched, ssh

pytestmark = [pytest.mark.testbed]

MODEL, OFFSET = "ittune", 4700
HOSTS = {"tb1": ADDRESSES["tb1"]}
# an SLO of 200 ms, loose enough for this shared, loaded machine to meet it at some rate (the
# test asserts the behaviour, not the figures), and a batch timeout of 16 ms: under light
# traffic every batch closes on it half-empty, the limit `fab diagnose` must name
SLO_MS = 200
CATALOG = {"max_batch_size": 32, "batch_timeout_micros": 16000, "num_batch_threads": 2}


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    for made in fleet_fixture(tmp_path_factory, MODEL, OFFSET, {1: GOOD[1]},
                              serial=("100%",), hosts=HOSTS):
        text = made.inventory.read_text()
        assert "batch_timeout_micros=2000," in text and "latency_slo_ms=50," in text
        made.inventory.write_text(text.replace("batch_timeout_micros=2000,",
                                               "batch_timeout_micros=16000,")
                                  .replace("latency_slo_ms=50,", f"latency_slo_ms={SLO_MS},"))
        made.deploy(1)
        yield made


def scratch_left(host: str = "tb1") -> list[str]:
    listed = ssh(host, f"docker ps -aq --filter label=tfsdeploy.tune={MODEL}; "
                       f"ls -A /srv/tfsdeploy/{MODEL}/tune 2>/dev/null", check=False)
    return listed.stdout.split()


def test_tune_measures_beside_the_live_release_and_recommends(fleet: Fleet) -> None:
    before = fleet.inventory.read_text()
    serving = fleet.containers("tb1")
    out, pasted = fleet.tmp / "tuned", fleet.tmp / "tuned.py"
    with Traffic(fleet, "tb1") as client:
        # a trial takes 10-15 s here alone and up to 50 s beside the other fleet tests: two
        # trials exactly (--trials), whatever the machine's speed; the budget only bounds them
        run = fleet.fab("tune", "--host", "tb1", "--budget", "4m", "--trials", "2",
                        "--step", "1s", "--out", str(out), "--write", str(pasted),
                        timeout=360)
    assert run.code == 0, run.describe()
    assert not client.failures, client.failures[:5]
    assert client.ok > 20, client.ok
    assert "warning: the trials share tb1's CPUs and GPU" in run.out, run.out

    data = json.loads((out / "tune.json").read_text())
    trials = data["trials"]
    assert len(trials) == 2, trials  # the catalog's and one candidate
    assert data["ended"] == "trials: 2 of at most 2 run", data["ended"]
    assert {k: trials[0]["batching"][k] for k in CATALOG} == CATALOG
    assert trials[0]["threads"]["intra_op"] == 1 and trials[0]["threads"]["inter_op"] == 2
    for trial in trials:
        assert {"batching", "threads", "qps", "p99_ms", "meets_slo"} <= set(trial), trial
        assert trial["batching"]["batch_timeout_micros"] <= SLO_MS * 1000 // 3
        sizes = trial["batching"]["allowed_batch_sizes"]
        assert sizes[-1] == trial["batching"]["max_batch_size"], trial
        if trial["meets_slo"]:
            assert trial["p99_ms"] <= data["slo_p99_ms"] and trial["qps"] > 0, trial
            assert trial["mean_batch_size"] is not None, trial  # TFServing's own histogram
            assert trial["cpu_cores"] is not None and trial["cpu_cores"] > 0, trial
    index = data["recommended"]
    assert index is not None and trials[index]["meets_slo"], data
    best = max(t["qps"] for t in trials if t["meets_slo"])
    if index == 0:
        assert best <= trials[0]["qps"] * 1.05 or not trials[0]["meets_slo"], data
    else:
        assert trials[index]["qps"] == best and trials[index]["qps"] > trials[0]["qps"], data
    assert (out / "tune.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"

    from tfsdeploy.core.inventory.catalog import Batching, Threads
    pasted_text = pasted.read_text()
    chosen = eval(f"dict({pasted_text.split(chr(10), 1)[1]})",
                  {"Batching": Batching, "Threads": Threads})
    assert chosen["batching"].max_batch_size == trials[index]["batching"]["max_batch_size"]

    assert fleet.inventory.read_text() == before
    assert scratch_left() == []
    assert [c["id"] for c in fleet.containers("tb1")] == [c["id"] for c in serving]
    fleet.assert_serving(1)


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_a_stop_signal_removes_the_scratch_instance(fleet: Fleet, sig: signal.Signals) -> None:
    proc = Watched(fleet.argv("tune", "--host", "tb1", "--budget", "5m", "--step", "1s",
                                 "--out", str(fleet.tmp / "stopped")), [])
    proc.wait_for(r"trial 0: batch", timeout=60)
    deadline = time.monotonic() + 60
    while not scratch_left() and time.monotonic() < deadline:  # its scratch instance runs
        time.sleep(0.5)
    assert scratch_left(), proc.text()
    proc.send(sig)
    run = proc.finish(timeout=120)
    assert run.code == 2, run.describe()
    assert f"{sig.name}: stop" in run.out, run.describe()
    assert scratch_left() == []
    fleet.assert_serving(1)


def test_diagnose_names_the_batch_timeout_that_leaves_batches_half_empty(fleet: Fleet) -> None:
    with Traffic(fleet, "tb1") as client:
        run = fleet.fab("diagnose", "--for", "5s", "--json", timeout=120)
    assert run.code == 0, run.describe()
    assert not client.failures, client.failures[:5]
    (row,) = json.loads(run.stdout)
    found = row["diagnosis"]
    assert row["host"] == "tb1" and found["stage"] == "batch_timeout", found
    assert "close on the 16 ms timeout half-empty" in found["summary"], found
    assert any(f.startswith("batch queueing ") for f in found["figures"]), found
    assert any(f.startswith("CPU ") and "user" in f for f in found["figures"]), found
    assert found["fix"].startswith("lower batch_timeout_micros (now 16000)"), found


def test_diagnose_names_a_grpc_quota_too_small_for_the_load(fleet: Fleet) -> None:
    # a quota of 4 holds 3 requests at once (one thread polls); the catalog allows it for an
    # expected concurrency of 2, and a load of 16 in flight then meets it
    text = fleet.inventory.read_text()
    assert "grpc_max_threads=256)," in text
    small = fleet.tmp / "inventory_quota.py"
    small.write_text(text.replace("grpc_max_threads=256),", "grpc_max_threads=4),")
                     .replace("port_offset=", "expected_concurrency=2, port_offset="))
    fleet.deploy(1, inventory=small)
    # the load lasts until the diagnosis has read its 5 s, then Ctrl-C ends it: a 12 s bench
    # once ended before a diagnosis that took 25 s to start reading on a busy machine, which
    # then saw no load and rightly named no stage
    load = Watched(fleet.argv("bench", "--concurrency", "16", "--duration", "180s",
                              inventory=small), [])
    try:
        load.wait_for(r"request data", timeout=60)
        run = fleet.fab("diagnose", "--for", "5s", "--json", inventory=small, timeout=120)
    finally:
        load.send(signal.SIGINT)
        load.finish(timeout=120)
    assert run.code == 0, run.describe()
    found = json.loads(run.stdout)[0]["diagnosis"]
    assert found["stage"] == "grpc_threads", found
    assert "reached the 3 the quota of 4 holds" in found["summary"], found
    assert found["fix"].startswith("raise grpc_max_threads to at least "), found
    assert any("the gRPC quota 4 holds 3" in f for f in found["figures"]), found
