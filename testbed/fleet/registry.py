"""The testbed registry: Debian's docker-registry on 10.87.0.1:5000, data in the state dir."""

from __future__ import annotations

import subprocess
from pathlib import Path

from common import REGISTRY, Places, TestbedError, daemon_pid, http_ok, log, pid_alive, wait_until

CONFIG = """\
# written by scripts/testbed
version: 0.1
log:
  level: warn
  accesslog:
    disabled: true
storage:
  filesystem:
    rootdirectory: {data}
  delete:
    enabled: true
http:
  addr: {addr}
"""


def pid(places: Places) -> int | None:
    return daemon_pid(places.registry / "registry.pid", "docker-registry")


def answers(timeout: float = 1.0) -> bool:
    return http_ok(f"http://{REGISTRY}/v2/", timeout)


def ensure(places: Places) -> str:
    """Start the registry unless it runs and answers; returns 'running' or 'started'."""
    if pid(places) and answers():
        return "running"
    stop(places)
    data = places.registry / "data"
    data.mkdir(parents=True, exist_ok=True)
    config = places.registry / "config.yml"
    config.write_text(CONFIG.format(data=data, addr=REGISTRY))
    with open(places.logs / "registry.log", "ab") as out:
        proc = subprocess.Popen(
            ["docker-registry", "serve", str(config)],
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    (places.registry / "registry.pid").write_text(f"{proc.pid}\n")
    try:
        wait_until(
            lambda: answers(0.5) or proc.poll() is not None,
            timeout=20,
            what=f"the registry on {REGISTRY}",
        )
    except TestbedError:
        proc.kill()
        raise
    if proc.poll() is not None:
        raise TestbedError(
            f"docker-registry exited ({proc.returncode}); see "
            f"{places.logs / 'registry.log'} (is 10.87.0.1 on tfsbr0, port 5000 free?)"
        )
    return "started"


def stray_pids(places: Places) -> set[int]:
    """docker-registry processes serving our config (e.g. after the pid file was lost)."""
    config = str(places.registry / "config.yml").encode()
    found = set()
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                argv = (entry / "cmdline").read_bytes().split(b"\0")
            except OSError:
                continue
            if argv[0].endswith(b"docker-registry") and config in argv:
                found.add(int(entry.name))
    return found


def stop(places: Places) -> None:
    victims = stray_pids(places) | ({p} if (p := pid(places)) else set())
    for found in victims:
        subprocess.run(["kill", str(found)], check=False)
    for found in victims:
        try:
            wait_until(lambda f=found: not pid_alive(f), timeout=5, what="the registry to stop")
        except TestbedError:
            subprocess.run(["kill", "-9", str(found)], check=False)
            log("registry killed with SIGKILL")
    (places.registry / "registry.pid").unlink(missing_ok=True)
