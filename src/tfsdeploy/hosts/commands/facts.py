"""The one command that reads a model's state on a host (``facts.gather`` parses it).

One round trip prints every file-system fact the toolkit needs, each section after a marker
line ``@@<name> [argument]``: the ``current`` link and the sha256 of its files, every release
record, the lock record (and `fab tune`'s), the staged versions and their digests, free disk
where the versions are written (the volume of the model's directory), GPUs, listening
ports, the proxy's configuration, its ``show stat`` and the servers its haproxy.cfg enables
(what a restarted proxy serves), the kernel's boot id and which tools the host has; and the
GPU's truth (``commands.gpu``): each process's holding with its ancestors, the host-wide window
reservations and what processes were measured to hold beside their pools. Docker's
facts come from the Engine API, not from here.
"""

from __future__ import annotations

from tfsdeploy.core.inventory.layout import HostPaths
from tfsdeploy.hosts.commands import Argv
from tfsdeploy.hosts.commands.gpu import FACTS_SH

MARK = "@@"

_SCRIPT = r'''
home=$1; models=$2; sock=$3; root=$4
echo "@@boot"; cat /proc/sys/kernel/random/boot_id 2>/dev/null
echo "@@current"; readlink "$home/current" 2>/dev/null; echo
for f in "$home"/releases/*/manifest.json; do
  [ -f "$f" ] || continue; echo "@@record $f"; cat "$f"; echo
done
echo "@@live"; [ -d "$home/current/" ] && (cd "$home/current/" && sha256sum -- * 2>/dev/null)
echo "@@lock"; cat "$home/lock/info.json" 2>/dev/null; echo
[ -d "$home/lock" ] && echo "@@lockdir"
echo "@@lockdigest"; [ -f "$home/lock/info.json" ] && sha256sum < "$home/lock/info.json"
echo "@@tunelock"; cat "$home/tune.lock/info.json" 2>/dev/null; echo
echo "@@versions"
for d in "$models"/*; do
  v=${d##*/}; case $v in ''|*[!0-9]*) continue;; esac
  [ -d "$d" ] && printf '%s %s\n' "$v" "$(cat "$home/versions/$v.sha256" 2>/dev/null)"
done
echo "@@disk"; p=$models; while [ ! -e "$p" ]; do p=$(dirname "$p"); done; df -Pm "$p" | tail -n 1
''' + FACTS_SH + r'''
echo "@@listen"; ss -ltnH 2>/dev/null
echo "@@proxycfg"; cat "$home/proxy/haproxy.cfg" 2>/dev/null
echo "@@proxyloaded"; cat "$home/proxy/loaded" 2>/dev/null
echo "@@proxy"
[ -S "$sock" ] && command -v socat >/dev/null &&
  echo "show stat" | socat -t 2 - "UNIX-CONNECT:$sock" 2>/dev/null
echo "@@tools"
for t in socat flock sha256sum tar nvidia-smi; do command -v $t >/dev/null && echo $t; done
echo "@@end"
'''


def read_facts(paths: HostPaths) -> Argv:
    """Print the model's file-system facts on the host, section by section."""
    return ["sh", "-c", _SCRIPT, "sh", paths.home, paths.model_dir, paths.admin_socket,
            paths.root]
