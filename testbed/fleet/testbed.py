#!/usr/bin/env python3
"""scripts/testbed: bring the local test fleet up, show it, take it down.  See docs/testbed.md."""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import functools
import json
import os
import pwd
import shutil
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import hosts as hostlib
import images
import prometheus
import registry
from common import (
    BASTION_ADDRESS,
    BASTION_HOST,
    BASTION_INDEX,
    BRIDGE,
    CARDS,
    DEFAULT_CARD,
    DEFAULT_GPU_MIB,
    DEFAULT_GPUS,
    DEFAULT_HOSTS,
    FLEET_DIR,
    GATEWAY_INDEX,
    MAX_GPUS,
    MAX_HOSTS,
    NVIDIA_SMI_PATH,
    REGISTRY,
    Places,
    TestbedError,
    Timer,
    host_address,
    host_name,
    log,
    make_ssh_key,
    run,
    wait_until,
)

USER_MARK = "tfsdeploy-testbed"
# hosts started at once: each start is a dockerd and a containerd on two cores
START_AT_ONCE = 10
REQUIRED_TOOLS = [
    "ip",
    "iptables",
    "nsenter",
    "unshare",
    "dockerd",
    "docker",
    "runc",
    "docker-registry",
    "ssh",
    "ssh-keygen",
    "/usr/sbin/sshd",
]


# ---------------------------------------------------------------- options


def _per_host(option: str, specs: list[str], parse: Callable[[str], Any]) -> dict[str, Any]:
    """`VALUE` (every host, key "") and `tbN=VALUE` (one host) option values, parsed."""
    found: dict[str, Any] = {}
    names = [host_name(i) for i in range(1, MAX_HOSTS + 1)]
    for spec in specs:
        target, _, value = spec.rpartition("=")
        if target and target not in names:
            raise TestbedError(f"{option} {spec!r}: unknown host {target!r} (tb1..tb{MAX_HOSTS})")
        found[target] = parse(value)
    return found


def _gpu_count(value: str) -> int:
    try:
        count = int(value)
    except ValueError:
        count = -1
    if not 0 <= count <= MAX_GPUS:
        raise TestbedError(
            f"--gpus {value!r}: give a number of GPUs per host, 0..{MAX_GPUS} "
            "(e.g. --gpus 2, or --gpus tb3=4 for one host)"
        )
    return count


def _gpu_sizes(value: str) -> list[int]:
    try:
        mibs = [int(s) for s in value.split(",")]
    except ValueError:
        mibs = [-1]
    if mibs == [0]:
        return []  # tbN=0: no GPU at all
    if any(m <= 0 for m in mibs):
        raise TestbedError(
            f"--gpu-mib {value!r}: sizes must be positive integers in MiB, or 0 alone for no "
            "GPU (e.g. --gpu-mib 16384, --gpu-mib tb3=8192, --gpu-mib tb2=16384,8192)"
        )
    return mibs


def parse_gpu_specs(sizes: list[str], count: int, gpus: list[str] | None = None,
                    current: dict[str, list[int]] | None = None) -> dict[str, list[int]]:
    """`--gpus` and `--gpu-mib` values -> the memory of each GPU of each of ``count`` hosts.

    `--gpus 2` gives every host two GPUs, `--gpus tb3=4` one host four (default: 1). A single
    `--gpu-mib` size (`16384`, `tb3=8192`) is the size of each of the host's GPUs; a list
    (`tb2=16384,8192`) sizes them one by one and, without `--gpus`, sets how many; `tb2=0`: no
    GPU. A host that neither option names keeps its ``current`` GPUs (what hosts.json says),
    so a plain `up` repairs the fleet without reshaping it.
    """
    counts = _per_host("--gpus", gpus or [], _gpu_count)
    mibs = _per_host("--gpu-mib", sizes, _gpu_sizes)
    layout: dict[str, list[int]] = {}
    for name in (host_name(i) for i in range(1, count + 1)):
        named = name in mibs or name in counts or "" in mibs or "" in counts
        if not named and current is not None and name in current:
            layout[name] = list(current[name])
            continue
        size = mibs.get(name, mibs.get("", [DEFAULT_GPU_MIB]))
        wanted = counts.get(name, counts.get(""))
        if not size:
            layout[name] = []  # --gpu-mib tbN=0 wins over any --gpus
        elif len(size) == 1:
            layout[name] = size * (DEFAULT_GPUS if wanted is None else wanted)
        elif wanted in (None, len(size)):
            layout[name] = size
        else:
            raise TestbedError(
                f"{name}: --gpu-mib lists {len(size)} GPU sizes but --gpus asks for {wanted}; "
                f"give one size (for every GPU) or {wanted} sizes"
            )
    return layout


def _card(value: str) -> str:
    if value not in CARDS:
        raise TestbedError(
            f"--gpu-card {value!r}: choose one of {', '.join(sorted(CARDS))} "
            "(e.g. --gpu-card tb4=h200)"
        )
    return value


def parse_card_specs(
    specs: list[str],
    count: int,
    named: list[list[str]] | None = None,
    current: dict[str, str] | None = None,
) -> dict[str, str]:
    """`--gpu-card` values -> each host's card. A host that no GPU option names (``named``:
    the --gpus and --gpu-mib values) keeps its ``current`` card; a named one without a card
    gets the default (so `up --gpus tb4=2` makes tb4's GPUs T4s again)."""
    cards = _per_host("--gpu-card", specs, _card)
    others = [spec.rpartition("=")[0] for values in named or [] for spec in values]
    layout = {}
    for name in (host_name(i) for i in range(1, count + 1)):
        if name in cards or "" in cards:
            layout[name] = cards.get(name, cards.get("", DEFAULT_CARD))
        elif name in others or "" in others or current is None or name not in current:
            layout[name] = DEFAULT_CARD
        else:
            layout[name] = current[name]
    return layout


def apply_cards(
    gpus: dict[str, list[int]], cards: dict[str, str], sizes: list[str], previous: dict[str, str]
) -> dict[str, list[int]]:
    """Each host's GPU sizes once its card is known: a host whose card changes (or that is
    new) takes the card's memory, unless --gpu-mib names it."""
    sized = {spec.rpartition("=")[0] for spec in sizes}
    out = {}
    for name, mibs in gpus.items():
        changed = previous.get(name, DEFAULT_CARD) != cards[name]
        if changed and name not in sized and "" not in sized:
            total = int(CARDS[cards[name]]["memory_total_mib"])
            out[name] = [total] * len(mibs)
        else:
            out[name] = mibs
    return out


