"""The guard when nobody watches: it acts only on the release it judged (pinned per host, refused
under the lock when another is live), and it fails closed (a host it cannot measure is said,
per host, and the guard exits 3; it never reports health it did not see). Fake hosts and
readers; the probes against real local HTTP servers."""

from __future__ import annotations

import http.server
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from tfsdeploy.core.errors import ExitCode, TfsDeployError
from tfsdeploy.core.inventory.layout import host_port
from tfsdeploy.core.observe.guard import GuardPolicy, parse_metrics
from tfsdeploy.core.target import Target
from tfsdeploy.hosts import probes
from tfsdeploy.run import plans
from tfsdeploy.run.engine import RunResult
from tfsdeploy.run.guard import Look, guard, scrape
from tfsdeploy.run.rollback import rollback

from .fakes import FakeFleet, FakeSlot, FrozenClock
from .helpers import inventory, model
from .runs import Recorder, run_deploy, serving, target

A, B = "r20261201-010000000-v1", "r20261201-020000000-v2"


def _page(model_name: str, count: int, slow: bool) -> str:
    def bucket(le: str, n: int) -> str:
        return (f':tensorflow:serving:request_latency_bucket{{model_name="{model_name}",'
                f'API="Predict",entrypoint="GRPC",le="{le}"}} {n}')

    return "\n".join([
        f':tensorflow:serving:request_count{{model_name="{model_name}",status="OK"}} {count}',
        bucket("1000", 0 if slow else count), bucket("50000", count),
        bucket("+Inf", count)]) + "\n"


class Readers:
    """Every process's counters grow by 100 per read; ``down`` hosts' reads fail; the
    ``restarting`` hosts' processes restart between any two reads (a crash loop: each read
    finds fewer requests counted than the one before)."""

    def __init__(self, slow: bool = True, down: frozenset[str] = frozenset(),
                 restarting: frozenset[str] = frozenset()) -> None:
        self.slow, self.down, self.restarting = slow, down, restarting
        self.counts: dict[tuple[str, int], int] = {}
        self.now = 0.0

    def read(self, address: str, port: int, path: str, model_name: str) -> Any:
        if address in self.down:
            raise probes.httpx.ConnectTimeout("timed out")
        previous = self.counts.get((address, port), 0)
        restarts = address in self.restarting
        count = (previous or 1_000_000) - 100 if restarts else previous + 100
        self.counts[(address, port)] = count
        return parse_metrics(_page(model_name, count, self.slow), model_name)

    def sleep(self, seconds: float) -> None:
        self.now += seconds


def _target() -> Target:
    inv = inventory(models=[model(latency_slo_ms=10)])
    return Target(inv, inv.models["m"], inv.hosts)


def _watch(readers: Readers, looks: Callable[[], Look], **policy: Any
           ) -> tuple[ExitCode, str, list[Any], Recorder]:
    target = _target()
    acted: list[Any] = []
    recorder = Recorder()

    def act(judged: Any) -> RunResult:
        acted.append(dict(judged))
        return RunResult("m", 1, A)

    settings = {"for_s": 10, "interval_s": 5, "duration_s": 120, "min_requests": 1, **policy}
    code, message = guard(target, GuardPolicy(**settings), reporter=recorder,
                          read=readers.read, sleep=readers.sleep, look=lambda _: looks(),
                          act=act, abort=lambda release: RunResult("m", 1, release),
                          clock=lambda: readers.now)
    return code, message, acted, recorder


def _addresses() -> dict[str, str]:
    return {h.name: h.address for h in _target().hosts}


# -- it acts only on what it judged ----------------------------------------------------------

def test_the_guard_hands_its_rollback_the_release_it_judged_on_each_host() -> None:
    hosts = list(_addresses())
    code, _, acted, _ = _watch(Readers(), lambda: Look(None, {h: A for h in hosts}))
    assert int(code) == 2
    assert acted == [{h: A for h in hosts}]


