"""Command line: ``python -m testbed.models [--out DIR] [--only NAME...] [--force]``."""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from testbed.models import default_out_dir


def parse_args(argv: list[str]) -> argparse.Namespace:
    """Parse the command line."""
    parser = argparse.ArgumentParser(
        prog="make-models",
        description="Make the testbed's SavedModels (cached; see docs/models.md).",
    )
    parser.add_argument(
        "--out",
        type=Path,
        default=default_out_dir(),
        help="model root (default: $TFSDEPLOY_CACHE/models)",
    )
    parser.add_argument(
        "--only", nargs="+", default=[], metavar="NAME", help="make only these models"
    )
    parser.add_argument("--force", action="store_true", help="remake even if cached")
    parser.add_argument("--list", action="store_true", help="list models and versions, then exit")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    """Run the generator; exit 0 on success, 1 on bad arguments."""
    args = parse_args(sys.argv[1:] if argv is None else argv)
    from testbed.models import generate

    if args.list:
        for spec in generate.all_specs():
            print(f"{spec.key:24} {spec.summary}")
        return 0
    start = time.perf_counter()
    try:
        results = generate.generate(args.out, args.only, args.force)
    except ValueError as err:
        print(f"make-models: {err}", file=sys.stderr)
        return 1
    except generate.UnservableModel as err:
        print(f"make-models: {err}", file=sys.stderr)
        return 2
    made = [r for r in results if r.action == "made"]
    print(
        f"make-models: {len(made)} made, {len(results) - len(made)} cached, "
        f"{time.perf_counter() - start:.1f} s total, in {args.out}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
