"""The testbed's Prometheus: Debian's `prometheus` on 10.87.0.1:9090 (root namespace, like the
registry), scraping the fleet with what `fab observe` renders from inventory/testbed.py.

Its files live in the state dir: ``prometheus/prometheus/prometheus.yml`` and ``rules/``
(rendered), ``prometheus/targets/<model>.json`` (the file_sd targets every deploy, rollback,
promote and abort on the default inventory rewrites: the inventory's
``monitoring.local_targets_dir``), ``prometheus/grafana/`` (the dashboards) and
``prometheus/data`` (the TSDB). ``ensure`` is idempotent: a running Prometheus is left running
and reloads (SIGHUP) only when the rendered files changed.
"""

from __future__ import annotations

import hashlib
import os
import signal
import subprocess
from pathlib import Path

from common import GATEWAY, Places, TestbedError, daemon_pid, http_ok, log, pid_alive, wait_until

ADDRESS = f"{GATEWAY}:9090"
REPO = Path(__file__).resolve().parents[2]
BINARY = "/usr/bin/prometheus"


def home(places: Places) -> Path:
    return places.state / "prometheus"


def config_file(places: Places) -> Path:
    return home(places) / "prometheus" / "prometheus.yml"


def pid(places: Places) -> int | None:
    return daemon_pid(home(places) / "prometheus.pid", "prometheus")


def answers(timeout: float = 1.0) -> bool:
    return http_ok(f"http://{ADDRESS}/-/ready", timeout)


def _digest(folder: Path) -> str:
    sums = hashlib.sha256()
    for path in sorted(folder.rglob("*.yml")):
        sums.update(path.name.encode() + path.read_bytes())
    return sums.hexdigest()


def render(places: Places, *, targets: bool) -> None:
    """`fab observe` into the state dir (with ``targets``: also each model's current
    targets, read from the hosts)."""
    fab = places.cache / "venv" / "bin" / "fab"
    if not fab.exists():
        raise TestbedError(f"{fab} not found: run scripts/setup first (it builds the venv)")
    argv = [str(fab), "observe", "--out", str(home(places)),
            "--inventory", str(REPO / "inventory" / "testbed.py")]
    env = {k: v for k, v in os.environ.items() if k != "TFSDEPLOY_INVENTORY"}
    done = subprocess.run(argv + (["--targets"] if targets else []), cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=300)
    if done.returncode != 0:
        raise TestbedError(f"fab observe failed ({done.returncode}): "
                           f"{(done.stderr or done.stdout).strip()[-2000:]}")


def ensure(places: Places, *, targets: bool = True) -> str:
    """Render the configuration and start Prometheus unless it runs and answers (then reload
    it if the configuration changed); returns 'running', 'reloaded' or 'started'."""
    if not Path(BINARY).exists():
        raise TestbedError(f"{BINARY} not found: run scripts/setup (Debian's prometheus)")
    folder = config_file(places).parent
    before = _digest(folder) if folder.is_dir() else ""
    (home(places) / "targets").mkdir(parents=True, exist_ok=True)
    render(places, targets=targets)
    running = pid(places)
    if running and answers():
        if _digest(folder) == before:
            return "running"
        os.kill(running, signal.SIGHUP)  # Prometheus re-reads its config and rules on SIGHUP
        return "reloaded"
    stop(places)
    data = home(places) / "data"
    data.mkdir(parents=True, exist_ok=True)
    with open(places.logs / "prometheus.log", "ab") as out:
        proc = subprocess.Popen(
            [BINARY, f"--config.file={config_file(places)}", f"--storage.tsdb.path={data}",
             f"--web.listen-address={ADDRESS}", "--storage.tsdb.retention.time=2d",
             "--web.enable-lifecycle"],
            stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
            start_new_session=True, cwd=home(places))
    (home(places) / "prometheus.pid").write_text(f"{proc.pid}\n")
    try:
        wait_until(lambda: answers(0.5) or proc.poll() is not None, timeout=30,
                   what=f"Prometheus on {ADDRESS}")
    except TestbedError:
        proc.kill()
        raise
    if proc.poll() is not None:
        raise TestbedError(f"prometheus exited ({proc.returncode}); see "
                           f"{places.logs / 'prometheus.log'} (is port 9090 free on {GATEWAY}?)")
    return "started"


def stop(places: Places) -> None:
    found = pid(places)
    if found is None:
        (home(places) / "prometheus.pid").unlink(missing_ok=True)
        return
    subprocess.run(["kill", str(found)], check=False)
    try:
        wait_until(lambda: not pid_alive(found), timeout=10, what="Prometheus to stop")
    except TestbedError:
        subprocess.run(["kill", "-9", str(found)], check=False)
        log("prometheus killed with SIGKILL")
    (home(places) / "prometheus.pid").unlink(missing_ok=True)