def gpu_document(name: str, mibs: list[int], card: str = DEFAULT_CARD) -> dict[str, Any] | None:
    if not mibs:
        return None
    profile = CARDS[card]
    return {
        "gpus": [
            {
                "index": i,
                "name": profile["name"],
                "uuid": "GPU-" + str(uuid.uuid5(uuid.NAMESPACE_DNS, f"{name}.gpu{i}.tfsdeploy")),
                "memory_total_mib": mib,
                "memory_reserved_mib": profile["memory_reserved_mib"],
                "context_mib": profile["context_mib"],
                "compute_capability": profile["compute_capability"],
                "card": card,
            }
            for i, mib in enumerate(mibs)
        ]
    }


# ---------------------------------------------------------------- files on the machine


def install_file(source: Path, target: Path) -> None:
    """Copy source to target (mode 0755) unless identical; atomic so running readers never break."""
    if target.exists() and target.read_bytes() == source.read_bytes():
        return
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_name(f".{target.name}.tmp")
    shutil.copyfile(source, tmp)
    tmp.chmod(0o755)
    tmp.rename(target)


def install_gpu_tools(places: Places) -> Path:
    """The simulated-GPU runtime, its hook and nvidia-smi; returns the runtime's path.

    The shared rules go first: a runtime or hook that starts meanwhile finds them."""
    install_file(FLEET_DIR / "simgpu_devices.py", places.bin / "simgpu_devices.py")
    install_file(FLEET_DIR / "nvidia_container_hook.py",
                 places.bin / "nvidia-container-runtime-hook")
    install_file(FLEET_DIR / "simgpu_runtime.py", places.bin / "simgpu_runtime.py")
    install_file(FLEET_DIR / "simgpu_runtime.sh", places.bin / "simgpu-runtime")
    install_file(FLEET_DIR / "nvidia_smi.py", NVIDIA_SMI_PATH)
    return places.bin / "simgpu-runtime"


def ensure_client_key(places: Places) -> None:
    places.ssh.mkdir(parents=True, exist_ok=True)
    places.ssh.chmod(0o700)
    make_ssh_key(places.ssh_key, "tfsdeploy-testbed")
    pub = Path(f"{places.ssh_key}.pub").read_text()
    (places.ssh / "authorized_keys").write_text(pub)


def ssh_config_text(places: Places) -> str:
    lines = [f"# {USER_MARK}: written by scripts/testbed; ssh -F {places.ssh_config} tb1"]
    for i in range(1, MAX_HOSTS + 1):
        lines += [f"Host {host_name(i)}", f"    HostName {host_address(i)}"]
        if hostlib.Host(i, places).behind_bastion:  # its sshd answers the bastion alone
            lines.append(f"    ProxyJump root@{BASTION_ADDRESS}")
    lines += [f"Host {BASTION_HOST}", f"    HostName {BASTION_ADDRESS}"]
    patterns = " ".join(
        [f"tb{i}" for i in range(1, MAX_HOSTS + 1)]
        + [host_address(i) for i in range(1, MAX_HOSTS + 1)]
        + [BASTION_HOST, BASTION_ADDRESS]
    )
    lines += [
        f"Host {patterns}",
        "    User root",
        f"    IdentityFile {places.ssh_key}",
        "    IdentitiesOnly yes",
        f"    UserKnownHostsFile {places.known_hosts}",
        "    StrictHostKeyChecking yes",
        "    BatchMode yes",
        "    LogLevel ERROR",
        "",
    ]
    return "\n".join(lines)


def known_hosts_lines(places: Places, count: int) -> list[str]:
    """tb1..tbN's pinned keys, and the bastion's while it is up (the inventory checks a
    jump host's key in the same file as its hosts')."""
    lines = []
    for i in range(1, count + 1):
        host = hostlib.Host(i, places)
        keytype, key = Path(f"{host.dir}/ssh_host_ed25519_key.pub").read_text().split()[:2]
        lines.append(f"{host.address},{host.name} {keytype} {key}")
        lines.append(f"[{host.address}]:{hostlib.ALT_SSH_PORT} {keytype} {key}")
    bastion = hostlib.Host(BASTION_INDEX, places)
    if bastion_json(places).exists():
        keytype, key = Path(f"{bastion.dir}/ssh_host_ed25519_key.pub").read_text().split()[:2]
        lines.append(f"{bastion.address},{bastion.name} {keytype} {key}")
    return lines


def write_known_hosts(places: Places, count: int) -> None:
    """known_hosts for tb1..tbN (and the bastion), replaced whole: runs reading it meanwhile
    see the old file or the new one."""
    tmp = places.known_hosts.with_name(".known_hosts.tmp")
    tmp.write_text("\n".join(known_hosts_lines(places, count)) + "\n")
    tmp.rename(places.known_hosts)


def user_ssh_dir() -> Path:
    return Path(pwd.getpwuid(os.getuid()).pw_dir) / ".ssh"


def strip_user_entries(text: str) -> str:
    """Remove what install_user_ssh added (a marked config block, marked known_hosts lines)."""
    out, skipping = [], False
    for line in text.splitlines():
        if line.strip() == f"# BEGIN {USER_MARK}":
            skipping = True
        elif line.strip() == f"# END {USER_MARK}":
            skipping = False
        elif not skipping and not line.rstrip().endswith(f" {USER_MARK}"):
            out.append(line)
    return "\n".join(out) + ("\n" if out else "")


def install_user_ssh(places: Places, count: int) -> None:
    """Make plain `ssh root@10.87.0.11` and docker's ssh:// (paramiko or ssh binary) work.

    docker-py's paramiko path reads only ~/.ssh/config (no Include) and ~/.ssh/known_hosts, so
    the testbed block and host keys go there, marked, and `down` takes them out again.
    """
    ssh_dir = user_ssh_dir()
    ssh_dir.mkdir(mode=0o700, exist_ok=True)
    config, known = ssh_dir / "config", ssh_dir / "known_hosts"
    old = strip_user_entries(config.read_text()) if config.exists() else ""
    block = f"# BEGIN {USER_MARK}\n{ssh_config_text(places)}# END {USER_MARK}\n"
    config.write_text(block + old)  # first match wins in ssh_config: our block goes first
    config.chmod(0o600)
    old_known = strip_user_entries(known.read_text()) if known.exists() else ""
    marked = "".join(f"{line} {USER_MARK}\n" for line in known_hosts_lines(places, count))
    known.write_text(old_known + marked)


