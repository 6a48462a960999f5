"""Exact commands and specs: argument lists, quoted once at the SSH boundary, hostile names
included; batches; the proxy's runtime commands and `show stat`; the Engine's container list."""

from __future__ import annotations

import shlex
import subprocess
from pathlib import Path

import pytest

from tfsdeploy.core.inventory.layout import HostPaths, Ports
from tfsdeploy.core.render.host_proxy import parse_stat, set_state, switch_commands
from tfsdeploy.core.rollout.batches import batch_size, plan_batches, threshold_exceeded
from tfsdeploy.hosts.commands.containers import Mount, server_spec
from tfsdeploy.hosts.commands.files import UnsafePath, append_lines, point_symlink, remove_tree
from tfsdeploy.hosts.dockerapi import container_fact, sdk_arguments
from tfsdeploy.hosts.facts import ProxyFact, parse_facts

PORTS = Ports(grpc=8500, rest=8501, slots={"blue": (8510, 8511), "green": (8520, 8521)})
RELEASE = "r20261130-100000000-v3"


def test_server_spec() -> None:
    paths = HostPaths(root="/srv/tfsdeploy", model="m")
    spec = server_spec(model="m", release_id=RELEASE, slot="green", version=3,
                       image="reg/tfs:2.21.0", paths=paths, ports=PORTS,
                       flags=["--enable_batching=true"], gpus=None)
    assert spec.name == f"tfs-m-{RELEASE}-i0"
    assert Mount("/srv/tfsdeploy/models/m", "/models/m", read_only=True) in spec.mounts
    assert Mount(f"/srv/tfsdeploy/m/releases/{RELEASE}", "/etc/tfsdeploy",
                 read_only=True) in spec.mounts
    assert spec.image == "reg/tfs:2.21.0"
    assert spec.command == ("--enable_batching=true", "--port=8520", "--rest_api_port=8521")
    assert spec.entrypoint == ("/usr/bin/tensorflow_model_server",)
    assert spec.labels["tfsdeploy.slot"] == "green" and spec.labels["tfsdeploy.version"] == "3"
    run = sdk_arguments(spec)
    assert (run["name"], run["image"], run["network_mode"]) == (spec.name, spec.image, "host")
    assert run["entrypoint"] == ["/usr/bin/tensorflow_model_server"]
    assert run["command"] == list(spec.command) and run["detach"] is True
    assert run["cap_drop"] == ["ALL"] and run["security_opt"] == ["no-new-privileges"]
    assert run["read_only"] is True and "/tmp" in run["tmpfs"]
    assert [(m["Source"], m["Target"], m["ReadOnly"]) for m in run["mounts"]] == [
        ("/srv/tfsdeploy/models/m", "/models/m", True),
        (f"/srv/tfsdeploy/m/releases/{RELEASE}", "/etc/tfsdeploy", True)]


def test_hostile_values_stay_single_arguments(tmp_path: Path) -> None:
    hostile = "x; rm -rf / #"
    log = str(tmp_path / "a b" / "audit.log")
    argv = append_lines(log, [hostile, "$(id)"])
    assert argv[-3:] == [log, hostile, "$(id)"]
    # quoting happens once: the shell sees the same words back
    assert shlex.split(shlex.join(argv)) == argv
    subprocess.run(["sh", "-c", shlex.join(argv)], check=True)
    assert Path(log).read_text() == f"{hostile}\n$(id)\n"
    link = str(tmp_path / "current")
    swap = point_symlink("releases/$(id)", link)
    assert shlex.split(shlex.join(swap))[4] == "releases/$(id)"
    subprocess.run(["sh", "-c", shlex.join(swap)], check=True)
    assert Path(link).readlink() == Path("releases/$(id)")


