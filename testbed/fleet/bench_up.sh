#!/usr/bin/env bash
# Benchmark of `scripts/testbed up`: prints the figures the issue sets targets for.
#   testbed/fleet/bench_up.sh            down, then up with images cached (target: < 60 s for 3 hosts)
#   testbed/fleet/bench_up.sh --fresh    first purge testbed state and every image/wheel cache, as on
#                                        a fresh machine (target: < 10 min; downloads packages again)
# HOSTS=N changes the host count (default 3).
set -euo pipefail
here=$(cd "$(dirname "$0")/../.." && pwd)
cache=${TFSDEPLOY_CACHE:-/var/cache/tfsdeploy}
hosts=${HOSTS:-3}
mode=cached
target=60
down_args=()
if [ "${1:-}" = "--fresh" ]; then
  mode=fresh
  target=600
  down_args=(--purge)
fi

"$here/scripts/testbed" down "${down_args[@]}"
if [ "$mode" = fresh ]; then
  rm -rf "$cache/images" "$cache/pip"
fi
start=$(date +%s%N)
"$here/scripts/testbed" up --hosts "$hosts"
secs=$(( ($(date +%s%N) - start) / 1000000 ))
echo "bench: scripts/testbed up --hosts $hosts ($mode): $((secs / 1000)).$(printf %03d $((secs % 1000)))s (target < ${target}s)"
if [ "$secs" -ge $((target * 1000)) ]; then
  echo "bench: OVER TARGET" >&2
  exit 1
fi
