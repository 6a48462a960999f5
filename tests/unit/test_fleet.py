"""`fab logs`, `fab exec` and `fab status` on what a host holds: which containers serve and how
they are named (pure, on typed facts), and the commands over fake hosts (tests/unit/fakes.py)
whose Engine also answers log and exec calls."""

from __future__ import annotations

import signal
import threading
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

import pytest

from tfsdeploy.cli import output
from tfsdeploy.core.errors import ConfigError
from tfsdeploy.core.inventory.layout import LABEL_PREFIX
from tfsdeploy.core.render.host_proxy import ServerState
from tfsdeploy.core.rollout.records import ReleaseRecord, ReleaseStatus
from tfsdeploy.hosts.dockerapi import ContainerFact
from tfsdeploy.hosts.facts import HostFacts, ProxyFact
from tfsdeploy.run import views as fleet

from . import runs
from .fakes import READY, FakeDocker, FakeFleet, FakeHost, LocalConnection

OLD, NEW = "r20260101-000000000-v1", "r20260102-000000000-v2"
NOW = datetime(2026, 11, 30, 23, 30, tzinfo=UTC).timestamp()


# -- --since -------------------------------------------------------------------------------

@pytest.mark.parametrize(("text", "back_s"), [
    ("30s", 30), ("10m", 600), ("2h", 7200), ("1h30m", 5400), ("1d", 86400), ("1.5h", 5400),
    ("500ms", 0.5)])
def test_since_takes_a_span_back_from_now(text: str, back_s: float) -> None:
    assert fleet.since_timestamp(text, NOW) == pytest.approx(NOW - back_s)


@pytest.mark.parametrize(("text", "at"), [
    ("2026-11-30T23:28:00Z", datetime(2026, 11, 30, 23, 28, tzinfo=UTC)),
    ("2026-11-30T23:28:00.5+00:00", datetime(2026, 11, 30, 23, 28, 0, 500000, tzinfo=UTC)),
    ("2026-12-01T00:28:00+01:00", datetime(2026, 11, 30, 23, 28, tzinfo=UTC))])
def test_since_takes_an_rfc3339_time(text: str, at: datetime) -> None:
    assert fleet.since_timestamp(text, NOW) == at.timestamp()


@pytest.mark.parametrize("text", ["bogus", "10", "", "1 m", "m10", "-5m", "10m ago",
                                  "2026-11-30T23:28:00", "2026-11-30", "1969-01-01T00:00:00Z"])
def test_a_bad_since_names_the_option_and_the_fix(text: str) -> None:
    with pytest.raises(ConfigError) as error:
        fleet.since_timestamp(text, NOW)
    problem = error.value.problems[0]
    assert problem.field == "--since" and repr(text) in problem.message
    assert "10m" in problem.fix


def test_a_bad_since_is_refused_before_any_host_is_contacted(world: dict[str, Any]) -> None:
    contacted: list[str] = []

    def connect(host: Any) -> Any:
        contacted.append(host.name)
        raise AssertionError("no host may be contacted")

    raised: list[BaseException] = []

    def run() -> None:
        try:
            fleet.logs(runs.target(world, count=2), lines=5, since="yesterday", follow=False,
                       out=print, connect=connect)
        except BaseException as error:
            raised.append(error)

    reader = threading.Thread(target=run, daemon=True)
    reader.start()
    reader.join(timeout=20)
    assert contacted == [] and not reader.is_alive()
    assert len(raised) == 1 and isinstance(raised[0], ConfigError), raised
    assert "--since" in str(raised[0])


# -- which containers serve, and their names --------------------------------------------------

def _container(slot: str, instance: int = 0, release: str = OLD, *,
               running: bool = True) -> ContainerFact:
    version = int(release.rsplit("v", 1)[1])
    return ContainerFact(name=f"tfs-hp2-{release}-i{instance}", role="server", release=release,
                         slot=slot, version=version, instance=instance, running=running,
                         status="Up", state="running" if running else "exited", image="img")


def _ready(slot: str, instance: int = 0, weight: int = 100) -> list[ServerState]:
    return [ServerState(backend, instance, slot, READY, 0, weight)
            for backend in ("grpc", "rest")]


def _maint(slot: str, instance: int = 0) -> list[ServerState]:
    return [ServerState(backend, instance, slot, "MAINT", 0, 100)
            for backend in ("grpc", "rest")]


