from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tfsdeploy.core.errors import ConfigError, Problem
from tfsdeploy.core.inventory.fleet import Gpu, Group, Host
from tfsdeploy.core.inventory.load import build_inventory, load_inventory
from tfsdeploy.core.inventory.versions import available_versions, choose_version

from .helpers import model

PREAMBLE = (
    "import sys\n"
    "from tfsdeploy.core.inventory.fleet import Host, Group, Gpu\n"
    "from tfsdeploy.core.inventory.catalog import (Batching, Model, Rollout, Signature,\n"
    "                                              TensorSpec, Threads, Warmup)\n"
    "SIG = Signature(inputs={'x': TensorSpec('DT_FLOAT', (-1, 1))},\n"
    "                outputs={'y': TensorSpec('DT_FLOAT', (-1, 1))})\n"
    "def M(**changes):\n"
    "    base = dict(name='m', source='/nonexistent/m', signature=SIG, memory_mib=1024,\n"
    "                latency_slo_ms=60, batching=Batching(max_batch_size=8,\n"
    "                allowed_batch_sizes=(4, 8)))\n"
    "    base.update(changes)\n"
    "    return Model(**base)\n"
)
PREAMBLE_LINES = PREAMBLE.count("\n")


def _inv(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "inv.py"
    path.write_text(PREAMBLE + text)
    return path


def _problems(tmp_path: Path, text: str) -> list[Problem]:
    with pytest.raises(ConfigError) as err:
        load_inventory(str(_inv(tmp_path, text)))
    return err.value.problems


def _text(problems: list[Problem]) -> str:
    return "\n".join(p.render() for p in problems)


def test_precedence_defaults_group_host() -> None:
    hosts = [Host("a", "10.0.0.1", vars={"ssh_port": 2203}), Host("b", "10.0.0.2"),
             Host("c", "10.0.0.3")]
    groups = {"first": Group(["a", "b"], vars={"ssh_port": 2201, "ssh_user": "ops"}),
              "second": Group(["b"], vars={"ssh_port": 2202})}
    inv = build_inventory("i.py", hosts=hosts, groups=groups,
                          defaults={"ssh_port": 2200, "data_root": "/data"}, models=[])
    assert [h.vars.ssh_port for h in inv.hosts] == [2203, 2202, 2200]
    assert inv.host("a").vars.ssh_user == "ops"
    assert inv.host("c").vars.ssh_user == "root"  # built-in default
    assert {h.vars.data_root for h in inv.hosts} == {"/data"}
    assert inv.host("b").groups == ("first", "second")


def test_unknown_var_names_where_and_suggests() -> None:
    with pytest.raises(ConfigError) as err:
        build_inventory("i.py", hosts=[Host("a", "10.0.0.1")],
                        groups={"g": Group(["a"], vars={"ssh_prot": 22})}, defaults={},
                        models=[])
    text = str(err.value)
    assert "groups.g.vars.ssh_prot" in text and "did you mean 'ssh_port'" in text


def test_wrong_var_type_is_refused_where_it_was_set() -> None:
    with pytest.raises(ConfigError) as err:
        build_inventory("i.py", hosts=[Host("a", "10.0.0.1", vars={"ssh_port": "22"})],
                        groups={}, defaults={}, models=[])
    (problem,) = err.value.problems
    assert problem.host == "a" and problem.field == "hosts.a.vars.ssh_port"
    assert problem.message == "ssh_port is '22': must be a whole number"


def test_every_problem_is_listed_at_once() -> None:
    with pytest.raises(ConfigError) as err:
        build_inventory("i.py", hosts=[Host("a", "10.0.0.1", gpus=[Gpu(0, 0)]),
                                       Host("b", "", vars={"ssh_port": 0})],
                        groups={}, defaults={"data_root": "srv"},
                        models=[model(memory_mib=-1), model(name="n", latency_slo_ms=0)])
    fields = sorted(p.field or "" for p in err.value.problems)
    assert fields == ["defaults.data_root", "hosts.a.gpus[0].memory_mib", "hosts.b.address",
                      "hosts.b.vars.ssh_port", "models.m.memory_mib", "models.n.latency_slo_ms"]


def test_group_with_unknown_host_and_duplicate_host() -> None:
    with pytest.raises(ConfigError) as err:
        build_inventory("i.py", hosts=[Host("a", "1.1.1.1"), Host("a", "1.1.1.2")],
                        groups={"g": Group(["ab"])}, defaults={}, models=[])
    text = str(err.value)
    assert "declared twice" in text and "unknown host 'ab'" in text and "did you mean 'a'" in text


def test_select_by_name_group_glob_and_limit() -> None:
    hosts = [Host(n, f"10.0.0.{i}") for i, n in enumerate(["web-1", "web-2", "gpu-1", "gpu-2"])]
    inv = build_inventory("i.py", hosts=hosts, groups={"gpus": Group(["gpu-1", "gpu-2"])},
                          defaults={}, models=[])
    assert [h.name for h in inv.select("gpus")] == ["gpu-1", "gpu-2"]
    assert [h.name for h in inv.select("web-*")] == ["web-1", "web-2"]
    assert [h.name for h in inv.select("web-2,gpu-1")] == ["web-2", "gpu-1"]
    assert [h.name for h in inv.select("all", limit="gpu-2,web-1")] == ["web-1", "gpu-2"]
    assert [h.name for h in inv.select(None, model=model(hosts="gpus"))] == ["gpu-1", "gpu-2"]
    with pytest.raises(ConfigError, match="'nope' matches no host"):
        inv.select("nope")
    with pytest.raises(ConfigError, match="no host matches"):
        inv.select("gpus", limit="web-1")


def test_load_inventory_file_and_line_of_error(tmp_path: Path) -> None:
    path = _inv(tmp_path, "hosts = [Host('a', '10.0.0.1')]\nx = 1 / 0\n")
    with pytest.raises(ConfigError) as err:
        load_inventory(str(path))
    assert f"{path}:{PREAMBLE_LINES + 2}" in str(err.value)
    assert "ZeroDivisionError" in str(err.value)


def test_missing_inventory_and_env_selection(tmp_path: Path, monkeypatch: pytest.MonkeyPatch
                                            ) -> None:
    with pytest.raises(ConfigError, match="does not exist"):
        load_inventory(str(tmp_path / "none.py"))
    path = _inv(tmp_path, "hosts = [Host('only', '10.0.0.9')]\n")
    monkeypatch.setenv("TFSDEPLOY_INVENTORY", str(path))
    assert [h.name for h in load_inventory().hosts] == ["only"]


def test_unknown_model_lists_known() -> None:
    inv = build_inventory("i.py", hosts=[], groups={}, defaults={}, models=[model(name="a")])
    with pytest.raises(ConfigError, match=r"model 'b' is not in the catalog \(known: a\)"):
        inv.model("b")


def test_shipped_inventories_load(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TFSDEPLOY_TESTBED_DIR", "/nonexistent/no-testbed")  # as shipped
    prod = load_inventory("inventory/example_production.py")
    assert len(prod.hosts) == 25 and set(prod.models) == {"resnet50", "ranker"}
    assert [h.name for h in prod.hosts if not h.gpus] == ["prom-01"]  # the Prometheus host
    assert prod.monitoring.hosts == "monitoring"
    assert {g for h in prod.hosts for g in h.groups} >= {"gpu_a", "gpu_b", "gpu_c"}
    testbed = load_inventory("inventory/testbed.py")
    assert len(testbed.hosts) >= 3 and "resnet50" in testbed.models


def test_validated_values_stay_frozen() -> None:
    inv = build_inventory("i.py", hosts=[Host("a", "10.0.0.1", gpus=[Gpu(0, 16384)])],
                          groups={}, defaults={}, models=[model(labels={"stable": 1})])
    host, catalog = inv.host("a"), inv.models["m"]
    assert isinstance(host.gpus, tuple) and isinstance(catalog.batching.allowed_batch_sizes,
                                                        tuple)
    with pytest.raises(TypeError):
        host.vars.slot_ports["blue"] = (1, 2)  # type: ignore[index]
    with pytest.raises(TypeError):
        catalog.labels["canary"] = 2  # type: ignore[index]


# -- hostile inventories: each raised a traceback (not a located error) before ---------------

TRACEBACKS = [
    ("models = M()\n", "models"),
    ("models = 'resnet50'\n", "models"),
    ("hosts = Host('a', '10.0.0.1')\n", "hosts"),
    ("hosts = None\n", "hosts"),
    ("hosts = [Host('a', '10.0.0.1')]\ndefaults = None\n", "defaults"),
    ("hosts = [Host('a', '10.0.0.1')]\ngroups = ['a']\n", "groups"),
    ("hosts = [Host('a', '10.0.0.1', vars={'slot_ports': 'abc'})]\n", "hosts.a.vars.slot_ports"),
    ("hosts = [Host('a', '10.0.0.1', vars={'slot_ports': {'blue': (1, 2)}})]\n",
     "hosts.a.vars.slot_ports"),
    ("hosts = [Host('a', '10.0.0.1', gpus=[Gpu(0, '16384')])]\n", "hosts.a.gpus[0].memory_mib"),
    ("hosts = [Host('a', '10.0.0.1', gpus=[Gpu(0, 10**400)])]\n",
     "hosts.a.gpus[0].memory_mib"),
    ("hosts = [Host('a', '10.0.0.1', gpus=5)]\n", "hosts.a.gpus"),
    ("hosts = [Host('a', '10.0.0.1', vars=None)]\n", "hosts.a.vars"),
    ("hosts = [Host('a', '10.0.0.1')]\nmodels = [M(memory_mib=float('nan'))]\n",
     "models.m.memory_mib"),
    ("hosts = [Host('a', '10.0.0.1')]\nmodels = [M(latency_slo_ms=float('inf'))]\n",
     "models.m.latency_slo_ms"),
    ("hosts = [Host('a', '10.0.0.1')]\nmodels = [M(latency_slo_ms=1e308)]\n",
     "models.m.latency_slo_ms"),
    ("hosts = [Host('a', '10.0.0.1')]\nmodels = [M(memory_mib=10**400)]\n",
     "models.m.memory_mib"),
    ("hosts = [Host('a', '10.0.0.1')]\ndefaults = {'gpu_safety_margin': float('nan')}\n",
     "defaults.gpu_safety_margin"),
    ("hosts = [Host('a', '10.0.0.1')]\nmodels = [M(memory_mib='1024')]\n",
     "models.m.memory_mib"),
    ("hosts = [Host('a', '10.0.0.1')]\nmodels = [M(port_offset='100')]\n",
     "models.m.port_offset"),
    ("hosts = [Host('a', '10.0.0.1')]\nmodels = [M(latency_slo_ms='50')]\n",
     "models.m.latency_slo_ms"),
    ("hosts = [Host('a', '10.0.0.1')]\nmodels = [M(labels=None)]\n", "models.m.labels"),
    ("hosts = [Host('a', '10.0.0.1')]\nmodels = [M(signature=None)]\n", "models.m.signature"),
    ("hosts = [Host('a', '10.0.0.1')]\nmodels = [M(rollout=Rollout(serial=5))]\n",
     "models.m.rollout.serial"),
]


@pytest.mark.parametrize("text, field", TRACEBACKS)
def test_hostile_input_is_a_located_error_not_a_traceback(tmp_path: Path, text: str,
                                                          field: str) -> None:
    problems = _problems(tmp_path, text)
    assert any(p.field == field for p in problems), _text(problems)
    assert all(is_located(p) for p in problems), _text(problems)


# -- hostile inventories: each was accepted (exit 0) before --------------------------------

ACCEPTED = [
    ("hosts = [Host('a', '10.0.0.1'), Host('b', '10.0.0.1')]\n", "hosts.b.address",
     "same address"),
    ("hosts = [Host('a', '')]\n", "hosts.a.address", "neither an IP address nor a DNS name"),
    ("hosts = [Host('a', '-oProxyCommand=x')]\n", "hosts.a.address", "neither"),
    ("hosts = [Host('a', '10.0.0.1', vars={'ssh_port': -1})]\n", "hosts.a.vars.ssh_port",
     "at least 1"),
    ("hosts = [Host('a', '10.0.0.1')]\ndefaults = {'grpc_port': 70000}\n",
     "defaults.grpc_port", "at most 65535"),
    ("hosts = [Host('a', '10.0.0.1')]\nmodels = [M(port_offset=10**6)]\n",
     "models.m.port_offset", "at most 65535"),
    ("hosts = [Host('a', '10.0.0.1')]\nmodels = [M(port_offset=60000)]\n",
     "models.m.port_offset", "beyond 65535"),
    ("hosts = [Host('a', '10.0.0.1')]\ndefaults = {'data_root': 'srv/tfsdeploy'}\n",
     "defaults.data_root", "not an absolute path"),
    ("hosts = [Host('a', '10.0.0.1')]\ndefaults = {'data_root': ''}\n", "defaults.data_root",
     "not an absolute path"),
    ("hosts = [Host('a', '10.0.0.1')]\ndefaults = {'data_root': '/'}\n", "defaults.data_root",
     "root directory"),
    ("hosts = [Host('a', '10.0.0.1')]\ndefaults = {'data_root': '/srv/../etc'}\n",
     "defaults.data_root", "'..'"),
    ("hosts = [Host('a', '10.0.0.1')]\ndefaults = {'image': '--privileged'}\n",
     "defaults.image", "not a docker image reference"),
    ("hosts = [Host('a', '10.0.0.1')]\ndefaults = {'proxy_image': 'Haproxy:2.6'}\n",
     "defaults.proxy_image", "not a docker image reference"),
    ("hosts = [Host('a', '10.0.0.1')]\n"
     "models = [M(batching=Batching(batch_timeout_micros=-5, max_batch_size=8))]\n",
     "models.m.batching.batch_timeout_micros", "at least 0"),
    ("hosts = [Host('a', '10.0.0.1')]\n"
     "models = [M(batching=Batching(num_batch_threads=10**9, max_batch_size=8))]\n",
     "models.m.batching.num_batch_threads", "at most 1024"),
    ("hosts = [Host('a', '10.0.0.1')]\nmodels = [M(threads=Threads(intra_op=-1))]\n",
     "models.m.threads.intra_op", "at least 0"),
    ("hosts = [Host('a', '10.0.0.1')]\nmodels = [M(threads=Threads(grpc_max_threads=-8))]\n",
     "models.m.threads.grpc_max_threads", "at least 0"),
    ("hosts = [Host('a', '10.0.0.1')]\ndefaults = {'max_num_load_retries': -1}\n",
     "defaults.max_num_load_retries", "at least 0"),
    ("hosts = [Host('a', '10.0.0.1')]\ndefaults = {'file_system_poll_wait_seconds': -1}\n",
     "defaults.file_system_poll_wait_seconds", "at least 0"),
    ("hosts = [Host('a', '10.0.0.1')]\nmodels = [M(rollout=Rollout(load_timeout_s=-1))]\n",
     "models.m.rollout.load_timeout_s", "greater than 0"),
    ("hosts = [Host('a', '10.0.0.1')]\nmodels = [M(warmup=Warmup(timeout_s=-5))]\n",
     "models.m.warmup.timeout_s", "greater than 0"),
    ("hosts = [Host('a', '10.0.0.1')]\nmodels = [M(rollout=Rollout(drain_timeout_s=-1))]\n",
     "models.m.rollout.drain_timeout_s", "at least 0"),
    ("hosts = [Host('a', '10.0.0.1')]\nmodels = [M(rollout=Rollout(deadline_s=0.0))]\n",
     "models.m.rollout.deadline_s", "greater than 0"),
    ("hosts = [Host('a', '10.0.0.1')]\nmodels = [M(rollout=Rollout(deadline_s=1e9))]\n",
     "models.m.rollout.deadline_s", "at most"),
    ("hosts = [Host('a', '10.0.0.1')]\nmodels = [M(rollout=Rollout(on_failure='revrt'))]\n",
     "models.m.rollout.on_failure", "did you mean 'revert'"),
    ("hosts = [Host('a', '10.0.0.1')]\nmodels = [M(rollout=Rollout(strategy='canary'))]\n",
     "models.m.rollout.strategy", "'dual-slot' or 'recreate'"),
    ("hosts = [Host('a', '10.0.0.1')]\nmodels = [M(name='models')]\n", "models.models.name",
     "the host layout uses"),
    ("hosts = [Host('a', '10.0.0.1')]\nmodels = [M(name='lock')]\n", "models.lock.name",
     "the host layout uses"),
    ("hosts = [Host('a', '10.0.0.1')]\nmodels = [M(name='-rf')]\n", "models.-rf.name",
     "starting with a letter or digit"),
    ("hosts = [Host('a', '10.0.0.1')]\nmodels = [M(hosts=',')]\n", "models.m.hosts",
     "names no host"),
    ("hosts = [Host('a', '10.0.0.1')]\nmodels = [M(hosts='b*')]\n", "models.m.hosts",
     "matches no host"),
    ("hosts = [Host('a', '10.0.0.1')]\nsys.exit(0)\n", None, "sys.exit(0)"),
    ("hosts = [Host('a', '10.0.0.1')]\nraise SystemExit\n", None, "sys.exit(None)"),
]


@pytest.mark.parametrize("text, field, words", ACCEPTED)
def test_bad_values_are_refused_with_their_place(tmp_path: Path, text: str, field: str | None,
                                                 words: str) -> None:
    problems = _problems(tmp_path, text)
    located = [p for p in problems if p.field == field]
    assert located and words in _text(located), _text(problems)
    assert all(is_located(p) for p in problems), _text(problems)


def is_located(problem: Problem) -> bool:
    """A file and a field or host, or a line of the inventory file (its Python failed)."""
    return bool(problem.file and (problem.field or problem.host
                                  or problem.file.rpartition(":")[2].isdigit()))


def test_syntax_error_names_the_line(tmp_path: Path) -> None:
    problems = _problems(tmp_path, "hosts = [\n    Host('a' '10.0.0.1'),,\n]\n")
    assert problems[0].file == f"{tmp_path / 'inv.py'}:{PREAMBLE_LINES + 2}"
    assert "SyntaxError" in problems[0].message


def test_sys_exit_names_the_line(tmp_path: Path) -> None:
    problems = _problems(tmp_path, "hosts = []\nsys.exit(0)\n")
    assert problems[0].file == f"{tmp_path / 'inv.py'}:{PREAMBLE_LINES + 2}"


def test_a_value_set_in_defaults_is_reported_once() -> None:
    hosts = [Host(f"h{i}", f"10.0.0.{i}") for i in range(1, 6)]
    with pytest.raises(ConfigError) as err:
        build_inventory("i.py", hosts=hosts, groups={}, defaults={"grpc_port": 8510},
                        models=[])
    (problem,) = err.value.problems
    assert problem.host == "h1, h2, h3 and 2 more" and problem.field == "slot_ports.blue"
    assert problem.message.startswith("grpc_port and slot_ports.blue[0] are both 8510")


def test_version_directories_are_ascii_digits(tmp_path: Path) -> None:
    for name in ("1", "7", "0012", "v9", "0", "²", "٣", "+5", " 8", "99999999999999999999"):
        (tmp_path / name).mkdir()
    assert available_versions(str(tmp_path)) == [1, 7, 12]
    assert choose_version(model(source=str(tmp_path)), None, "inv.py") == 12


@pytest.mark.parametrize("requested", ["²", "٣", "+3", " 3", "1_000", "3.0", "-1", "0",
                                       "9223372036854775808", ""])
def test_version_argument_is_ascii_digits_in_int64(requested: str) -> None:
    with pytest.raises(ConfigError) as err:
        choose_version(model(), requested, "inv.py")
    assert err.value.problems[0].field == "--version"


@pytest.mark.parametrize("ending, expected", [
    ("sys.exit(0)\n", "the inventory called sys.exit(0)"),
    ("models = [M(memory_mib='1024')]\n", "memory_mib is '1024': must be a whole number"),
    ("defaults = {'image': '--privileged'}\n", "is not a docker image reference"),
])
def test_fab_render_of_a_hostile_inventory_exits_1_with_the_place(
        tmp_path: Path, ending: str, expected: str) -> None:
    path = _inv(tmp_path, "hosts = [Host('a', '10.0.0.1', gpus=[Gpu(0, 16384)])]\n" + ending)
    fab = str(Path(sys.executable).with_name("fab"))
    result = subprocess.run([fab, "render", "--model", "m", "--version", "1", "--inventory",
                             str(path), "--out", str(tmp_path / "out")],
                            capture_output=True, text=True, timeout=120, check=False)
    assert result.returncode == 1, result.stdout + result.stderr
    assert expected in result.stderr and f"file {path}" in result.stderr, result.stderr
    assert "Traceback" not in result.stderr and not (tmp_path / "out").exists()
