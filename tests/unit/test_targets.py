"""The model's file_sd targets a run publishes (run/targets.py) over fake hosts: one target per
running server, IPv6 addresses bracketed; a host that cannot be read keeps the targets it had,
read back from the local file or, without one, from the first monitoring host that holds the
file; when no monitoring host can say what they were, their files are left as they are."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tfsdeploy.core.inventory.fleet import Group, Host
from tfsdeploy.core.inventory.load import Inventory, build_inventory
from tfsdeploy.core.inventory.monitoring import Monitoring
from tfsdeploy.core.observe.prometheus import scrape_address
from tfsdeploy.core.target import Target
from tfsdeploy.run.jobs import Session
from tfsdeploy.run.targets import publish_targets

from .fakes import FakeFleet, FrozenClock
from .helpers import model

OLD, NEW = "r20261201-000000000-v1", "r20261202-000000000-v2"


def _inventory(tmp: Path, monitoring: Monitoring) -> Inventory:
    """h1 (IPv4) and h2 (IPv6) serve m; mon1 and mon2 run Prometheus."""
    hosts = [Host(name, address, vars={"data_root": f"{tmp}/{name}/r"})
             for name, address in (("h1", "10.0.0.1"), ("h2", "fd00::2"),
                                   ("mon1", "10.0.0.8"), ("mon2", "10.0.0.9"))]
    return build_inventory(str(tmp / "inv.py"), hosts=hosts,
                           groups={"g": Group(["h1", "h2"]), "mon": Group(["mon1", "mon2"])},
                           defaults={}, models=[model(hosts="g")], monitoring=monitoring)


@pytest.fixture()
def fleet() -> FakeFleet:
    return FakeFleet()


def _serve(fleet: FakeFleet, target: Target, host: str, release: str, slot: str) -> None:
    """A running server of m on ``host`` (the only one there)."""
    resolved = next(h for h in target.inventory.hosts if h.name == host)
    fake = fleet.host(resolved)
    fake.docker.by_name.clear()
    fake.docker.add(f"tfs-m-{release}-i0", {
        "tfsdeploy.model": "m", "tfsdeploy.role": "server", "tfsdeploy.release": release,
        "tfsdeploy.slot": slot, "tfsdeploy.version": release[-1], "tfsdeploy.instance": "0"})


def _publish(fleet: FakeFleet, target: Target) -> list[str]:
    for host in target.inventory.hosts:
        fleet.host(host)  # every fake host exists (the unreachable ones too)
    return publish_targets(target, session=Session(connections={}, clock=FrozenClock(),
                                                   connect=fleet.connect))


def _targets(text: str) -> list[tuple[str, str, str]]:
    return [(g["labels"]["host"], g["targets"][0], g["labels"]["release"])
            for g in json.loads(text)]


def test_an_ipv6_target_is_bracketed_as_prometheus_splits_it() -> None:
    assert scrape_address("fd00::2", 8511) == "[fd00::2]:8511"
    assert scrape_address("fe80::1%eth0", 8511) == "[fe80::1%eth0]:8511"  # the zone as is
    assert scrape_address("10.0.0.1", 8511) == "10.0.0.1:8511"
    assert scrape_address("gpu-a01.example", 8511) == "gpu-a01.example:8511"


def test_a_host_not_read_keeps_its_targets_from_the_local_file(
        tmp_path: Path, fleet: FakeFleet) -> None:
    inv = _inventory(tmp_path, Monitoring(local_targets_dir="targets"))
    target = Target(inv, inv.model("m"), inv.hosts)
    _serve(fleet, target, "h1", OLD, "blue")
    _serve(fleet, target, "h2", OLD, "blue")
    (written,) = _publish(fleet, target)
    assert _targets(Path(written).read_text()) == [("h1", "10.0.0.1:8511", OLD),
                                                   ("h2", "[fd00::2]:8511", OLD)]
    _serve(fleet, target, "h1", NEW, "green")
    fleet["h2"].unreachable = True
    _publish(fleet, target)
    assert _targets(Path(written).read_text()) == [("h1", "10.0.0.1:8521", NEW),
                                                   ("h2", "[fd00::2]:8511", OLD)]


def test_without_a_local_file_a_host_not_read_keeps_the_monitoring_hosts_targets(
        tmp_path: Path, fleet: FakeFleet) -> None:
    remote = tmp_path / "prometheus-targets"
    inv = _inventory(tmp_path, Monitoring(hosts="mon", targets_dir=str(remote)))
    target = Target(inv, inv.model("m"), inv.hosts)
    _serve(fleet, target, "h1", OLD, "blue")
    _serve(fleet, target, "h2", OLD, "blue")
    assert _publish(fleet, target) == [f"mon1:{remote}/m.json", f"mon2:{remote}/m.json"]
    _serve(fleet, target, "h1", NEW, "green")
    fleet["h2"].unreachable = True
    fleet["mon1"].unreachable = True  # the first Prometheus host is down: the second says
    assert _publish(fleet, target) == [f"mon2:{remote}/m.json"]
    assert _targets((remote / "m.json").read_text()) == [("h1", "10.0.0.1:8521", NEW),
                                                         ("h2", "[fd00::2]:8511", OLD)]


def test_when_no_monitoring_host_says_what_a_host_had_the_files_are_left_as_they_are(
        tmp_path: Path, fleet: FakeFleet, capsys: pytest.CaptureFixture[str]) -> None:
    remote = tmp_path / "prometheus-targets"
    inv = _inventory(tmp_path, Monitoring(hosts="mon", targets_dir=str(remote)))
    target = Target(inv, inv.model("m"), inv.hosts)
    _serve(fleet, target, "h1", OLD, "blue")
    _serve(fleet, target, "h2", OLD, "blue")
    _publish(fleet, target)
    before = (remote / "m.json").read_text()
    (remote / "m.json").write_text("{not json")  # what it was cannot be read back
    fleet["h2"].unreachable = True
    assert _publish(fleet, target) == []
    assert (remote / "m.json").read_text() == "{not json"  # not rewritten without h2
    assert "the targets of m were left as they are: h2 could not be read, and no " \
           "monitoring host gave its previous targets" in capsys.readouterr().err
    (remote / "m.json").write_text(before)
    fleet["h2"].unreachable = False
    _serve(fleet, target, "h2", NEW, "green")
    _publish(fleet, target)  # read again: its targets follow what serves
    assert _targets((remote / "m.json").read_text())[1] == ("h2", "[fd00::2]:8521", NEW)


def test_a_first_publish_with_a_host_not_read_writes_what_was_read(
        tmp_path: Path, fleet: FakeFleet) -> None:
    """No monitoring host holds the file yet: nothing was known of the host not read."""
    remote = tmp_path / "prometheus-targets"
    inv = _inventory(tmp_path, Monitoring(hosts="mon", targets_dir=str(remote)))
    target = Target(inv, inv.model("m"), inv.hosts)
    _serve(fleet, target, "h1", OLD, "blue")
    fleet.host(next(h for h in inv.hosts if h.name == "h2")).unreachable = True
    written: Any = _publish(fleet, target)
    assert written == [f"mon1:{remote}/m.json", f"mon2:{remote}/m.json"]
    assert _targets((remote / "m.json").read_text()) == [("h1", "10.0.0.1:8511", OLD)]