def remove_user_ssh() -> None:
    for name in ("config", "known_hosts"):
        path = user_ssh_dir() / name
        if path.exists():
            path.write_text(strip_user_entries(path.read_text()))


def current_cards(places: Places) -> dict[str, str]:
    """Each host's card, as the last `up` wrote it (none: the default)."""
    try:
        hosts = json.loads(places.hosts_json.read_text())["hosts"]
        return {h["name"]: str(h.get("card", DEFAULT_CARD)) for h in hosts}
    except (OSError, ValueError, KeyError, TypeError):
        return {}


def current_shape(places: Places) -> tuple[dict[str, list[int]], set[str]]:
    """Each host's GPU sizes and the reserved hosts, as the last `up` wrote them (none yet:
    empty)."""
    try:
        hosts = json.loads(places.hosts_json.read_text())["hosts"]
        gpus = {h["name"]: [int(g["memory_mib"]) for g in h["gpus"]] for h in hosts}
        return gpus, {h["name"] for h in hosts if h.get("reserved")}
    except (OSError, ValueError, KeyError, TypeError):
        return {}, set()


def parse_reserve(value: str | None, count: int, current: set[str]) -> set[str]:
    """`--reserve tb4,tb5` (none: ``''``; not given: the current reservations)."""
    if value is None:
        return {name for name in current if int(name[2:]) <= count}
    names = {v.strip() for v in value.split(",") if v.strip()}
    unknown = sorted(n for n in names if n not in {host_name(i) for i in range(1, count + 1)})
    if unknown:
        raise TestbedError(f"--reserve {value!r}: {', '.join(unknown)} not among tb1..tb{count}")
    return names


def write_hosts_json(places: Places, gpus: dict[str, list[int]],
                     reserved: set[str] | None = None,
                     cards: dict[str, str] | None = None) -> None:
    hosts = []
    for name, mibs in gpus.items():
        card = (cards or {}).get(name, DEFAULT_CARD)
        doc = gpu_document(name, mibs, card) or {"gpus": []}
        behind = hostlib.Host(int(name[2:]), places).behind_bastion
        hosts.append(
            {
                "name": name,
                "address": host_address(int(name[2:])),
                # left out of inventory/testbed.py: hosts the test suite keeps to itself
                "reserved": name in (reserved or set()),
                "card": card,
                # reached through the bastion alone (its ssh_proxy_jump in the inventory)
                **({"via": f"root@{BASTION_ADDRESS}"} if behind else {}),
                "gpus": [
                    {
                        "index": g["index"],
                        "name": g["name"],
                        "uuid": g["uuid"],
                        "memory_mib": g["memory_total_mib"],
                        "reserved_mib": g["memory_reserved_mib"],
                    }
                    for g in doc["gpus"]
                ],
            }
        )
    data = {
        "hosts": hosts,
        "registry": REGISTRY,
        "ssh_key": str(places.ssh_key),
        "known_hosts": str(places.known_hosts),
        "ssh_user": "root",
        "ssh_config": str(places.ssh_config),
    }
    tmp = places.hosts_json.with_suffix(".tmp")
    tmp.write_text(json.dumps(data, indent=2) + "\n")
    tmp.rename(places.hosts_json)


# ---------------------------------------------------------------- commands


def preflight() -> None:
    if os.geteuid() != 0:
        raise TestbedError(
            "the testbed needs root (namespaces, bridges, dockerd): run it with sudo"
        )
    missing = [t for t in REQUIRED_TOOLS if not shutil.which(t)]
    if missing:
        raise TestbedError(f"missing tools: {', '.join(missing)}; run scripts/setup")


def existing_hosts(places: Places) -> list[int]:
    """Indexes of hosts that have anything on the machine (state dir, netns or veth)."""
    netns = set(run(["ip", "netns", "list"]).stdout.split())
    found = []
    for i in range(1, MAX_HOSTS + 1):
        host = hostlib.Host(i, places)
        if host.name in netns or (host.dir / "holder.json").exists() or host.netns_path.exists():
            found.append(i)
    return found


def needs_images(host: hostlib.Host) -> bool:
    """A host whose engine has no data yet (a new host)."""
    return not (host.dir / "docker" / "image").exists()


def seeder(places: Places, hosts: list[hostlib.Host]) -> Callable[[hostlib.Host], object] | None:
    """What fills a new host's engine from the shared image store (None: no host is new, or
    the registry has no images yet)."""
    if not any(needs_images(h) for h in hosts) or images.ensure_store(places) is None:
        return None
    return functools.partial(images.seed_host, places)


def bring_up_hosts(places: Places, gpus: dict[str, list[int]], runtime: Path,
                   cards: dict[str, str] | None = None) -> dict[str, str]:
    """Start every host that is not fully healthy; returns what happened per host."""
    seed = seeder(places, [hostlib.Host(i, places) for i in range(1, len(gpus) + 1)])

    def one(index: int) -> str:
        host = hostlib.Host(index, places)
        gpu_doc = gpu_document(host.name, gpus[host.name],
                               (cards or {}).get(host.name, DEFAULT_CARD))
        state = hostlib.inspect(host)
        if state.healthy:
            hostlib.write_gpus(host, gpu_doc)
            if state.dockerd and not hostlib.dockerd_current(host, state.dockerd, runtime):
                log(f"{host.name}: dockerd runs with an older command line or environment; "
                    "restarting it")
                hostlib.restart_dockerd(host, runtime=runtime)
                hostlib.refresh_sshd(host)
                return "dockerd-restarted"
            return "running" if not hostlib.refresh_sshd(host) else "sshd-reconfigured"
        hostlib.start(host, runtime=runtime, gpus=gpu_doc, seed=seed)
        hostlib.wait_ready(host)
        return "started" if not (state.holder or state.sshd or state.dockerd) else "restarted"

    with ThreadPoolExecutor(max_workers=START_AT_ONCE) as pool:
        results = list(pool.map(one, range(1, len(gpus) + 1)))
    return {host_name(i + 1): r for i, r in enumerate(results)}


