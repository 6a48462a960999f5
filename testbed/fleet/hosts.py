"""One testbed host: a network namespace, a private mount + UTS namespace, its own sshd and dockerd.

Every host process lives in netns tbN and in one mount namespace created by a small holder process
(`sleep infinity` renamed tfsdeploy-testbed-tbN).  dockerd and sshd are entered into that mount
namespace with nsenter, so all of a host's private mounts vanish with its last process: stopping a
host is killing its processes, deleting its veth and its netns.
"""

from __future__ import annotations

import contextlib
import http.client
import json
import os
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from common import (
    BASTION_ADDRESS,
    BASTION_INDEX,
    BRIDGE,
    GATEWAY,
    PREFIX_LEN,
    PRIVATE_DIRS,
    Places,
    TestbedError,
    boot_id,
    host_address,
    host_name,
    isolated_dockerd_argv,
    make_ssh_key,
    pid_alive,
    read_pid,
    run,
    veth_name,
    wait_until,
)

# PATH of a plain Debian host (dockerd gets the testbed's bin dir in front, see dockerd_env)
HOST_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

HOLDER_SCRIPT = r"""
set -eu
d=$1; name=$2
for pair in run:/run docker:/var/lib/docker srv:/srv/tfsdeploy tmp:/tmp home:/root; do
  mount --bind "$d/${pair%%:*}" "${pair#*:}"
done
hostname "$name"
mkdir -p /run/sshd /run/lock /run/simgpu/procs
chmod 0755 /run/sshd
touch /run/.tfsdeploy-holder-ready
exec -a "tfsdeploy-testbed-$name" sleep infinity
"""


@dataclass(frozen=True)
class Host:
    """Names and places of host tbN."""

    index: int
    places: Places

    @property
    def name(self) -> str:
        return host_name(self.index)

    @property
    def address(self) -> str:
        return host_address(self.index)

    @property
    def dir(self) -> Path:
        return self.places.host_dir(self.name)

    @property
    def run_dir(self) -> Path:
        """The host's /run, seen from the root namespace."""
        return self.dir / "run"

    @property
    def docker_socket(self) -> Path:
        return self.run_dir / "docker.sock"

    @property
    def netns_path(self) -> Path:
        return Path("/run/netns") / self.name

    def log_path(self, what: str) -> Path:
        return self.places.logs / f"{self.name}-{what}.log"

    @property
    def is_bastion(self) -> bool:
        return self.index == BASTION_INDEX

    @property
    def behind_bastion(self) -> bool:
        """Started by `up --bastion`: its sshd answers the bastion alone (a mark in its
        directory, kept across restarts and reboots)."""
        return (self.dir / BEHIND_MARK).exists()


# ---------------------------------------------------------------- processes of a host


def _ns_link(pid: int, kind: str) -> str | None:
    try:
        return os.readlink(f"/proc/{pid}/ns/{kind}")
    except OSError:
        return None


def _all_pids() -> list[int]:
    return [int(p) for p in os.listdir("/proc") if p.isdigit()]


def _parent_map() -> dict[int, int]:
    parents: dict[int, int] = {}
    for pid in _all_pids():
        try:
            with open(f"/proc/{pid}/stat") as f:
                parents[pid] = int(f.read().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
    return parents


def _saved_mntns(host: Host) -> str | None:
    """The mount namespace recorded at the host's last start, if it was during this boot."""
    try:
        saved = json.loads((host.dir / "holder.json").read_text())
    except (OSError, ValueError):
        return None
    return saved.get("mntns") if saved.get("boot_id") == boot_id() else None


def host_pids(host: Host) -> set[int]:
    """Every process that belongs to the host: in its netns or mount namespace, and descendants.

    A namespace is known by its inode number, which the kernel gives again to the next new
    namespace as soon as the last process of the old one has gone (the lowest free number):
    the saved mount namespace counts only while the host's holder, still alive, is in it (a
    stop that ran after the holder died matched a container being created on another host,
    and killed it). The network namespace stays pinned by its file until ``remove_network``.
    """
    wanted: set[str] = set()
    if host.netns_path.exists():
        wanted.add(f"net:[{os.stat(host.netns_path).st_ino}]")
    mntns = _saved_mntns(host)
    holder = holder_pid(host)
    if mntns and holder is not None and _ns_link(holder, "mnt") == mntns:
        wanted.add(mntns)
    own = {_ns_link(1, "net"), _ns_link(1, "mnt"), _ns_link(os.getpid(), "mnt")}
    wanted -= own  # never match the machine's own namespaces
    found = {
        pid
        for pid in _all_pids()
        if _ns_link(pid, "net") in wanted or _ns_link(pid, "mnt") in wanted
    }
    parents = _parent_map()
    grew = True
    while grew:  # add descendants (containers live in namespaces of their own)
        extra = {pid for pid, ppid in parents.items() if ppid in found and pid not in found}
        found |= extra
        grew = bool(extra)
    found.discard(os.getpid())
    found.discard(1)
    return found


def holder_pid(host: Host) -> int | None:
    pid = read_pid(host.dir / "holder.pid")
    if pid is None or not pid_alive(pid):
        return None
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return None
    return pid if cmdline.startswith(f"tfsdeploy-testbed-{host.name}".encode()) else None


def daemon_pid(host: Host, pidfile: str, exe: str) -> int | None:
    """The pid in the host's /run/<pidfile> if that process is alive and is `exe`."""
    pid = read_pid(host.run_dir / pidfile)
    if pid is None or not pid_alive(pid):
        return None
    try:
        name = Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return None
    return pid if name == exe else None


def _kill_all(pids: set[int], sig: int) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, sig)


