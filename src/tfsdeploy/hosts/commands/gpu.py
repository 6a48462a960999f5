"""The GPU commands (pure builders): what each process holds (nvidia-smi, run on the host so
that it names host pids, and each process's ancestors from /proc), the host-wide window
reservations, and the record of what a process held beside its pool.

nvidia-smi prints its errors on stdout, so each answer is captured and printed only when
nvidia-smi succeeded; a driver whose nvidia-smi does not know ``memory.reserved`` is asked again
without it (``core.gpu.smi`` derives the reserve then).
"""

from __future__ import annotations

from collections.abc import Sequence

from tfsdeploy.core.gpu.smi import QUERY_APPS, QUERY_GPU
from tfsdeploy.hosts.commands import Argv
from tfsdeploy.hosts.commands.files import publish_sh

MARK = "@@"

# section @@gpus: each GPU's memory, with a header naming the columns
GPUS_SH = f'''
g=$(nvidia-smi --query-gpu={",".join(QUERY_GPU)} --format=csv,nounits 2>/dev/null) ||
g=$(nvidia-smi --query-gpu={",".join(QUERY_GPU[:-1])} --format=csv,nounits 2>/dev/null) || g=
echo "@@gpus"; [ -n "$g" ] && printf '%s\\n' "$g"
'''

# sections @@gpuapps (each compute process: host pid, MiB, GPU) and @@gpuancestry ("pid ppid
# ppid2 ..." per process, read from /proc/<pid>/status without forking a process per step)
APPS_SH = f'''
a=$(nvidia-smi --query-compute-apps={",".join(QUERY_APPS)} --format=csv,noheader,nounits \\
2>/dev/null) || a=
echo "@@gpuapps"; [ -n "$a" ] && printf '%s\\n' "$a"
echo "@@gpuancestry"
[ -n "$a" ] && printf '%s\\n' "$a" | while IFS=', ' read -r pid rest; do
  case $pid in ''|*[!0-9]*) continue;; esac
  chain=$pid; p=$pid; n=0
  while [ "$p" -gt 1 ] && [ $n -lt 64 ] && [ -r "/proc/$p/status" ]; do
    q=; while read -r k v; do [ "$k" = PPid: ] && {{ q=$v; break; }}; done < "/proc/$p/status"
    [ -n "$q" ] || break; chain="$chain $q"; p=$q; n=$((n + 1))
  done
  echo "$chain"
done
'''

# the host-wide records under <data_root>/gpu: each reservation (and, when there is one, the
# lock record of its model, whose token says whether its run still holds it), each overhead;
# $held counts the reservations (what their processes hold is read only when there are some)
_RECORDS_SH = '''
held=0
for f in "$1"/reservations/*.json; do
  [ -f "$f" ] || continue; echo "@@gpureservation ${f##*/}"; cat "$f"; echo
  m=${f##*/}; m=${m#*.}; m=${m%.*.json}; held=$((held + 1))
  echo "@@gpulock ${f##*/}"; cat "$2/$m/lock/info.json" 2>/dev/null; echo
done
for f in "$1"/overhead/*.json; do
  [ -f "$f" ] || continue; echo "@@gpuoverhead ${f##*/}"; cat "$f"; echo
done
'''
RECORDS_SH = _RECORDS_SH.replace('"$1"', '"$root/gpu"').replace('"$2/', '"$root/')
# the facts' part: the GPUs, the records, and the processes when a reservation may need them
FACTS_SH = GPUS_SH + RECORDS_SH + '[ "$held" -gt 0 ] && [ -n "$g" ] && {' + APPS_SH + '}\n'


def read_gpu_apps() -> Argv:
    """Each compute process's holding (host pid) and its ancestors, in one round trip; ends
    with ``@@end`` so a cut answer is told from an empty one."""
    return ["sh", "-c", APPS_SH + 'echo "@@end"']


