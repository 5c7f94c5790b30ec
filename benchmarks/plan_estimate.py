"""How far off is a run's plan? The estimate a plan prints against the time the run takes.

For each job kind (an experiment: the quick demo; the oracle testbed at its quick size; a
comparison of two small CNNs on generated images, quick) in a fresh folder: the plan alone
(``plan_only=True``, what ``--plan`` prints), then the run itself, timed. Prints the
estimate, the wall time and their ratio; the estimate of a run's IRI sets is an upper bound
(every step of every image), so the ratio is expected above 1 where IRIs dominate.

    python benchmarks/plan_estimate.py                 # about 5 minutes on 2 cores
    python benchmarks/plan_estimate.py --only demo_quick
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import torch


def _demo_quick(out: Path, plan_only: bool):
    from stitchlab.experiments import builtin_config, run_experiment

    return run_experiment(builtin_config("demo_quick"), out, progress=False,
                          plan_only=plan_only, echo=lambda _: None)  # fmt: skip


def _oracle_quick(out: Path, plan_only: bool):
    from stitchlab.oracle import OracleSettings, run_oracle

    return run_oracle(OracleSettings.quick(), out, progress=False, plan_only=plan_only,
                      echo=lambda _: None)  # fmt: skip


def _compare_quick(out: Path, plan_only: bool):
    from stitchlab import data as D
    from stitchlab import models
    from stitchlab.compare import CompareSettings, run_compare

    if not (out / "data.npz").exists():
        import numpy as np

        out.mkdir(parents=True, exist_ok=True)
        x, y = D.shapes(1200, seed=0)[:2]
        np.savez(out / "data.npz", x=x.numpy(), y=y.numpy())
        for seed in (0, 1):
            torch.manual_seed(seed)
            models.save(models.create("small_cnn", num_classes=10, width=16),
                        out / f"m{seed}.safetensors")  # fmt: skip
    s = CompareSettings.quick(front=str(out / "m0.safetensors"), back=str(out / "m1.safetensors"),
                              data=str(out / "data.npz"))  # fmt: skip
    return run_compare(s, out / "run", progress=False, plan_only=plan_only,
                       echo=lambda _: None)  # fmt: skip


JOBS: dict[str, Callable[[Path, bool], object]] = {
    "demo_quick": _demo_quick, "oracle_quick": _oracle_quick, "compare_quick": _compare_quick,
}  # fmt: skip


def main(argv: list[str] | None = None) -> None:
    """Print one row per job: estimate, wall time, ratio."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--only", nargs="*", choices=list(JOBS))
    args = ap.parse_args(argv)
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads")
    print("| job | estimate s | of it, IRI sets (at most) s | run s | estimate / run |")
    print("|---|---|---|---|---|")
    for name in args.only or list(JOBS):
        with tempfile.TemporaryDirectory() as tmp:
            out = Path(tmp) / name
            plan = JOBS[name](out, True)
            t0 = time.perf_counter()
            JOBS[name](out, False)
            wall = time.perf_counter() - t0
            iris = sum(s.seconds or 0.0 for s in plan.stages if s.at_most and s.todo)
            print(f"| {name} | {plan.seconds:.0f} | {iris:.0f} | {wall:.0f} | "
                  f"{plan.seconds / wall:.2f} |", flush=True)  # fmt: skip


if __name__ == "__main__":
    sys.exit(main())