def check_ssh(places: Places, indexes: list[int]) -> None:
    """One real login per host with strict host-key checking, as the toolkit will do; at
    most 4 at once through the bastion (its OpenSSH default MaxStartups drops new
    connections at random once 10 are unauthenticated)."""

    def one(index: int) -> None:
        out = run(
            ["ssh", "-F", str(places.ssh_config), host_name(index), "hostname"],
            check=False,
            timeout=30,
        )
        if out.returncode != 0 or out.stdout.strip() != host_name(index):
            raise TestbedError(
                f"ssh to {host_name(index)} failed: {out.stderr.strip()} "
                f"(sshd log: {places.logs / (host_name(index) + '-sshd.log')})"
            )

    behind = [i for i in indexes if hostlib.Host(i, places).behind_bastion]
    for group, at_once in (([i for i in indexes if i not in behind], 10), (behind, 4)):
        if group:
            with ThreadPoolExecutor(max_workers=at_once) as pool:
                list(pool.map(one, group))


GATEWAY_IMAGE = f"{REGISTRY}/tfsdeploy-proxy:2.6"


def gateway_json(places: Places) -> Path:
    """What `up --gateway` writes: the gateway host, for inventory/testbed.py."""
    return places.state / "gateway.json"


def gateway_known_hosts(places: Places) -> Path:
    """The gateway host's pinned key, in a file of its own: a plain `up` rewrites
    known_hosts with tb1..tbN only."""
    return places.ssh / "known_hosts.gateway"


def gateway_up(places: Places) -> str:
    """Start (or repair) the gateway host tbgw, alone: tb1..tbN are not looked at, restarted
    or reconfigured (other runs may be using them), nor is any image rebuilt or pushed; the
    gateway's image is pulled from the registry as it is."""
    if not registry.answers():
        raise TestbedError("the registry does not answer: bring the fleet up first "
                           "(scripts/testbed up)")
    ensure_client_key(places)
    runtime = install_gpu_tools(places)
    hostlib.ensure_bridge()
    host = hostlib.Host(GATEWAY_INDEX, places)
    state = hostlib.inspect(host)
    what = "running"
    if not state.healthy:
        hostlib.start(host, runtime=runtime, gpus=None)
        hostlib.wait_ready(host)
        what = "started"
    elif hostlib.refresh_sshd(host):
        what = "sshd-reconfigured"
    keytype, key = Path(f"{host.dir}/ssh_host_ed25519_key.pub").read_text().split()[:2]
    gateway_known_hosts(places).write_text(
        f"{host.address},{host.name} {keytype} {key}\n"
        f"[{host.address}]:{hostlib.ALT_SSH_PORT} {keytype} {key}\n")
    docker = ["docker", "-H", f"unix://{host.docker_socket}"]
    if run([*docker, "image", "inspect", GATEWAY_IMAGE], check=False).returncode != 0:
        run([*docker, "pull", "--quiet", GATEWAY_IMAGE], timeout=600)
    data = {"hosts": [{"name": host.name, "address": host.address, "gateway": True,
                       "known_hosts": str(gateway_known_hosts(places)), "gpus": []}]}
    tmp = gateway_json(places).with_suffix(".tmp")
    tmp.write_text(json.dumps(data, indent=2) + "\n")
    tmp.rename(gateway_json(places))
    out = run(["ssh", "-i", str(places.ssh_key), "-o",
               f"UserKnownHostsFile={gateway_known_hosts(places)}", "-o",
               "StrictHostKeyChecking=yes", "-o", "BatchMode=yes", f"root@{host.address}",
               "hostname"], check=False, timeout=30)
    if out.returncode != 0 or out.stdout.strip() != host.name:
        raise TestbedError(f"ssh to {host.name} failed: {out.stderr.strip()} "
                           f"(sshd log: {host.log_path('sshd')})")
    return what


def stop_hosts(places: Places, indexes: list[int], why: str) -> None:
    """Stop these hosts (their disks kept); one started behind the bastion is no longer so."""
    if not indexes:
        return
    log(f"stopping {', '.join(map(host_name, indexes))} ({why})")
    with ThreadPoolExecutor(max_workers=len(indexes)) as pool:
        list(pool.map(lambda i: hostlib.stop(hostlib.Host(i, places)), indexes))
    for i in indexes:
        (hostlib.Host(i, places).dir / hostlib.BEHIND_MARK).unlink(missing_ok=True)


def write_ssh_files(places: Places, count: int, *, user: bool) -> None:
    """known_hosts, the ssh config and (``user``) the invoking user's marked entries."""
    write_known_hosts(places, count)
    tmp = places.ssh_config.with_name(".config.tmp")
    tmp.write_text(ssh_config_text(places))
    tmp.rename(places.ssh_config)
    if user:
        install_user_ssh(places, count)


def bastion_json(places: Places) -> Path:
    """What `up --bastion` writes: the bastion, for inventory/testbed.py and the tests."""
    return places.state / "bastion.json"


def ensure_bastion(places: Places) -> str:
    """Start (or repair) the bastion tbjump: an sshd alone, OpenSSH's default MaxStartups
    and MaxSessions, TCP forwarding allowed; its key joins known_hosts."""
    ensure_client_key(places)
    hostlib.ensure_bridge()
    host = hostlib.Host(BASTION_INDEX, places)
    if hostlib.bastion_healthy(host):
        what = "sshd-reconfigured" if hostlib.refresh_sshd(host) else "running"
    else:
        hostlib.start_bastion(host)
        wait_until(lambda: hostlib.tcp_open(host.address, 22), timeout=30,
                   what=f"{host.name}: sshd on {host.address}:22 (log: {host.log_path('sshd')})")
        what = "started"
    keytype, key = Path(f"{host.dir}/ssh_host_ed25519_key.pub").read_text().split()[:2]
    pinned = places.ssh / "known_hosts.bastion"  # its key alone, beside known_hosts' copy
    pinned.with_suffix(".tmp").write_text(f"{host.address},{host.name} {keytype} {key}\n")
    pinned.with_suffix(".tmp").rename(pinned)
    data = {"name": host.name, "address": host.address, "jump": f"root@{host.address}",
            "known_hosts": str(pinned), "sshd_log": str(host.log_path("sshd"))}
    tmp = bastion_json(places).with_suffix(".tmp")
    tmp.write_text(json.dumps(data, indent=2) + "\n")
    tmp.rename(bastion_json(places))
    shape, _ = current_shape(places)
    write_known_hosts(places, len(shape))
    return what