def stop_processes(host: Host, *, grace: float = 6.0) -> None:
    """Stop dockerd gracefully (it stops containerd), then kill whatever else the host runs."""
    dockerd = daemon_pid(host, "docker.pid", "dockerd")
    if dockerd:
        _kill_all({dockerd}, signal.SIGTERM)
        deadline = time.monotonic() + grace
        while pid_alive(dockerd) and time.monotonic() < deadline:
            time.sleep(0.05)
    deadline = time.monotonic() + 20
    while True:
        pids = host_pids(host)
        if not pids:
            return
        if time.monotonic() > deadline:
            raise TestbedError(
                f"{host.name}: processes {sorted(pids)} survive SIGKILL; "
                "look at them with `ps -o pid,stat,cmd -p PID` (D state = stuck I/O)"
            )
        _kill_all(pids, signal.SIGKILL)
        time.sleep(0.1)


# ---------------------------------------------------------------- network


def ensure_bridge() -> None:
    """Bridge tfsbr0 with 10.87.0.1/24, and firewall rules so hosts can reach nothing else."""
    if run(["ip", "link", "show", BRIDGE], check=False).returncode != 0:
        run(["ip", "link", "add", BRIDGE, "type", "bridge", "forward_delay", "0"])
    addrs = run(["ip", "-o", "-4", "addr", "show", "dev", BRIDGE]).stdout
    if f"{GATEWAY}/{PREFIX_LEN}" not in addrs:
        run(["ip", "addr", "add", f"{GATEWAY}/{PREFIX_LEN}", "dev", BRIDGE])
    run(["ip", "link", "set", BRIDGE, "up"])
    for rule in FIREWALL_RULES:
        if run(["iptables", "-C", "FORWARD", *rule], check=False).returncode != 0:
            run(["iptables", "-I", "FORWARD", *rule])


# Hosts have no default route, and even if one were added nothing is forwarded to or from them.
FIREWALL_RULES = [
    [
        "-i",
        BRIDGE,
        "!",
        "-o",
        BRIDGE,
        "-m",
        "comment",
        "--comment",
        "tfsdeploy-testbed",
        "-j",
        "DROP",
    ],
    [
        "-o",
        BRIDGE,
        "!",
        "-i",
        BRIDGE,
        "-m",
        "comment",
        "--comment",
        "tfsdeploy-testbed",
        "-j",
        "DROP",
    ],
]


def remove_bridge() -> None:
    for rule in FIREWALL_RULES:
        while run(["iptables", "-D", "FORWARD", *rule], check=False).returncode == 0:
            pass
    if run(["ip", "link", "show", BRIDGE], check=False).returncode == 0:
        run(["ip", "link", "del", BRIDGE])


def remove_network(host: Host) -> None:
    if run(["ip", "link", "show", veth_name(host.index)], check=False).returncode == 0:
        run(["ip", "link", "del", veth_name(host.index)])
    if host.netns_path.exists() or host.name in run(["ip", "netns", "list"]).stdout.split():
        run(["ip", "netns", "del", host.name])


