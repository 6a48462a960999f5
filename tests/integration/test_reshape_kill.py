"""kill -9 of `fab deploy` at each step of a proxy reshape, then the same deploy again: it
converges, with 0 failed requests through the stable ports.

Model ``itreshapekill`` on tb3 alone, one instance; each deploy moves its ports (port offset
5400, then 5450, 5520, 5550), which makes the deploy's first roll step rewrite the proxy's
configuration (the new stable ports bound beside every old one) and reload it. A client of
the first stable ports predicts from start to end. The kills:
- after the configuration is written, before the reload (seen on the host: haproxy.cfg
  rewritten, file_cue.py; the reload's `haproxy -c` comes first): the running worker binds
  the old ports only, and the deploy run again must read that from the worker, not from the
  file;
- after the reload signal (seen on the host: another worker answers the admin socket), before
  the old worker's runtime state is set on the new one;
- after the reshape step (its progress line).
Then a worker loaded on another configuration than the file's with the same servers and ports
(a setting changed): the next deploy reloads it and records what it loaded.
Each time the same deploy run again exits 0, the proxy listens on the new and every old
stable port (tb3's `ss`), and the new one answers with the deployed version.
"""

from __future__ import annotations

import dataclasses
import re
import subprocess
from collections.abc import Callable, Iterator

import pytest
from deploy_support import GOOD, Fleet, Traffic, assert_ports_free, fleet_fixture
from testbed_support import ADDRESSES, STATE, FileCue, expected_y, grpc_predict, netns

from tfsdeploy.core.render.host_proxy import shape_digest

pytestmark = pytest.mark.testbed

MODEL, OFFSET, HOST = "itreshapekill", 5400, "tb3"
MOVES = (5450, 5520, 5550)  # one offset per kill point (5500 would bind 14000: fab tune's first
# scratch port, which test_tune_scratch.py's tune on tb3 may hold at the same time)
ROOT = STATE / "hosts" / HOST / "srv" / MODEL  # the model's files as the root namespace sees
CONFIG = ROOT / "proxy" / "haproxy.cfg"
LOADED = ROOT / "proxy" / "loaded"  # the configuration the running worker was loaded on
ADMIN = ROOT / "proxy-admin" / "admin.sock"


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    for offset in MOVES:
        assert_ports_free(offset, {HOST: ADDRESSES[HOST]})
    yield from fleet_fixture(tmp_path_factory, MODEL, OFFSET, {1: GOOD[1], 2: GOOD[2]},
                             hosts={HOST: ADDRESSES[HOST]}, serial=(1,), min_healthy_s=1.0)


def admin(command: str) -> str:
    """A runtime-API command on the model's proxy on tb3 (from the root namespace)."""
    return subprocess.run(["socat", "-t", "2", "-", f"UNIX-CONNECT:{ADMIN}"],
                          input=command + "\n", capture_output=True, text=True, timeout=10,
                          check=True).stdout


STABLE = {8500 + o for o in (OFFSET, *MOVES)} | {8501 + o for o in (OFFSET, *MOVES)}


def listening() -> set[int]:
    """The model's stable ports (of every offset the module uses) something listens on in
    tb3, as its kernel says (`ss`): only the model's proxy binds them."""
    out = subprocess.run(netns(HOST, "ss", "-Hltn"), capture_output=True, text=True,
                         timeout=10, check=True).stdout
    ports = {int(line.split()[3].rpartition(":")[2]) for line in out.splitlines()
             if len(line.split()) > 3}
    return ports & STABLE


def worker() -> int | None:
    """The pid of the worker that answers the admin socket (None: none answers)."""
    try:
        info = admin("show info")
    except (subprocess.CalledProcessError, subprocess.TimeoutExpired):
        return None
    return next((int(line.split(":")[1]) for line in info.splitlines()
                 if line.startswith("Pid:")), None)


def moved_inventory(fleet: Fleet, offset: int) -> str:
    path = fleet.tmp / f"inventory_{offset}.py"
    text = fleet.inventory.read_text()
    assert f"port_offset={OFFSET!r}," in text
    path.write_text(text.replace(f"port_offset={OFFSET!r},", f"port_offset={offset!r},"))
    return str(path)


