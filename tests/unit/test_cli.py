"""`fab` as a user types it, from the repository root."""

from __future__ import annotations

import importlib.util
import inspect
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
FAB = str(Path(sys.executable).with_name("fab"))


def _fab(*args: str, tmp_path: Path) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, TFSDEPLOY_TESTBED_DIR=str(tmp_path / "no-testbed"))
    return subprocess.run([FAB, *args], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=120, check=False)


def test_fab_list_shows_tasks(tmp_path: Path) -> None:
    result = _fab("--list", tmp_path=tmp_path)
    assert result.returncode == 0, result.stderr
    assert "render" in result.stdout and "hosts" in result.stdout


def test_fab_render_writes_one_folder_per_host(tmp_path: Path) -> None:
    out = tmp_path / "out"
    result = _fab("render", "--model", "resnet50", "--version", "2", "--hosts", "tb1,tb3",
                  "--out", str(out), tmp_path=tmp_path)
    assert result.returncode == 0, result.stderr
    assert sorted(p.name for p in out.iterdir()) == ["tb1", "tb3"]
    assert sorted(p.name for p in (out / "tb1" / "resnet50").iterdir()) == [
        "batching.config", "models.config", "monitoring.config", "proxy", "tfserving.flags"]
    assert "versions: 2" in (out / "tb3" / "resnet50" / "models.config").read_text()
    assert "tb1" in result.stdout and "0.150" in result.stdout


def test_fab_render_shows_what_cuda_can_allocate_beside_nvidia_smis_total(
        tmp_path: Path) -> None:
    # the testbed inventory declares what `scripts/testbed up --gpu-card tb1=h200` wrote
    state = tmp_path / "no-testbed"
    state.mkdir()
    (state / "hosts.json").write_text(json.dumps({"hosts": [
        {"name": "tb1", "address": "10.87.0.11", "reserved": False, "gpus": [
            {"index": 0, "name": "Simulated NVIDIA H200", "memory_mib": 143771,
             "reserved_mib": 616}]}]}))
    out = tmp_path / "out"
    result = _fab("render", "--model", "resnet50", "--version", "2", "--out", str(out),
                  tmp_path=tmp_path)
    assert result.returncode == 0, result.stderr
    line = ("tb1: CUDA total 143155 MiB = 143771 MiB (nvidia-smi memory.total) - 616 MiB "
            "(memory.reserved); fraction = ceil(2048 MiB x 1.2 / 143155 MiB, 3 places) = "
            "0.018, pool 2576 MiB per process")
    assert line in result.stdout, result.stdout
    assert line.removeprefix("tb1: ") in (out / "tb1" / "resnet50" / "tfserving.flags").read_text()


def test_fab_render_writes_a_proxy_config_haproxy_accepts(tmp_path: Path) -> None:
    out = tmp_path / "out"
    result = _fab("render", "--model", "resnet50", "--version", "1", "--out", str(out),
                  "--hosts", "tb2", tmp_path=tmp_path)
    assert result.returncode == 0, result.stderr
    configs = list(out.glob("*/*/proxy/haproxy.cfg"))
    assert len(configs) == 1
    text = configs[0].read_text()
    assert "bind :8500 proto h2" in text and "bind :8501" in text
    assert "server i0-blue 127.0.0.1:" in text and " disabled" in text
    haproxy = shutil.which("haproxy") or "/usr/sbin/haproxy"
    assert Path(haproxy).exists(), "HAProxy is installed by scripts/setup"
    check = subprocess.run([haproxy, "-c", "-f", str(configs[0])], capture_output=True,
                           text=True, timeout=30, check=False)
    assert check.returncode == 0, check.stdout + check.stderr


def test_fab_render_invalid_input_exits_1_and_writes_nothing(tmp_path: Path) -> None:
    inventory = tmp_path / "bad.py"
    inventory.write_text(
        (ROOT / "inventory" / "testbed.py").read_text()
        .replace("batch_timeout_micros=2000,", "batch_timeout_micros=90000,"))
    out = tmp_path / "out"
    result = _fab("render", "--model", "half_plus_two", "--version", "1", "--inventory",
                  str(inventory), "--out", str(out), tmp_path=tmp_path)
    assert result.returncode == 1
    assert "batch_timeout_micros 90000 exceeds a third of the 50 ms latency SLO" in result.stderr
    assert "host tb1" in result.stderr and "fix:" in result.stderr
    assert not out.exists()


def test_fab_render_unknown_model_and_bad_version(tmp_path: Path) -> None:
    result = _fab("render", "--model", "nope", tmp_path=tmp_path)
    assert result.returncode == 1 and "model 'nope' is not in the catalog" in result.stderr
    result = _fab("render", "--model", "resnet50", "--version", "0", tmp_path=tmp_path)
    assert result.returncode == 1 and "must be a positive integer" in result.stderr


def test_render_path_never_imports_tensorflow(tmp_path: Path) -> None:
    code = (
        "import sys\n"
        "from tfsdeploy.core.target import load_target, render_release\n"
        "render_release(load_target('resnet50'), 1)\n"
        "import tasks\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] == 'tensorflow'))\n"
    )
    env = dict(os.environ, TFSDEPLOY_TESTBED_DIR=str(tmp_path / "none"),
               PYTHONPATH=f"{ROOT}:{ROOT / 'src'}")
    result = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True,
                            text=True, timeout=120, check=False)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]"


