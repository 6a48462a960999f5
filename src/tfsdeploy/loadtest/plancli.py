"""``scripts/plan-capacity``: instances needed for a target QPS (see tfsdeploy.loadtest.capacity).

Exit codes: 0 planned; 1 bad input (no sweep report, no point under the SLO, bad factor).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from tfsdeploy.loadtest.cli import EXIT_BAD_INPUT, _Parser, plan_capacity


def build_parser() -> argparse.ArgumentParser:
    """Arguments of plan-capacity."""
    parser = _Parser(prog="plan-capacity", description="instances = target QPS / (per-instance "
                     "QPS at the SLO x load factor x availability factor)")
    parser.add_argument("target_qps", type=float, help="fleet-wide QPS to carry")
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--sweep-report", help="sweep.json from scripts/loadtest --sweep")
    source.add_argument("--per-instance-qps", type=float, help="measured QPS of one instance")
    parser.add_argument("--load-factor", type=float, default=0.65)
    parser.add_argument("--availability-factor", type=float, default=0.9)
    parser.add_argument("--headroom", type=float, default=0.15,
                        help="extra fraction on top of the minimum (default 0.15)")
    parser.add_argument("--failure-domains", type=int, default=1,
                        help="one spare instance per failure domain, at least (default 1)")
    parser.add_argument("--instances-per-host", type=int, default=1,
                        help="server instances per host (one per GPU: the host's GPU count)")
    parser.add_argument("--json", action="store_true", help="print JSON")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point."""
    ns = build_parser().parse_args(argv)
    source = ns.sweep_report if ns.sweep_report is not None else ns.per_instance_qps
    code, text = plan_capacity(ns.target_qps, source, load_factor=ns.load_factor,
                               availability_factor=ns.availability_factor,
                               headroom=ns.headroom, failure_domains=ns.failure_domains,
                               instances_per_host=ns.instances_per_host, as_json=ns.json)
    print(text, file=sys.stdout if code == 0 else sys.stderr)
    return code if code in (0, EXIT_BAD_INPUT) else EXIT_BAD_INPUT


if __name__ == "__main__":
    sys.exit(main())