def test_a_release_that_took_over_during_the_breach_is_judged_afresh() -> None:
    hosts = list(_addresses())
    looks = iter([Look(None, {h: A for h in hosts})] * 2)  # start; the breach begins on A

    def look() -> Look:
        return next(looks, Look(None, {h: B for h in hosts}))  # a fix deployed meanwhile

    code, _, acted, recorder = _watch(Readers(), look)
    assert any(step[2:] == ("slo", "changed") for step in recorder.steps), recorder.steps
    assert any(f"the breach began on {A}, {B} is live now" in d for d in recorder.details)
    # it acted only once B itself breached for --for-s, and on B
    assert int(code) == 2 and acted == [{h: B for h in hosts}]


def test_a_rollback_refuses_when_another_release_is_live_than_the_one_judged(
        world: dict[str, Any]) -> None:
    judged = run_deploy(world, 1)  # the release the guard judged bad
    fix = run_deploy(world, 2)  # deployed while the guard waited for the lock
    fleet: FakeFleet = world["fleet"]
    with pytest.raises(plans.LiveChanged) as refused:
        rollback(target(world), reporter=Recorder(), connect=fleet.connect, clock=FrozenClock(),
                 client_factory=FakeSlot, by_guard=True,
                 judged={h: judged.release_id for h in fleet.hosts})
    assert refused.value.exit_code == ExitCode.INCONSISTENT
    text = str(refused.value)
    assert f"h1: judged {judged.release_id}, live now {fix.release_id}" in text
    assert "nothing was changed" in text
    assert all(serving(h) == [fix.release_id] for h in fleet.hosts.values())
    assert not any((h.dir / "r" / "hp2" / "lock").exists() for h in fleet.hosts.values())


def test_the_guard_reports_the_refusal_as_exit_3() -> None:
    hosts = list(_addresses())

    def refused(judged: Any) -> RunResult:
        raise plans.LiveChanged(f"h1: judged {A}, live now {B}")

    target = _target()
    readers = Readers()
    code, message = guard(target, GuardPolicy(for_s=10, interval_s=5, duration_s=120,
                                              min_requests=1),
                          reporter=Recorder(), read=readers.read, sleep=readers.sleep,
                          look=lambda _: Look(None, {h: A for h in hosts}), act=refused,
                          clock=lambda: readers.now)
    assert int(code) == 3 and f"judged {A}, live now {B}" in message


def test_an_abort_refuses_when_the_canary_under_way_is_not_the_one_judged(
        world: dict[str, Any]) -> None:
    from tfsdeploy.run.canary import finish_canary
    from tfsdeploy.run.jobs import Verb

    run_deploy(world, 1)
    fleet: FakeFleet = world["fleet"]
    with pytest.raises(plans.LiveChanged, match=f"judged the canary {B} of hp2, but the "
                       "canary under way now is none"):
        finish_canary(Verb.ABORT, target(world), reporter=Recorder(), connect=fleet.connect,
                      clock=FrozenClock(), client_factory=FakeSlot, judged=B)


# -- it fails closed ---------------------------------------------------------------------------

def test_no_host_measured_is_exit_3_never_no_breach() -> None:
    readers = Readers(down=frozenset(_addresses().values()))
    code, message, acted, recorder = _watch(readers, lambda: Look(None))
    assert int(code) == 3 and acted == []
    assert message.startswith("cannot measure m: no serving process's metrics could be read")
    assert "ConnectTimeout: timed out" in message and "no sustained" not in message
    assert readers.now < 60, "it says so once no host was measured for --for-s"
    assert sum(1 for s in recorder.steps if s[2:] == ("measure", "blind")) == len(_addresses())


def test_a_host_not_measured_is_said_and_is_not_called_healthy() -> None:
    names = _addresses()
    first = next(iter(names))
    others = sorted(set(names) - {first})
    readers = Readers(slow=False, down=frozenset({names[first]}))
    code, message, acted, recorder = _watch(readers, lambda: Look(None), duration_s=60)
    assert int(code) == 3 and acted == []
    assert message.startswith(f"not measured, so not known to be healthy: {first}: ")
    assert message.endswith(f"no sustained SLO breach on {', '.join(others)}")
    assert (first, "guard", "measure", "blind") in recorder.steps


def test_a_crash_looping_release_measures_nothing() -> None:
    readers = Readers(slow=False, restarting=frozenset(_addresses().values()))
    code, message, _, _ = _watch(readers, lambda: Look(None))
    assert int(code) == 3, message
    assert "restarted (its counters went back)" in message


# -- the probes: no proxy from the environment, IPv6 bracketed, pages that are no metrics -----

