"""``python -m stitchlab.report RUN_DIR``: write the figures and report.html of a run."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from . import ReportInputError, make_report


def main(argv: Sequence[str] | None = None) -> int:
    """Command-line entry point; returns the exit status."""
    p = argparse.ArgumentParser(prog="python -m stitchlab.report", description=__doc__)
    p.add_argument("run_dir", help="a run directory with results.csv")
    p.add_argument("--num-classes", type=int, default=None, help="chance = 100 / K")
    p.add_argument("--spread", choices=("minmax", "std", "none"), default="minmax")
    p.add_argument("--no-pdf", action="store_true", help="PNG figures only")
    args = p.parse_args(argv)
    try:
        out = make_report(
            args.run_dir,
            num_classes=args.num_classes,
            spread=args.spread,
            formats=("png",) if args.no_pdf else ("png", "pdf"),
        )
    except ReportInputError as exc:
        print(f"stitchlab report: {exc}", file=sys.stderr)
        return 2
    print(out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