def _facts(containers: list[ContainerFact], servers: list[ServerState], *,
           answered: bool = True, releases: tuple[ReleaseRecord, ...] = ()) -> HostFacts:
    return HostFacts(host="tb1", containers=tuple(containers), current=OLD, releases=releases,
                     proxy=ProxyFact(running=True, servers=tuple(servers) if answered else (),
                                     answered=answered))


def _named(facts: HostFacts) -> list[tuple[str, str, int | None]]:
    return [(s.label, s.release, s.share) for s in fleet.serving_containers(facts)]


def test_one_container_per_host_is_named_by_its_host() -> None:
    facts = _facts([_container("blue"), _container("green", release=NEW, running=False)],
                   _ready("blue") + _maint("green"))
    assert _named(facts) == [("tb1", OLD, 100)]


def test_both_slots_of_a_canary_are_named_apart_with_their_shares() -> None:
    facts = _facts([_container("blue"), _container("green", release=NEW)],
                   _ready("blue", weight=75) + _ready("green", weight=25))
    assert _named(facts) == [("tb1/blue", OLD, 75), ("tb1/green", NEW, 25)]
    assert fleet.split_lines(fleet.serving_containers(facts)) == [
        f"tb1: blue serves {OLD} (v1) 75% of new requests, "
        f"green serves {NEW} (v2) 25% of new requests"]


def test_each_instance_of_a_host_with_one_server_per_gpu_is_named() -> None:
    facts = _facts([_container("blue", 0), _container("blue", 1),
                    _container("green", 0, NEW)],
                   _ready("blue", 0, 90) + _ready("green", 0, 10) + _ready("blue", 1)
                   + _maint("green", 1))
    assert _named(facts) == [("tb1/i0/blue", OLD, 90), ("tb1/i0/green", NEW, 10),
                             ("tb1/i1", OLD, 100)]
    assert fleet.split_lines(fleet.serving_containers(facts)) == [
        f"tb1/i0: blue serves {OLD} (v1) 90% of new requests, "
        f"green serves {NEW} (v2) 10% of new requests"]


def test_without_the_proxy_the_recorded_current_serves() -> None:
    facts = _facts([_container("blue"), _container("green", release=NEW)], [],
                   answered=False)
    assert _named(facts) == [("tb1", OLD, None)]
    assert fleet.split_lines(fleet.serving_containers(facts)) == []


# -- fab status: traffic and the canary ---------------------------------------------------------

def _record(release: str, canary: dict[str, Any] | None) -> ReleaseRecord:
    return ReleaseRecord(id=release, model="hp2", version=int(release.rsplit("v", 1)[1]),
                         image="img", slot="green", status=ReleaseStatus.PAUSED
                         if canary else ReleaseStatus.SERVING, canary=canary)


def test_status_shows_a_canary_s_shares_and_that_it_is_paused() -> None:
    facts = _facts([_container("blue"), _container("green", release=NEW)],
                   _ready("blue", weight=75) + _ready("green", weight=25),
                   releases=(_record(OLD, None), _record(NEW, {"state": "paused"})))
    instance = {"instance": 0, "traffic_slot": facts.proxy.serving_slot(0),
                "traffic": fleet.traffic_shares(facts, 0)}
    assert instance["traffic"] == {"blue": 75, "green": 25}
    assert fleet.canary_on(facts) == {"release": NEW, "state": "paused"}
    assert output.traffic_cell([instance], fleet.canary_on(facts)) == (
        f"blue 75 / green 25; paused canary {NEW}")


def test_status_outside_a_canary_names_the_serving_slot() -> None:
    facts = _facts([_container("blue")], _ready("blue") + _maint("green"),
                   releases=(_record(OLD, {"state": "done"}),))
    one = {"instance": 0, "traffic_slot": "blue", "traffic": fleet.traffic_shares(facts)}
    assert fleet.canary_on(facts) is None
    assert output.traffic_cell([one], None) == "blue"
    two = [dict(one), {"instance": 1, "traffic_slot": None, "traffic": {}}]
    assert output.traffic_cell(two, None) == "i0 blue, i1 -"


