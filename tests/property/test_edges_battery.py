"""Hostile-input battery of the unattended path's edges:

- host-side text (release records, lock records, container labels, audit lines, proxy stats,
  errors) holding rich markup, escape sequences, CR, BEL, NUL, bidi controls and lone
  surrogates, read as the facts read them and printed as `fab status`, `history`, `lock` and
  a run's summary print them: nothing raises, and nothing a terminal acts on reaches the
  output (what is shown is ``core.visible``'s escape of it);
- a stream that fails (EIO, EPIPE, closed) under every write: the command's writes never
  raise;
- option values at and beyond every bound (declared beside each option in cli/verbs.py), as
  text: each is taken within its bound or refused with one located problem naming the option
  and its fix;
- inventories with huge integers (beyond 64 bits, beyond Python's int-str limit) in their
  numeric fields: a ConfigError of located problems, never a bare ValueError or OverflowError.
"""

from __future__ import annotations

import errno
import io
import json
import math
from collections import Counter
from typing import Any

from hypothesis import example, given
from hypothesis import strategies as st

from tfsdeploy.cli import output
from tfsdeploy.cli.options import bounded, option_value
from tfsdeploy.cli.terminal import GuardedStream
from tfsdeploy.cli.verbs import Bound
from tfsdeploy.core.errors import ConfigError
from tfsdeploy.core.inventory.canary_policy import CanaryPolicy
from tfsdeploy.core.inventory.catalog import Batching, Rollout, Warmup
from tfsdeploy.core.inventory.fleet import Gpu, Host
from tfsdeploy.core.inventory.load import build_inventory
from tfsdeploy.core.rollout.records import parse_audit, parse_lock
from tfsdeploy.core.visible import visible
from tfsdeploy.hosts.dockerapi import container_fact
from tfsdeploy.hosts.facts import parse_facts
from tfsdeploy.run.engine import HostOutcome, RunResult

from .budget import examples
from .strategies import HOSTILE_TEXT, catalog_model

# what a terminal acts on: C0 but newline and tab, DEL, C1, bidi controls, separators,
# surrogates
ACTED_ON = {chr(c) for c in (*range(0x20), 0x7F, *range(0x80, 0xA0), 0x061C, 0x200E, 0x200F,
                             *range(0x202A, 0x202F), *range(0x2066, 0x206A), 0x2028, 0x2029,
                             *range(0xD800, 0xE000))} - {"\n", "\t"}
MARKUP = ["[/srv/tfsdeploy/m]", "[bold]x", "[/]", "[link=file:///etc]y[/link]", ":warning:",
          "[red", "\\[x]", "[[", "]]"]
CONTROLS = ["\x1b[2J", "\x1b]0;title\x07", "\x9b31m", "\r", "\x00", "\x08\x08", "\u202e",
            "\udcff", "\ud800", "\x7f", "\u2028"]
HOST_TEXT = st.one_of(
    st.lists(st.sampled_from(MARKUP + CONTROLS) | st.text(max_size=6), max_size=6).map(
        "".join),
    st.text(max_size=30), HOSTILE_TEXT)


def _clean(text: str) -> bool:
    return not ACTED_ON & set(text)


@examples(300)
@given(HOST_TEXT)
def test_visible_escapes_all_a_terminal_acts_on_and_is_stable(text: str) -> None:
    shown = visible(text)
    assert _clean(shown)
    assert visible(shown) == shown
    assert visible(text.replace("\n", "").replace("\t", "")).count("\\") >= \
        sum(1 for c in text if c in ACTED_ON)
    shown.encode("utf-8")  # every UTF-8 stream takes it


class Failing(io.TextIOBase):
    def __init__(self, error: BaseException) -> None:
        self.error = error

    def write(self, text: str) -> int:
        raise self.error

    def flush(self) -> None:
        raise self.error


@examples(60)
@given(st.lists(HOST_TEXT, min_size=1, max_size=5),
       st.sampled_from([OSError(errno.EIO, "Input/output error"),
                        BrokenPipeError(errno.EPIPE, "Broken pipe"),
                        ValueError("I/O operation on closed file.")]))
def test_a_failing_stream_never_fails_a_write(lines: list[str], error: BaseException) -> None:
    stream = GuardedStream(Failing(error))  # type: ignore[arg-type]
    for line in lines:
        print(line, file=stream)  # type: ignore[arg-type]
        stream.flush()
    assert stream.lost


def _lock_json(who: str, machine: str, command: str) -> str:
    return json.dumps({"token": "ab" * 8, "who": who, "machine": machine, "pid": 7,
                       "started": "2026-12-01T03:00:00Z", "command": command})


