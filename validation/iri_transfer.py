"""Stitch-free transfer of a front's IRIs to a back model, per IRI recipe.

For the first ``--n`` stitching images of an experiment config (with the marker of the
front's model table, as the protocol uses them), generates the front's IRIs at ``--point``
with each recipe preset of ``--presets`` and prints their error (median, p90, times
closer than the null) and ``stitchlab.evaluation.iri_agreement`` of the back and of the front on
them: how the whole back model decides on the IRIs against their sources (with its 95%
interval and its null), which the invariance-aware stitch score follows within about a
point (docs/validation/a_converged.md). A quick check of whether better IRIs change what
a pair shares, without training a stitch.

    python validation/iri_transfer.py CONFIG --store STORE --front seed1 --back back \
        --point layer4.1 [--n 1024] [--presets v1,default]
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import torch

from stitchlab.evaluation import iri_agreement
from stitchlab.experiments import load_config, with_fingerprints
from stitchlab.experiments.datasets import stitch_data
from stitchlab.experiments.jobs import load_model
from stitchlab.iris import generate_iris


def main() -> None:
    """Generate each preset's IRIs and print the transfer table."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("config")
    ap.add_argument("--store", required=True, type=Path)
    ap.add_argument("--front", required=True)
    ap.add_argument("--back", required=True)
    ap.add_argument("--point", required=True)
    ap.add_argument("--n", type=int, default=1024)
    ap.add_argument("--presets", default="v1,default")
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    raw = with_fingerprints(load_config(args.config).raw)
    for name in (args.front, args.back):
        if name not in raw["models"]:
            raise SystemExit(f"no model {name!r} in {args.config}; it has {sorted(raw['models'])}")
    front = load_model(raw, args.store, args.front)
    back = load_model(raw, args.store, args.back)
    data = stitch_data(raw, raw["models"][args.front]["marker"])
    n = min(args.n, len(data))
    x = torch.stack([data[i][0] for i in range(n)])
    labels = torch.zeros(n, dtype=torch.long)  # iri_agreement compares outputs, not labels
    print(f"| {args.front} -> {args.back} at {args.point}, {n} images | IRI median / p90 "
          f"(x null) | back on the IRIs [95%] (null) | front on its IRIs | seconds |")  # fmt: skip
    print("|---|---|---|---|---|")
    for preset in args.presets.split(","):
        t0 = time.perf_counter()
        res = generate_iris(front, args.point, x, preset=preset)
        q = res.quality()
        b = iri_agreement(back, (res.iris, labels), (x, labels))
        f = iri_agreement(front, (res.iris, labels), (x, labels))
        print(f"| {preset} | {q.median_error:.4f} / {q.p90_error:.4f} ({q.null_ratio:.0f}x) | "
              f"{b['agreement']:.1f} [{b['agreement_ci_low']:.1f}, {b['agreement_ci_high']:.1f}] "
              f"({b['null_agreement']:.1f}) | {f['agreement']:.1f} | "
              f"{time.perf_counter() - t0:.0f} |", flush=True)  # fmt: skip


if __name__ == "__main__":
    main()