def test_fab_plan_capacity_shows_the_arithmetic(tmp_path: Path) -> None:
    result = _fab("plan-capacity", "--target-qps", "100000", "--per-instance-qps", "8000",
                  tmp_path=tmp_path)
    assert result.returncode == 0, result.stderr
    assert "100,000 / (8,000.0 x 0.65 x 0.9)" in result.stdout
    assert "minimum 22 instances" in result.stdout


def test_status_row_names_each_instance_when_a_host_runs_several() -> None:
    from tfsdeploy.cli.output import status_row

    def slots(release: str) -> dict[str, list[dict[str, object]]]:
        return {"blue": [{"release": release, "running": True,
                          "versions": [{"version": 2, "state": "AVAILABLE"}]}], "green": []}

    row = {"host": "gpu-a1", "reachable": True, "current": "r1", "version": 2,
           "traffic_slot": "blue", "slots": slots("r1"), "drift": [], "lock": None,
           "instances": [{"instance": 0, "gpus": [0], "traffic_slot": "blue",
                          "slots": slots("r1")},
                         {"instance": 1, "gpus": [1], "traffic_slot": None,
                          "slots": slots("r1")}]}
    cells = status_row(row)
    assert cells[3] == "i0 blue, i1 -"
    assert cells[4] == ("i0 blue: r1 running [2 AVAILABLE]; i1 blue: r1 running [2 AVAILABLE]")
    one = dict(row, instances=row["instances"][:1])  # type: ignore[index]
    assert status_row(one)[3:5] == ("blue", "blue: r1 running [2 AVAILABLE]")


def test_fab_hosts_shows_one_instance_per_gpu(tmp_path: Path) -> None:
    result = _fab("hosts", "--inventory", "inventory/example_production.py",
                  "--hosts", "gpu-a01,gpu-c01", tmp_path=tmp_path)
    assert result.returncode == 0, result.stderr
    lines = {line.split()[1]: line for line in result.stdout.splitlines() if "gpu-" in line}
    assert "resnet50 x2 (GPU 0,1), ranker x2 (GPU 0,1)" in lines["gpu-c01"]
    assert "x2" not in lines["gpu-a01"]


def _tasks_module() -> Any:
    spec = importlib.util.spec_from_file_location("tfsdeploy_tasks", ROOT / "tasks.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_every_option_of_every_command_shows_as_name_and_value() -> None:
    tasks = _tasks_module()
    for context in tasks.ns.to_contexts():
        for names, _text in context.help_tuples():
            flag = context.flags[names.split("=")[0]]
            assert names.startswith("--") and "," not in names and not names.startswith(
                "--="), f"fab --help {context.name}: {names}"
            if flag.kind is bool:
                assert "=" not in names, (context.name, names)
            else:  # the value named by what it is (tasks.VALUES), not =STRING
                assert names == f"{names.split('=')[0]}={tasks.VALUES[flag.name]}", names


def test_every_number_option_is_typed_and_range_checked() -> None:
    from typing import get_type_hints

    from tfsdeploy.cli.verbs import VERBS, declared, meta

    numbers = 0
    for verb in VERBS:
        hints = get_type_hints(verb)
        for one in declared(verb):
            kinds = {getattr(k, "__name__", str(k)) for k in getattr(
                hints[one.name], "__args__", (hints[one.name],))}
            if kinds & {"int", "float"}:
                numbers += 1
                assert meta(one).bound is not None, (verb.command, one.name)
    assert numbers > 20  # the check reads the declarations it is meant to


def test_each_task_is_made_from_its_declaration() -> None:
    from tfsdeploy.cli.verbs import VERBS, declared, meta

    tasks = _tasks_module()
    for verb in VERBS:
        task = tasks.ns[verb.command]
        parameters = list(inspect.signature(task.body).parameters)[1:]
        assert parameters == [f.name for f in declared(verb)], verb.command
        assert task.help == {f.name: meta(f).help for f in declared(verb)}, verb.command
        assert (task.body.__doc__ or "").startswith(verb.summary.split("\n")[0])


def test_fab_help_and_a_bad_number_from_the_command_line(tmp_path: Path) -> None:
    shown = _fab("--help", "deploy", tmp_path=tmp_path)
    assert shown.returncode == 0, shown.stderr
    assert "--json-file=FILE" in shown.stdout and "--=" not in shown.stdout
    assert "--lock-wait=SECONDS" in shown.stdout and " -j" not in shown.stdout
    bad = _fab("logs", "--model", "resnet50", "--lines", "many", tmp_path=tmp_path)
    assert bad.returncode == 1 and "Traceback" not in bad.stderr, bad.stderr
    assert "[field --lines] --lines 'many'" in bad.stderr and "fix:" in bad.stderr


def test_bench_data_is_the_live_version_and_says_so() -> None:
    from tfsdeploy.run.bench import pick_data_version

    assert pick_data_version({"tb1": 1, "tb2": 1, "tb3": 1}, [1, 2, 3, 4]) == (
        1, "request data: warmup records of version 1, live on tb1, tb2, tb3 "
           "(--version V to choose)")
    version, line = pick_data_version({"tb1": 2, "tb2": 1, "tb3": 1}, [1, 2, 3])
    assert version == 1 and "live on tb2, tb3; other hosts serve v2" in line
    assert pick_data_version({"tb1": 2, "tb2": 1}, [1, 2])[0] == 2  # a tie: the newer
    version, line = pick_data_version({"tb1": None, "tb2": None}, [1, 2, 3])
    assert version == 3 and "the newest in the source (no host reported a live" in line
    version, line = pick_data_version({"tb1": 7}, [1, 2, 3])
    assert version == 3 and "the live version 7 is no longer in it" in line
    assert pick_data_version({"tb1": None}, [])[0] is None
