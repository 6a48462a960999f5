"""`fab tune`'s output (cli/tune.py): the table's marks, the Python --write writes, the PNG,
and exit 2 with nothing written when no trial met the SLO."""

from __future__ import annotations

from pathlib import Path

from tfsdeploy.cli.tune import _conclude, draw, rows
from tfsdeploy.core.inventory.catalog import Batching
from tfsdeploy.core.tuning.search import Config, Search, Trial
from tfsdeploy.run.tune import TuneResult

from .helpers import model


def _result(recommended: int | None, *, meets: bool = True) -> TuneResult:
    m = model()
    current = Config.of(m)
    bigger = Config(Batching(max_batch_size=16, batch_timeout_micros=2000,
                             max_enqueued_batches=8, allowed_batch_sizes=(4, 8, 16)), m.threads)
    trials = [Trial(current, 100.0, 5.0, 9.0, 30.0, meets, 12.0, mean_batch=6.0,
                    queue_share=0.4, cpu_cores=0.8),
              Trial(bigger, 150.0, 6.0, 11.0, 40.0, meets, 12.0),
              Trial(bigger, 0.0, None, None, None, False, 3.0, error="exited (1)")]
    return TuneResult(model=m, host="h1", version=3, release="r1", image="img", host_cpus=2,
                      course=Search(trials=trials), recommended=recommended)


def test_the_table_marks_the_catalog_and_the_recommendation() -> None:
    table = rows(_result(1))
    assert table[0][-1] == "catalog" and table[1][-1] == "recommended"
    assert table[2][-1] == "exited (1)" and table[2][2] == "-"
    assert table[0][6:9] == ("6.0", "40", "0.80")
    assert rows(_result(0))[0][-1] == "catalog, recommended"


def test_write_puts_the_recommended_configuration_as_python(tmp_path: Path) -> None:
    target = tmp_path / "tuned.py"
    assert _conclude(_result(1), str(target)) == 0
    text = target.read_text()
    assert text.startswith("# fab tune --model m on h1: 150.0 QPS at P99 <= 60 ms\n")
    assert "batching=Batching(max_batch_size=16, batch_timeout_micros=2000, " in text


def test_no_trial_at_the_slo_exits_2_and_writes_nothing(tmp_path: Path) -> None:
    target = tmp_path / "tuned.py"
    assert _conclude(_result(None, meets=False), str(target)) == 2
    assert not target.exists()


def test_the_plot_is_a_png(tmp_path: Path) -> None:
    path = tmp_path / "tune.png"
    draw(_result(1), path)
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