@pytest.mark.parametrize(("address", "expected"), [
    ("10.0.0.1", "http://10.0.0.1:8511/m"), ("tb1.example", "http://tb1.example:8511/m"),
    ("fd00::11", "http://[fd00::11]:8511/m"), ("::1", "http://[::1]:8511/m"),
    ("fe80::1%eth0", "http://[fe80::1%25eth0]:8511/m")])
def test_urls_bracket_ipv6_addresses(address: str, expected: str) -> None:
    assert probes.http_url(address, 8511, "/m") == expected
    assert host_port(address, 8500) == expected[len("http://"):].replace(":8511/m", ":8500")


def test_the_guard_reads_an_ipv6_host_at_a_bracketed_url(monkeypatch: pytest.MonkeyPatch
                                                         ) -> None:
    from tfsdeploy.core.inventory.fleet import Gpu, Group, Host
    from tfsdeploy.core.inventory.load import build_inventory
    from tfsdeploy.run.guard import read_host

    asked: list[str] = []

    class Reply:
        text = _page("m", 10, slow=False)

        def raise_for_status(self) -> None:
            pass

    def fake_get(url: str, **options: Any) -> Reply:
        asked.append(url)
        return Reply()

    monkeypatch.setattr(probes.httpx, "get", fake_get)
    inv = build_inventory("inv.py", hosts=[Host("h6", "fd00::11", gpus=[Gpu(0, 16384)])],
                          groups={"g": Group(["h6"])}, defaults={}, models=[model()])
    target = Target(inv, inv.models["m"], inv.hosts)
    read = read_host(inv.hosts[0], target, scrape)
    assert sorted(asked) == ["http://[fd00::11]:8511/monitoring/prometheus/metrics",
                             "http://[fd00::11]:8521/monitoring/prometheus/metrics"]
    assert len(read.readings) == 2 and not read.failed


class _Server:
    """A local HTTP server answering every GET with ``body``; counts its requests."""

    def __init__(self, body: str) -> None:
        hits = self.hits = [0]

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                hits[0] += 1
                data = body.encode()
                self.send_response(200)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args: Any) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.server.server_address[1]
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture()
def servers() -> Iterator[tuple[_Server, _Server]]:
    metrics = _Server(_page("m", 100, slow=False))
    proxy = _Server("proxy says hello")  # a 200 without metrics: the worst a proxy can do
    yield metrics, proxy
    metrics.close()
    proxy.close()


def test_proxy_variables_in_the_environment_are_never_used(
        servers: tuple[_Server, _Server], monkeypatch: pytest.MonkeyPatch) -> None:
    metrics, proxy = servers
    for name in ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "http_proxy", "https_proxy",
                 "all_proxy"):
        monkeypatch.setenv(name, f"http://127.0.0.1:{proxy.port}")
    monkeypatch.setenv("NO_PROXY", "")
    monkeypatch.setenv("no_proxy", "")
    text = probes.metrics("127.0.0.1", metrics.port, "/monitoring/prometheus/metrics")
    assert parse_metrics(text, "m").requests == {"OK": 100}
    assert probes.rest_problems("127.0.0.1", metrics.port, "m", 1, metrics_path=None)
    assert proxy.hits == [0] and metrics.hits[0] >= 2


def test_a_page_without_tfserving_metrics_is_no_measurement(
        servers: tuple[_Server, _Server]) -> None:
    _, proxy = servers
    with pytest.raises(probes.NotMetrics, match="without TFServing's metric names"):
        probes.metrics("127.0.0.1", proxy.port, "/monitoring/prometheus/metrics")


def test_a_refused_rollback_message_names_both_releases() -> None:
    from tfsdeploy.hosts.facts import HostFacts

    facts = {"h1": HostFacts(host="h1")}
    with pytest.raises(TfsDeployError, match=f"h1: judged {A}, live now no single release"):
        plans.refuse_changed("m", facts, {"h1": A})


# -- a signal ends the watch, with what it saw ---------------------------------------------------