def bastion_up(places: Places, args: argparse.Namespace) -> int:
    """`up --bastion [--hosts N]`: the bastion, and hosts tbK+1..tbN behind it (K: the hosts
    up now). tb1..tbK are left exactly as they are (not looked at, restarted or
    reconfigured: other runs use them); only hosts behind the bastion beyond N are stopped."""
    if not registry.answers():
        raise TestbedError("the registry does not answer: bring the fleet up first "
                           "(scripts/testbed up)")
    timer = Timer()
    shape, reserved = current_shape(places)
    count = len(shape) if args.hosts is None else args.hosts
    if not 1 <= count <= MAX_HOSTS:
        raise TestbedError(f"--hosts {count}: choose 1..{MAX_HOSTS}")
    behind = {n for n in shape if hostlib.Host(int(n[2:]), places).behind_bastion}
    direct_beyond = [n for n in shape if int(n[2:]) > count and n not in behind]
    if direct_beyond:
        raise TestbedError(f"--hosts {count} --bastion: {', '.join(direct_beyond)} are not "
                           "behind the bastion; stop them with scripts/testbed up --hosts "
                           f"{count} (without --bastion)")
    runtime = install_gpu_tools(places)
    t = time.monotonic()
    bastion = ensure_bastion(places)
    stop_hosts(places, [int(n[2:]) for n in shape if int(n[2:]) > count], f"beyond --hosts {count}")
    layout = parse_gpu_specs(args.gpu_mib, count, args.gpus, current=shape)
    gpus = {n: (shape[n] if n in shape else layout[n]) for n in layout}
    far = [i for i in range(1, count + 1) if host_name(i) not in shape or host_name(i) in behind]
    for i in far:
        (hostlib.Host(i, places).dir).mkdir(parents=True, exist_ok=True)
        (hostlib.Host(i, places).dir / hostlib.BEHIND_MARK).write_text(BASTION_HOST + "\n")
    timer.phase("bastion", t)
    t = time.monotonic()
    far_hosts = [hostlib.Host(i, places) for i in far]
    seed = seeder(places, far_hosts)
    timer.phase("image store", t)
    t = time.monotonic()

    def one(host: hostlib.Host) -> str:
        if hostlib.inspect(host).healthy:
            return "running"
        hostlib.start(host, runtime=runtime, gpus=gpu_document(host.name, gpus[host.name]),
                      seed=seed)
        hostlib.wait_ready(host)
        return "started"

    with ThreadPoolExecutor(max_workers=START_AT_ONCE) as pool:
        states = dict(zip([h.name for h in far_hosts], pool.map(one, far_hosts), strict=True))
    write_ssh_files(places, count, user=not args.no_user_ssh)
    write_hosts_json(places, gpus, reserved & set(gpus), current_cards(places))
    check_ssh(places, [h.index for h in far_hosts if states[h.name] == "started"])
    timer.phase("hosts", t)
    if not args.no_images:
        t = time.monotonic()
        wanted = {img.ref: images.registry_image_id(img) for img in images.IMAGES}
        pulls = images.pull_everywhere(far_hosts, {k: str(v) for k, v in wanted.items() if v})
        timer.phase(f"pulls ({pulls})", t)
    print(f"testbed up --bastion: {BASTION_HOST} {BASTION_ADDRESS} {bastion}; "
          f"{len(far_hosts)} hosts behind it; the others untouched")
    for name, what in states.items():
        print(f"  {name}  {host_address(int(name[2:])):<12} {what:<9} {gpu_label(gpus[name])}"
              f"   ssh -F {places.ssh_config} {name}")
    figures = ", ".join(f"{name} {secs:.1f}s" for name, secs in timer.phases)
    print(f"  timing: total {timer.total():.1f}s ({figures})")
    return 0


def bastion_down(places: Places) -> int:
    """`down --bastion`: stop the bastion and every host behind it; nothing else."""
    t = time.monotonic()
    shape, reserved = current_shape(places)
    behind = [i for i in existing_hosts(places) if hostlib.Host(i, places).behind_bastion]
    stop_hosts(places, behind, "behind the bastion")
    bastion = hostlib.Host(BASTION_INDEX, places)
    hostlib.stop(bastion)
    bastion_json(places).unlink(missing_ok=True)
    kept = {n: g for n, g in shape.items() if int(n[2:]) not in behind}
    write_hosts_json(places, kept, reserved & set(kept), current_cards(places))
    config = user_ssh_dir() / "config"
    installed = config.exists() and f"# BEGIN {USER_MARK}" in config.read_text()
    write_ssh_files(places, len(kept), user=installed)
    print(f"testbed down --bastion: stopped {BASTION_HOST} and {len(behind)} hosts behind it "
          f"({time.monotonic() - t:.1f}s); the others untouched")
    return 0


