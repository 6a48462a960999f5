"""The GPU's truth, pure: nvidia-smi's answers parsed (on a real H200's own output), each
process's holding mapped to its container by host pid, a holding judged against its planned
pool, and the host-wide window reservations judged in the host's order."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

from tfsdeploy.core.gpu.holding import Holding, card_of, held_by, parse_ancestry
from tfsdeploy.core.gpu.records import (
    OverheadRecord,
    WindowReservation,
    live_reservations,
    measured_overhead,
)
from tfsdeploy.core.gpu.smi import GpuApp, GpuCard, parse_apps, parse_gpus
from tfsdeploy.core.gpu.window import Earlier, admit
from tfsdeploy.core.inventory.fleet import Gpu
from tfsdeploy.core.inventory.gpu import plan_instances, pool_mib
from tfsdeploy.hosts.commands.gpu import forget_model

from .helpers import inventory, model

H200 = Path(__file__).resolve().parents[1] / "fixtures" / "nvidia-smi" / "h200"


def fixture(name: str) -> str:
    return (H200 / name).read_text()


# -- nvidia-smi, as a real H200 answered ------------------------------------------------------

def test_the_reserved_query_gives_what_cuda_can_allocate() -> None:
    (card,) = parse_gpus(fixture("nvidia-smi-query-gpu-reserved.csv"))
    assert (card.index, card.total_mib, card.reserved_mib, card.used_mib, card.free_mib) == (
        0, 143771, 616, 0, 143156)
    # cuMemGetInfo's total, measured beside these files: 143,155.9 MiB
    assert card.cuda_mib == 143155
    assert card.available_mib == 143156


def test_without_memory_reserved_the_reserve_is_what_total_used_and_free_leave() -> None:
    (card,) = parse_gpus(fixture("nvidia-smi-query-gpu-full.csv"))
    assert card.uuid == "GPU-aabb59c4-b036-6b88-72b1-ac491fab8292"
    assert card.reserved_mib is None
    # -q says Reserved 616 MiB; total - used - free is one MiB less (each figure is rounded)
    reported = int(re.search(r"Reserved\s+:\s+(\d+) MiB", fixture(
        "nvidia-smi-q-d-MEMORY.txt")).group(1))  # type: ignore[union-attr]
    assert reported == 616
    assert card.driver_reserve_mib == 615
    assert card.cuda_mib == 143156


def test_the_legacy_query_without_header_or_units() -> None:
    (card,) = parse_gpus(fixture("nvidia-smi-query-gpu-index-total-used.csv"))
    assert (card.index, card.total_mib, card.used_mib, card.free_mib) == (0, 143771, 0, None)
    assert card.cuda_mib == 143771  # nothing says what is reserved: the whole total


def test_what_is_no_finite_number_is_no_card_or_figure() -> None:
    """A host's nvidia-smi output is not trusted: ``inf`` (found by
    tests/property/test_host_records.py), ``nan`` or ``1e999`` where a number stands is no
    figure, never an OverflowError that stops the run."""
    assert parse_gpus("INF") == ()
    assert parse_gpus("0, nan, 0") == ()
    assert parse_gpus("0, 1e999, 0") == ()
    (card,) = parse_gpus("0, 16384, inf")
    assert (card.total_mib, card.used_mib) == (16384, 0)
    assert parse_apps("inf, 10\n7, -inf") == (GpuApp(pid=7, used_mib=None, gpu_uuid=""),)


def test_compute_apps_name_the_host_pid_and_its_holding() -> None:
    apps = parse_apps(fixture("compute-apps-one-torch-process.csv"))
    assert apps == (GpuApp(pid=462, used_mib=930, gpu_uuid=""),)
    cards = parse_gpus(fixture("nvidia-smi-query-gpu-full.csv"))
    assert card_of(apps[0], cards) == 0  # one card: the process is on it


def test_values_nvidia_smi_cannot_give_and_its_errors_are_not_taken_for_cards() -> None:
    assert parse_apps("7, [N/A], GPU-x\n8, [Not Supported], GPU-x\n") == (
        GpuApp(7, None, "GPU-x"), GpuApp(8, None, "GPU-x"))
    assert parse_gpus('Field "memory.reserved" is not a valid field to query.\n') == ()
    assert parse_gpus("") == ()
    two = parse_gpus("index, uuid, memory.total [MiB], memory.used [MiB], memory.free [MiB]\n"
                     "0, GPU-a, 16384, 1000, 15384\n1, GPU-b, 16384, 0, 16000\n")
    assert [(c.index, c.driver_reserve_mib) for c in two] == [(0, 0), (1, 384)]


# -- a container's processes, by host pid ------------------------------------------------------

CARDS = (GpuCard(0, 16384, 9000, 7384, 0, "GPU-a"), GpuCard(1, 16384, 3000, 13384, 0, "GPU-b"))


def test_a_process_belongs_to_the_container_whose_main_pid_is_among_its_ancestors() -> None:
    ancestry = parse_ancestry("5001 5000 900 1\n6001 6000 900 1\n7001 1\nnot a pid\n")
    apps = (GpuApp(5001, 4000, "GPU-a"), GpuApp(6001, 5000, "GPU-a"),
            GpuApp(6001, 3000, "GPU-b"), GpuApp(7001, 500, "GPU-a"))
    assert held_by(5000, apps, ancestry, CARDS) == {0: 4000}  # its child holds the GPU
    assert held_by(6001, apps, ancestry, CARDS) == {0: 5000, 1: 3000}  # itself, two GPUs
    assert held_by(900, apps, ancestry, CARDS) == {0: 9000, 1: 3000}  # dockerd's shim: both
    assert held_by(4242, apps, ancestry, CARDS) == {}  # not on a GPU
    assert held_by(0, apps, ancestry, CARDS) == {}  # a container that does not run


def test_a_holding_short_of_its_pool_is_a_cut_pool() -> None:
    planned = pool_mib(0.3, 16384)
    assert planned == 4915
    healthy = Holding(gpu=0, planned_mib=planned, held_mib=planned + 256)
    assert not healthy.short and healthy.beside_pool_mib == 256
    cut = Holding(gpu=0, planned_mib=planned, held_mib=int(planned * 0.729) + 256)
    assert cut.short and cut.beside_pool_mib == 0


def test_a_warm_process_is_judged_against_what_its_model_held_beside_the_pool_before() -> None:
    # an H200 pool of 0.038 x 143155 = 5439 MiB, 626 MiB beside it: one 0.9 step leaves
    # 4895 + 626 = 5521 MiB held, more than the pool itself
    planned = pool_mib(0.038, 143155)
    one_step = int(planned * 0.9) + 626
    assert one_step > planned
    assert not Holding(0, planned, one_step).short  # nothing known before: not seen
    cut = Holding(0, planned, one_step, before_mib=626)
    assert cut.slack_mib == planned // 20 == 271
    assert cut.expected_mib == planned + 626 - 271 and cut.short
    # a whole pool with somewhat less beside it than last time (other kernels loaded) is fine
    assert not Holding(0, planned, planned + 626 - 200, before_mib=626).short
    # a small pool: the slack is at least 128 MiB
    assert Holding(0, 622, 750, before_mib=256).expected_mib == 750


# -- the plan: fractions of what CUDA can allocate ----------------------------------------------

def test_the_plan_sizes_fractions_against_memory_total_less_reserved() -> None:
    m = model(memory_mib=20000)
    inv = inventory(models=[m])
    host = inv.select("h1")[0]
    h200 = type(host)(name=host.name, address=host.address,
                      gpus=(Gpu(0, 143771, "NVIDIA H200", reserved_mib=616),), groups=(),
                      vars=host.vars)
    plan = plan_instances(h200, m)[0].plan
    assert plan is not None
    assert (plan.gpu_memory_mib, plan.total_mib, plan.reserved_mib) == (143155, 143771, 616)
    assert plan.fraction == 0.168  # ceil(24000 / 143155, 3 places); of 143771 it is 0.167
    assert plan.pool_mib == int(0.168 * 143155)
    arithmetic = plan.arithmetic()
    assert arithmetic.startswith("CUDA total 143155 MiB = 143771 MiB (nvidia-smi memory.total) "
                                 "- 616 MiB (memory.reserved); fraction = ceil(20000 MiB x "
                                 "1.2 / 143155 MiB, 3 places) = 0.168, pool 24050 MiB")
    assert "2 x 1024 MiB beside each pool / 143155 MiB" in arithmetic


# -- the host's records --------------------------------------------------------------------

def _reservation(model_name: str, token: str, need: int, **more: object) -> WindowReservation:
    return WindowReservation(model=model_name, release="20260101-000000-v1", lock_token=token,
                             who="alice@deploy1", started="2026-01-01T00:00:00+00:00",
                             need_mib={0: need}, containers=(f"tfs-{model_name}-x",), **more)


def test_a_reservation_lives_while_its_run_holds_its_models_lock() -> None:
    a = _reservation("a", "aaaa1111", 5000).to_json().decode()
    b = _reservation("b", "bbbb2222", 5000).to_json().decode()
    c = _reservation("c", "cccc3333", 5000).to_json().decode()
    live = live_reservations([
        ("000000000002.a.0.json", a, '{"token": "aaaa1111"}'),
        ("000000000001.b.0.json", b, '{"token": "another0"}'),  # its run ended; another holds
        ("000000000003.c.0.json", c, ""),  # no lock at all: its run is over
        ("000000000004.d.0.json", "{trunc", '{"token": "x"}'),
    ])
    assert [(r.model, r.seq) for r in live] == [("a", 2)]


def test_an_earlier_window_is_counted_for_what_it_has_not_taken_yet() -> None:
    first = _reservation("a", "aaaa1111", 6000, seq=1)
    # nothing of a's new process holds memory yet: its 6000 MiB are still to come
    refusal = admit({0: 5000}, {0: 10000}, [Earlier(first, {})])
    assert refusal is not None and refusal.holders == (first,)
    text = refusal.text()
    assert ("GPU 0: the window needs 5000 MiB; 10000 MiB free, of which 6000 MiB are reserved "
            "for other runs' windows that have not taken them yet; other runs' windows open on "
            "this GPU: a release") in text
    assert "a release 20260101-000000-v1 (instance 0; by alice@deploy1" in text
    # once it holds 5800 of them (in nvidia-smi's used memory now), 200 are still to come
    assert admit({0: 5000}, {0: 5300}, [Earlier(first, {0: 5800})]) is None
    assert admit({0: 5000}, {0: 5100}, [Earlier(first, {0: 5800})]) is not None
    # what the run frees before its start counts
    assert admit({0: 5000}, {0: 4000}, [], {0: 1000}) is None
    assert admit({0: 5000}, {0: 4000}, []) is not None


def test_the_largest_overhead_measured_on_a_card_is_the_one_planned_with() -> None:
    records = [OverheadRecord(gpu=0, model=m, release="r", pool_mib=1000, held_mib=1000 + o,
                              overhead_mib=o, at="t") for m, o in (("a", 626), ("b", 939))]
    records.append(OverheadRecord(gpu=1, model="a", release="r", pool_mib=1, held_mib=2000,
                                  overhead_mib=1999, at="t"))
    found = measured_overhead(records, 0)
    assert found is not None and (found.model, found.overhead_mib) == ("b", 939)
    assert measured_overhead(records, 7) is None


@pytest.mark.parametrize("name", ["nvidia-smi-query-gpu-full.csv",
                                  "nvidia-smi-query-gpu-reserved.csv"])
def test_the_inventory_card_of_the_h200(name: str) -> None:
    (card,) = parse_gpus(fixture(name))
    declared = Gpu(0, card.total_mib, "NVIDIA H200", reserved_mib=616)
    assert abs(declared.cuda_mib - card.cuda_mib) <= 1


def test_a_retired_model_leaves_no_gpu_record_and_another_models_stay(tmp_path: Path) -> None:
    for name in ("overhead/0.a.json", "overhead/1.a.json", "overhead/0.b.a.json",
                 "reservations/000000000001.a.0.json", "reservations/000000000002.b.a.0.json",
                 "reservations/000000000003.a.b.1.json"):
        (tmp_path / name).parent.mkdir(exist_ok=True)
        (tmp_path / name).write_text("{}")
    subprocess.run(forget_model(str(tmp_path), "a"), check=True)
    assert sorted(str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*.json")) == [
        "overhead/0.b.a.json", "reservations/000000000002.b.a.0.json",
        "reservations/000000000003.a.b.1.json"]