def mac_address(index: int) -> str:
    """The host's eth0 address, the same at every start as a real NIC's burned-in address
    (locally administered, 02:...). A new random address at each start left the machine's
    ARP entry for the host pointing at the old one after a reboot: nothing reached the host
    until that entry expired (up to about 50 s: base_reachable_time 30 s, randomised to
    15-45 s, then delay_first_probe_time 5 s and the probes)."""
    return f"02:87:00:00:{index >> 8:02x}:{index & 0xFF:02x}"


def create_network(host: Host) -> None:
    remove_network(host)
    run(["ip", "netns", "add", host.name])
    run(["ip", "link", "add", veth_name(host.index), "type", "veth", "peer", "name", "eth0",
         "address", mac_address(host.index), "netns", host.name])
    run(["ip", "link", "set", veth_name(host.index), "master", BRIDGE, "up"])
    ns = ["ip", "-n", host.name]
    run([*ns, "addr", "add", f"{host.address}/{PREFIX_LEN}", "dev", "eth0"])
    run([*ns, "link", "set", "eth0", "up"])
    run([*ns, "link", "set", "lo", "up"])


# ---------------------------------------------------------------- files of a host


def _host_key(host: Host) -> Path:
    key = host.dir / "ssh_host_ed25519_key"
    make_ssh_key(key, f"root@{host.name}")
    return key


FORWARDING_FILE = "ssh-forwarding"
ALT_SSH_PORT = 2222
BEHIND_MARK = "behind-bastion"
FIREWALL_COMMENT = "tfsdeploy-testbed-bastion-only"


def ssh_forwarding(places: Places) -> bool:
    """Whether the hosts' sshd allow port forwarding (``up --ssh-forwarding yes``); by default
    they do not, as a hardened fleet host: the toolkit must work without it."""
    path = places.state / FORWARDING_FILE
    return path.exists() and path.read_text().strip() == "yes"


def _sshd_lines(host: Host) -> list[str]:
    """The host's sshd_config. The suite's hosts allow many startups and sessions (several
    test runs share each host); the bastion and the hosts behind it keep OpenSSH's defaults
    (MaxStartups 10:30:100, MaxSessions 10: sshd_config(5)), as a real fleet's, and log at
    VERBOSE: each MaxStartups drop ("drop connection #N ... past MaxStartups", sshd.c
    drop_connection) and each session ("Starting session", "Close session", session.c)."""
    authorized = host.places.ssh / "authorized_keys"
    forwarding = "yes" if ssh_forwarding(host.places) else "no"
    common = [
        f"HostKey {_host_key(host)}",
        "PidFile /run/sshd.pid",
        "PermitRootLogin prohibit-password",
        "PubkeyAuthentication yes",
        "PasswordAuthentication no",
        "KbdInteractiveAuthentication no",
        "UsePAM no",
        f"AuthorizedKeysFile {authorized}",
        "PrintMotd no",
    ]
    if host.is_bastion:
        return ["# written by scripts/testbed: sshd of the bastion " + host.name,
                f"ListenAddress {host.address}", "Port 22", *common,
                "# MaxStartups and MaxSessions: OpenSSH's defaults (10:30:100, 10)",
                "AllowTcpForwarding yes", "AllowStreamLocalForwarding no", "X11Forwarding no",
                "PermitTunnel no", "LogLevel VERBOSE", ""]
    limits = (["# MaxStartups and MaxSessions: OpenSSH's defaults (10:30:100, 10)",
               "LogLevel VERBOSE"] if host.behind_bastion
              else ["MaxSessions 100", "MaxStartups 100:30:200"])
    return [
        "# written by scripts/testbed: sshd of testbed host " + host.name,
        f"ListenAddress {host.address}",
        "Port 22",
        # the same daemon on a second port: a test that cuts one run's SSH off drops
        # only this port, and every other run on the fleet keeps port 22
        f"Port {ALT_SSH_PORT}",
        *common,
        "AcceptEnv LANG LC_*",
        "Subsystem sftp internal-sftp",
        *limits,
        f"AllowTcpForwarding {forwarding}",
        f"AllowStreamLocalForwarding {forwarding}",
        "X11Forwarding no",
        "PermitTunnel no",
        "",
    ]


def _write_sshd_config(host: Host) -> bool:
    """Write the host's sshd_config; True if it changed."""
    config = host.dir / "sshd_config"
    old = config.read_text() if config.exists() else None
    config.write_text("\n".join(_sshd_lines(host)))
    return old != config.read_text()