# stdin: the reservation record (its directory is $gd: publish_sh sets $d). Under the
# host-wide flock: this instance's earlier reservation of the same model (a run the model's
# lock has ended) goes, the next number is drawn, the record is written under it; then
# everything a judgement needs is printed, read in that same hold: every reservation with its
# model's lock record, and the GPUs' memory.
_TAKE = ('gd="$1"; mkdir -p -- "$gd/reservations" && exec 9>>"$gd/lock" && '
         'flock -w 20 9 || exit 4; '
         'rm -f -- "$gd/reservations/"????????????".$2.$3.json"; '
         'n=$(cat "$gd/seq" 2>/dev/null); case $n in ""|*[!0-9]*) n=0;; esac; n=$((n + 1)); '
         'printf "%s\\n" "$n" > "$gd/seq.tmp" && mv -f -- "$gd/seq.tmp" "$gd/seq" || exit 4; '
         'name=$(printf "%012d" "$n").$2.$3.json; t="$gd/reservations/.$name.tmp"; '
         '{ cat > "$t" && ' + publish_sh('"$t"', '"$gd/reservations/$name"') + '; } || '
         '{ rm -f -- "$t"; exit 4; }; '
         'echo "@@mine $name"; root="$4"; ' + GPUS_SH + RECORDS_SH
         + '[ "$held" -gt 1 ] && [ -n "$g" ] && {' + APPS_SH + '}\n' + 'echo "@@end"')


def take_reservation(gpu_dir: str, root: str, model: str, instance: int) -> Argv:
    """Write the reservation on stdin as the host's next one (for ``model``'s ``instance``),
    then print every reservation, their models' lock records and the GPUs' memory (and, when
    there is another reservation, what every process holds)."""
    return ["sh", "-c", _TAKE, "sh", gpu_dir, model, str(instance), root]


# first writes each (path, record) pair given (what the window's processes held beside their
# pools), then removes the model's reservations (every instance) that carry the token: another
# run's stay
_RELEASE = ('d0="$1"; m="$2"; tok="$3"; shift 3; while [ $# -ge 2 ]; do '
            'mkdir -p -- "$(dirname -- "$1")" && t="$1.tmp-$$" && '
            '{ printf "%s" "$2" > "$t" && ' + publish_sh('"$t"', '"$1"') + '; } || '
            '{ rm -f -- "$t"; exit 4; }; echo "recorded ${1##*/}"; shift 2; done; '
            '[ -d "$d0/reservations" ] || exit 0; exec 9>>"$d0/lock" && '
            'flock -w 20 9 || exit 4; '
            'for f in "$d0/reservations/"????????????".$m."*.json; do [ -f "$f" ] || continue; '
            'grep -qF -- "\\"lock_token\\":\\"$tok\\"" "$f" && { rm -f -- "$f" || exit 4; '
            'echo "released ${f##*/}"; }; done; exit 0')


def release_reservation(gpu_dir: str, model: str, token: str,
                        records: Sequence[tuple[str, str]] = ()) -> Argv:
    """Write ``records`` ((path, JSON) pairs: what the window's processes held beside their
    pools), then remove ``model``'s reservations taken under the lock ``token``."""
    return ["sh", "-c", _RELEASE, "sh", gpu_dir, model, token,
            *(part for record in records for part in record)]


def remove_reservation(gpu_dir: str, name: str) -> Argv:
    """Remove one reservation by its file name (a refused one)."""
    return ["sh", "-c", 'exec 9>>"$1/lock" && flock -w 20 9 && rm -f -- "$1/reservations/$2"',
            "sh", gpu_dir, name]


# what a model retired from the host leaves in the host-wide GPU records (its name matched
# whole: `a` is not `b.a`)
_FORGET = ('for f in "$1"/overhead/*.json "$1"/reservations/*.json; do [ -f "$f" ] || continue; '
           'n=${f##*/}; n=${n#*.}; n=${n%.json}; case $f in */reservations/*) n=${n%.*};; esac; '
           '[ "$n" = "$2" ] && rm -f -- "$f"; done; exit 0')


def forget_model(gpu_dir: str, model: str) -> Argv:
    """Remove ``model``'s GPU records on the host (what its processes held beside their
    pools; its reservations)."""
    return ["sh", "-c", _FORGET, "sh", gpu_dir, model]
