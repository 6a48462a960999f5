"""A signal after the roll never rewrites or erases what the run recorded: `fab deploy
--json-file F --metrics-file P`, sent SIGTERM (and, in another run, Ctrl-C) once every host has
finished its roll while its after-passes still run (the model's Prometheus targets go to a
monitoring host whose SSH port is filtered), leaves F and P with the roll's own exit code,
says the signal, and ends at once.

Model ``itaftersig`` on tb1 (port offset 5300). The monitoring host is tb3 reached on its
second sshd port (ALT_SSH_PORT), which a DROP rule in tb3's network namespace filters while a
signalled deploy runs: the targets pass's SSH connection hangs in its TCP connect, as to a
Prometheus host behind a firewall that drops it. The other modules keep port 22.
"""

from __future__ import annotations

import json
import re
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from deploy_support import CORRUPT, GOOD, Fleet, Partition, fleet_fixture, remove_partition_rules
from testbed_support import ADDRESSES, ALT_SSH_PORT, Watched, ssh

from tests.bounds import within

# filters new SSH connections to a host's second sshd port, which the other modules that cut
# one use too: the modules of the group "ssh-cut" run one after another (tests/conftest.py)
pytestmark = [pytest.mark.testbed, pytest.mark.xdist_group("ssh-cut")]

MODEL, OFFSET = "itaftersig", 5300
HOSTS = {"tb1": ADDRESSES["tb1"]}
MONITORING = "tb3"  # the Prometheus host, on ALT_SSH_PORT
TARGETS_DIR = "/srv/itaftersig-prometheus-targets"


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    for made in fleet_fixture(tmp_path_factory, MODEL, OFFSET, {1: GOOD[1], 2: GOOD[2],
                                                                3: CORRUPT},
                              serial=(1,), hosts=HOSTS, tidy=remove_partition_rules):
        text = made.inventory.read_text()
        text = text.replace("        port_offset=", '        hosts="canary",\n'
                            "        port_offset=", 1)
        text += ("\nfrom tfsdeploy.core.inventory.monitoring import Monitoring\n"
                 f"hosts.append(Host('prom', {ADDRESSES[MONITORING]!r}, "
                 f"vars={{'ssh_port': {ALT_SSH_PORT}}}))\n"
                 f"monitoring = Monitoring(hosts='prom', targets_dir={TARGETS_DIR!r})\n")
        made.inventory.write_text(text)
        run = made.fab("deploy", "--version", "1")  # its targets reach tb3: nothing filtered
        assert run.code == 0, run.describe()
        assert MODEL in ssh(MONITORING, f"cat {TARGETS_DIR}/*").stdout
        try:
            yield made
        finally:
            ssh(MONITORING, f"rm -rf {TARGETS_DIR}", check=False)


def signalled_deploy(fleet: Fleet, tmp: Path, version: int, sig: int
                     ) -> tuple[int, dict[str, object], str, float, str]:
    """Deploy ``version`` and send ``sig`` once its result is recorded (the JSON file written:
    the after-passes run from then on); returns (exit code, JSON result, textfile, seconds
    from the signal to the exit, output)."""
    result, metrics = tmp / f"result-{version}.json", tmp / f"tfsdeploy-{version}.prom"
    with Partition(MONITORING, None, None):  # new connections to tb3's ALT_SSH_PORT dropped
        watched = Watched(fleet.argv("deploy", "--version", str(version), "--json-file",
                                     str(result), "--metrics-file", str(metrics)), fleet.log)
        end = time.monotonic() + 300
        while not result.exists():
            assert watched.proc.poll() is None, watched.text()
            assert time.monotonic() < end, watched.text()
            time.sleep(0.05)
        time.sleep(0.5)  # the targets' after-pass is under way, its TCP connect hanging
        assert watched.proc.poll() is None, "the run ended before its after-passes were cut"
        sent = time.monotonic()
        watched.send(sig)
        run = watched.finish(timeout=60)
    return (run.code, json.loads(result.read_text()), metrics.read_text(),
            time.monotonic() - sent, run.out)


def exit_sample(textfile: str) -> int:
    found = re.search(r'^tfsdeploy_last_run_exit_code\{[^}]*command="deploy"[^}]*\} (\d+)(?:\.0)?$',
                      textfile, re.M)
    assert found, textfile
    return int(found[1])


def test_sigterm_during_the_after_passes_leaves_the_roll_s_result(fleet: Fleet,
                                                                  tmp_path: Path) -> None:
    code, result, textfile, seconds, out = signalled_deploy(fleet, tmp_path, 2,
                                                            signal.SIGTERM)
    assert code == 0, out
    assert result["exit_code"] == 0 and exit_sample(textfile) == 0
    assert "SIGTERM after the roll: its result stands as recorded" in out, out
    # the signal leaves the hanging pass at once (a 0.1 s poll), then the connections close
    # measured in a full run (2 cores, 4 workers beside it): 0.639 s, margin 15.7x;
    # scripts/test prints it every run
    within("SIGTERM to the exit, s", seconds, below=10, detail=out)
    fleet.assert_serving(2)


def test_ctrl_c_during_the_after_passes_of_a_failed_roll_leaves_exit_2(fleet: Fleet,
                                                                      tmp_path: Path) -> None:
    code, result, textfile, seconds, out = signalled_deploy(fleet, tmp_path, 3,
                                                            signal.SIGINT)
    assert code == 2, out
    assert result["exit_code"] == 2 and exit_sample(textfile) == 2
    assert "SIGINT after the roll: its result stands as recorded" in out, out
    assert "interrupted before any host was changed" not in out
    # as for SIGTERM; measured in a full run (2 cores, 4 workers beside it): 0.565 s, margin 17.7x;
    # scripts/test prints it every run
    within("Ctrl-C to the exit, s", seconds, below=10, detail=out)
    fleet.assert_serving(2)
