"""`fab diagnose`'s decision (core/tuning/bottleneck.py): one case per limit of TFServing's request
path, each with the figures it shows and its fix."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from tfsdeploy.core.inventory.catalog import Batching, Threads
from tfsdeploy.core.tuning.bottleneck import Evidence, diagnose
from tfsdeploy.core.tuning.stages import StageWindow
from tfsdeploy.loadtest.hostcpu import CpuTicks, busy_share, parse_proc_stat

BATCHING = Batching(max_batch_size=32, batch_timeout_micros=2000, max_enqueued_batches=16,
                    num_batch_threads=2, allowed_batch_sizes=(8, 16, 32))


def _stages(**changes: Any) -> StageWindow:
    base = StageWindow(requests_ok=3000, request_ms=10.0, runtime_ms=3.0, queue_ms=2.0,
                       mean_batch=20.0, batches=150, statuses={"OK": 3000})
    return replace(base, **changes)


def _evidence(**changes: Any) -> Evidence:
    base = Evidence(host="h1", window_s=30.0, stages=_stages(), batching=BATCHING,
                    threads=Threads(intra_op=4, inter_op=4, grpc_max_threads=64), slo_ms=50.0,
                    host_cpus=8, cpu_user_s=30.0, cpu_system_s=6.0, max_in_flight=10)
    return replace(base, **changes)


def test_an_instance_with_room_everywhere_is_limited_by_nothing() -> None:
    found = diagnose(_evidence())
    assert found.stage == "none"
    assert "100.0 requests/s answered over 30 s" in found.figures
    assert "CPU 1.20 of 8 cores (user 30.0 s, sys 6.0 s)" in found.figures


def test_no_traffic_is_said_so() -> None:
    found = diagnose(_evidence(stages=_stages(requests_ok=0, statuses={})))
    assert found.stage == "no_traffic"


def test_requests_in_flight_at_the_grpc_quota() -> None:
    found = diagnose(_evidence(threads=Threads(grpc_max_threads=4), max_in_flight=3))
    assert found.stage == "grpc_threads"
    assert "3 requests in flight reached the 3 the quota of 4 holds" in found.summary
    assert found.fix.startswith("raise grpc_max_threads to at least 8")


def test_the_grpc_default_quota_is_four_per_cpu() -> None:
    default = Threads(grpc_max_threads=0)
    assert diagnose(_evidence(threads=default, max_in_flight=31)).stage == "grpc_threads"
    assert diagnose(_evidence(threads=default, max_in_flight=30)).stage == "none"


def test_a_full_batch_queue() -> None:
    found = diagnose(_evidence(stages=_stages(statuses={"OK": 3000, "UNAVAILABLE": 40})))
    assert found.stage == "batch_queue"
    assert "queue of 16 batches was full 40 times" in found.summary
    assert "40 requests refused with the batch queue full" in found.figures


def test_a_batch_timeout_close_to_the_slo_leaves_batches_half_empty() -> None:
    slow = replace(BATCHING, batch_timeout_micros=16000)
    found = diagnose(_evidence(batching=slow, stages=_stages(
        request_ms=18.0, queue_ms=16.0, runtime_ms=1.0, mean_batch=2.0)))
    assert found.stage == "batch_timeout"
    assert "close on the 16 ms timeout half-empty (2.0 of 32)" in found.summary
    assert "batch queueing 16.00 ms mean (89% of the latency)" in found.figures
    assert found.fix.startswith("lower batch_timeout_micros (now 16000)")


def test_full_batches_waiting_for_batch_threads() -> None:
    found = diagnose(_evidence(stages=_stages(request_ms=20.0, queue_ms=14.0,
                                              mean_batch=30.0)))
    assert found.stage == "batch_threads"
    assert "wait for one of 2 batch thread(s)" in found.summary
    assert "raise num_batch_threads (now 2)" in found.fix


def test_an_intra_op_pool_of_one() -> None:
    found = diagnose(_evidence(threads=Threads(intra_op=1, inter_op=4), stages=_stages(
        request_ms=10.0, runtime_ms=8.0, queue_ms=1.0), cpu_user_s=27.0, cpu_system_s=1.0))
    assert found.stage == "intra_op"
    assert "uses 0.93 cores, what an intra-op pool of 1 can run, of 8" in found.summary
    assert "raise threads.intra_op (now 1)" in found.fix


def test_an_intra_op_pool_of_one_on_a_busy_host_as_measured() -> None:
    # resnet50, intra_op=1, one request in flight, the host's other core busy elsewhere
    found = diagnose(_evidence(window_s=8.04, host_cpus=2, threads=Threads(
        intra_op=1, inter_op=4), stages=_stages(requests_ok=70, request_ms=109.81,
        runtime_ms=109.21, queue_ms=1.28, mean_batch=1.0, batches=70, statuses={"OK": 70}),
        cpu_user_s=6.2, cpu_system_s=0.2, max_in_flight=1))
    assert found.stage == "intra_op", found
    assert "uses 0.80 cores, what an intra-op pool of 1 can run, of 2" in found.summary


def test_a_pool_using_well_under_its_threads_is_not_the_limit() -> None:
    # an intra-op pool of 2 on 8 CPUs, Session::Run most of the latency, 0.70 cores used:
    # 0.35 of what the pool can run
    found = diagnose(_evidence(threads=Threads(intra_op=2, inter_op=4),
                               stages=_stages(request_ms=10.0, runtime_ms=8.0, queue_ms=1.0),
                               cpu_user_s=20.0, cpu_system_s=1.0))
    assert found.stage != "intra_op", found


def test_an_inter_op_pool_below_the_batch_threads() -> None:
    found = diagnose(_evidence(threads=Threads(intra_op=0, inter_op=1), stages=_stages(
        request_ms=10.0, runtime_ms=8.0, queue_ms=1.0), cpu_user_s=40.0, cpu_system_s=2.0))
    assert found.stage == "inter_op"
    assert "1 inter-op thread(s) run the ops of the 2 concurrent batch(es)" in found.summary


def test_a_host_whose_cpus_are_full_needs_more_instances() -> None:
    found = diagnose(_evidence(stages=_stages(request_ms=20.0, runtime_ms=15.0, queue_ms=14.0,
                                              mean_batch=30.0),
                               cpu_user_s=200.0, cpu_system_s=20.0))
    assert found.stage == "instances"
    assert "uses 7.33 of the host's 8 cores" in found.summary
    assert "fab plan-capacity" in found.fix


def test_a_high_kernel_share_is_noted() -> None:
    found = diagnose(_evidence(cpu_user_s=10.0, cpu_system_s=10.0))
    assert found.notes and "50% of the CPU time is the kernel's" in found.notes[0]


@pytest.mark.parametrize("stage", ["grpc_threads", "batch_queue"])
def test_refusals_come_before_latency_shares(stage: str) -> None:
    # both a full quota and a full queue and a slow timeout: the refusals are named first
    evidence = _evidence(batching=replace(BATCHING, batch_timeout_micros=16000),
                         stages=_stages(queue_ms=9.0, mean_batch=2.0,
                                        statuses={"OK": 3000, "UNAVAILABLE": 5}),
                         max_in_flight=63 if stage == "grpc_threads" else 10)
    assert diagnose(evidence).stage == stage


def test_the_live_releases_own_files_give_its_settings() -> None:
    from tfsdeploy.core.render.files import BATCHING_CONFIG, FLAGS, render_fleet
    from tfsdeploy.core.tuning.bottleneck import release_config

    from .helpers import inventory, model

    m = model(threads=Threads(intra_op=1, inter_op=3, grpc_max_threads=40))
    inv = inventory(models=[m])
    render = render_fleet(inv, m, 3, inv.select("h1"))[0]
    files = {f.name: f.text for f in render.files}
    batching, threads = release_config(files)
    assert batching == replace(m.batching, enabled=True)
    assert (threads.intra_op, threads.inter_op, threads.grpc_max_threads) == (1, 3, 40)
    off = dict(files, **{FLAGS: files[FLAGS].replace("--enable_batching=true", "")})
    assert release_config(off)[0].enabled is False
    assert release_config({FLAGS: files[FLAGS], BATCHING_CONFIG: "{json"})[0].enabled is False


def test_a_pool_of_one_starved_by_other_processes_is_not_judged() -> None:
    # the measured case above with a CPU hog beside it: the instance got 0.60 cores, the
    # host's CPUs were 98% busy; its pool of one cannot be told from the hog's share
    starved = dict(window_s=8.1, host_cpus=2, threads=Threads(intra_op=1, inter_op=4),
                   stages=_stages(requests_ok=101, request_ms=74.4, runtime_ms=70.0,
                                  queue_ms=1.37, mean_batch=1.0, batches=101,
                                  statuses={"OK": 101}),
                   cpu_user_s=4.6, cpu_system_s=0.26, max_in_flight=1)
    found = diagnose(_evidence(**starved, host_busy=0.98))
    assert found.stage == "host_cpu", found
    assert "the host's CPUs were 98% busy, 1.36 of its 2 cores used by other processes " \
           "and 0.60 by this instance" in found.summary
    assert "host CPUs 98% busy: other processes 1.36 cores" in found.figures
    # the same on a host with room: nothing limits it, and the host's share is said
    quiet = diagnose(_evidence(**starved, host_busy=0.31))
    assert quiet.stage == "none"
    assert quiet.summary.endswith("has CPU to spare (the host's CPUs 31% busy)")
    # not measured: as before
    assert diagnose(_evidence(**starved)).stage == "none"


def test_a_full_pool_is_named_on_a_busy_host_too() -> None:
    # 0.80 cores for a pool of one while the other core ran other work: the pool is the limit
    found = diagnose(_evidence(window_s=8.04, host_cpus=2, threads=Threads(
        intra_op=1, inter_op=4), stages=_stages(requests_ok=70, request_ms=109.81,
        runtime_ms=109.21, queue_ms=1.28, mean_batch=1.0, batches=70, statuses={"OK": 70}),
        cpu_user_s=6.2, cpu_system_s=0.2, max_in_flight=1, host_busy=0.97))
    assert found.stage == "intra_op", found


def test_proc_stat_gives_the_busy_share() -> None:
    # the reader `fab diagnose` shares with the load generator (loadtest/hostcpu.py)
    before = parse_proc_stat("cpu  100 20 30 800 50 0 5 0 0 0\ncpu0 1 2 3 4 5 6 7 8 9 0\n")
    after = parse_proc_stat("cpu  250 20 80 850 50 0 5 0 0 0\n")
    assert before == CpuTicks(busy=155, total=1005) and after == CpuTicks(busy=355, total=1255)
    assert busy_share(before, after) == 0.8
    assert parse_proc_stat("intr 1 2 3\n") is None
    assert busy_share(after, before) is None