def test_the_status_table_shows_the_shares() -> None:

    slots = {"blue": [{"release": OLD, "running": True, "versions": []}],
             "green": [{"release": NEW, "running": True, "versions": []}]}
    row = {"host": "tb1", "reachable": True, "current": OLD, "version": 1,
           "traffic_slot": None, "slots": slots, "drift": [], "lock": None,
           "canary": {"release": NEW, "state": "paused"},
           "instances": [{"instance": 0, "gpus": [0], "traffic_slot": None,
                          "traffic": {"blue": 75, "green": 25}, "slots": slots}]}
    assert output.status_row(row)[3] == f"blue 75 / green 25; paused canary {NEW}"


# -- the commands over fake hosts -------------------------------------------------------------

class Streams:
    """Log and exec calls of the fake Engines: each container's log is two lines; followed,
    a stream then waits until the test ends it (as a live container's stream does)."""

    def __init__(self) -> None:
        self.opened: list[tuple[str, str, Any]] = []  # (host, container, since)
        self.end = threading.Event()
        # set: a followed stream fails once this is set, as a real stream fails when its SSH
        # connection is closed under it
        self.cut: threading.Event | None = None

    def log_lines(self, docker: FakeDocker, name: str, *, lines: int, since: float | None,
                  follow: bool) -> Iterator[str]:
        self.opened.append((docker.host.name, name, since))
        for second in (1, 2):
            yield f"2026-11-30T23:0{second}:00.000000000Z {name} line {second}"
        if follow and self.cut is not None:
            self.cut.wait(30)
            raise ConnectionError("SSH connection lost during a Docker Engine call")
        if follow:
            self.end.wait(30)


@pytest.fixture()
def streams(monkeypatch: pytest.MonkeyPatch) -> Iterator[Streams]:
    made = Streams()

    def log_lines(docker: FakeDocker, name: str, **options: Any) -> Iterator[str]:
        return made.log_lines(docker, name, **options)

    def run_in(docker: FakeDocker, name: str, argv: list[str]) -> tuple[int, str]:
        return 0, f"{docker.host.name} {name}\n"

    monkeypatch.setattr(FakeDocker, "log_lines", log_lines, raising=False)
    monkeypatch.setattr(FakeDocker, "exec", run_in, raising=False)
    yield made
    made.end.set()


def _deployed_per_gpu(world: dict[str, Any]) -> Any:
    """hp2 v1 on h1, h2 with one server per GPU (two instances each)."""
    result = runs.run_deploy(world, 1, count=2, gpus=2)
    assert result.exit_code == 0, result.message
    return runs.target(world, count=2, gpus=2)


def test_logs_read_every_instance_and_pass_since_as_a_unix_time(
        world: dict[str, Any], streams: Streams) -> None:
    chosen = _deployed_per_gpu(world)
    fleet_: FakeFleet = world["fleet"]
    shown: list[str] = []
    code = fleet.logs(chosen, lines=5, since="10m", follow=False, out=shown.append,
                      connect=fleet_.connect, now=lambda: NOW)
    assert code == 0, shown
    assert {(h, since) for h, _, since in streams.opened} == {("h1", NOW - 600),
                                                              ("h2", NOW - 600)}
    labels = sorted({line.split()[1] for line in shown})
    # each serving instance, and each host's proxy (its failed requests, servers down or up)
    assert labels == ["h1/i0", "h1/i1", "h1/proxy", "h2/i0", "h2/i1", "h2/proxy"]
    assert [line.split()[0] for line in shown] == sorted(line.split()[0] for line in shown)


def _follow_until_ctrl_c(chosen: Any, fleet_: FakeFleet) -> tuple[int, list[str]]:
    """`fab logs --follow` over the per-GPU fleet (``_deployed_per_gpu``), ended by the
    person's Ctrl-C once two lines of each of the six containers came; its exit code and
    lines. In the main thread,
    as `fab logs` runs: the look's own SIGINT handler ends the read (without it, the signal
    is a KeyboardInterrupt here and the test fails). A stream that blocked the others would
    never bring the 12th line: a Ctrl-C after 20 s ends the read then, with fewer lines."""
    shown: list[str] = []
    ended = threading.Event()

    def out(line: str) -> None:
        shown.append(line)
        if len(shown) == 12:
            signal.raise_signal(signal.SIGINT)

    def outside_the_look(signum: int, frame: Any) -> None:
        # the look's own handler replaces this one while it runs; a Ctrl-C raised by a
        # thread just as the look ended (the 20 s one on a slow machine) lands here instead
        # of as a KeyboardInterrupt in whichever test runs next
        if not ended.is_set():
            raise KeyboardInterrupt

    late = threading.Timer(20, signal.raise_signal, (signal.SIGINT,))
    before = signal.signal(signal.SIGINT, outside_the_look)
    late.start()
    try:
        code = fleet.logs(chosen, lines=5, since=None, follow=True, out=out,
                          connect=fleet_.connect)
    finally:
        ended.set()
        late.cancel()
        late.join()  # it sent its signal or never will; the main thread takes it below
        signal.signal(signal.SIGINT, before)
    return code, shown