def reloaded(before: int | None) -> Callable[[], bool]:
    """Another worker than ``before`` answers the admin socket."""
    return lambda: worker() not in (before, None)


def test_a_reshape_killed_at_each_step_converges_when_run_again(fleet: Fleet) -> None:
    fleet.deploy(1)
    first = {8500 + OFFSET, 8501 + OFFSET}
    assert listening() == first
    bound = set(first)
    version = 1
    with Traffic(fleet, HOST, rest=True) as client:  # a client of the first stable ports
        for point, offset in zip(("written", "reloaded", "reshaped"), MOVES, strict=True):
            version = 3 - version
            new = {8500 + offset, 8501 + offset}
            argv = ("deploy", "--version", str(version))
            inventory = moved_inventory(fleet, offset)
            cue = FileCue(CONFIG) if point == "written" else None
            killed = fleet.background(*argv, inventory=inventory, own_session=True)
            if cue is not None:
                killed.kill_on_change(cue, "the proxy's configuration rewritten on tb3")
                assert f"bind :{8500 + offset} " in CONFIG.read_text()
                assert listening() == bound, "the reload came before the kill"
            elif point == "reloaded":
                killed.kill_if(reloaded(worker()), "a new proxy worker on tb3")
            else:
                killed.kill_when(rf"{HOST} +roll +reshape_proxy +ok")
            assert killed.proc.returncode == -9, killed.describe()
            again = fleet.fab(*argv, inventory=inventory)
            assert again.code == 0, f"killed after {point}\n{again.describe()}"
            assert "broke a stale lock" in again.out, again.describe()
            bound |= new
            assert listening() == bound, (point, listening())
            got = grpc_predict(ADDRESSES[HOST], 8500 + offset, MODEL, [2.0])
            assert got == pytest.approx([expected_y(version, 2.0)]), (point, got)
            print(f"\nkilled after {point!r}, the same deploy again: exit 0 in "
                  f"{again.seconds:.1f} s; the worker listens on {sorted(bound)}")
    print(f"\na client of :{8500 + OFFSET}/:{8501 + OFFSET} through the three kills: "
          f"{client.ok} answers, {len(client.failures)} failed")
    assert not client.failures, client.failures[:5]
    assert client.ok > 100, client.ok

    # the model's next deploy drops the old ports (a reload); then, under a client of the
    # ports it kept, the worker was loaded on a configuration other than haproxy.cfg's with
    # the same servers and ports (a setting a newer toolkit changed; faked in the record of
    # what it loaded): the deploy after reloads it, seamlessly, and records the file's
    last = moved_inventory(fleet, MOVES[-1])
    version = 3 - version
    dropped = fleet.fab("deploy", "--version", str(version), inventory=last)
    assert dropped.code == 0, dropped.describe()
    assert listening() == {8500 + MOVES[-1], 8501 + MOVES[-1]}, listening()
    assert LOADED.read_text() == shape_digest(CONFIG.read_text()) + "\n"
    LOADED.write_text(shape_digest(CONFIG.read_text() + "\n# another setting\n") + "\n")
    before = worker()
    with Traffic(dataclasses.replace(fleet, offset=MOVES[-1]), HOST, rest=True) as kept:
        settled = fleet.fab("deploy", "--version", str(3 - version), inventory=last)
    assert settled.code == 0, settled.describe()
    assert re.search(rf"{HOST} +roll +reshape_proxy +ok .* reloaded: .*its worker was not "
                     "loaded on this configuration", settled.out), settled.describe()
    assert worker() not in (before, None), "the proxy was not reloaded"
    assert LOADED.read_text() == shape_digest(CONFIG.read_text()) + "\n"
    print(f"a setting the worker was not loaded on: reloaded by the next deploy; a client of "
          f":{8500 + MOVES[-1]}/:{8501 + MOVES[-1]}: {kept.ok} answers, "
          f"{len(kept.failures)} failed")
    assert not kept.failures, kept.failures[:5]
    assert kept.ok > 20, kept.ok