def guard_ssh(host: Host) -> None:
    """A host behind the bastion answers SSH (22, 2222) from the bastion alone (and itself,
    for `status`), as a fleet whose security group lets SSH in only from its bastion;
    everything else (its serving ports, the registry) stays reachable. Others get a reset:
    refused at once."""
    ports = ["-p", "tcp", "-m", "multiport", "--dports", f"22,{ALT_SSH_PORT}",
             "-m", "comment", "--comment", FIREWALL_COMMENT]
    iptables = ["nsenter", f"--net={host.netns_path}", "iptables"]
    for rule in (["INPUT", "-s", BASTION_ADDRESS, *ports, "-j", "ACCEPT"],
                 ["INPUT", "-s", host.address, *ports, "-j", "ACCEPT"],
                 ["INPUT", *ports, "-j", "REJECT", "--reject-with", "tcp-reset"]):
        if run([*iptables, "-C", *rule], check=False).returncode != 0:
            run([*iptables, "-A", *rule])


def _prepare_dirs(host: Host) -> None:
    host.dir.mkdir(parents=True, exist_ok=True)
    for sub in PRIVATE_DIRS:
        path = host.dir / sub
        if sub in ("run", "tmp") and path.exists():
            shutil.rmtree(path)  # a fresh /run and /tmp at every start, like a reboot
        path.mkdir(parents=True, exist_ok=True)
    (host.dir / "tmp").chmod(0o1777)
    _seed_home(host.dir / "home")
    for target in PRIVATE_DIRS.values():
        Path(target).mkdir(parents=True, exist_ok=True)  # mount points on the shared root fs
    # never read the machine's /etc/docker/daemon.json; an own key.json gives each engine its own ID
    (host.dir / "daemon.json").write_text(
        json.dumps({"deprecated-key-path": str(host.dir / "engine-key.json")}) + "\n"
    )


def _seed_home(home: Path) -> None:
    """root's home on a fresh Debian host: the stock .bashrc and .profile from base-files."""
    home.chmod(0o700)
    for name in ("bashrc", "profile"):
        target = home / f".{name}"
        stock = Path("/usr/share/base-files") / f"dot.{name}"
        if not target.exists() and stock.exists():
            shutil.copyfile(stock, target)


# ---------------------------------------------------------------- start


def _spawn(
    argv: list[str], log_path: Path, env: dict[str, str] | None = None
) -> subprocess.Popen[bytes]:
    with open(log_path, "ab") as out:
        return subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            close_fds=True,
            env=env,
        )


def _start_holder(host: Host) -> int:
    argv = [
        "nsenter",
        f"--net={host.netns_path}",
        "unshare",
        "--mount",
        "--uts",
        "--propagation",
        "private",
        "--",
        "bash",
        "-c",
        HOLDER_SCRIPT,
        "holder",
        str(host.dir),
        host.name,
    ]
    proc = _spawn(argv, host.log_path("holder"))
    ready = host.run_dir / ".tfsdeploy-holder-ready"
    try:
        wait_until(
            lambda: ready.exists() or proc.poll() is not None,
            timeout=10,
            what=f"{host.name}: mount namespace holder",
        )
    except TestbedError:
        proc.kill()
        raise
    if proc.poll() is not None:
        raise TestbedError(
            f"{host.name}: the namespace holder exited ({proc.returncode}); "
            f"see {host.log_path('holder')}"
        )
    (host.dir / "holder.pid").write_text(f"{proc.pid}\n")
    (host.dir / "holder.json").write_text(
        json.dumps({"pid": proc.pid, "mntns": _ns_link(proc.pid, "mnt"), "boot_id": boot_id()})
        + "\n"
    )
    return proc.pid


def _enter(holder: int) -> list[str]:
    return ["nsenter", f"--target={holder}", "--mount", "--uts", "--net", "--"]


def dockerd_argv(host: Host, runtime: Path) -> list[str]:
    return [
        *isolated_dockerd_argv(socket="/run/docker.sock", data_root="/var/lib/docker",
                               exec_root="/run/docker", pidfile="/run/docker.pid",
                               config_file=host.dir / "daemon.json"),
        f"--add-runtime=simgpu={runtime}",
        "--default-runtime=simgpu",
        "--shutdown-timeout=2",
        "--max-concurrent-downloads=6",
        # containers keep running while the engine restarts (an upgrade, a crash), as Docker
        # advises for production hosts (docs.docker.com, "Live restore"); a reboot still
        # stops them and their restart policy brings them back
        "--live-restore",
    ]


