"""`fab render`'s table: a row per host for a few hosts, a row per distinct setting for many."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from tfsdeploy.cli.render import HOST_ROWS_UP_TO, summary_table


def _render(index: int, version: int = 3) -> Any:
    host = SimpleNamespace(name=f"gpu-{index:04d}", address=f"10.0.0.{index % 250}")
    return SimpleNamespace(host=host, version=version, instances=(), files=(1, 2, 3, 4))


def test_a_few_hosts_get_a_row_each() -> None:
    headers, rows = summary_table([_render(i) for i in range(HOST_ROWS_UP_TO)])
    assert headers == ("host", "address", "version", "GPU fraction", "files")
    assert len(rows) == HOST_ROWS_UP_TO
    assert rows[7] == ("gpu-0007", "10.0.0.7", "3", "no GPU", "5")


def test_many_hosts_get_a_row_per_distinct_setting_in_the_order_first_seen() -> None:
    renders = [_render(i, version=2 if i % 10 == 9 else 3) for i in range(1000)]
    headers, rows = summary_table(renders)
    assert headers == ("hosts", "first … last", "version", "GPU fraction", "files")
    assert rows == [("900", "gpu-0000 … gpu-0998", "3", "no GPU", "5"),
                    ("100", "gpu-0009 … gpu-0999", "2", "no GPU", "5")]


def test_a_setting_held_by_one_host_names_it_alone() -> None:
    renders = [_render(i) for i in range(60)] + [_render(60, version=4)]
    _, rows = summary_table(renders)
    assert rows[1] == ("1", "gpu-0060", "4", "no GPU", "5")