@examples(150)
@given(HOST_TEXT, HOST_TEXT, HOST_TEXT, HOST_TEXT, HOST_TEXT)
@example("\ud800\udcff", "", "", "", "")  # a surrogate pair: one character once stored
def test_host_records_with_markup_and_controls_are_printed_escaped(
        who: str, machine: str, label: str, detail: str, stat: str) -> None:
    lock = parse_lock(_lock_json(who, machine, "deploy m"))
    # the record keeps the exact text JSON stores: a high and a low surrogate side by side
    # ("\ud800\udcff") are one escaped pair in JSON and read back as the one character they
    # encode (U+100FF, RFC 8259 section 7); lone surrogates stay as they are
    stored = who.encode("utf-16-le", "surrogatepass").decode("utf-16-le", "surrogatepass")
    assert lock is not None and lock.who == stored
    audit = parse_audit(json.dumps({"time": "t", "who": who, "host": "h1", "model": "m",
                                    "release": label, "event": detail, "details": {}}) +
                        "\n" + detail)
    fact = container_fact({"Names": ["/c0"], "Labels": {
        "tfsdeploy.model": "m", "tfsdeploy.release": label, "tfsdeploy.slot": "blue",
        "tfsdeploy.version": "1", "tfsdeploy.instance": "0"}, "State": "running",
        "Status": label, "Image": label})
    facts = parse_facts("h1", "\n".join([
        "@@current", f"releases/{label}", "@@live", detail, "@@lock",
        _lock_json(who, machine, detail), "@@versions", stat, "@@disk", stat, "@@gpus", stat,
        "@@listen", stat, "@@proxy", "# pxname,svname,scur,status,weight",
        f"grpc,i0-blue,0,{stat},1", "@@tools", "socat flock", "@@end"]),
        [fact] if fact is not None else [])
    out = io.StringIO()
    stream = GuardedStream(out)  # type: ignore[arg-type]
    row = {"host": "h1", "reachable": True, "current": label, "version": 1,
           "traffic_slot": facts.proxy.serving_slot(0), "drift": [detail],
           "lock": lock.describe(), "canary": {"release": label, "state": detail},
           "slots": {"blue": [{"release": label, "running": True,
                               "versions": [{"version": 1, "state": stat}]}]}}
    output.print_table("status", ("host", "release", "version", "traffic", "slots", "drift",
                                  "lock"), [output.status_row(row)], stream=stream)
    output.print_table("down", ("host", "release", "version", "traffic", "slots", "drift",
                                "lock"), [output.status_row(
                                    {"host": "h1", "reachable": False, "error": detail})],
                       stream=stream)
    history = {"host": "h1", "reachable": True, "broken_records": [
        {"path": label, "error": detail}], "audit": [e.model_dump() for e in audit],
        "releases": [{"id": label, "version": 1, "status": stat, "slot": "blue", "by": who,
                      "at": machine, "seconds": 1.0, "gates": {detail: 1.0}}]}
    result = RunResult(model="m", version=1, release_id=label, message=detail,
                       hosts={"h1": HostOutcome("h1", "failed", error=detail,
                                                diagnosis={"cause": who, "fix": machine})})
    import contextlib

    with contextlib.redirect_stdout(stream):  # type: ignore[type-var]
        output.print_history("m", [history])
        output.print_run("deploy", result, None)
        print(f"h1: {lock.describe()}")
    assert _clean(out.getvalue())
    shown = out.getvalue()
    for markup in ("[/srv/tfsdeploy/m]", "[bold]x"):
        if markup in who and "\n" not in who:
            assert markup in shown  # shown as text, never taken as markup


def _values(bound: Bound) -> st.SearchStrategy[str]:
    """Text for an option with ``bound``: near and beyond each end, and junk forms."""
    near = st.one_of(
        st.floats(min_value=bound.low - 1, max_value=bound.low + 1),
        st.floats(min_value=bound.high - 1, max_value=bound.high + 1),
        st.floats(allow_nan=True, allow_infinity=True),
        st.sampled_from([bound.low, bound.high, math.nextafter(bound.high, math.inf),
                         math.nextafter(bound.low, -math.inf), 1e-300, 1e300, -0.0, 5e-324]))
    whole = st.one_of(st.integers(int(bound.low) - 2, int(bound.low) + 2),
                      st.integers(int(bound.high) - 2, int(bound.high) + 2),
                      st.integers(min_value=-(2**70), max_value=2**70))
    junk = st.sampled_from(["1e309", " 5 ", "5_0", "0x10", "\uff11", "1" * 5000, "-" + "9" * 400,
                            "nan", "inf", "1,5", "", "10s"])
    return st.one_of(near.map(repr), whole.map(str), junk)


BOUNDED = bounded()