def dockerd_env(host: Host) -> dict[str, str]:
    """dockerd's environment: a host's plain PATH with the testbed's bin dir first, where
    dockerd finds nvidia-container-runtime-hook at start-up and so registers its NVIDIA device
    driver (`docker run --gpus`), as on a host with the NVIDIA Container Toolkit installed."""
    return {"PATH": f"{host.places.bin}:{HOST_PATH}", "HOME": "/root", "LANG": "C.UTF-8"}


def dockerd_current(host: Host, pid: int, runtime: Path) -> bool:
    """The running dockerd has today's command line and environment (an older `up` may have
    started it otherwise: without the GPU hook on its PATH, say)."""
    try:
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[:-1]
        environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    except OSError:
        return False
    want_env = [f"{k}={v}".encode() for k, v in dockerd_env(host).items()]
    return argv == [a.encode() for a in dockerd_argv(host, runtime)] and all(
        e in environ for e in want_env
    )


def _start_dockerd(host: Host, holder: int, runtime: Path) -> None:
    _spawn([*_enter(holder), *dockerd_argv(host, runtime)], host.log_path("dockerd"),
           env=dockerd_env(host))


def restart_dockerd(host: Host, *, runtime: Path, timeout: float = 60) -> None:
    """Restart only the host's dockerd, with today's command line: sshd and sessions stay;
    the containers keep running (live restore) and the engine takes them up again."""
    holder, pid = holder_pid(host), daemon_pid(host, "docker.pid", "dockerd")
    if holder is None or pid is None:
        raise TestbedError(f"{host.name}: no running dockerd to restart; run scripts/testbed up")
    os.kill(pid, signal.SIGTERM)
    wait_until(lambda: not pid_alive(pid), timeout=timeout,
               what=f"{host.name}: dockerd {pid} to stop (log: {host.log_path('dockerd')})")
    _start_dockerd(host, holder, runtime)
    wait_until(lambda: docker_ping(host.docker_socket, timeout=1), timeout=timeout,
               what=f"{host.name}: dockerd on /run/docker.sock (log: {host.log_path('dockerd')})")


def start(host: Host, *, runtime: Path, gpus: dict[str, Any] | None,
          seed: Callable[[Host], object] | None = None) -> None:
    """Start host from nothing: network, holder, simulated GPU file, dockerd, sshd.
    ``seed`` fills the engine's data root first (the shared image store)."""
    stop_processes(host)
    create_network(host)
    if host.behind_bastion:
        guard_ssh(host)
    _prepare_dirs(host)
    if seed is not None:
        seed(host)
    _write_sshd_config(host)
    holder = _start_holder(host)
    write_gpus(host, gpus)
    _start_dockerd(host, holder, runtime)
    _start_sshd(host, holder)


def start_bastion(host: Host) -> None:
    """Start the bastion from nothing: network, holder, sshd (no engine, no GPU)."""
    stop_processes(host)
    create_network(host)
    _prepare_dirs(host)
    _write_sshd_config(host)
    _start_sshd(host, _start_holder(host))


def _start_sshd(host: Host, holder: int) -> None:
    argv = [
        "/usr/sbin/sshd",
        "-D",
        "-f",
        str(host.dir / "sshd_config"),
        "-o",
        f"ListenAddress={host.address}",
        "-E",
        str(host.log_path("sshd")),
    ]
    _spawn([*_enter(holder), *argv], host.log_path("sshd-stdout"))


def refresh_sshd(host: Host) -> bool:
    """On a running host, apply a changed sshd_config by restarting sshd (sessions stay)."""
    holder = holder_pid(host)
    sshd = daemon_pid(host, "sshd.pid", "sshd")
    if not _write_sshd_config(host) or holder is None or sshd is None:
        return False
    os.kill(sshd, signal.SIGTERM)  # only the listener: open sessions are separate processes
    wait_until(lambda: not pid_alive(sshd), timeout=10, what=f"{host.name}: old sshd to exit")
    _start_sshd(host, holder)
    wait_until(
        lambda: ssh_answers(host),
        timeout=30,
        what=f"{host.name}: sshd on {host.address}:22 (log: {host.log_path('sshd')})",
    )
    return True