def cmd_up(args: argparse.Namespace) -> int:
    preflight()
    places = Places.from_env()
    places.check_state_dir()
    if args.gateway:
        t = time.monotonic()
        what = gateway_up(places)
        print(f"testbed up --gateway: tbgw {hostlib.Host(GATEWAY_INDEX, places).address} {what} "
              f"({time.monotonic() - t:.1f}s); {gateway_json(places)}; the other hosts "
              "untouched")
        return 0
    if args.bastion:
        return bastion_up(places, args)
    timer = Timer()
    shape, reserved_now = current_shape(places)
    if args.hosts is None:  # as many as there are, at least the default
        args.hosts = max(DEFAULT_HOSTS, len(shape))
    if not 1 <= args.hosts <= MAX_HOSTS:
        raise TestbedError(f"--hosts {args.hosts}: choose 1..{MAX_HOSTS}")
    gpus = parse_gpu_specs(args.gpu_mib, args.hosts, args.gpus, current=shape)
    cards_now = current_cards(places)
    cards = parse_card_specs(args.gpu_card, args.hosts, [args.gpus, args.gpu_mib], cards_now)
    gpus = apply_cards(gpus, cards, args.gpu_mib, cards_now)
    reserved = parse_reserve(args.reserve, args.hosts, reserved_now)
    for sub in ("logs", "bin", "hosts", "registry"):
        (places.state / sub).mkdir(parents=True, exist_ok=True)
    if args.ssh_forwarding is not None:
        (places.state / hostlib.FORWARDING_FILE).write_text(args.ssh_forwarding + "\n")
    t = time.monotonic()
    ensure_client_key(places)
    runtime = install_gpu_tools(places)
    stop_hosts(places, [i for i in existing_hosts(places) if i > args.hosts],
               f"beyond --hosts {args.hosts}")
    hostlib.ensure_bridge()
    reg = registry.ensure(places)
    timer.phase("bridge+registry", t)
    t = time.monotonic()
    if any(hostlib.Host(i, places).behind_bastion for i in range(1, args.hosts + 1)):
        ensure_bastion(places)
    states = bring_up_hosts(places, gpus, runtime, cards)
    write_ssh_files(places, args.hosts, user=not args.no_user_ssh)
    write_hosts_json(places, gpus, reserved, cards)
    check_ssh(places, list(range(1, args.hosts + 1)))
    timer.phase("hosts", t)
    if not args.no_images:
        images.ensure(places, [hostlib.Host(i, places) for i in range(1, args.hosts + 1)], timer)
    t = time.monotonic()
    prom = prometheus.ensure(places)
    timer.phase("prometheus", t)
    print_summary(places, states, reg, gpus, timer)
    print(f"  prometheus: http://{prometheus.ADDRESS}/ ({prom}); config "
          f"{prometheus.config_file(places)}")
    return 0


def cmd_reboot(args: argparse.Namespace) -> int:
    """Reboot one host as a machine reboots: every process stops (dockerd first, which stops
    the containers; with --hard everything is killed at once, a power cut), the disks are
    kept (its Docker engine's containers and images, the toolkit's files), then the host
    starts again, with --gpus / --gpu-mib its GPUs changed (a GPU lost or added). Containers
    with a restart policy start again with its engine, as on a real host."""
    preflight()
    places = Places.from_env()
    shape, reserved = current_shape(places)
    if args.host not in shape:
        raise TestbedError(f"reboot {args.host}: no such host (up: {', '.join(shape) or 'none'})")
    specs = [f"{args.host}={v}" for v in args.gpus]
    sizes = [f"{args.host}={v}" for v in args.gpu_mib]
    layout = parse_gpu_specs(sizes, len(shape), specs, current=shape)
    host = hostlib.Host(int(args.host[2:]), places)
    t = time.monotonic()
    if args.hard:
        hostlib.stop_processes(host, grace=0.0)
    hostlib.stop(host)
    down_s = time.monotonic() - t
    card = current_cards(places).get(host.name, DEFAULT_CARD)
    hostlib.start(host, runtime=install_gpu_tools(places),
                  gpus=gpu_document(host.name, layout[host.name], card))
    hostlib.wait_ready(host)
    write_hosts_json(places, {**shape, host.name: layout[host.name]}, reserved,
                     current_cards(places))
    print(f"testbed reboot: {host.name} down in {down_s:.1f}s, up again in "
          f"{time.monotonic() - t - down_s:.1f}s with {gpu_label(layout[host.name])}")
    return 0


def cmd_restart_engine(args: argparse.Namespace) -> int:
    """Restart one host's Docker engine alone (an engine upgrade or crash): its containers
    keep running (live restore), sshd and its sessions stay."""
    preflight()
    places = Places.from_env()
    shape, _ = current_shape(places)
    if args.host not in shape:
        raise TestbedError(f"restart-engine {args.host}: no such host")
    host = hostlib.Host(int(args.host[2:]), places)
    t = time.monotonic()
    hostlib.restart_dockerd(host, runtime=install_gpu_tools(places))
    print(f"testbed restart-engine: {host.name}'s dockerd answers again after "
          f"{time.monotonic() - t:.1f}s")
    return 0


def cmd_prometheus(args: argparse.Namespace) -> int:
    """Start (or reload) the testbed's Prometheus alone; idempotent, the hosts untouched."""
    preflight()
    places = Places.from_env()
    (places.state / "logs").mkdir(parents=True, exist_ok=True)
    state = prometheus.ensure(places, targets=not args.no_targets)
    print(f"prometheus: http://{prometheus.ADDRESS}/ ({state}); config "
          f"{prometheus.config_file(places)}")
    return 0


def gpu_label(mibs: list[int]) -> str:
    """`GPU 16384 MiB`, `GPUs 2x16384 MiB`, `GPUs 16384+8192 MiB` or `no GPU`."""
    if not mibs:
        return "no GPU"
    if len(mibs) == 1:
        return f"GPU {mibs[0]} MiB"
    if len(set(mibs)) == 1:
        return f"GPUs {len(mibs)}x{mibs[0]} MiB"
    return f"GPUs {'+'.join(map(str, mibs))} MiB"


def print_summary(
    places: Places, states: dict[str, str], reg: str, gpus: dict[str, list[int]], timer: Timer
) -> None:
    print(f"testbed up: {len(states)} hosts, registry {REGISTRY} ({reg})")
    for name, what in states.items():
        print(
            f"  {name}  {host_address(int(name[2:])):<11}  {what:<9}  {gpu_label(gpus[name])}   "
            f"ssh -F {places.ssh_config} {name}"
        )
    print(
        f"  ssh:    ssh -i {places.ssh_key} -o UserKnownHostsFile={places.known_hosts} "
        "root@10.87.0.11 docker ps"
    )
    print(
        "  docker: docker -H ssh://root@10.87.0.11 ps   |   "
        'docker.DockerClient(base_url="ssh://root@10.87.0.11")'
    )
    print(f"  hosts:  {places.hosts_json}")
    figures = ", ".join(f"{name} {secs:.1f}s" for name, secs in timer.phases)
    print(f"  timing: total {timer.total():.1f}s ({figures})")


