"""The unattended path's outputs on the local fleet: a real `fab deploy` whose stdout is a pipe
whose reader stopped after the first line (`fab deploy ... | head -1`) still exits with the
run's code and writes its JSON result and textfile; a playbook's remote step whose argv
starts with `NAME=` or `-` runs as given through the real sshd, login shell, env and sh.

Model ``itunattended`` on tb1, port offset 3000, version 1 (half_plus_two 1). The
remote-step test uses no model or port: its programs live in a directory of root's home on
tb1 that it owns (``ITUA_MARK=d``, ``-itua``) and removes.
"""

from __future__ import annotations

import json
import subprocess
import time
from collections.abc import Iterator

import pytest
from deploy_support import GOOD, Fleet, fleet_fixture
from testbed_support import HOSTS, REPO, fab_env, ssh

from tfsdeploy.cli.unattended import read_samples
from tfsdeploy.core.inventory.load import load_inventory
from tfsdeploy.hosts.commands.steps import remote_step
from tfsdeploy.hosts.ssh import SshConnection

pytestmark = pytest.mark.testbed

MODEL, OFFSET = "itunattended", 3000


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    # one host: the pipe and the interpreter are what is tested, not the roll
    yield from fleet_fixture(tmp_path_factory, MODEL, OFFSET, {1: GOOD[1]},
                             serial=(1, "100%"), hosts={"tb1": HOSTS["tb1"]})


def deploy_into_head_1(fleet: Fleet, version: int) -> tuple[int, str, dict[str, object],
                                                             dict[str, float]]:
    """`fab deploy --version V ... | head -1`: the reader takes the first line and goes.
    Returns (exit code, the line read, the JSON result, the textfile's samples)."""
    json_file, metrics = fleet.tmp / f"v{version}.json", fleet.tmp / "tfsdeploy.prom"
    argv = fleet.argv("deploy", "--version", str(version), "--json-file", str(json_file),
                      "--metrics-file", str(metrics))
    proc = subprocess.Popen(argv, cwd=REPO, env=fab_env(), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    assert proc.stdout is not None and proc.stderr is not None
    first = proc.stdout.readline()
    proc.stdout.close()  # head exits: every later write to stdout is EPIPE
    err = proc.stderr.read()
    code = proc.wait(timeout=600)
    assert "Traceback" not in err and "Exception ignored" not in err, err
    return code, first, json.loads(json_file.read_text()), read_samples(str(metrics))


def test_a_deploy_piped_into_a_reader_that_stops_keeps_its_exit_code_and_outputs(
        fleet: Fleet) -> None:
    # one real deploy: the exit-2 and exit-3 endings through a dead stdout are the unit
    # tier's (tests/unit/test_unattended_outputs.py); here the real pipe and interpreter
    started = time.monotonic()
    code, first, written, samples = deploy_into_head_1(fleet, 1)
    key = f'tfsdeploy_last_run_exit_code{{command="deploy",model="{MODEL}"}}'
    assert first.strip(), "the reader got the first progress line"
    assert (code, written["exit_code"], samples[key]) == (0, 0, 0), written.get("message")
    assert written["result"] == "ok" and set(written["hosts"]) == set(fleet.hosts)
    fleet.assert_serving(1)
    print(f"the piped deploy: {time.monotonic() - started:.1f} s")


# `--`: the kernel hands the script's path to sh, which would read a leading '-' as options
PROGRAM = '#!/bin/sh --\nprintf "%s|" "$0" "$@" "$TFSDEPLOY_HOST" > "$HOME/{out}"\n'


@pytest.mark.parametrize(("argv", "place"), [
    (["ITUA_MARK=d/prog", "first", "--second"], "ITUA_MARK=d"),
    (["-itua/prog", "-x", "NAME=y"], "-itua"),
], ids=["NAME= first", "dash first"])
def test_a_remote_step_whose_argv_starts_with_an_assignment_or_a_dash_runs_as_given(
        fleet: Fleet, argv: list[str], place: str) -> None:
    out = f"{place}/ran.txt"
    ssh("tb1", f"mkdir -p -- '{place}' && printf '%s' '{PROGRAM.format(out=out)}' > "
               f"'{place}/prog' && chmod 755 -- '{place}/prog' && rm -f -- '{out}'")
    host = load_inventory(str(fleet.inventory)).host("tb1")
    conn = SshConnection(host)
    try:
        done = conn.run(remote_step({"TFSDEPLOY_HOST": "tb1"}, argv), timeout=60)
        assert done.ok, (done.stdout, done.stderr)
        ran = ssh("tb1", f"cat -- '{out}'").stdout
    finally:
        conn.close()
        ssh("tb1", f"rm -rf -- '{place}'", check=False)
    assert ran == "|".join([*argv, "tb1"]) + "|"

