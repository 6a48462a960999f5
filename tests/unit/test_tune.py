"""`fab tune`'s search (core/tuning/search.py): candidates within the toolkit's rules, a direction
pruned at its first step that does not gain, the budget, the catalog's configuration always
measured first, the recommendation rule and the rate ramp."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

import pytest

from tfsdeploy.core.errors import Problem
from tfsdeploy.core.inventory.catalog import Batching, Model, Threads
from tfsdeploy.core.inventory.gpu import plan_instances
from tfsdeploy.core.inventory.layout import assigned_ports, model_ports
from tfsdeploy.core.tuning.search import (
    Config,
    Dimension,
    Ramp,
    RatePoint,
    Trial,
    better,
    config_problems,
    dimensions,
    recommend,
    scratch_gpu_problem,
    scratch_ports,
    search,
    step_fits,
)
from tfsdeploy.core.tuning.stages import parse_totals, stage_window

from .helpers import inventory, model

SLO_MS = 60.0  # helpers.model's: a batch timeout of at most 20000 us


def _trial(config: Config, qps: float, *, meets: bool = True, seconds: float = 10.0) -> Trial:
    return Trial(config=config, qps=qps, p50_ms=1.0, p95_ms=2.0, p99_ms=3.0, meets_slo=meets,
                 seconds=seconds)


def _measure(curve: Callable[[Config], float], made: list[Config],
             seconds: float = 10.0) -> Callable[[Config], Trial]:
    def measure(config: Config) -> Trial:
        made.append(config)
        return _trial(config, curve(config), seconds=seconds)
    return measure


def _no_problems(config: Config) -> list[Problem]:
    return []


def _rules(m: Model) -> Callable[[Config], list[Problem]]:
    inv = inventory(models=[m])
    host = inv.select("h1")[0]
    return lambda c: config_problems(m, host, 3, c, inventory_file="inv.py")


def _batch_dim(values: tuple[int, ...] = (1, 2, 4, 8, 16, 32, 64)) -> Dimension:
    return Dimension("max_batch_size", values)


def test_the_catalog_configuration_is_always_the_first_trial_even_without_budget() -> None:
    current = Config.of(model())
    made: list[Config] = []
    course = search(current, [_batch_dim()], measure=_measure(lambda c: 100.0, made),
                    problems=_no_problems, budget_s=0.0, estimate_s=10.0)
    assert made == [current]
    assert [t.config for t in course.trials] == [current]
    assert course.ended.startswith("budget: 10 s of 0 s spent")


def test_a_direction_stops_at_its_first_step_that_does_not_gain() -> None:
    # QPS peaks at max_batch_size 32: 8 -> 16 -> 32 gain, 64 loses; down is never tried
    peak = {8: 100.0, 16: 150.0, 32: 200.0, 64: 190.0, 128: 500.0, 4: 900.0}
    made: list[Config] = []
    course = search(Config.of(model()), [_batch_dim((1, 2, 4, 8, 16, 32, 64, 128))],
                    measure=_measure(lambda c: peak[c.batching.max_batch_size], made),
                    problems=_no_problems, budget_s=1e9, estimate_s=1.0)
    assert [c.batching.max_batch_size for c in made] == [8, 16, 32, 64]
    assert course.ended == "every direction explored"
    assert recommend(course.trials) == 2


def test_down_is_tried_only_when_up_brought_nothing() -> None:
    curve = {8: 100.0, 16: 90.0, 4: 130.0, 2: 131.0}
    made: list[Config] = []
    search(Config.of(model()), [_batch_dim()],
           measure=_measure(lambda c: curve[c.batching.max_batch_size], made),
           problems=_no_problems, budget_s=1e9, estimate_s=1.0)
    # 2 gains < 5 % over 4: the walk stops there, at 4
    assert [c.batching.max_batch_size for c in made] == [8, 16, 4, 2]


def test_each_dimension_starts_from_the_best_configuration_so_far() -> None:
    def curve(c: Config) -> float:
        return c.batching.max_batch_size * 10 + c.batching.num_batch_threads * 100 \
            if c.batching.max_batch_size <= 16 and c.batching.num_batch_threads <= 2 else 1.0
    made: list[Config] = []
    course = search(Config.of(model()),
                    [_batch_dim(), Dimension("num_batch_threads", (1, 2, 4))],
                    measure=_measure(curve, made), problems=_no_problems, budget_s=1e9,
                    estimate_s=1.0)
    threads_trials = [c for c in made if c.batching.num_batch_threads != 1]
    assert {c.batching.max_batch_size for c in threads_trials} == {16}
    best = course.trials[recommend(course.trials) or 0].config
    assert (best.batching.max_batch_size, best.batching.num_batch_threads) == (16, 2)


def test_the_budget_stops_the_search_before_a_trial_it_cannot_hold() -> None:
    made: list[Config] = []
    course = search(Config.of(model()), [_batch_dim()],
                    measure=_measure(lambda c: float(c.batching.max_batch_size), made,
                                     seconds=30.0),
                    problems=_no_problems, budget_s=100.0, estimate_s=10.0)
    # 3 trials spend 90 s; a 4th (about 30 s, as trials took) would pass 100 s
    assert len(made) == 3
    assert course.spent_s == 90.0
    assert course.ended == "budget: 90 s of 100 s spent, a trial takes about 30 s"


def test_max_trials_stops_the_search_however_much_budget_is_left() -> None:
    made: list[Config] = []
    course = search(Config.of(model()), [_batch_dim()],
                    measure=_measure(lambda c: float(c.batching.max_batch_size), made),
                    problems=_no_problems, budget_s=1e9, estimate_s=1.0, max_trials=2)
    # the curve rises with the batch size: without the cap the walk would go on up
    assert len(made) == 2 and len(course.trials) == 2
    assert course.ended == "trials: 2 of at most 2 run"


def test_the_budget_expects_what_the_trials_took_not_the_first_estimate() -> None:
    made: list[Config] = []
    search(Config.of(model()), [_batch_dim()],
           measure=_measure(lambda c: float(c.batching.max_batch_size), made, seconds=10.0),
           problems=_no_problems, budget_s=40.0, estimate_s=100.0)
    assert len(made) == 4  # 10 s each: the fourth ends at 40 s


def test_a_ramp_step_that_would_end_beyond_the_budget_is_not_taken() -> None:
    assert step_fits(0, now=700.0, deadline=600.0, step_s=5.0)  # a trial's first: a figure
    assert step_fits(3, now=590.0, deadline=600.0, step_s=10.0)  # ends at the deadline
    assert not step_fits(3, now=590.5, deadline=600.0, step_s=10.0)
    assert not step_fits(1, now=601.0, deadline=600.0, step_s=1.0)


def test_a_candidate_the_rules_refuse_is_never_measured_and_ends_its_direction() -> None:
    # the timeout rule (at most a third of the SLO) is the toolkit's own, through the render
    m = model(batching=Batching(max_batch_size=8, batch_timeout_micros=20000,
                                max_enqueued_batches=8, allowed_batch_sizes=(4, 8)))
    too_long = Dimension("batch_timeout_micros", (0, 10000, 20000, 30000, 40000))
    made: list[Config] = []
    course = search(Config.of(m), [too_long],
                    measure=_measure(lambda c: 100.0 - c.batching.batch_timeout_micros / 1000,
                                     made),
                    problems=_rules(m), budget_s=1e9, estimate_s=1.0)
    assert all(c.batching.batch_timeout_micros <= 20000 for c in made)
    assert [s.config.batching.batch_timeout_micros for s in course.skipped] == [30000]
    assert "exceeds a third of the 60 ms latency SLO" in course.skipped[0].reason


def test_the_grpc_quota_rule_refuses_a_batch_larger_than_the_quota_holds() -> None:
    m = model(threads=Threads(grpc_max_threads=9))  # holds 8 requests: max_batch_size 8
    bigger = Dimension("max_batch_size", (8, 16)).set(Config.of(m), 16)
    problems = _rules(m)(bigger)
    assert problems and problems[0].field == "models.m.threads.grpc_max_threads"
    assert _rules(m)(Config.of(m)) == []


def test_candidates_stay_within_the_rules() -> None:
    m = model(latency_slo_ms=30.0)
    dims = {d.name: d for d in dimensions(m, host_cpus=6)}
    assert max(dims["batch_timeout_micros"].values) == 10000  # 30 ms / 3
    assert dims["batch_timeout_micros"].values[0] == 0
    assert dims["num_batch_threads"].values == (1, 2, 4, 6)
    assert dims["intra_op"].values == (1, 2, 4, 6) and dims["intra_op"].zero_as == 6
    rules = _rules(m)
    config = Config.of(m)
    for dim in dims.values():
        for value in dim.values:
            assert rules(dim.set(config, value)) == [], (dim.name, value)


def test_a_new_max_batch_size_closes_allowed_batch_sizes() -> None:
    config = Config.of(model())  # allowed (4, 8), max 8
    dim = _batch_dim()
    assert dim.set(config, 16).batching.allowed_batch_sizes == (4, 8, 16)
    assert dim.set(config, 4).batching.allowed_batch_sizes == (4,)
    assert dim.set(config, 2).batching.allowed_batch_sizes == (2,)
    empty = replace(config, batching=replace(config.batching, allowed_batch_sizes=()))
    assert dim.set(empty, 16).batching.allowed_batch_sizes == ()


def test_a_default_thread_pool_is_walked_from_the_hosts_cpus() -> None:
    dim = Dimension("intra_op", (1, 2, 4), zero_as=4)
    config = Config.of(model())  # intra_op 0: TensorFlow's default, the CPUs
    assert dim.neighbour(config, 1) is None
    assert dim.neighbour(config, -1) == 2


def test_no_batching_searches_only_the_thread_pools() -> None:
    m = model(batching=Batching(enabled=False))
    assert [d.name for d in dimensions(m, host_cpus=2)] == ["intra_op", "inter_op"]


def test_the_recommendation_keeps_the_catalog_unless_another_clearly_beats_it() -> None:
    config = Config.of(model())
    assert recommend([_trial(config, 100.0), _trial(config, 104.0)]) == 0
    assert recommend([_trial(config, 100.0), _trial(config, 106.0)]) == 1
    assert recommend([_trial(config, 100.0, meets=False), _trial(config, 5.0)]) == 1
    assert recommend([_trial(config, 100.0, meets=False)]) is None
    assert recommend([]) is None


def test_a_trial_that_never_met_the_slo_scores_nothing() -> None:
    config = Config.of(model())
    assert not better(_trial(config, 1e6, meets=False), _trial(config, 1.0), 0.05)
    assert better(_trial(config, 1.0), _trial(config, 1e6, meets=False), 0.05)


def test_the_python_to_paste_is_the_configuration() -> None:
    config = Config(Batching(max_batch_size=16, batch_timeout_micros=500,
                             allowed_batch_sizes=(4, 16)), Threads(intra_op=2))
    text = config.python()
    assert text == ("batching=Batching(max_batch_size=16, batch_timeout_micros=500, "
                    "num_batch_threads=1, allowed_batch_sizes=(4, 16)),\n"
                    "threads=Threads(intra_op=2, inter_op=0),\n")
    from tfsdeploy.core.inventory import catalog
    namespace = {"Batching": catalog.Batching, "Threads": catalog.Threads}
    assert eval(f"dict({text})", namespace) == {"batching": config.batching,
                                                "threads": config.threads}


def test_tune_json_names_every_figure() -> None:
    made = _trial(Config.of(model()), 123.456)
    data = made.as_json()
    assert {"batching", "threads", "qps", "p99_ms", "meets_slo"} <= set(data)
    assert data["qps"] == 123.46 and data["batching"]["allowed_batch_sizes"] == [4, 8]


def _point(rate: float, p99: float, *, qps: float | None = None, errors: float = 0.0
           ) -> RatePoint:
    return RatePoint(rate=rate, qps=rate if qps is None else qps, p50_ms=p99 / 3,
                     p95_ms=p99 / 2, p99_ms=p99, error_pct=errors)


def test_the_ramp_doubles_the_rate_then_bisects_to_the_slo() -> None:
    ramp = Ramp(slo_ms=50.0)
    assert ramp.next_rate([_point(100, 10)]) == 200
    points = [_point(100, 10), _point(200, 20), _point(400, 80)]
    assert ramp.next_rate(points) == 300
    points.append(_point(300, 40))
    assert ramp.next_rate(points) == 350
    points.append(_point(350, 60))
    assert ramp.next_rate(points) == 325
    points.append(_point(325, 45))
    assert ramp.next_rate(points) is None  # 350 / 325 is within 15 %
    assert ramp.at_slo(points) == points[5]


def test_the_ramp_counts_the_first_error_as_a_limit() -> None:
    ramp = Ramp(slo_ms=50.0, precision=2.0)
    points = [_point(100, 10), _point(200, 20, errors=0.5)]
    assert ramp.next_rate(points) is None
    assert ramp.at_slo(points) == points[0]


def test_the_ramp_goes_down_until_a_rate_meets_the_slo() -> None:
    ramp = Ramp(slo_ms=50.0)
    assert ramp.next_rate([_point(100, 80)]) == 50
    assert ramp.next_rate([_point(100, 80), _point(50, 10)]) == 75
    assert ramp.next_rate([_point(1, 80)]) is None


def test_the_ramp_takes_a_rate_the_server_could_not_answer_as_too_high() -> None:
    ramp = Ramp(slo_ms=50.0)
    points = [_point(100, 10), _point(200, 10, qps=150)]
    assert ramp.next_rate(points) == 150
    assert ramp.at_slo(points) == points[1]  # its 150 answered per second met the SLO


def test_the_ramp_has_a_step_limit() -> None:
    ramp = Ramp(slo_ms=50.0, max_steps=3)
    assert ramp.next_rate([_point(1, 1), _point(2, 1), _point(4, 1)]) is None
    assert ramp.next_rate([]) is None


def test_scratch_ports_are_the_first_free_pair_above_14000() -> None:
    assert scratch_ports(frozenset()) == (14000, 14001)
    assert scratch_ports(frozenset({14001, 14002})) == (14003, 14004)
    assert scratch_ports(frozenset({14000}), ceiling=14001) is None


def test_the_ports_an_inventory_gives_a_model_count_whether_or_not_anything_listens() -> None:
    # a model at port_offset 5500 has its stable ports on 14000/14001: a scratch instance
    # started while its proxy is down must not take them
    m = model(port_offset=5500)
    host = inventory(models=[m]).select("h1")[0]
    ports = assigned_ports(model_ports(host, m), 2)
    assert ports == {14000, 14001, 14010, 14011, 14020, 14021, 14030, 14031, 14040, 14041}
    assert scratch_ports(ports) == (14002, 14003)


def test_a_gpu_without_room_for_one_more_instance_is_refused_with_the_arithmetic() -> None:
    # 16384 MiB GPU: a 5000 MiB model x 1.2 takes 0.367, a CUDA context 512 MiB (0.031):
    # one live + one scratch (0.797) fits under 0.9, two live (a deploy window) + one does not
    m = model(memory_mib=5000)
    inv = inventory(models=[m], defaults={"gpu_context_mib": 512})
    plan = plan_instances(inv.select("h1")[0], m)[0].plan
    assert plan is not None
    assert scratch_gpu_problem(plan, 1) is None
    problem = scratch_gpu_problem(plan, 2)
    assert problem is not None
    assert problem.startswith("this GPU of h1 cannot hold a scratch instance of m beside the "
                              "2 running: CUDA total 16384 MiB = 16384 MiB (nvidia-smi "
                              "memory.total) - 0 MiB (memory.reserved); fraction = "
                              "ceil(5000 MiB x 1.2 / 16384 MiB")
    assert "3 x 0.367 + 3 x 512 MiB beside each pool / 16384 MiB = 1.101 + 0.094 = 1.195" in problem
    assert problem.endswith("limit 1 - 0.1 = 0.900")


PAGE = """# TYPE :tensorflow:serving:request_count counter
:tensorflow:serving:request_count{{model_name="m",status="OK"}} {ok}
:tensorflow:serving:request_count{{model_name="m",status="UNAVAILABLE"}} {full}
:tensorflow:serving:request_count{{model_name="other",status="OK"}} 999
# TYPE :tensorflow:serving:request_latency histogram
:tensorflow:serving:request_latency_sum{{model_name="m",API="predict",entrypoint="GRPC"}} {lat}
:tensorflow:serving:request_latency_count{{model_name="m",API="predict",entrypoint="GRPC"}} {ok}
:tensorflow:serving:request_latency_sum{{model_name="other",API="predict",entrypoint="GRPC"}} 5
:tensorflow:serving:request_latency_count{{model_name="other",API="predict",entrypoint="GRPC"}} 5
# TYPE :tensorflow:serving:batching_session:queuing_latency histogram
:tensorflow:serving:batching_session:queuing_latency_sum{{thread_pool_name=""}} {queue}
:tensorflow:serving:batching_session:queuing_latency_count{{thread_pool_name=""}} {ok}
# TYPE :tensorflow:serving:batching_session:processed_batch_size histogram
:tensorflow:serving:batching_session:processed_batch_size_bucket{{le="+Inf"}} {batches}
:tensorflow:serving:batching_session:processed_batch_size_sum {items}
:tensorflow:serving:batching_session:processed_batch_size_count {batches}
"""


def test_the_stage_window_is_the_servers_own_figures_between_two_reads() -> None:
    before = parse_totals(PAGE.format(ok=100, full=0, lat=500_000, queue=100_000, batches=20,
                                      items=100), "m")
    after = parse_totals(PAGE.format(ok=300, full=7, lat=2_500_000, queue=1_300_000,
                                     batches=45, items=300), "m")
    window = stage_window(before, after)
    assert window.requests_ok == 200 and window.queue_full == 7
    assert window.request_ms == pytest.approx(10.0)  # 2 000 000 us over 200 requests
    assert window.queue_ms == pytest.approx(6.0)
    assert window.queue_share == pytest.approx(0.6)
    assert window.mean_batch == pytest.approx(8.0)  # 200 items in 25 batches
    assert window.runtime_ms is None  # not on the page


def test_a_restarted_server_counts_everything_it_reports_as_new() -> None:
    before = parse_totals(PAGE.format(ok=900, full=0, lat=9e6, queue=1e6, batches=90,
                                      items=900), "m")
    after = parse_totals(PAGE.format(ok=10, full=0, lat=1e5, queue=5e4, batches=2,
                                     items=10), "m")
    window = stage_window(before, after)
    assert window.requests_ok == 10 and window.mean_batch == pytest.approx(5.0)
