"""Exact commands: argument lists, quoted once at the SSH boundary, hostile names included."""

from __future__ import annotations

import shlex

from tfsdeploy import commands
from tfsdeploy.batches import batch_size, plan_batches, threshold_exceeded
from tfsdeploy.layout import HostPaths, Ports
from tfsdeploy.proxy import maint_commands, parse_sessions, switch_commands
from tfsdeploy.state import parse_containers, traffic_slot

PORTS = Ports(grpc=8500, rest=8501, slots={"blue": (8510, 8511), "green": (8520, 8521)},
              admin=8599)


def test_run_slot_argv() -> None:
    paths = HostPaths(root="/srv/tfsdeploy", model="m")
    argv = commands.run_slot(model="m", release_id="r1", slot="green", version=3,
                             image="reg/tfs:2.21.0", paths=paths, ports=PORTS,
                             flags=["--enable_batching=true"], gpus=None)
    assert argv[:4] == ["docker", "run", "--detach", "--name"]
    assert argv[argv.index("--name") + 1] == "tfs-m-r1"
    assert "/srv/tfsdeploy/models/m:/models/m:ro" in argv
    assert "/srv/tfsdeploy/m/releases/r1:/etc/tfsdeploy:ro" in argv
    assert argv[-4:] == ["reg/tfs:2.21.0", "--enable_batching=true", "--port=8520",
                         "--rest_api_port=8521"]
    assert argv[argv.index("--entrypoint") + 1] == "/usr/bin/tensorflow_model_server"


def test_hostile_values_stay_single_arguments() -> None:
    hostile = "x; rm -rf / #"
    argv = commands.append_line("/srv/a b/audit.log", hostile)
    assert argv[-2:] == [hostile, "/srv/a b/audit.log"]
    # quoting happens once: the shell sees the same words back
    assert shlex.split(shlex.join(argv)) == argv
    assert shlex.split(shlex.join(commands.point_symlink("releases/$(id)", "/x/current")))[4] \
        == "releases/$(id)"


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
    assert switch_commands("green", "blue") == [
        "set server grpc/green state ready", "set server rest/green state ready",
        "set server grpc/blue state drain", "set server rest/blue state drain"]
    assert switch_commands("blue", None)[2:] == maint_commands("green")


HEADER = ("# pxname,svname,qcur,qmax,scur,smax,slim,stot,bin,bout,dreq,dresp,ereq,econ,eresp,"
          "wretr,wredis,status\n")
STAT = HEADER + """grpc,FRONTEND,,,3,9,8000,40,0,0,0,0,0,,,,,OPEN
grpc,blue,0,0,2,5,,20,0,0,,0,,0,0,0,0,DRAIN
grpc,green,0,0,1,4,,20,0,0,,0,,0,0,0,0,no check
grpc,BACKEND,0,0,3,9,800,40,0,0,0,0,,0,0,0,0,UP
rest,blue,0,0,0,0,,0,0,0,,0,,0,0,0,0,MAINT
rest,green,0,0,0,0,,0,0,0,,0,,0,0,0,0,no check
"""


def test_show_stat_parsing() -> None:
    assert parse_sessions(STAT) == {("grpc", "blue"): 2, ("grpc", "green"): 1,
                                    ("rest", "blue"): 0, ("rest", "green"): 0}
    assert traffic_slot(STAT) == "green"


def test_parse_containers_from_docker_ps() -> None:
    line = ('{"Names":"tfs-m-r1","State":"running","Status":"Up 3 minutes","Labels":'
            '"tfsdeploy.model=m,tfsdeploy.release=r1,tfsdeploy.slot=blue,tfsdeploy.version=4"}\n'
            '{"Names":"tfs-proxy-m","State":"running","Labels":"tfsdeploy.proxy=m"}\n')
    (only,) = parse_containers(line)
    assert (only.name, only.release, only.slot, only.version, only.running) == (
        "tfs-m-r1", "r1", "blue", 4, True)