def cmd_down(args: argparse.Namespace) -> int:
    preflight()
    places = Places.from_env()
    if args.bastion:
        return bastion_down(places)
    t = time.monotonic()
    indexes = existing_hosts(places)

    jobs: list[Callable[[], None]] = [
        functools.partial(registry.stop, places),
        functools.partial(prometheus.stop, places),
        functools.partial(images.stop_builder, places),
    ]
    jobs += [functools.partial(hostlib.stop, hostlib.Host(i, places)) for i in indexes]
    gateway = hostlib.Host(GATEWAY_INDEX, places)
    if gateway.netns_path.exists() or (gateway.dir / "holder.json").exists():
        jobs.append(functools.partial(hostlib.stop, gateway))
        gateway_json(places).unlink(missing_ok=True)
    bastion = hostlib.Host(BASTION_INDEX, places)
    if bastion.netns_path.exists() or (bastion.dir / "holder.json").exists():
        jobs.append(functools.partial(hostlib.stop, bastion))
        bastion_json(places).unlink(missing_ok=True)
    with ThreadPoolExecutor(max_workers=len(jobs)) as pool:
        for future in [pool.submit(job) for job in jobs]:
            future.result()
    hostlib.remove_bridge()
    remove_user_ssh()
    unmount_leftovers(places)
    unmount_empty_netns_dir()
    if args.purge:
        shutil.rmtree(places.state, ignore_errors=True)
    print(
        f"testbed down: stopped {len(indexes)} hosts, registry, bridge "
        f"({time.monotonic() - t:.1f}s){'; state purged' if args.purge else ''}"
    )
    return 0


def unmount_leftovers(places: Places) -> None:
    """Lazily unmount anything still mounted under the state dir or the image cache
    (a daemon killed with SIGKILL in an older version could leave such mounts)."""
    roots = (f"{places.state}/", f"{places.images}/")
    points = []
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        point = line.split(" ")[4].encode().decode("unicode_escape")
        if point.startswith(roots):
            points.append(point)
    for point in sorted(points, key=len, reverse=True):
        subprocess.run(["umount", "-l", point], check=False, capture_output=True)


def unmount_empty_netns_dir() -> None:
    """`ip netns add` mounts /run/netns on itself; take that away once no namespace is left."""
    netns_dir = Path("/run/netns")
    if netns_dir.is_dir() and not any(netns_dir.iterdir()):
        mounts = Path("/proc/self/mountinfo").read_text().split("\n")
        if any(line.split(" ")[4:5] == ["/run/netns"] for line in mounts if line):
            subprocess.run(["umount", "/run/netns"], check=False)


def cmd_status(args: argparse.Namespace) -> int:
    places = Places.from_env()
    indexes = existing_hosts(places)
    with ThreadPoolExecutor(max_workers=MAX_HOSTS) as pool:
        states = list(pool.map(lambda i: hostlib.inspect(hostlib.Host(i, places)), indexes))
    gw_host = hostlib.Host(GATEWAY_INDEX, places)
    gw_state = hostlib.inspect(gw_host) if gateway_json(places).exists() else None
    jump = hostlib.Host(BASTION_INDEX, places)
    jump_state = hostlib.inspect(jump) if bastion_json(places).exists() else None
    behind = {s.name for s in states
              if hostlib.Host(int(s.name[2:]), places).behind_bastion}
    reg_pid = registry.pid(places)
    reg_ok = registry.answers()
    runtime = places.bin / "simgpu-runtime"
    current = {
        s.name: s.dockerd is not None
        and hostlib.dockerd_current(hostlib.Host(int(s.name[2:]), places), s.dockerd, runtime)
        for s in states
    }
    report = {
        "hosts": [
            {
                "name": s.name,
                "address": s.address,
                "healthy": s.healthy,
                "holder": s.holder,
                "sshd": s.sshd,
                "dockerd": s.dockerd,
                # False: started by an older `up` (e.g. without the GPU hook); `up` restarts it
                "dockerd_current": current[s.name],
                "docker_answers": s.docker_ok,
                "ssh_answers": s.ssh_ok,
                "network": s.network_ok,
                # reached through the bastion alone (`up --bastion`)
                "behind_bastion": s.name in behind,
            }
            for s in states
        ],
        "registry": {"address": REGISTRY, "pid": reg_pid, "answers": reg_ok},
        "prometheus": {"address": prometheus.ADDRESS, "pid": prometheus.pid(places),
                       "answers": prometheus.answers()},
        "bridge": run(["ip", "link", "show", BRIDGE], check=False).returncode == 0,
        # `up --gateway`'s host; not counted in the exit code (the serving fleet's health)
        "gateway": None if gw_state is None else {
            "name": gw_state.name, "address": gw_state.address, "healthy": gw_state.healthy,
            "sshd": gw_state.sshd, "dockerd": gw_state.dockerd},
        # `up --bastion`'s jump host; not counted in the exit code, as the gateway
        "bastion": None if jump_state is None else {
            "name": jump_state.name, "address": jump_state.address,
            "healthy": bool(jump_state.sshd and jump_state.ssh_ok), "sshd": jump_state.sshd},
    }
    if args.json:
        print(json.dumps(report, indent=2))
    else:

        def mark(ok: object, pid: int | None = None) -> str:
            return (f"up({pid})" if pid else "up") if ok else "DOWN"

        print(
            f"bridge {BRIDGE}: {'up' if report['bridge'] else 'DOWN'}   registry {REGISTRY}: "
            f"{mark(reg_ok, reg_pid)}   prometheus {prometheus.ADDRESS}: "
            f"{mark(report['prometheus']['answers'], report['prometheus']['pid'])}   "
            f"state: {places.state}"
        )
        if not states:
            print("no hosts (start them with scripts/testbed up)")
        for s in states:
            images = docker_images(hostlib.Host(int(s.name[2:]), places)) if s.docker_ok else "-"
            stale = "" if current[s.name] or not s.dockerd else "  (dockerd outdated: run up)"
            via = f"  (behind {BASTION_HOST})" if s.name in behind else ""
            print(
                f"  {s.name} {s.address:<11} sshd {mark(s.ssh_ok and s.sshd, s.sshd):<12} "
                f"dockerd {mark(s.docker_ok and s.dockerd, s.dockerd):<12} images: {images}"
                f"{stale}{via}"
            )
        if jump_state is not None:
            print(f"  {jump_state.name} {jump_state.address:<11} bastion: "
                  f"{'up' if jump_state.sshd and jump_state.ssh_ok else 'DOWN'} "
                  "(scripts/testbed up --bastion)")
        if gw_state is not None:
            print(f"  {gw_state.name} {gw_state.address:<11} gateway host: "
                  f"{'healthy' if gw_state.healthy else 'DOWN (scripts/testbed up --gateway)'}")
    healthy = bool(states) and all(s.healthy for s in states) and reg_ok
    return 0 if healthy else 3


