"""Event notifications against a real HTTP receiver on 127.0.0.1 (http.server in a thread)."""

from __future__ import annotations

import itertools
import json
import socket
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from tfsdeploy import notify
from tfsdeploy.errors import ConfigError
from tfsdeploy.hooks import RunFacts
from tfsdeploy.notify import DeliveryPolicy, Event, EventKind, Notifier

FACTS = RunFacts(command="deploy", model="resnet50", version=2, release="r20260509-073525123-v2",
                 hosts=("tb1", "tb2", "tb3"), who="alice@deploybox", run_id="c0ffee")
FAST = DeliveryPolicy(request_timeout_s=2.0, attempts=4, backoff_initial_s=0.01,
                      backoff_max_s=0.05)
SECRET = "/services/T0001/B0002/s3cr3tT0ken"


class Receiver:
    """A webhook receiver: answers each POST with the next planned status (then 200)."""

    def __init__(self, statuses: list[int] | None = None, *, hold: bool = False,
                 headers: dict[str, str] | None = None) -> None:
        self.statuses = list(statuses or [])
        self.headers = headers or {}
        self.requests: list[dict[str, Any]] = []  # every request, with the status it got
        self.first_request = threading.Event()
        self.release = threading.Event()
        if not hold:
            self.release.set()
        self.lock = threading.Lock()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers["content-length"])))
                receiver.first_request.set()
                receiver.release.wait(10)
                with receiver.lock:
                    status = receiver.statuses.pop(0) if receiver.statuses else 200
                    receiver.requests.append({"body": body, "status": status,
                                              "path": self.path, "at": time.monotonic(),
                                              "content_type": self.headers["content-type"]})
                self.send_response(status)
                for name, value in receiver.headers.items():
                    self.send_header(name, value)
                self.send_header("content-length", "2")
                self.end_headers()
                self.wfile.write(b"ok")

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}{SECRET}"

    def accepted(self) -> list[dict[str, Any]]:
        with self.lock:
            return [r["body"] for r in self.requests if r["status"] == 200]

    def stop(self) -> None:
        self.release.set()
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture()
def receivers() -> Iterator[list[Receiver]]:
    made: list[Receiver] = []
    yield made
    for receiver in made:
        receiver.stop()


def _receiver(made: list[Receiver], *args: Any, **kwargs: Any) -> Receiver:
    receiver = Receiver(*args, **kwargs)
    made.append(receiver)
    return receiver


def _refusing_url() -> str:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    return f"http://127.0.0.1:{port}{SECRET}"  # nothing listens there now: connection refused


@pytest.fixture()
def black_hole() -> Iterator[str]:
    """A port that accepts connections (the kernel completes them) but never answers."""
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(64)
        yield f"http://127.0.0.1:{listener.getsockname()[1]}{SECRET}"


def _a_run() -> list[Event]:
    """The events of a three-host deploy whose second host failed its warmup gate."""
    return [notify.run_started(), notify.batch_started(1, 2, ["tb1"]),
            notify.host_rolled("tb1", release=FACTS.release, seconds=21.5),
            notify.batch_started(2, 2, ["tb2", "tb3"]),
            notify.host_rolled("tb3", release=FACTS.release, seconds=19.0),
            notify.gate_failed("tb2", "gate_warmup", "p99 900 ms > 250 ms"),
            notify.rollback(["tb1", "tb3"], "r20260501-101010000-v1", "reverted after tb2"),
            notify.finished(2, 84.25, "gate_warmup failed on tb2", ["tb2"])]