def test_follow_reads_every_container_at_once_and_ctrl_c_ends_it(
        world: dict[str, Any], streams: Streams) -> None:
    code, shown = _follow_until_ctrl_c(_deployed_per_gpu(world), world["fleet"])
    assert len(shown) >= 12, f"a followed stream blocked the others: {shown}"
    assert code == 0, shown
    assert sorted({line.split()[1] for line in shown}) == ["h1/i0", "h1/i1", "h1/proxy",
                                                          "h2/i0", "h2/i1", "h2/proxy"]


def test_streams_cut_by_the_close_that_follows_ctrl_c_are_no_failure(
        world: dict[str, Any], streams: Streams, monkeypatch: pytest.MonkeyPatch) -> None:
    chosen = _deployed_per_gpu(world)  # before the streams are cut by every close
    streams.cut = threading.Event()
    close = LocalConnection.close

    def closing(self: LocalConnection) -> None:
        # the streams fail at once and have time to say so before the close returns
        assert streams.cut is not None
        streams.cut.set()
        threading.Event().wait(0.3)
        close(self)

    monkeypatch.setattr(LocalConnection, "close", closing)
    code, shown = _follow_until_ctrl_c(chosen, world["fleet"])
    assert code == 0, shown  # exit 3 would say a host failed; only Ctrl-C ended the streams
    assert not any("unreachable" in line for line in shown), shown


def _canary_on(host: FakeHost, weight: int) -> None:
    """A canary of release NEW in h1's green slot taking ``weight`` % of the requests."""
    blue = next(c for c in host.docker.by_name.values()
                if c.labels.get(f"{LABEL_PREFIX}.role") == "server")
    host.docker.add(f"tfs-{runs.MODEL}-{NEW}-i0", {
        **blue.labels, f"{LABEL_PREFIX}.release": NEW, f"{LABEL_PREFIX}.slot": "green",
        f"{LABEL_PREFIX}.version": "2"}, command=(
        f"--port={host.proxy.addresses[('grpc', 'i0-green')]}",
        f"--rest_api_port={host.proxy.addresses[('rest', 'i0-green')]}"))
    for backend in ("grpc", "rest"):
        host.proxy.servers[(backend, "i0-green")] = READY
        host.proxy.weights[(backend, "i0-green")] = weight
        host.proxy.weights[(backend, "i0-blue")] = 100 - weight


def test_exec_names_both_slots_of_a_canary_and_what_each_serves(
        world: dict[str, Any], streams: Streams) -> None:
    result = runs.run_deploy(world, 1, count=2)
    assert result.exit_code == 0, result.message
    fleet_: FakeFleet = world["fleet"]
    _canary_on(fleet_["h1"], 25)
    shown: list[str] = []
    code = fleet.exec_in(runs.target(world, count=2), ["hostname"], force=False,
                         out=shown.append, connect=fleet_.connect)
    assert code == 0, shown
    summary = shown[-1]
    assert summary == "exit codes: h1/blue 0, h1/green 0, h2 0", shown
    assert any(line.startswith("h1/green ") and NEW in line for line in shown), shown
    release = next(c.release for c in fleet_["h1"].docker.by_name.values()
                   if c.labels.get(f"{LABEL_PREFIX}.slot") == "blue")
    assert (f"h1: blue serves {release} (v1) 75% of new requests, green serves {NEW} (v2) "
            "25% of new requests") in shown


def test_status_of_a_canary_host_over_its_proxy(world: dict[str, Any]) -> None:
    result = runs.run_deploy(world, 1, count=2)
    assert result.exit_code == 0, result.message
    fleet_: FakeFleet = world["fleet"]
    _canary_on(fleet_["h1"], 25)
    rows = {r["host"]: r for r in fleet.status(runs.target(world, count=2),
                                                connect=fleet_.connect)}
    assert rows["h1"]["instances"][0]["traffic"] == {"blue": 75, "green": 25}
    assert rows["h2"]["instances"][0]["traffic"] == {"blue": 100}