def docker_images(host: hostlib.Host) -> str:
    out = run(
        [
            "docker",
            "-H",
            f"unix://{host.docker_socket}",
            "images",
            "--format",
            "{{.Repository}}:{{.Tag}}",
        ],
        check=False,
        timeout=10,
    )
    names = [n.rsplit("/", 1)[-1] for n in out.stdout.split()]
    return ", ".join(names) or "none"


@contextlib.contextmanager
def fleet_lock(places: Places, *, shared: bool) -> Iterator[None]:
    """The testbed's own lock (``$STATE/testbed.lock``): exclusive for the commands that
    change hosts, shared for those that read them; waited for, however long the holder runs."""
    places.state.mkdir(parents=True, exist_ok=True)
    with open(places.state / "testbed.lock", "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_SH if shared else fcntl.LOCK_EX)
        yield


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="scripts/testbed", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    up = sub.add_parser("up", help="start (or repair) the local fleet; idempotent")
    up.add_argument("--hosts", type=int, default=None,
                    help=f"number of hosts, 1..{MAX_HOSTS} (default: as many as now, at least "
                    f"{DEFAULT_HOSTS})")
    up.add_argument("--reserve", default=None, metavar="tbN[,tbN]",
                    help="hosts left out of inventory/testbed.py, kept for the test suite's own "
                    "models ('' for none; default: as now)")
    up.add_argument(
        "--gpus",
        action="append",
        default=[],
        metavar="[tbN=]N",
        help=f"simulated GPUs per host (default: as now; {DEFAULT_GPUS} on a new host): for all "
        "hosts, or one host",
    )
    up.add_argument(
        "--gpu-mib",
        action="append",
        default=[],
        metavar="[tbN=]MIB[,MIB]",
        help=f"memory of each simulated GPU (default: as now; {DEFAULT_GPU_MIB} on a new host): "
        "for all hosts, or one host; a list sizes the GPUs one by one; 0 = no GPU",
    )
    up.add_argument(
        "--gpu-card",
        action="append",
        default=[],
        metavar="[tbN=]CARD",
        help=f"the simulated card: {', '.join(sorted(CARDS))} (default: as now; "
        f"{DEFAULT_CARD} on a new host or one --gpus/--gpu-mib names); its memory, reserved "
        "memory and what a process holds beside its pool",
    )
    up.add_argument("--no-images", action="store_true", help="skip building/pushing/pulling images")
    up.add_argument("--bastion", action="store_true",
                    help=f"start (or repair) the bastion {BASTION_HOST} ({BASTION_ADDRESS}: "
                    "sshd alone, OpenSSH's default MaxStartups and MaxSessions) and, with "
                    "--hosts N, hosts beyond the current ones up to tbN behind it (their sshd "
                    "answers the bastion alone); the hosts up now are left exactly as they are")
    up.add_argument("--gateway", action="store_true",
                    help="start (or repair) only the gateway host tbgw (10.87.0.30, the "
                    "inventory's gateway group); tb1..tbN are left exactly as they are")
    up.add_argument(
        "--ssh-forwarding",
        choices=("yes", "no"),
        default=None,
        help="allow TCP and unix-socket forwarding in the hosts' sshd (default: as last set; "
        "no on a new testbed, as on a hardened host)",
    )
    up.add_argument(
        "--no-user-ssh",
        action="store_true",
        help="do not add the testbed to ~/.ssh/config and ~/.ssh/known_hosts",
    )
    reboot = sub.add_parser(
        "reboot", help="reboot one host (disks kept; containers with a restart policy come "
        "back), optionally with its GPUs changed")
    reboot.add_argument("host", metavar="tbN")
    reboot.add_argument("--gpus", action="append", default=[], metavar="N",
                        help="its simulated GPUs after the reboot (default: as now)")
    reboot.add_argument("--gpu-mib", action="append", default=[], metavar="MIB[,MIB]",
                        help="the memory of each of its GPUs after the reboot")
    reboot.add_argument("--hard", action="store_true",
                        help="a power cut: every process killed at once, no orderly stop")
    engine = sub.add_parser("restart-engine", help="restart one host's Docker engine alone "
                            "(its containers keep running: live restore)")
    engine.add_argument("host", metavar="tbN")
    down = sub.add_parser("down", help="stop everything; keeps docker data unless --purge")
    down.add_argument("--purge", action="store_true", help="also delete all testbed state")
    down.add_argument("--bastion", action="store_true",
                      help="stop only the bastion and the hosts behind it")
    status = sub.add_parser(
        "status", help="show hosts, daemons and registry (exit 3 if not healthy)"
    )
    status.add_argument("--json", action="store_true")
    prom = sub.add_parser(
        "prometheus", help=f"start (or reload) the testbed's Prometheus on {prometheus.ADDRESS} "
        "alone (up starts it too); idempotent")
    prom.add_argument("--no-targets", action="store_true",
                      help="do not read the hosts for the models' current targets")
    args = parser.parse_args(argv)
    # One command changes the fleet at a time, and `status` answers between them, never in
    # the middle of one (a host being rebooted is not a fleet to repair: a test's
    # "is the fleet up?" that ran `up` then would give the host back what the reboot took)
    shared = args.command in ("status", "prometheus")
    handler = {"up": cmd_up, "down": cmd_down, "status": cmd_status,
               "prometheus": cmd_prometheus, "reboot": cmd_reboot,
               "restart-engine": cmd_restart_engine}[args.command]
    try:
        with fleet_lock(Places.from_env(), shared=shared):
            return handler(args)
    except TestbedError as exc:
        print(f"testbed {args.command}: FAILED: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
