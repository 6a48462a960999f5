"""Merging every generator's results: exact histograms, each request counted once, seconds
aligned on the common start (tfsdeploy.accept.merge, loadtest.stats)."""

from __future__ import annotations

import json
import random
from collections import Counter

from hdrh.histogram import HdrHistogram
from hypothesis import given, settings
from hypothesis import strategies as st

from tfsdeploy.accept.merge import GeneratorOutcome, merge_fleet, series_rows, slice_of, slices
from tfsdeploy.loadtest import stats

from .support import Request, S, outcome, proc_result


def single_histogram(requests: list[Request]) -> HdrHistogram:
    hist = stats.new_histogram()
    for _, latency, ok in requests:
        if ok:
            hist.record_value(max(latency // 1000, 1))
    return hist


def random_requests(rng: random.Random, count: int, seconds: int) -> list[Request]:
    return [(rng.randrange(seconds * S), rng.randint(200_000, 2_000_000_000), rng.random() > 0.02)
            for _ in range(count)]


def test_fleet_histogram_equals_the_histogram_of_every_request() -> None:
    rng = random.Random(16)
    parts = [random_requests(rng, 3000, 10) for _ in range(4)]  # 2 generators x 2 processes
    merged = merge_fleet([outcome("a", [proc_result(parts[0]), proc_result(parts[1])]),
                          outcome("b", [proc_result(parts[2]), proc_result(parts[3])])])
    everything = [r for p in parts for r in p]
    assert merged.fleet is not None
    assert list(merged.fleet.ok_hist.counts) == list(single_histogram(everything).counts)
    for pct in (50, 95, 99, 99.9, 100):
        assert stats.percentile_ns(merged.fleet.ok_hist, pct) == \
            stats.percentile_ns(single_histogram(everything), pct)


def test_merged_count_is_the_sum_of_the_generators_counts() -> None:
    rng = random.Random(3)
    a = [proc_result(random_requests(rng, 1234, 5)), proc_result(random_requests(rng, 777, 5))]
    b = [proc_result(random_requests(rng, 2001, 5))]
    merged = merge_fleet([outcome("a", a), outcome("b", b)])
    assert merged.generators["a"] is not None and merged.generators["b"] is not None
    assert merged.generators["a"].count == 1234 + 777
    assert merged.generators["b"].count == 2001
    assert merged.count == merged.generator_count_sum == 1234 + 777 + 2001
    assert merged.fleet is not None
    assert merged.fleet.ok.count + merged.fleet.err.count == merged.count
    assert sum(c for c, _ in merged.fleet.per_second.values()) == merged.count


def test_a_lost_generator_adds_nothing_and_is_not_counted() -> None:
    rng = random.Random(5)
    kept = proc_result(random_requests(rng, 500, 5))
    lost = GeneratorOutcome("b", 100.0, "lost", error="gone")
    merged = merge_fleet([outcome("a", [kept]), lost])
    assert merged.generators == {"a": merged.generators["a"], "b": None}
    assert merged.count == merged.generator_count_sum == 500


def test_seconds_line_up_on_the_common_start_whatever_each_clock_reads() -> None:
    # two machines whose monotonic clocks differ by hours; both measure from the common start
    a = proc_result([(int(1.5 * S), 2_000_000, True), (int(2.9 * S), 4_000_000, True)],
                    origin_ns=7_000 * S)
    b = proc_result([(int(1.2 * S), 3_000_000, True), (int(2.1 * S), 5_000_000, False)],
                    origin_ns=11 * S)
    # as the generators write them: start and end moved onto a (shared) wall clock
    a_json = stats.result_to_json(a, clock_offset_ns=1_700_000_000 * S - 7_000 * S)
    b_json = stats.result_to_json(b, clock_offset_ns=1_700_000_000 * S - 11 * S)
    a2, b2 = (stats.result_from_json(json.loads(json.dumps(d))) for d in (a_json, b_json))
    assert a2.start_ns == b2.start_ns == 1_700_000_000 * S
    merged = merge_fleet([outcome("a", [a2]), outcome("b", [b2])]).fleet
    assert merged is not None
    assert merged.per_second == {1: (2, 0), 2: (2, 1)}
    second_1 = slice_of(merged, 1, 2)
    assert second_1.count == 2 and second_1.hist.get_total_count() == 2
    assert slice_of(merged, 2, 3).hist.get_total_count() == 1  # the error is not a latency


def test_json_round_trip_keeps_every_field() -> None:
    rng = random.Random(9)
    result = proc_result(random_requests(rng, 400, 3), late=7)
    again = stats.result_from_json(json.loads(json.dumps(stats.result_to_json(result))))
    assert again == result


def test_per_second_histograms_add_up_to_the_whole_run() -> None:
    rng = random.Random(11)
    requests = random_requests(rng, 2500, 8)
    result = proc_result(requests)
    total = stats.merge_histograms(result.interval_hists.values())
    assert list(total.counts) == list(stats.decode(result.ok_hist).counts)
    assert list(total.counts) == list(single_histogram(requests).counts)


def test_a_completion_out_of_time_order_still_lands_in_its_second() -> None:
    intervals = stats.IntervalHistograms()
    for second, latency in ((0, 100), (1, 200), (0, 300), (1, 400), (2, 500)):
        intervals.record(second, latency)
    intervals.flush()
    counts = {s: stats.decode(e).get_total_count() for s, e in intervals.encoded.items()}
    assert counts == {0: 2, 1: 2, 2: 1}
    assert intervals.total.get_total_count() == 5


def test_series_covers_the_window_and_the_late_completions() -> None:
    result = proc_result([(int(0.5 * S), 1_000_000, True), (int(5.2 * S), 9_000_000, True)])
    merged = merge_fleet([outcome("a", [result])]).fleet
    assert merged is not None
    rows = series_rows(slices(merged, duration_s=4.0))
    assert [r["second"] for r in rows] == [0, 1, 2, 3, 4, 5]  # window 0-3, then second 5
    assert rows[1]["count"] == 0 and rows[1]["p99"] is None
    assert rows[5]["count"] == 1 and abs(rows[5]["p99"] - 9.0) < 0.01
    intervals = slices(merged, duration_s=4.0, width_s=4)
    assert [(s.start_s, s.end_s, s.count) for s in intervals] == [(0, 4, 1), (4, 6, 1)]


@settings(max_examples=40, deadline=None)
@given(st.lists(st.lists(st.tuples(st.integers(0, 6 * S - 1), st.integers(1_000, 10**10),
                                   st.booleans()), max_size=60), min_size=1, max_size=5))
def any_split(outcomes: Counter[str], parts: list[list[Request]]) -> None:
    """One fleet's requests split among generators, merged; counted in ``outcomes``."""
    merged = merge_fleet([outcome(f"g{i}", [proc_result(p)]) for i, p in enumerate(parts)])
    everything = [r for p in parts for r in p]
    assert merged.count == merged.generator_count_sum == len(everything)
    if merged.fleet is None:
        outcomes["no requests"] += 1
        return
    outcomes["merged"] += 1
    assert list(merged.fleet.ok_hist.counts) == list(single_histogram(everything).counts)
    for second in range(6):
        inside = [r for r in everything if r[0] // S == second]
        got = slice_of(merged.fleet, second, second + 1)
        assert got.count == len(inside)
        assert got.errors == sum(1 for r in inside if not r[2])
        assert list(got.hist.counts) == list(single_histogram(inside).counts)


def test_merge_is_exact_for_any_split() -> None:
    outcomes: Counter[str] = Counter()
    any_split(outcomes)
    assert outcomes["merged"] > outcomes["no requests"], outcomes
