"""Argument lists run on a generator host (pure; quoted once, by the runner).

Shell is used only where a step needs it (a pid file before ``exec``, a fixed install script);
every value reaches those scripts as a positional argument, never spliced into the script.

On a host (``<data_root>`` from the inventory, /srv/tfsdeploy by default)::

    <data_root>/loadgen/env/<key>/        the generator's Python environment (cached by
                                          content hash; ``.complete`` once usable)
    <data_root>/loadgen/runs/<run-id>/    one run: requests, pid, results (removed after)
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

PROBE_SCRIPT = """\
import json, os, platform, sys, sysconfig, time
print(json.dumps({"python": "%d.%d" % sys.version_info[:2],
                  "soabi": sysconfig.get_config_var("SOABI"),
                  "machine": platform.machine(), "libc": list(platform.libc_ver()),
                  "cores": os.cpu_count() or 1,
                  "envReady": os.path.exists(os.path.join(sys.argv[1], ".complete")),
                  "timeNs": time.time_ns()}))
"""

# $1 env dir, $2 uploaded bundle, $3 run id (names the work dir), $4 import check (Python code),
# $5 the bundle's sha256 (checked before anything of it is unpacked; exit 5 when it differs)
INSTALL_SCRIPT = """\
set -eu
if [ "$(sha256sum < "$2" | cut -c1-64)" != "$5" ]; then rm -f "$2"; exit 5; fi
work="$1.tmp.$3"
rm -rf "$work"
python3 -m venv --without-pip "$work"
site=$("$work/bin/python" -c 'import sysconfig; print(sysconfig.get_path("purelib"))')
tar -xzf "$2" -C "$site"
rm -f "$2"
"$work/bin/python" -c "$4"
touch "$work/.complete"
mv -T "$work" "$1" 2>/dev/null || rm -rf "$work"
"""

# $1 pid file; the rest is the command, which keeps this shell's pid (exec)
PID_SCRIPT = 'echo $$ > "$1"; shift; exec "$@"'
# exit 3: no pid file yet (the generator has not started: ask again); 0: asked, or gone
STOP_SCRIPT = 'pid=$(cat "$1" 2>/dev/null) || exit 3; kill -INT "$pid" 2>/dev/null; true'
ALIVE_SCRIPT = 'kill -0 "$(cat "$1")" 2>/dev/null'
ENV_UNUSED_MINUTES = 1440
# $1 env dir in use, $2 env root, $3 its key: keep it fresh, drop others unused for a day
PRUNE_SCRIPT = ('touch "$1"; find "$2" -mindepth 1 -maxdepth 1 ! -name "$3" '
                f'-mmin +{ENV_UNUSED_MINUTES} -exec rm -rf {{}} + 2>/dev/null; true')
# A generator sleeps between sends and must wake on time: a higher CPU priority keeps other
# work on its machine from delaying its sends (which open loop would count as latency).
# Without the privilege, nice warns and runs it at the normal priority; lag is measured anyway.
GENERATOR_NICENESS = -10


@dataclass(frozen=True)
class HostDirs:
    """A generator host's directories for one run."""

    root: str
    key: str
    run_id: str

    @property
    def env_root(self) -> str:
        """Where cached environments live."""
        return f"{self.root}/loadgen/env"

    @property
    def env(self) -> str:
        """The environment of this bundle."""
        return f"{self.env_root}/{self.key}"

    @property
    def python(self) -> str:
        """The environment's interpreter."""
        return f"{self.env}/bin/python"

    @property
    def upload(self) -> str:
        """Where the bundle is uploaded before it is unpacked."""
        return f"{self.env_root}/{self.key}.tar.gz.{self.run_id}"

    @property
    def run(self) -> str:
        """This run's work directory."""
        return f"{self.root}/loadgen/runs/{self.run_id}"


@dataclass(frozen=True)
class RunFiles:
    """The files of one generator run, in its run directory."""

    run_dir: str

    @property
    def requests(self) -> str:
        """Serialized PredictRequests (TFRecord)."""
        return f"{self.run_dir}/requests.tfrecord"

    @property
    def raw(self) -> str:
        """The generator's exact per-process results (JSON)."""
        return f"{self.run_dir}/result.json"

    @property
    def report(self) -> str:
        """The generator's own ghz-compatible report."""
        return f"{self.run_dir}/report.json"

    @property
    def pid(self) -> str:
        """The generator's process id, for stopping it."""
        return f"{self.run_dir}/pid"


def probe(env_dir: str) -> list[str]:
    """Python version, ABI, libc, cores, clock and whether the environment is there."""
    return ["python3", "-c", PROBE_SCRIPT, env_dir]


def install_env(dirs: HostDirs, import_check: str, sha256: str) -> list[str]:
    """Check the uploaded bundle's ``sha256``, unpack it into a fresh venv and move that into
    place in one rename."""
    return ["sh", "-c", INSTALL_SCRIPT, "sh", dirs.env, dirs.upload, dirs.run_id, import_check,
            sha256]


def make_dirs(*paths: str) -> list[str]:
    """``mkdir -p`` of each path."""
    return ["mkdir", "-p", "--", *paths]


def prune_envs(dirs: HostDirs) -> list[str]:
    """Mark the environment used now; remove other environments unused for a day."""
    return ["sh", "-c", PRUNE_SCRIPT, "sh", dirs.env, dirs.env_root, dirs.key]


def read_file(path: str) -> list[str]:
    """The content of ``path``."""
    return ["cat", "--", path]


def remove_tree(path: str) -> list[str]:
    """``rm -rf`` of one directory."""
    return ["rm", "-rf", "--", path]


def with_pid_file(pid_file: str, argv: Sequence[str]) -> list[str]:
    """``argv`` run so that its pid is in ``pid_file`` (it replaces the shell)."""
    return ["sh", "-c", PID_SCRIPT, "sh", pid_file, *argv]


def alive(pid_file: str) -> list[str]:
    """Exit 0 while the process the pid file names runs."""
    return ["sh", "-c", ALIVE_SCRIPT, "sh", pid_file]


def stop(pid_file: str) -> list[str]:
    """SIGINT to the generator: it ends its window and still writes its results (exit 3: it
    has not started yet)."""
    return ["sh", "-c", STOP_SCRIPT, "sh", pid_file]


@dataclass(frozen=True)
class LoadSpec:
    """One generator's load: its share, the window, and its sizes."""

    share_qps: float
    duration_s: float
    start_at_s: float  # wall clock, seconds since the epoch
    targets: tuple[str, ...]
    workers: int
    procs: int
    connections: int
    timeout_s: float
    warmup: int
    name: str


def generator(python: str, files: RunFiles, load: LoadSpec) -> list[str]:
    """The load generator (``python -m tfsdeploy.loadtest``) for one share of the run; a
    share of 0 runs it closed loop, as fast as its workers go (the benchmark's use)."""
    rate = ["--rps", repr(load.share_qps), "--open-loop"] if load.share_qps > 0 else []
    return [
        "nice", "-n", str(GENERATOR_NICENESS), python, "-m", "tfsdeploy.loadtest",
        "--data-serialized", files.requests,
        *rate,
        "-z", f"{load.duration_s!r}s",
        "--start-at", f"{load.start_at_s:.6f}",
        "--interval-histograms", "--raw-output", files.raw,
        "-O", "json", "-o", files.report,
        "-c", str(load.workers), "--procs", str(load.procs),
        "--connections", str(load.connections),
        "-t", f"{load.timeout_s!r}s", "--skip-first", str(load.warmup),
        "--name", load.name,
        *load.targets,
    ]
