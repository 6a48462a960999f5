"""CLI start-up and render speed. Prints the figures beside their targets.

    python benchmarks/bench_cli.py [--runs 7] [--hosts 1000]

Targets: `fab --list` median under 1 s; `fab render` for a 1,000-host
inventory under 3 s (the whole command, as a user runs it).

The render writes 5,000 files: its time depends on what the file system under the temporary
directory ($TMPDIR) charges to create a file, so the figures also say how the render's time
splits into user and system CPU, and what making as many folders and files costs there by
itself.
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FAB = str(Path(sys.executable).with_name("fab"))

INVENTORY = '''
from tfsdeploy.core.inventory.catalog import Batching, Model, Signature, TensorSpec
from tfsdeploy.core.inventory.fleet import Gpu, Group, Host

hosts = [Host(f"gpu-{{i:04d}}", f"10.{{i // 250}}.{{i % 250}}.10", gpus=[Gpu(0, 24576)])
         for i in range({hosts})]
groups = {{f"rack{{r}}": Group([h.name for h in hosts[r::20]]) for r in range(20)}}
defaults = {{"image": "registry.example:5000/tensorflow/serving:2.21.0-gpu"}}
models = [Model(name="resnet50", source="/srv/model-store/resnet50",
                signature=Signature(inputs={{"input_1": TensorSpec("DT_FLOAT", (-1, 224, 224, 3))}},
                                    outputs={{"predictions": TensorSpec("DT_FLOAT", (-1, 1000))}}),
                memory_mib=3500, latency_slo_ms=100,
                batching=Batching(max_batch_size=32, batch_timeout_micros=20000,
                                  allowed_batch_sizes=(8, 16, 32)))]
'''


def timed(argv: list[str]) -> float:
    """Wall time of one run; fails loudly if the command fails."""
    start = time.perf_counter()
    subprocess.run(argv, cwd=ROOT, check=True, capture_output=True)
    return time.perf_counter() - start


def children_cpu() -> tuple[float, float]:
    """User and system CPU seconds of the finished child processes so far."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime, usage.ru_stime


def bare_layout(directory: Path, hosts: int) -> float:
    """Seconds to make the render's layout with nothing rendered: per host the folders
    ``<host>/<model>/proxy`` and five small files, in a new folder of ``directory``."""
    folder = Path(tempfile.mkdtemp(dir=directory))
    start = time.perf_counter()
    for index in range(hosts):
        model = folder / f"h{index}" / "m"
        (model / "proxy").mkdir(parents=True)
        for name in ("a", "b", "c", "d", "proxy/e"):
            fd = os.open(model / name, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
            os.write(fd, b"x" * 200)
            os.close(fd)
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--runs", type=int, default=7)
    parser.add_argument("--hosts", type=int, default=1000)
    args = parser.parse_args()
    list_times = [timed([FAB, "--list"]) for _ in range(args.runs)]
    with tempfile.TemporaryDirectory() as tmp:
        inventory = Path(tmp) / "big.py"
        inventory.write_text(INVENTORY.format(hosts=args.hosts))
        render = [FAB, "render", "--model", "resnet50", "--version", "3", "--inventory",
                  str(inventory), "--out", str(Path(tmp) / "out")]
        before = children_cpu()
        render_times = [timed(render) for _ in range(max(3, args.runs // 2))]
        after = children_cpu()
        user, system = ((b - a) / len(render_times) for a, b in zip(before, after, strict=True))
        files = sum(1 for _ in (Path(tmp) / "out").rglob("*.config"))
        layout = bare_layout(Path(tmp), args.hosts)
    print(f"fab --list: median {statistics.median(list_times):.3f} s over {len(list_times)} "
          f"runs (target < 1 s)")
    print(f"fab render, {args.hosts} hosts ({files} config files + flags): median "
          f"{statistics.median(render_times):.3f} s over {len(render_times)} runs (target < 3 s)")
    print(f"  CPU per render: {user:.2f} s user, {system:.2f} s system; the same folders "
          f"and files, nothing rendered, made in {tempfile.gettempdir()} alone: {layout:.2f} s")


if __name__ == "__main__":
    main()
