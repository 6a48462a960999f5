"""A deploy machine's install: `pip install .` with no extras into a fresh venv. Prints the
environment's size, the install time from a cold pip cache (a fresh --cache-dir) and from a
warm one (that cache, filled), the size of the wheels it downloads, whether TensorFlow,
TFServing's API package, numpy or matplotlib came in, and `fab --list`'s time from that
environment.

    python3 benchmarks/bench_install.py [--source DIR] [--runs 5] [--keep DIR]

Targets: the environment at most 150 MB, with no importable tensorflow, tensorflow_serving or
numpy; `fab --list` under 1 s. The install times depend on the package index and the network
(a cold install downloads every wheel): they are figures to compare, not targets. Exits 1 when
a target is missed.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SIZE_TARGET_MB = 150.0
LIST_TARGET_S = 1.0
ABSENT = ("tensorflow", "tensorflow_serving", "numpy", "matplotlib")


# the installed package, never a checkout's src/ named by the caller's environment
ENV = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}


def timed(argv: list[str], *, cwd: Path | None = None) -> float:
    """Wall time of one command; fails loudly (with its output) if it fails."""
    start = time.perf_counter()
    done = subprocess.run(argv, cwd=cwd, capture_output=True, text=True, check=False, env=ENV)
    if done.returncode != 0:
        sys.exit(f"{' '.join(argv)} failed ({done.returncode}):\n{done.stderr[-2000:]}")
    return time.perf_counter() - start


def size_mb(path: Path) -> int:
    """``du -sm``: MiB on disk under ``path`` (blocks, hard links once, rounded up)."""
    out = subprocess.run(["du", "-sm", str(path)], capture_output=True, text=True,
                         check=True).stdout
    return int(out.split()[0])


def install(venv: Path, source: Path, cache: Path) -> tuple[float, float]:
    """(seconds to make the venv, seconds of `pip install SOURCE` with ``cache``)."""
    made = timed([sys.executable, "-m", "venv", str(venv)])
    took = timed([str(venv / "bin" / "pip"), "install", "--quiet", "--disable-pip-version-check",
                  "--cache-dir", str(cache), str(source)])
    return made, took


def importable(venv: Path, module: str) -> bool:
    """Whether ``module`` imports in the venv (a non-editable install: no PYTHONPATH)."""
    code = (f"import importlib.util, sys; "
            f"sys.exit(0 if importlib.util.find_spec({module!r}) else 1)")
    return subprocess.run([str(venv / "bin" / "python"), "-c", code], check=False,
                          env={"PATH": "/usr/bin:/bin"}).returncode == 0


def largest(venv: Path, count: int = 8) -> list[tuple[str, int]]:
    """The largest entries of the venv's site-packages."""
    site = next((venv / "lib").glob("python3*/site-packages"))
    sizes = [(p.name, size_mb(p)) for p in site.iterdir()]
    return sorted(sizes, key=lambda s: -s[1])[:count]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--source", type=Path, default=ROOT,
                        help="what to install (a checkout, a wheel, a requirement)")
    parser.add_argument("--runs", type=int, default=5, help="timed runs of fab --list")
    parser.add_argument("--keep", type=Path, default=None,
                        help="make the environments here and keep them (default: a temporary "
                             "directory, removed)")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="bench-install-", dir=args.keep))
    try:
        cache = work / "pip-cache"
        cold_made, cold = install(work / "cold", args.source, cache)
        downloaded = size_mb(cache)
        wheels = work / "wheels"
        timed([str(work / "cold" / "bin" / "pip"), "download", "--quiet",
               "--disable-pip-version-check", "--cache-dir", str(cache), "--dest", str(wheels),
               str(args.source)])
        _, warm = install(work / "warm", args.source, cache)
        venv = work / "warm"
        env_mb = size_mb(venv)
        fab = str(venv / "bin" / "fab")
        first = timed([fab, "--list"], cwd=ROOT)
        runs = [timed([fab, "--list"], cwd=ROOT) for _ in range(args.runs)]
        present = [m for m in ABSENT if importable(venv, m)]
        print(f"python {sys.version.split()[0]}, source {args.source}")
        print(f"environment (fresh venv + pip install, no extras): {env_mb} MB, du -sm "
              f"(target <= {SIZE_TARGET_MB:.0f} MB); making the bare venv took "
              f"{cold_made:.1f} s")
        print("  largest: " + ", ".join(f"{name} {mb} MB" for name, mb in largest(venv)))
        print(f"  importable: {', '.join(present) or 'none'} of {', '.join(ABSENT)}")
        print(f"install, cold pip cache (fresh --cache-dir): {cold:.1f} s; its wheels (pip "
              f"download): {size_mb(wheels)} MB; the pip cache after it: {downloaded} MB "
              "(an index on local disk is read, not cached)")
        print(f"install, warm pip cache: {warm:.1f} s")
        median = statistics.median(runs)
        print(f"fab --list: first {first:.2f} s, median of {len(runs)} {median:.2f} s "
              f"(target < {LIST_TARGET_S:g} s)")
        missed = env_mb > SIZE_TARGET_MB or present or median >= LIST_TARGET_S
        return 1 if missed else 0
    finally:
        if args.keep is None:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