def test_remove_tree_refuses_paths_outside_its_root() -> None:
    root = "/srv/tfsdeploy/m"
    assert remove_tree(f"{root}/releases/{RELEASE}", root=root) == [
        "rm", "-rf", "--", f"{root}/releases/{RELEASE}"]
    for path in (f"{root}/releases/../../../../etc", "/etc", root, f"{root}/", "/srv/tfsdeploy",
                 f"{root}x/releases", "releases/x", f"{root}/./x", f"{root}//x", ""):
        with pytest.raises(UnsafePath):
            remove_tree(path, root=root)
    with pytest.raises(UnsafePath):
        remove_tree("/srv/x", root="relative")


def test_batches_follow_serial_and_the_last_step_repeats() -> None:
    hosts = list(range(8))
    assert [len(b) for b in plan_batches(hosts, (1, "25%", "100%"))] == [1, 2, 5]
    assert [len(b) for b in plan_batches(hosts, (3,))] == [3, 3, 2]
    assert [len(b) for b in plan_batches(hosts, ("10%",))] == [1] * 8
    assert batch_size("50%", 3) == 1 and batch_size(2, 3) == 2
    assert plan_batches([], (1,)) == []


def test_threshold_is_inclusive() -> None:
    assert not threshold_exceeded(2, 8, 25)
    assert threshold_exceeded(3, 8, 25)
    assert threshold_exceeded(1, 8, 0)
    assert not threshold_exceeded(0, 8, 0)


def test_switch_and_maint_commands() -> None:
    assert switch_commands(0, "green", "blue") == [
        "set server grpc/i0-green state ready", "set server rest/i0-green state ready",
        "set server grpc/i0-blue state drain", "set server rest/i0-blue state drain"]
    assert switch_commands(0, "blue", None)[2:] == set_state(0, "green", "maint")
    assert set_state(0, "green", "maint") == ["set server grpc/i0-green state maint",
                                              "set server rest/i0-green state maint"]


HEADER = ("# pxname,svname,qcur,qmax,scur,smax,slim,stot,bin,bout,dreq,dresp,ereq,econ,eresp,"
          "wretr,wredis,status,weight\n")
STAT = HEADER + """grpc,FRONTEND,,,3,9,8000,40,0,0,0,0,0,,,,,OPEN,
grpc,i0-blue,0,0,2,5,,20,0,0,,0,,0,0,0,0,DRAIN,1
grpc,i0-green,0,0,1,4,,20,0,0,,0,,0,0,0,0,no check,1
grpc,BACKEND,0,0,3,9,800,40,0,0,0,0,,0,0,0,0,UP,1
rest,i0-blue,0,0,0,0,,0,0,0,,0,,0,0,0,0,MAINT,1
rest,i0-green,0,0,0,0,,0,0,0,,0,,0,0,0,0,no check,1
"""


def test_show_stat_parsing() -> None:
    servers = parse_stat(STAT)
    assert {(s.backend, s.slot): s.sessions for s in servers} == {
        ("grpc", "blue"): 2, ("grpc", "green"): 1, ("rest", "blue"): 0, ("rest", "green"): 0}
    assert ProxyFact(True, servers, True).serving_slot(0) == "green"


def test_containers_from_the_engines_list() -> None:
    server = {"Names": [f"/tfs-m-{RELEASE}-i0"], "State": "running",
              "Status": "Up 3 minutes", "Image": "reg/tfs:2.21.0",
              "Labels": {"tfsdeploy.model": "m", "tfsdeploy.role": "server",
                         "tfsdeploy.release": RELEASE, "tfsdeploy.slot": "blue",
                         "tfsdeploy.version": "4"}}
    proxy = {"Names": ["/tfs-proxy-m"], "State": "running",
             "Labels": {"tfsdeploy.model": "m", "tfsdeploy.core.render.host_proxy": "m"}}
    facts = [container_fact(server), container_fact(proxy)]
    assert all(f is not None for f in facts)
    only, = parse_facts("h", "@@end\n", [f for f in facts if f]).servers
    assert (only.name, only.release, only.slot, only.version, only.running) == (
        f"tfs-m-{RELEASE}-i0", RELEASE, "blue", 4, True)