@examples(400)
@given(st.sampled_from(BOUNDED), st.data())
def bounded_option(outcomes: Counter[str], case: tuple[str, str, Bound],
                   data: st.DataObject) -> None:
    """One bounded option given one generated value, counted in ``outcomes``."""
    command, name, bound = case
    text = data.draw(_values(bound))
    flag = f"--{name.replace('_', '-')}"
    try:
        value = option_value(command, name, text)
    except ConfigError as refused:
        outcomes["refused"] += 1
        (problem,) = refused.problems
        assert problem.field == flag and problem.fix and problem.message.startswith(flag)
        assert len(problem.message) < 1200  # a 5000-digit value is never written out whole
        return
    outcomes["taken"] += 1
    assert math.isfinite(value)
    assert (bound.low < value if bound.above else bound.low <= value) and value <= bound.high
    assert not bound.whole or isinstance(value, int)


def test_every_bounded_option_takes_its_range_and_refuses_the_rest() -> None:
    outcomes: Counter[str] = Counter()
    bounded_option(outcomes)
    assert outcomes["taken"] and outcomes["refused"], outcomes


@examples(150)
@given(st.sampled_from(["d", "h", "m", "s", "ms"]),
       st.one_of(st.integers(0, 10**7), st.integers(10**9, 10**30),
                 st.sampled_from(["9" * 5000, "1" * 400, "0.5", "00"])))
def since_span(outcomes: Counter[str], unit: str, count: int | str) -> None:
    """One ``--since`` span, counted in ``outcomes``."""
    try:
        option_value("logs", "since", f"{count}{unit}")
    except ConfigError as refused:
        outcomes["refused"] += 1
        (problem,) = refused.problems
        assert problem.field == "--since" and "before 1970" in problem.message
        assert len(problem.message) < 1200
    else:
        outcomes["taken"] += 1


def test_a_since_span_is_taken_or_refused_located() -> None:
    outcomes: Counter[str] = Counter()
    since_span(outcomes)
    assert outcomes["taken"] and outcomes["refused"], outcomes


HUGE = st.one_of(st.integers(min_value=2**63, max_value=2**80),
                 st.integers(min_value=-(2**80), max_value=-(2**63)),
                 st.sampled_from([10**4301, -(10**4301), 10**6000, 2**64, 2**63]))
PLACES: list[Any] = [
    lambda n, m: ({"gpu": Gpu(n, 16384)}, m),
    lambda n, m: ({"gpu": Gpu(0, n)}, m),
    lambda n, m: ({"vars": {"ssh_port": n}}, m),
    lambda n, m: ({"vars": {"grpc_port": n, "gpu_headroom": n}}, m),
    lambda n, m: ({"vars": {"slot_ports": {"blue": (1, n), "green": (n, 2)}}}, m),
    lambda n, m: ({}, {"memory_mib": n}),
    lambda n, m: ({}, {"port_offset": n, "expected_concurrency": n}),
    lambda n, m: ({}, {"labels": {"stable": n}}),
    lambda n, m: ({}, {"batching": Batching(max_batch_size=n)}),
    lambda n, m: ({}, {"warmup": Warmup(samples=n)}),
    lambda n, m: ({}, {"rollout": Rollout(keep_releases=n, window_s=n)}),
    lambda n, m: ({}, {"rollout": Rollout(canary=CanaryPolicy(weights=(n,), step_s=n))}),
    lambda n, m: ({}, {"rollout": Rollout(canary=CanaryPolicy(
        min_requests=n, max_p99_ratio=n, latency_slack_ms=n, max_extensions=n))}),
]


@examples(200)
@given(catalog_model(), st.lists(st.tuples(st.sampled_from(range(len(PLACES))), HUGE),
                                 min_size=1, max_size=3))
def huge_integers(outcomes: Counter[str], model: Any, placed: list[tuple[int, int]]) -> None:
    """One inventory given huge integers in one to three places, counted in ``outcomes``."""
    from dataclasses import replace

    host: dict[str, Any] = {"gpu": Gpu(0, 16384), "vars": {}}
    changes: dict[str, Any] = {}
    for index, number in placed:
        on_host, on_model = PLACES[index](number, {})
        host |= {k: v if k != "vars" else {**host["vars"], **v} for k, v in on_host.items()}
        changes |= on_model
    try:
        chosen = replace(model, **changes)
    except (TypeError, ValueError):
        outcomes["not a model"] += 1  # the generated model is not one a dataclass takes
        return
    try:
        build_inventory("inv.py", hosts=[Host("h1", "10.0.0.1", gpus=[host["gpu"]],
                                              vars=host["vars"])],
                        groups={}, defaults={}, models=[chosen])
    except ConfigError as refused:
        outcomes["refused"] += 1
        assert all(p.field or p.file for p in refused.problems)
        assert len(str(refused)) < 20_000
        return
    raise AssertionError(f"a huge integer was accepted: {placed}")


def test_an_inventory_with_huge_integers_is_refused_located() -> None:
    outcomes: Counter[str] = Counter()
    huge_integers(outcomes)
    # most cases must reach the inventory's checks, not stop at the dataclass
    assert outcomes["refused"] > outcomes["not a model"], outcomes
