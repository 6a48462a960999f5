"""What a dead --notify receiver adds to a run: the wall time of a run's event calls plus
close() with the default delivery policy, for a receiver that refuses connections and one
that accepts them but never answers (both on 127.0.0.1). Target: under 1 s.

    python benchmarks/bench_notify.py [--repeat N]

Prints one line per receiver kind: median and worst added seconds over N runs; exits 0 (the
target is reported, not enforced).
"""

from __future__ import annotations

import argparse
import socket
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests" / "unit"))
sys.path.insert(0, str(REPO / "src"))

from test_notify import FACTS  # noqa: E402
from test_notify import _a_run as a_run  # noqa: E402

from tfsdeploy.runbook.notify import Notifier  # noqa: E402

TARGET_S = 1.0


def added_s(url: str) -> float:
    """Seconds a run's notifications to ``url`` add, events sent and close() returned."""
    started = time.monotonic()
    notifier = Notifier([url], FACTS)
    for event in a_run():
        notifier.send(event)
    notifier.close()
    return time.monotonic() - started


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    with socket.socket() as listener, socket.socket() as probe:
        listener.bind(("127.0.0.1", 0))
        listener.listen(64)  # the kernel completes connections; nothing answers
        probe.bind(("127.0.0.1", 0))
        refusing = f"http://127.0.0.1:{probe.getsockname()[1]}/hook"
        probe.close()  # nothing listens there now: connection refused
        kinds = {"refuses": refusing,
                 "never answers": f"http://127.0.0.1:{listener.getsockname()[1]}/hook"}
        for kind, url in kinds.items():
            times = [added_s(url) for _ in range(args.repeat)]
            print(f"dead receiver ({kind}): added median {statistics.median(times):.3f} s, "
                  f"worst {max(times):.3f} s over {args.repeat} runs (target < {TARGET_S:g} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