def test_a_signal_between_two_rounds_ends_the_watch_with_exit_1_and_no_action(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """`fab guard` as cron's `timeout` stops it: SIGTERM while it waits between rounds (in
    ``watch``, under the engine's handling) ends the watch at once, said, not acted on, and
    the handler is given back."""
    import os
    import signal

    from tfsdeploy.run import guard as guarding

    hosts = list(_addresses())
    readers = Readers(slow=False)
    rounds: list[float] = []

    def read(address: str, port: int, path: str, model_name: str) -> Any:
        if not rounds or rounds[-1] != readers.now:
            rounds.append(readers.now)
            if len(rounds) == 2:
                os.kill(os.getpid(), signal.SIGTERM)
        return readers.read(address, port, path, model_name)

    real = guarding.guard

    def with_fakes(*args: Any, sleep: Callable[[float], None], **kwargs: Any) -> Any:
        def waits(seconds: float) -> None:  # the watch's own wait, on fake time
            began = time.monotonic()
            sleep(0.5)  # the real wait: a signal (its thread sets the stop) ends it at once
            if time.monotonic() - began >= 0.5:
                readers.sleep(seconds)
        return real(*args, sleep=waits, read=read, clock=lambda: readers.now,
                    look=lambda _: Look(None, {h: A for h in hosts}), **kwargs)

    monkeypatch.setattr(guarding, "guard", with_fakes)
    recorder, acted = Recorder(), []
    code, message = guarding.watch(_target(), GuardPolicy(for_s=10, interval_s=5,
                                                          duration_s=120, min_requests=1),
                                   reporter=recorder, act=lambda judged: acted.append(judged))
    assert code == ExitCode.INVALID, message
    assert message == ("SIGTERM: the guard stopped after 5 s of watching, before its duration "
                       "ended; it had not acted: nothing was changed")
    assert acted == [] and len(rounds) == 2
    assert "SIGTERM: ending the watch before it acts" in recorder.notes
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL


def test_a_signal_during_the_round_that_would_act_ends_the_watch_unacted() -> None:
    """A SIGTERM while the round whose breach is sustained reads the metrics: the guard does
    not start the rollback a SIGKILL could then cut short."""
    import os
    import signal

    from tfsdeploy.run.engine import Stop

    hosts = list(_addresses())
    readers, rounds, acted = Readers(slow=True), [], []

    def read(address: str, port: int, path: str, model_name: str) -> Any:
        if not rounds or rounds[-1] != readers.now:
            rounds.append(readers.now)
            if len(rounds) == 3:  # the breach began at the second: sustained at the third
                stop.stop("interrupted", "SIGTERM")
        return readers.read(address, port, path, model_name)

    stop = Stop()
    code, message = guard(_target(), GuardPolicy(for_s=5, interval_s=5, duration_s=120,
                                                 min_requests=1),
                          reporter=Recorder(), read=read, sleep=readers.sleep,
                          look=lambda _: Look(None, {h: A for h in hosts}),
                          act=lambda judged: acted.append(judged), clock=lambda: readers.now,
                          stop=stop)
    assert (code, acted, len(rounds)) == (ExitCode.INVALID, [], 3), message
    assert message.startswith("SIGTERM: the guard stopped after 10 s of watching")
    assert os.getpid() and signal.getsignal(signal.SIGTERM) is signal.SIG_DFL


def test_a_look_at_the_hosts_that_a_signal_ends_ends_the_watch() -> None:
    from tfsdeploy.run.engine import LookStopped, Stop

    def looks() -> Look:
        raise LookStopped("the look at m's hosts ended at SIGHUP", "SIGHUP")

    target, stop = _target(), Stop()
    code, message = guard(target, GuardPolicy(for_s=10, interval_s=5, duration_s=120),
                          reporter=Recorder(), look=lambda _: looks(), stop=stop)
    assert (code, message) == (ExitCode.INVALID, "SIGHUP: the guard stopped after 0 s of "
                               "watching, before its duration ended; it had not acted: "
                               "nothing was changed")
    assert stop.is_set() and stop.signal == "SIGHUP"


def test_a_look_that_outlives_its_deadline_is_an_error_not_a_stop() -> None:
    from tfsdeploy.run.engine import LookStopped, Stop

    def looks() -> Look:
        raise LookStopped("the look at m's hosts ended at its 300 s deadline")

    with pytest.raises(LookStopped):
        guard(_target(), GuardPolicy(for_s=10, interval_s=5, duration_s=120),
              reporter=Recorder(), look=lambda _: looks(), stop=Stop())