def test_payload_carries_slack_text_and_structured_fields(receivers: list[Receiver]) -> None:
    receiver = _receiver(receivers)
    notifier = Notifier([receiver.url], FACTS, policy=FAST)
    notifier.send(notify.run_started())
    notifier.send(notify.gate_failed("tb2", "gate_warmup",
                                     "p99 <900 ms> & rising\nsecond line of the log"))
    notifier.send(notify.finished(2, 84.25, "gate_warmup failed on tb2", ["tb2"]))
    report = notifier.close(5.0)
    assert report.ok, report.lines()
    assert [r.delivered for r in report.receivers] == [3]
    started, gate, done = receiver.accepted()
    assert started["text"] == ("[tfsdeploy] alice@deploybox started deploy resnet50 v2 "
                               "(r20260509-073525123-v2) on 3 host(s): tb1, tb2, tb3")
    assert started == {
        "text": started["text"], "schema": "tfsdeploy.event/1", "id": "c0ffee.1", "seq": 1,
        "event": "run_started", "time": started["time"], "command": "deploy",
        "model": "resnet50", "version": 2, "release": "r20260509-073525123-v2",
        "who": "alice@deploybox", "run_id": "c0ffee", "selected_hosts": ["tb1", "tb2", "tb3"]}
    assert started["time"].endswith("+00:00")
    assert gate["text"] == ("[tfsdeploy] deploy resnet50 v2: gate gate_warmup failed on tb2: "
                            "p99 &lt;900 ms&gt; &amp; rising")
    assert gate["host"] == "tb2" and gate["gate"] == "gate_warmup"
    assert gate["message"] == "p99 <900 ms> & rising\nsecond line of the log"
    assert done["text"] == ("[tfsdeploy] deploy resnet50 v2 finished: rolled_back (exit 2) in "
                            "84.2s (failed: tb2): gate_warmup failed on tb2")
    assert (done["event"], done["exit_code"], done["result"], done["seconds"],
            done["hosts"]) == ("finished", 2, "rolled_back", 84.25, ["tb2"])
    assert {r["content_type"] for r in receiver.requests} == {"application/json"}
    assert {r["path"] for r in receiver.requests} == {SECRET}


def test_retries_then_success(receivers: list[Receiver]) -> None:
    receiver = _receiver(receivers, [503, 502, 200])
    notifier = Notifier([receiver.url], FACTS, policy=FAST)
    notifier.send(notify.run_started())
    report = notifier.close(5.0)
    (only,) = report.receivers
    assert (only.delivered, only.failed, only.attempts) == (1, 0, 3)
    assert [r["status"] for r in receiver.requests] == [503, 502, 200]
    assert len({r["body"]["id"] for r in receiver.requests}) == 1  # the same event each time


def test_backoff_grows_and_is_capped(receivers: list[Receiver]) -> None:
    receiver = _receiver(receivers, [500, 500, 500, 500, 500])
    policy = DeliveryPolicy(attempts=6, backoff_initial_s=0.1, backoff_max_s=0.2)
    notifier = Notifier([receiver.url], FACTS, policy=policy)
    notifier.send(notify.run_started())
    report = notifier.close(10.0)
    assert report.ok and report.receivers[0].attempts == 6
    times = [r["at"] for r in receiver.requests]
    gaps = [b - a for a, b in itertools.pairwise(times)]
    assert gaps[0] >= 0.09  # the first retry waits the initial backoff
    assert all(gap < 0.2 + 0.25 for gap in gaps)  # never beyond the cap (plus scheduling)


def test_retry_after_is_honoured_up_to_the_cap(receivers: list[Receiver]) -> None:
    receiver = _receiver(receivers, [429, 200], headers={"retry-after": "0.3"})
    notifier = Notifier([receiver.url], FACTS, policy=DeliveryPolicy(
        backoff_initial_s=0.01, backoff_max_s=1.0))
    notifier.send(notify.run_started())
    assert notifier.close(5.0).ok
    first, second = (r["at"] for r in receiver.requests)
    assert second - first >= 0.29


def test_refused_event_is_not_retried(receivers: list[Receiver]) -> None:
    receiver = _receiver(receivers, [404])
    notifier = Notifier([receiver.url], FACTS, policy=FAST)
    notifier.send(notify.run_started())
    report = notifier.close(5.0)
    (only,) = report.receivers
    assert (only.delivered, only.failed, only.attempts) == (0, 1, 1)
    assert "HTTP 404" in only.last_error and not report.ok
    assert "1 failed" in report.lines()[0]


