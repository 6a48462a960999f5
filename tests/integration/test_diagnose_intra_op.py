"""`fab diagnose` names an intra-op pool of 1 on a live resnet50 instance: the testbed's
resnet50 (inventory/testbed.py's catalog entry, pushed over SSH) as ``itintra`` on tb1 with
``Threads(intra_op=1)``, under `fab bench` load of one request at a time. Session::Run then
takes most of each request's time on the one thread the pool has, and the process uses about
one core of the host's two: the limit `fab diagnose` must name, with the fix to raise it.

half_plus_two cannot show it (its graph is two ops; its time is gRPC's), so this module pays for
one resnet50 deploy. It judges a pool by the cores it keeps busy, so it runs alone (quiet).

Model ``itintra`` (port offset 4800) on tb1.
"""

from __future__ import annotations

import json
import signal
from collections.abc import Iterator

import pytest
from deploy_support import assert_ports_free
from testbed_support import (
    ADDRESSES,
    MODELS,
    ModelFleet,
    Watched,
    clean_model,
    ensure_fleet,
    resnet50_inventory,
)

pytestmark = [pytest.mark.testbed, pytest.mark.quiet]

MODEL, OFFSET, HOST = "itintra", 4800, "tb1"
HOSTS = {HOST: ADDRESSES[HOST]}
# one intra-op thread; a 1 ms batch timeout, so that a request waits for its batch far less
# than it runs (the batch-timeout rule comes first and would name a 20 ms wait on a lone request)
THREADS = "Threads(intra_op=1, inter_op=2, grpc_max_threads=256)"


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ModelFleet]:
    ensure_fleet()
    clean_model(MODEL, HOSTS)
    assert_ports_free(OFFSET, HOSTS)
    tmp = tmp_path_factory.mktemp(MODEL)
    made = ModelFleet(model=MODEL, offset=OFFSET, tmp=tmp, source=MODELS / "resnet50",
                      inventory=resnet50_inventory(tmp / "inventory.py", model=MODEL,
                                                   host=HOST, offset=OFFSET, threads=THREADS,
                                                   batch_timeout_micros=1000),
                      hosts=HOSTS)
    try:
        deployed = made.fab("deploy", "--version", "1", timeout=900)
        assert deployed.code == 0, deployed.describe()
        yield made
    finally:
        clean_model(MODEL, HOSTS)


def test_diagnose_names_an_intra_op_pool_of_one(fleet: ModelFleet) -> None:
    # the load lasts until the diagnosis has read its 8 s, then Ctrl-C ends it (a bench of a
    # fixed length can end before a slow-starting diagnosis reads anything)
    load = Watched(fleet.argv("bench", "--hosts", HOST, "--concurrency", "1", "--duration",
                              "180s"), fleet.log)
    try:
        load.wait_for(r"request data", timeout=120)
        run = fleet.fab("diagnose", "--for", "8s", "--json", timeout=120)
    finally:
        load.send(signal.SIGINT)
        load.finish(timeout=180)
    assert run.code == 0, run.describe()
    (row,) = json.loads(run.stdout)
    found = row["diagnosis"]
    print(f"\n{HOST} {MODEL} intra_op=1: {found['summary']}; {found['figures']}")
    assert row["host"] == HOST and found["stage"] == "intra_op", found
    assert "what an intra-op pool of 1 can run, of 2" in found["summary"], found
    assert found["fix"].startswith("raise threads.intra_op (now 1) towards 2"), found
    assert any(f.startswith("Session::Run ") for f in found["figures"]), found
