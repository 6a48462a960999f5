from __future__ import annotations

from pathlib import Path

import pytest

from tfsdeploy.errors import ConfigError
from tfsdeploy.inventory import Group, Host, build_inventory, load_inventory

from .helpers import model


def _inv(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "inv.py"
    path.write_text(
        "from tfsdeploy.inventory import Host, Group, Gpu\n"
        "from tfsdeploy.catalog import Model, Signature, TensorSpec\n" + text)
    return path


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


def test_wrong_var_type_is_refused() -> None:
    with pytest.raises(ConfigError, match="var 'ssh_port' is '22'"):
        build_inventory("i.py", hosts=[Host("a", "10.0.0.1", vars={"ssh_port": "22"})],
                        groups={}, defaults={}, models=[])


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
    assert f"{path}:4" in str(err.value) and "ZeroDivisionError" in str(err.value)


def test_missing_inventory_and_env_selection(tmp_path: Path, monkeypatch: pytest.MonkeyPatch
                                            ) -> None:
    with pytest.raises(ConfigError, match="does not exist"):
        load_inventory(str(tmp_path / "none.py"))
    path = _inv(tmp_path, "hosts = [Host('only', '10.0.0.9')]\n")
    monkeypatch.setenv("TFSDEPLOY_INVENTORY", str(path))
    assert [h.name for h in load_inventory().hosts] == ["only"]


def test_unknown_model_lists_known(tmp_path: Path) -> None:
    inv = build_inventory("i.py", hosts=[], groups={}, defaults={}, models=[model(name="a")])
    with pytest.raises(ConfigError, match=r"model 'b' is not in the catalog \(known: a\)"):
        inv.model("b")


def test_shipped_inventories_load() -> None:
    prod = load_inventory("inventory/example_production.py")
    assert len(prod.hosts) == 24 and set(prod.models) == {"resnet50", "ranker"}
    assert {g for h in prod.hosts for g in h.groups} >= {"gpu_a", "gpu_b", "gpu_c"}
    testbed = load_inventory("inventory/testbed.py")
    assert len(testbed.hosts) >= 3 and "resnet50" in testbed.models