@pytest.mark.parametrize("kind", ["refuses", "never answers"])
def test_dead_receiver_adds_under_a_second_to_the_run(kind: str, black_hole: str) -> None:
    """The added wall time of a run's event calls plus close() with the default policy."""
    url = _refusing_url() if kind == "refuses" else black_hole
    events = _a_run()
    started = time.monotonic()
    notifier = Notifier([url], FACTS)
    for event in events:
        notifier.send(event)
    sending = time.monotonic() - started
    report = notifier.close()
    added = time.monotonic() - started
    print(f"dead receiver ({kind}): {len(events)} sends {sending * 1000:.2f} ms, "
          f"close {report.waited_s:.3f} s, added in all {added:.3f} s\n  {report.lines()[0]}")
    assert added < 1.0
    (only,) = report.receivers
    assert only.delivered == 0 and not report.ok
    assert only.failed + only.dropped + only.unsent == len(events)
    line = report.lines()[0]
    assert "s3cr3t" not in line and "slow or down" in line
    assert line.startswith(f"notifications to {url.split('/services')[0]}/…:")


def test_dead_receiver_does_not_delay_a_live_one(receivers: list[Receiver],
                                                 black_hole: str) -> None:
    live = _receiver(receivers)
    notifier = Notifier([black_hole, live.url], FACTS)
    events = _a_run()
    for event in events:
        notifier.send(event)
    deadline = time.monotonic() + 5
    while len(live.accepted()) < len(events) and time.monotonic() < deadline:
        time.sleep(0.01)
    assert len(live.accepted()) == len(events)  # while the black hole still holds event 1
    dead, alive = notifier.close().receivers
    assert alive.ok and alive.delivered == len(events)
    assert not dead.ok and dead.delivered == 0


def test_queue_overflow_drops_the_oldest_and_is_reported(receivers: list[Receiver]) -> None:
    receiver = _receiver(receivers, hold=True)
    notifier = Notifier([receiver.url], FACTS,
                        policy=DeliveryPolicy(queue_size=4, backoff_initial_s=0.01))
    notifier.send(notify.run_started())
    assert receiver.first_request.wait(5)  # the worker is stuck on event 1
    for index in range(9):
        notifier.send(notify.host_rolled(f"h{index}", release="r", seconds=1.0))
    notifier.send(notify.finished(0, 30.0))
    receiver.release.set()
    report = notifier.close(5.0)
    (only,) = report.receivers
    assert (only.delivered, only.dropped, only.unsent) == (5, 6, 0)
    assert "6 dropped (queue full)" in report.lines()[0]
    seqs = [body["seq"] for body in receiver.accepted()]
    assert seqs == [1, 8, 9, 10, 11]  # the newest survive, so the result still goes out
    assert receiver.accepted()[-1]["event"] == "finished"


def test_events_arrive_in_the_order_sent(receivers: list[Receiver]) -> None:
    first = _receiver(receivers, [503, 503, 500])  # retries must not reorder
    second = _receiver(receivers)
    notifier = Notifier([first.url, second.url], FACTS, policy=FAST)
    for index in range(50):
        notifier.send(notify.host_rolled(f"h{index:02}", release="r", seconds=index))
    report = notifier.close(10.0)
    assert report.ok, report.lines()
    for receiver in (first, second):
        bodies = receiver.accepted()
        assert [b["seq"] for b in bodies] == list(range(1, 51))
        assert [b["host"] for b in bodies] == [f"h{i:02}" for i in range(50)]