def write_gpus(host: Host, gpus: dict[str, Any] | None) -> None:
    """(Re)write the host's /run/simgpu/gpus.json; None removes it (a host without GPU)."""
    simgpu = host.run_dir / "simgpu"
    (simgpu / "procs").mkdir(parents=True, exist_ok=True)
    # servers that run as an unprivileged user keep their reservation files here too
    (simgpu / "procs").chmod(0o1777)
    lock = simgpu / "lock"
    lock.touch()
    lock.chmod(0o666)
    target = simgpu / "gpus.json"
    if gpus is None:
        target.unlink(missing_ok=True)
        return
    tmp = simgpu / ".gpus.json.tmp"
    tmp.write_text(json.dumps(gpus, indent=2) + "\n")
    tmp.rename(target)


# ---------------------------------------------------------------- health


def docker_ping(socket_path: Path, timeout: float = 2.0) -> bool:
    """True when the dockerd behind this unix socket answers /_ping."""

    class _Conn(http.client.HTTPConnection):
        def connect(self) -> None:
            self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            self.sock.settimeout(timeout)
            self.sock.connect(str(socket_path))

    if not socket_path.exists():
        return False
    try:
        conn = _Conn("localhost", timeout=timeout)
        conn.request("GET", "/_ping")
        ok = conn.getresponse().status == 200
        conn.close()
        return ok
    except OSError:
        return False


def tcp_open(address: str, port: int, timeout: float = 1.0) -> bool:
    try:
        with socket.create_connection((address, port), timeout=timeout) as sock:
            banner = sock.recv(4) if port == 22 else b"SSH-"
            return banner.startswith(b"SSH-")
    except OSError:
        return False


@dataclass(frozen=True)
class HostState:
    name: str
    address: str
    holder: int | None
    sshd: int | None
    dockerd: int | None
    docker_ok: bool
    ssh_ok: bool
    network_ok: bool

    @property
    def healthy(self) -> bool:
        return all(
            [self.holder, self.sshd, self.dockerd, self.docker_ok, self.ssh_ok, self.network_ok]
        )


def inspect(host: Host) -> HostState:
    """What is running for this host right now (no side effects)."""
    network_ok = (
        host.netns_path.exists()
        and run(["ip", "link", "show", veth_name(host.index)], check=False).returncode == 0
    )
    return HostState(
        name=host.name,
        address=host.address,
        holder=holder_pid(host),
        sshd=daemon_pid(host, "sshd.pid", "sshd"),
        dockerd=daemon_pid(host, "docker.pid", "dockerd"),
        docker_ok=docker_ping(host.docker_socket),
        ssh_ok=network_ok and ssh_answers(host),
        network_ok=network_ok,
    )


def bastion_healthy(host: Host) -> bool:
    """The bastion's holder and sshd run and its sshd answers."""
    state = inspect(host)
    return bool(state.holder and state.sshd and state.ssh_ok and state.network_ok)


def ssh_answers(host: Host) -> bool:
    """The host's sshd answers on :22: from the machine, or for a host behind the bastion
    (which answers the bastion alone) from inside its own network namespace."""
    if not host.behind_bastion:
        return tcp_open(host.address, 22)
    probe = ("import socket,sys\ntry:\n s=socket.create_connection((sys.argv[1],22),1)\n"
             " sys.exit(0 if s.recv(4)==b'SSH-' else 1)\nexcept OSError:\n sys.exit(1)")
    return run(["nsenter", f"--net={host.netns_path}", "python3", "-c", probe, host.address],
               check=False, timeout=10).returncode == 0


def wait_ready(host: Host, *, timeout: float = 60) -> None:
    wait_until(
        lambda: docker_ping(host.docker_socket, timeout=1),
        timeout=timeout,
        what=f"{host.name}: dockerd on /run/docker.sock (log: {host.log_path('dockerd')})",
    )
    wait_until(
        lambda: ssh_answers(host),
        timeout=timeout,
        what=f"{host.name}: sshd on {host.address}:22 (log: {host.log_path('sshd')})",
    )


def stop(host: Host) -> None:
    """Stop every process of the host and remove its veth and netns."""
    stop_processes(host)
    remove_network(host)
    for name in ("holder.pid", "holder.json"):
        (host.dir / name).unlink(missing_ok=True)