def test_close_waits_at_most_its_deadline_and_counts_unsent(receivers: list[Receiver]) -> None:
    receiver = _receiver(receivers, hold=True)
    notifier = Notifier([receiver.url], FACTS, policy=FAST)
    for event in _a_run():
        notifier.send(event)
    assert receiver.first_request.wait(5)
    started = time.monotonic()
    report = notifier.close(0.3)
    assert time.monotonic() - started < 0.3 + 0.2
    (only,) = report.receivers
    assert (only.delivered, only.unsent) == (0, 8)  # one in flight, seven queued
    assert "8 not sent by the end of the run, one still being tried after 0." in \
        report.lines()[0]


def test_send_after_close_is_dropped_and_counted(receivers: list[Receiver]) -> None:
    receiver = _receiver(receivers)
    notifier = Notifier([receiver.url], FACTS, policy=FAST)
    notifier.close(1.0)
    notifier.send(notify.run_started())
    assert notifier.close(1.0).receivers[0].dropped == 1
    assert receiver.requests == []


def test_no_receivers_costs_nothing() -> None:
    notifier = Notifier([], FACTS)
    notifier.send(notify.run_started())
    report = notifier.close()
    assert report.ok and report.receivers == () and report.lines() == []


def test_bad_urls_are_errors_that_hide_the_token() -> None:
    with pytest.raises(ConfigError) as raised:
        Notifier(["ftp://files.example.com/x", "hooks.example.com/T/B/s3cr3t",
                  "https:///s3cr3t", "https://ok.example.com/a"], FACTS)
    text = str(raised.value)
    assert "3 problems" in text and "s3cr3t" not in text and "fix:" in text
    assert notify.check_urls(["http://a/x", "http://b/y", "http://a/x"]) == (
        "http://a/x", "http://b/y")


def test_redact_keeps_scheme_host_and_port_only() -> None:
    assert notify.redact("https://user:pw@hooks.slack.com:8443/services/T/B/X?k=v") == \
        "https://hooks.slack.com:8443/…"
    assert notify.redact("http://10.87.0.1:9000") == "http://10.87.0.1:9000"
    assert notify.redact("http://receiver.example.com/") == "http://receiver.example.com"


@pytest.mark.parametrize(("event", "text"), [
    (notify.batch_started(2, 3, ["tb2", "tb3"]),
     "deploy resnet50 v2: batch 2/3 started on tb2, tb3"),
    (notify.host_rolled("tb1", release="r2", seconds=12.34),
     "deploy resnet50 v2: tb1 rolled in 12.3s, now serving r2"),
    (notify.paused("after the canary batch; promote or abort", ["tb1"]),
     "deploy resnet50 v2 paused (tb1): after the canary batch; promote or abort"),
    (notify.promoted(), "deploy resnet50 v2 promoted"),
    (notify.aborted(["tb1"], "by bob"), "deploy resnet50 v2 aborted (tb1): by bob"),
    (notify.rollback(["tb1"], "r1", "reverted"), "deploy resnet50 v2: tb1 back on r1: reverted"),
    (notify.guard_triggered("tb3", "error rate 5.00% > 1.00% for 30s"),
     "deploy resnet50 v2: guard triggered on tb3: error rate 5.00% > 1.00% for 30s"),
    (notify.finished(0, 61.0), "deploy resnet50 v2 finished: ok (exit 0) in 61.0s"),
    (notify.batch_started(1, 1, [f"h{i}" for i in range(13)]),
     "deploy resnet50 v2: batch 1/1 started on h0, h1, h2, h3, h4, h5, h6, h7, h8, h9 and 3 more"),
])
def test_event_text(event: Event, text: str) -> None:
    assert notify.event_text(FACTS, event) == text


def test_every_event_kind_has_a_builder_and_a_payload() -> None:
    built = {e.kind for e in [*_a_run(), notify.paused(""), notify.promoted(),
                              notify.aborted(), notify.guard_triggered("h", "m")]}
    assert built == set(EventKind)
    for seq, event in enumerate(_a_run(), 1):
        body = notify.payload(FACTS, event, seq=seq, at=0.0)
        assert json.loads(json.dumps(body)) == body
        assert body["time"] == "1970-01-01T00:00:00.000+00:00"
